"""Opt-in (``--run-sglang-wheel``): SGLang 0.5.23's own streaming session, over its own unified
cache (FULL, FULL and MAMBA, or FULL and SWA components, both tree cores), its
``HybridReqToTokenPool`` or ``ReqToTokenPool`` and its token or SWA allocator, driven as its
scheduler drives a streaming session; a hybrid (Mamba) model's under speculative decoding is
finding 10 of specs/sglang_findings.md (also run on SGLang 0.5.16's
``StreamingSession`` around its ``MambaRadixCache``). With the FULL component alone, the
same hand-over is checked against kvpool's session rule (the over-allocation freed at the
hand-over). Generated multi-turn sessions (stops inside a run, reserves, aborts, retractions)
check kvpool's rules on SGLang's state after every turn: no KV slot, row or Mamba state leaked
or freed twice, a kept turn holding exactly its tokens through the stop. Every admission's
resumed positions are checked to hold their own tokens' KV, and on a hybrid model each lend of a
kept state against the prefix the turn resumes at: the mismatches are exactly those findings
10, 11 and 12 predict, and hypothesis's ``find`` isolates each. With a sliding window the
scheduler's slide runs on the session's record: every SWA slot is accounted for and every resumed
turn's window is live.

kvpool's lifecycle campaigns run their own session code on both sides (kvpool refuses a hybrid
session turn that stops early, ``ConfigError``). Here SGLang's code runs instead, through
:mod:`tests.sglang.session_world` (which calls, and what is set by hand).
"""

from __future__ import annotations

import pytest
from hypothesis import find, given, settings
from hypothesis import strategies as st

from kvpool.config import PoolConfig
from kvpool.reference.lifecycle.memory_manager import MemoryManager
from kvpool.sglang.cache_req import token_array
from kvpool.sglang.session_campaign import MAX_TURNS, RANGES, STOPS, Setup, shrink
from kvpool.sglang.session_plans import RETRACTIONS, Turn, predicted, run_session
from kvpool.sglang.session_world import (
    CORES,
    StreamingSessionStandIn,
    TurnReq,
    build,
)
from tests.sglang.session_world import (
    NEXT,
    OUTPUT,
    PROMPT,
    RESERVE,
    TurnReq16,
    build16,
    run_turn,
)

pytestmark = pytest.mark.sglang_wheel


@pytest.mark.parametrize("core", CORES)
def test_a_turn_stopping_inside_its_run_hands_the_next_turn_a_state_past_the_stop(
    core: str,
) -> None:
    """The finding: the session keeps the KV through the stop and the live state of every
    committed token; the next turn resumes at the stop from that state."""
    world = build(core)
    session = StreamingSessionStandIn("s")
    turn = TurnReq(world, "t1", PROMPT, session)
    state = run_turn(world, turn, stop=3)
    committed, through_stop = len(PROMPT) + len(OUTPUT), len(PROMPT) + 3
    free_before = world.allocator.impl.available_size()

    # SGLang's own rule: the live state holds all 14 committed tokens and cannot be cut back
    # to the 11 the request owns (its scheduler keeps such a request out of the tree)
    assert turn.owned_kv_len() == through_stop < committed
    assert world.finish(turn) is False

    # ... yet the streaming session keeps the record: the KV is trimmed to the stop (the
    # overshoot and the reserve are freed), the state slot is kept as it is
    slot = world.cache.session.slots["s"]
    assert session.finished == ["t1"] and not turn.kv.holds_kv
    assert slot.kv.kv_committed_len == slot.kv.kv_allocated_len == through_stop
    assert world.allocator.impl.available_size() == free_before + committed + RESERVE - through_stop
    assert slot.kv.holds_mamba and int(slot.kv.mamba_pool_idx) == state
    assert not slot.kv.mamba_needs_clear and slot.kv.mamba_ping_pong_track_buffer is None

    # the next turn continues from the stop: it borrows the record and resumes at token 11,
    # and its admission reuses the state slot that has seen 14 tokens (nothing clears it)
    nxt = TurnReq(world, "t2", PROMPT + OUTPUT[:3] + NEXT, session)
    match = world.match(nxt)
    assert nxt.kv is slot.kv
    assert match.device_prefix_len == through_stop
    assert world.pool.impl.alloc([nxt]) is not None
    assert int(nxt.kv.mamba_pool_idx) == state and not nxt.kv.mamba_needs_clear


