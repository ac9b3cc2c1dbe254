"""Opt-in (``--run-sglang-wheel``): finding 12 of specs/sglang_findings.md. Under speculative
decoding, a streaming session's hand-over counts the KV of the turn's last output token as
computed, although only the request's next verify computes it. When that verify is not already
launched (overlap off, or a prefill of other requests launched instead), the next turn reuses a
slot holding another token's KV: SGLang 0.5.23's own session, cache, pool and release (FULL
component, both tree cores) through :mod:`tests.sglang.session_world`.

What speculative decoding leaves at a finish (0.5.23): the prefill computes the prompt's KV and
samples a first token; each verify step computes the KV of its input (the previous step's bonus
token and the drafts) and commits its accepted run, the accepted drafts and a new bonus token
(``batch_result_processor.py``: ``kv_committed_len += num_accept_tokens``). So after a step's
result is processed, ``kv_committed_len`` counts every token whose KV is computed, and the
last output token (the bonus) is not among them: its KV comes with the next verify, whose
slot at that position holds, until then, a rejected draft's KV. The model's forward is stood
in by hand: a map from each row slot to the token whose KV it holds.
"""

from __future__ import annotations

import pytest

from kvpool.sglang.cache_req import token_array
from kvpool.sglang.session_world import (
    CORES,
    StreamingSessionStandIn,
    TurnReq,
    World,
    admit,
    build,
)
from tests.sglang.session_world import (
    NEXT,
    OUTPUT,
    PROMPT,
    RESERVE,
    TurnReq16,
    build16,
)

pytestmark = pytest.mark.sglang_wheel

TOKENS = PROMPT + OUTPUT
"""The turn's tokens: its prompt and its output, the last one the bonus of its last verify."""
CLOCK = len(TOKENS) - 1
"""``kv_committed_len`` after the last verify's result (13): every token but the bonus."""
REJECTED = 99
"""The last verify's first rejected draft, whose KV sits where the bonus's will go."""


def finishing_turn(
    world: World, session: StreamingSessionStandIn | None, in_flight: bool
) -> tuple[TurnReq, dict[int, int]]:
    """A turn whose last verify's result is processed with a stop at its bonus (the last output
    token): its clock at :data:`CLOCK`, :data:`RESERVE` slots allocated past it. With
    ``in_flight`` the next verify (its input the bonus) is already launched and has written the
    bonus's KV. Returns the request and the stand-in's map of row slot to token."""
    req = TurnReq(world, "t1", PROMPT, session)
    admit(world, req, len(PROMPT))
    world.extend_slots(req, CLOCK + RESERVE)
    req.kv.kv_committed_len = CLOCK
    req.output_ids = token_array(OUTPUT)
    req.finished_len = len(OUTPUT)
    req.finished_reason = world.finish_reason(False)
    row = world.pool.impl.req_to_token[req.kv.req_pool_idx]
    kv = {int(row[pos]): TOKENS[pos] for pos in range(CLOCK)}
    kv[int(row[CLOCK])] = TOKENS[CLOCK] if in_flight else REJECTED
    return req, kv


def next_turn_reads(
    world: World, session: StreamingSessionStandIn, kv: dict[int, int]
) -> list[int]:
    """The next turn's admission (the turn's tokens and :data:`NEXT`): the tokens whose KV its
    resumed prefix holds, position by position."""
    nxt = TurnReq(world, "t2", TOKENS + NEXT, session)
    prefix = admit(world, nxt, len(TOKENS + NEXT))
    row = world.pool.impl.req_to_token[nxt.kv.req_pool_idx]
    return [kv.get(int(row[pos]), -1) for pos in range(prefix)]


@pytest.mark.parametrize("core", CORES)
def test_the_hand_over_counts_the_bonus_whose_kv_no_forward_computed(core: str) -> None:
    """The finding: the session keeps ``kv_committed_len = prompt + finished_len`` (14), past
    the request's own 13; the next turn resumes at 14 and reads a rejected draft's KV where the
    bonus should be."""
    world = build(core, hybrid=False)
    session = StreamingSessionStandIn("s")
    req, kv = finishing_turn(world, session, in_flight=False)
    assert req.owned_kv_len() == CLOCK
    world.finish(req)
    slot = world.cache.session.slots["s"]
    assert slot.kv.kv_committed_len == slot.kv.kv_allocated_len == len(TOKENS) > CLOCK
    reads = next_turn_reads(world, session, kv)
    assert reads[:CLOCK] == TOKENS[:CLOCK]
    assert reads[CLOCK:] == [REJECTED]  # the bonus's position: another token's KV


@pytest.mark.parametrize("core", CORES)
def test_with_the_next_verify_launched_the_resumed_kv_is_right(core: str) -> None:
    """Control: the case the session's rule assumes (overlap, the next verify in flight): the
    same hand-over, and every resumed position holds its own token's KV."""
    world = build(core, hybrid=False)
    session = StreamingSessionStandIn("s")
    req, kv = finishing_turn(world, session, in_flight=True)
    world.finish(req)
    assert next_turn_reads(world, session, kv) == TOKENS


@pytest.mark.parametrize("core", CORES)
def test_without_a_session_the_tree_keeps_only_the_computed_tokens(core: str) -> None:
    """Contrast: the same finish without a session caches the request's 13 computed tokens
    (``owned_kv_len``), not the bonus."""
    world = build(core, hybrid=False)
    req, _ = finishing_turn(world, None, in_flight=False)
    world.finish(req)
    assert world.match(TurnReq(world, "t2", TOKENS + NEXT, None)).device_prefix_len == CLOCK


def test_0_5_16_session_also_counts_the_bonus() -> None:
    """Finding 12 on SGLang 0.5.16: its ``StreamingSession`` (around its ``MambaRadixCache``,
    the KV side being the same for every tree) keeps ``min(prompt + finished_len, allocated)``
    too, and the next turn resumes past the request's own clock."""
    world = build16()
    session = StreamingSessionStandIn("s")
    turn = TurnReq16("t1", PROMPT, session)
    world.start(turn, CLOCK, CLOCK + RESERVE)
    turn.output_ids = token_array(OUTPUT)
    turn.finished_len = len(OUTPUT)
    turn.finished_reason = world.classes["FINISH_MATCHED_TOKEN"](0)
    world.release(turn)
    assert world.cache.slots["s"].kv_committed_len == len(TOKENS) > CLOCK
    nxt = TurnReq16("t2", TOKENS + NEXT, session)
    assert len(world.match(nxt, TOKENS + NEXT).device_indices) == len(TOKENS)
