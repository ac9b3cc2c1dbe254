"""Opt-in (``--run-sglang-wheel``): finding 11 of specs/sglang_findings.md. Under overlap
scheduling, a hybrid (Mamba) streaming-session turn retracted while it decodes is admitted again
one token behind the state its session kept: SGLang's own session, cache, pools and release
(0.5.23, both tree cores; 0.5.16's ``StreamingSession`` around its ``MambaRadixCache``),
through :mod:`tests.sglang.session_world`.

What overlap scheduling leaves at a retraction (0.5.23's ``event_loop_overlap``): the scheduler
prepares the next batch (``update_running_batch``, where ``retract_decode`` runs) after it has
launched the previous one and before it processes that one's result. So the request's last
sampled token (the last of ``output_ids``) is already being computed: ``alloc_for_decode``
counted it in ``kv_committed_len``, and the forward writes its KV and advances the live Mamba
state through it. The token that forward samples is dropped (``is_retracted``). Here the model's
forward is stood in by hand: the row's slots, the committed length, and the state's tag, which
:meth:`kvpool.sglang.hybrid.SGLangMambaPool.write_state` sets to the number of tokens the state
has consumed.
"""

from __future__ import annotations

from typing import Any

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
    OUTPUT,
    PROMPT,
    TurnReq16,
    build16,
)

pytestmark = pytest.mark.sglang_wheel

SAMPLED = len(PROMPT) + len(OUTPUT)
"""The turn's tokens when it is retracted: its prompt and the output sampled so far (14)."""


def decoding_turn(world: World, session: StreamingSessionStandIn, overlap: bool) -> tuple[Any, int]:
    """A session's turn decoding when the scheduler retracts it: :data:`OUTPUT` sampled and
    processed, and with ``overlap`` the step computing the last of them already launched (the
    state and ``kv_committed_len`` include it); without, that step not yet prepared. Returns
    the request and its state slot."""
    req = TurnReq(world, "t1", PROMPT, session)
    admit(world, req, len(PROMPT))
    committed = SAMPLED if overlap else SAMPLED - 1
    world.extend_slots(req, committed)  # one slot per computed token (no speculation)
    req.kv.kv_committed_len = committed
    req.kv.mamba_needs_clear = False  # the prefill cleared the fresh state slot
    req.output_ids = token_array(OUTPUT)
    state = int(req.kv.mamba_pool_idx)
    world.pool.mamba_pool.write_state([state], [committed])
    return req, state


@pytest.mark.parametrize("core", CORES)
def test_a_turn_retracted_under_overlap_resumes_a_token_behind_its_state(core: str) -> None:
    """The finding: the session keeps the record and the live state after 14 tokens; the
    re-admission resumes at token 13, so the prefill feeds the 14th token into a state that has
    already consumed it."""
    world = build(core)
    session = StreamingSessionStandIn("s")
    req, state = decoding_turn(world, session, overlap=True)

    # release_req: release_kv_cache(checkpoint=False) hands the record to the session
    world.retract(req)
    slot = world.cache.session.slots["s"]
    assert not req.kv.holds_kv and slot.kv.kv_committed_len == slot.kv.kv_allocated_len == SAMPLED
    assert slot.kv.holds_mamba and int(slot.kv.mamba_pool_idx) == state
    assert session.finished == ["t1"]  # the retraction also advanced the session's checkpoint

    # admitted again over its fill ids (prompt and output): the key stops a token short, so
    # the session frees the last token's slot to compute it again ...
    assert admit(world, req, SAMPLED) == SAMPLED - 1
    assert req.kv is slot.kv and int(req.kv.mamba_pool_idx) == state
    # ... from the kept state slot, not cleared, which has consumed that token already
    assert not req.kv.mamba_needs_clear
    assert world.pool.mamba_pool.state_tags([state]) == [SAMPLED]


@pytest.mark.parametrize("core", CORES)
def test_without_overlap_the_retracted_turn_resumes_where_its_state_is(core: str) -> None:
    """Control: with the last sampled token not yet computed, the state and the resumed prefix
    hold the same 13 tokens."""
    world = build(core)
    req, state = decoding_turn(world, StreamingSessionStandIn("s"), overlap=False)
    world.retract(req)
    assert admit(world, req, SAMPLED) == SAMPLED - 1
    assert int(req.kv.mamba_pool_idx) == state
    assert world.pool.mamba_pool.state_tags([state]) == [SAMPLED - 1]


def test_0_5_16_session_also_resumes_a_token_behind_its_state() -> None:
    """Finding 11 on SGLang 0.5.16: its ``StreamingSession`` keeps an unfinished (retracted)
    turn's slot as a finished one's (``try_cache_finished_req``: ``save_from_req``), and the
    re-admission resumes at ``min(kv_committed_len, len(key))``, a token behind its state."""
    world = build16()
    session = StreamingSessionStandIn("s")
    turn = TurnReq16("t1", PROMPT, session)
    # 0.5.16's prepare_for_decode counted the launched step
    state = world.start(turn, SAMPLED, SAMPLED)
    turn.output_ids = token_array(OUTPUT)
    world.pool.mamba_pool.write_state([state], [SAMPLED])
    world.release(turn, is_insert=False)  # release_req: no insert
    slot = world.cache.slots["s"]
    assert slot.kv_committed_len == SAMPLED and int(slot.mamba_pool_idx) == state

    again = TurnReq16("t1", PROMPT + OUTPUT, session)  # its fill ids: prompt and output
    assert len(world.match(again, PROMPT + OUTPUT).device_indices) == SAMPLED - 1
    assert world.pool.impl.alloc([again]) is not None
    assert int(again.mamba_pool_idx) == state and not again.mamba_needs_clear
    assert world.pool.mamba_pool.state_tags([state]) == [SAMPLED]