@pytest.mark.parametrize("core", CORES)
def test_a_turn_stopping_at_its_last_token_keeps_state_and_kv_together(core: str) -> None:
    """Control: without an overshoot the session's KV and state hold the same tokens."""
    world = build(core)
    session = StreamingSessionStandIn("s")
    turn = TurnReq(world, "t1", PROMPT, session)
    state = run_turn(world, turn, stop=len(OUTPUT))
    committed = len(PROMPT) + len(OUTPUT)
    assert turn.owned_kv_len() == committed
    assert world.finish(turn) is True
    slot = world.cache.session.slots["s"]
    assert slot.kv.kv_committed_len == slot.kv.kv_allocated_len == committed
    nxt = TurnReq(world, "t2", PROMPT + OUTPUT + NEXT, session)
    assert world.match(nxt).device_prefix_len == committed
    assert int(nxt.kv.mamba_pool_idx) == state


@pytest.mark.parametrize("core", CORES)
def test_without_a_session_the_state_past_the_stop_is_freed(core: str) -> None:
    """Contrast: the same finish without a session caches nothing and frees the state, as
    SGLang's scheduler rule intends."""
    world = build(core)
    turn = TurnReq(world, "t1", PROMPT, None)
    run_turn(world, turn, stop=3)
    free_states = world.pool.impl.mamba_allocator.available_size()
    free_slots = world.allocator.impl.available_size()
    assert world.finish(turn) is False and turn.skip_radix_cache_insert
    assert world.pool.impl.mamba_allocator.available_size() == free_states + 1
    total = len(PROMPT) + len(OUTPUT) + RESERVE
    assert world.allocator.impl.available_size() == free_slots + total
    nxt = TurnReq(world, "t2", PROMPT + OUTPUT[:3] + NEXT, None)
    assert world.match(nxt).device_prefix_len == 0


@pytest.mark.parametrize("core", CORES)
def test_the_hand_over_frees_the_over_allocation_as_kvpools_sessions_do(core: str) -> None:
    """Full attention: SGLang's session frees a finished turn's over-allocation (the reserve,
    and the tokens past a stop) at the hand-over and holds ``allocated == committed``, which is
    kvpool's rule (``SessionSlot.take_from``, ``INV-SESSION-TRIMMED``): the same scenario on
    kvpool's reference frees as many slots at its finish."""
    committed = len(PROMPT) + len(OUTPUT)
    for stop in (len(OUTPUT), 3):
        world = build(core, hybrid=False)
        turn = TurnReq(world, "t1", PROMPT, StreamingSessionStandIn("s"))
        run_turn(world, turn, stop=stop)
        free_before = world.allocator.impl.available_size()
        assert world.finish(turn) is True  # no Mamba state: the scheduler's check says yes
        slot = world.cache.session.slots["s"]
        kept = len(PROMPT) + stop
        assert slot.kv.kv_committed_len == slot.kv.kv_allocated_len == kept
        sglang_freed = world.allocator.impl.available_size() - free_before
        assert sglang_freed == committed + RESERVE - kept

        mm = MemoryManager(PoolConfig(size=64, req_pool_size=4, max_context_len=32))
        mm.open_session("s")
        mm.new_req("t1", PROMPT, session_id="s")
        mm.extend(["t1"])
        mm.spec_step(["t1"], [OUTPUT[:3]], reserve=RESERVE)
        mm.spec_step(["t1"], [OUTPUT[3:]], reserve=RESERVE)
        t1 = mm.reqs["t1"]
        assert t1.kv_committed_len == committed
        over = t1.kv_allocated_len - committed  # kvpool's reserve: its own amount
        free_before = mm.token_to_kv_pool_allocator.available_size()
        mm.finish(["t1"], finished_lens=[stop])
        (held,) = mm.snapshot().sessions
        assert held.kv_committed_len == held.kv_allocated_len == kept
        kvpool_freed = mm.token_to_kv_pool_allocator.available_size() - free_before
        assert kvpool_freed == committed + over - kept  # the same rule: [kept, allocated)


turns = st.lists(
    st.tuples(
        *(st.integers(low, high) for low, high in RANGES),  # new, sampled, reserve
        st.one_of(st.none(), st.integers(*STOPS)),
        st.booleans(),
        st.sampled_from(RETRACTIONS),
        st.booleans(),
    ),
    min_size=1,
    max_size=MAX_TURNS,
)
"""The plans ``kvpool sessions`` draws (:mod:`kvpool.sglang.session_campaign`'s ranges), as a
hypothesis strategy."""


@pytest.mark.parametrize("chunked", [False, True])
@pytest.mark.parametrize("sessions", [1, 2])
@pytest.mark.parametrize("neighbours", [False, True])
@pytest.mark.parametrize("core", CORES)
@pytest.mark.parametrize(
    ("kind", "page_size"), [("full", 1), ("full", 4), ("hybrid", 1), ("swa", 1), ("swa", 4)]
)
@settings(max_examples=25, deadline=None)
@given(plan=turns)
def test_generated_sessions_keep_kvpools_rules_on_sglangs_code(
    chunked: bool,
    sessions: int,
    neighbours: bool,
    core: str,
    kind: str,
    page_size: int,
    plan: list[Turn],
) -> None:
    """Generated multi-turn sessions (stops inside a run, reserves, aborts, retractions,
    finishes with and without a launched next step; one session or two taking turns that share
    a first prompt; alone, or with a plain request after every turn pressing on the pool; whole
    or chunked prefills) on
    SGLang's own streaming session: nothing leaks, nothing is freed twice, a kept turn holds
    exactly its tokens through the stop; every resumed position holds its own token's KV and
    every lent state matches its resume, except where findings 10, 11 and 12 predict."""
    setup = Setup(kind, page_size, core, neighbours=neighbours, sessions=sessions, chunked=chunked)
    found = setup.play(plan)
    assert sorted(found) == sorted(predicted(plan, kind == "hybrid", sessions))


@pytest.mark.parametrize("core", CORES)
def test_the_generated_search_finds_and_shrinks_each_finding(core: str) -> None:
    """kvpool's checks of what a turn resumes from, searched by hypothesis over the same plans,
    find each finding alone and shrink it (finding 10's with kvpool's shrinker after
    hypothesis's) to a two-turn plan at most: one turn retracted under overlap (11); two turns,
    the first kept with its stop inside its run (10); two turns of full attention, the first
    speculating and finishing with no step launched (12)."""
    config = settings(max_examples=200, deadline=None, database=None, derandomize=True)

    def state_ahead_unretracted(plan: list[Turn]) -> bool:
        found = run_session(build(core), plan)
        return any(plan[i][5] is None and kind == "state" and d > 0 for i, kind, d in found)

    def kv_gap(plan: list[Turn]) -> bool:
        return bool(run_session(build(core, hybrid=False), plan))

    eleven = find(turns, lambda plan: bool(run_session(build(core), plan)), settings=config)
    assert eleven == [(1, 1, 0, None, False, "overlap", False)]
    # hypothesis's shrinker can keep a leading trivial turn here; kvpool's own (the one
    # `kvpool sessions` runs) takes the found plan the rest of the way: a turn stopping at its
    # first of three outputs, its forward two tokens in (no step launched), then the turn it
    # lends its state to
    ten = shrink(find(turns, state_ahead_unretracted, settings=config), state_ahead_unretracted)
    assert ten == [(1, 3, 0, 1, False, None, False), (1, 1, 0, None, False, None, False)]
    assert run_session(build(core), ten) == predicted(ten, True) == [(1, "state", 1)]
    twelve = find(turns, kv_gap, settings=config)
    assert twelve == [(1, 1, 1, None, False, None, False), (1, 1, 0, None, False, None, False)]


def test_0_5_16_session_also_resumes_from_a_state_past_the_stop() -> None:
    """Finding 10 on SGLang 0.5.16: its ``StreamingSession`` wrapped around its
    ``MambaRadixCache``, its release (``common.release_kv_cache``) and its
    ``HybridReqToTokenPool``: the hand-over trims the KV to the stop and keeps the state slot,
    and the next turn resumes at the stop from it."""
    world = build16()
    session = StreamingSessionStandIn("s")
    turn = TurnReq16("t1", PROMPT, session)
    committed = len(PROMPT) + len(OUTPUT)
    state = world.start(turn, committed, committed + RESERVE)
    turn.output_ids = token_array(OUTPUT)
    turn.finished_len = 3
    turn.finished_reason = world.classes["FINISH_MATCHED_TOKEN"](0)
    free_before = world.allocator.impl.available_size()
    world.release(turn)
    through_stop = len(PROMPT) + 3
    slot = world.cache.slots["s"]
    assert slot.kv_committed_len == slot.kv.kv_allocated_len == through_stop
    freed = world.allocator.impl.available_size() - free_before
    assert freed == committed + RESERVE - through_stop
    assert int(slot.mamba_pool_idx) == state  # the state after 14 tokens, kept

    nxt = TurnReq16("t2", PROMPT + OUTPUT[:3] + NEXT, session)
    assert len(world.match(nxt, list(nxt.origin_input_ids)).device_indices) == through_stop
    assert world.pool.impl.alloc([nxt]) is not None
    assert int(nxt.mamba_pool_idx) == state and not nxt.mamba_needs_clear
