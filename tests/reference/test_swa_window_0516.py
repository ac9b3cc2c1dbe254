"""SGLang 0.5.16's window timing in the reference SWA lifecycle (``Rules.swa_window_release ==
"maybe_evict"``, set by ``Rules.for_sglang("0.5.16")``): worked examples of when the window
slides (before a decode's or EAGLE v2 step's allocation from a request's second decode on, at a
later prefill chunk on the chunk cache) against kvpool's ``"decode"`` rule, whose frontier it
shares (specs/swa.md, "SGLang 0.5.16's window timing")."""

from __future__ import annotations

import dataclasses

import pytest

from kvpool.config import PoolConfig
from kvpool.errors import ConfigError
from kvpool.invariants import check_all
from kvpool.reference.lifecycle.swa_memory_manager import SWAMemoryManager
from kvpool.rules import Rules

MAYBE_EVICT = dataclasses.replace(Rules(), swa_window_release="maybe_evict")
SCHEDULER_1 = dataclasses.replace(Rules.for_sglang("0.5.23"), swa_eviction_interval=1)


def manager(rules: Rules, radix: bool = False, page_size: int = 1, window: int = 2,
            ratio: float = 0.8) -> SWAMemoryManager:  # fmt: skip
    return SWAMemoryManager(PoolConfig(size=64, page_size=page_size, disable_radix_cache=not radix,
                                       sliding_window=window, swa_full_tokens_ratio=ratio,
                                       rules=rules))  # fmt: skip


def cursor(mm: SWAMemoryManager, rid: str = "a") -> int:
    snap = mm.snapshot()
    check_all(snap)
    return next(r.swa_evicted_seqlen for r in snap.reqs if r.rid == rid)


def test_the_0_5_16_preset_is_the_maybe_evict_timing() -> None:
    rules = Rules.for_sglang("0.5.16")
    assert (rules.swa_window_release, rules.swa_eviction_interval) == ("maybe_evict", 1)
    assert Rules.for_sglang("0.5.17").swa_window_release == "maybe_evict"
    assert Rules().swa_window_release == "decode"  # kvpool's default is unchanged
    # 0.5.16's cadence is its scheduler's forward counter, which kvpool does not model
    with pytest.raises(ConfigError, match="swa_eviction_interval must be 1"):
        dataclasses.replace(MAYBE_EVICT, swa_eviction_interval=2)


def test_a_later_prefill_chunk_slides_the_window_and_the_first_decode_does_not() -> None:
    """Chunk cache, page 1, window 2, a 10-token prompt in chunks of 4, 4, 2, then three decodes.
    kvpool's rule slides after each decode only: the first at the 10 tokens before it (cursor
    8), then 9, 10. 0.5.16 slides before the allocation of each later chunk, at its prefix (4:
    cursor 2; 8: cursor 6), not at the request's first decode (it follows the prefill), then at
    each decode's committed length (11: cursor 9; 12: cursor 10)."""
    expected = {Rules(): [0, 0, 0, 8, 9, 10], MAYBE_EVICT: [0, 2, 6, 6, 9, 10]}
    for rules, cursors in expected.items():
        mm = manager(rules)
        mm.new_req("a", list(range(1, 11)))
        got = []
        for chunk in (4, 4, None):
            mm.extend(["a"], [chunk])
            got.append(cursor(mm))
        for token in (11, 12, 13):
            mm.decode(["a"], [token])
            got.append(cursor(mm))
        assert got == cursors, rules.swa_window_release


def test_the_first_decode_keeps_the_window_and_the_second_slides_first() -> None:
    """Chunk cache, page 1, window 2, SWA pool of 16 slots, a 10-token prompt in one extend then
    two decodes: (cursor, free SWA slots) after each. kvpool's rule takes the first decode's
    slot (5 free), then slides at the 10 tokens before it (8 freed: 13), the second likewise
    (one slot taken, one freed). 0.5.16 does not slide at the first decode (5 free); the
    second first frees the 9 SWA slots of tokens [0, 9) (cursor 11 - 2), then takes one."""
    expected = {Rules(): [(8, 13), (9, 13)], MAYBE_EVICT: [(0, 5), (9, 13)]}
    for rules, steps in expected.items():
        mm = manager(rules, ratio=0.25)
        mm.new_req("a", list(range(1, 11)))
        mm.extend(["a"])
        got = []
        for token in (11, 12):
            mm.decode(["a"], [token])
            snap = mm.snapshot()
            check_all(snap)
            assert snap.swa is not None
            got.append((snap.reqs[0].swa_evicted_seqlen, snap.swa.swa.available_size()))
        assert got == steps, rules.swa_window_release


def test_an_eagle_v2_step_slides_as_a_decode_does() -> None:
    """Chunk cache, page 1, window 2, a 6-token prompt, three EAGLE v2 steps of reserve 1
    (accepting 2, 1, then 0 tokens). 0.5.16's ``eagle_prepare_for_decode`` calls
    ``maybe_evict_swa`` first, as 0.5.23's does: no slide at the first step, at the 8 tokens
    committed before the second (cursor 6), the 9 before the third (cursor 7); each step
    allocates up to committed + 2 in both pools. kvpool's rule slides nothing in a step."""
    expected = {
        Rules(): [(2, 0, 43), (2, 0, 41), (1, 0, 40)],
        MAYBE_EVICT: [(2, 0, 43), (2, 6, 47), (1, 7, 47)],
    }
    for rules, steps in expected.items():
        mm = manager(rules)
        mm.new_req("a", [1, 2, 3, 4, 5, 6])
        mm.extend(["a"])
        got = []
        for accepted in ([7, 8], [9], []):
            out = mm.spec_step(["a"], [accepted], 1)
            snap = mm.snapshot()
            check_all(snap)
            assert snap.swa is not None
            got.append((len(out), snap.reqs[0].swa_evicted_seqlen,
                        snap.swa.swa.available_size()))  # fmt: skip
        assert got == steps, rules.swa_window_release


def test_the_radix_frontier_keeps_max_window_page_not_its_page_ceiling() -> None:
    """Radix cache, page 4, window 5, an 8-token prompt then nine decodes. 0.5.16 keeps
    ``max(5, 4)`` = 5 tokens (kvpool's frontier), from the second decode on: at 9 committed
    the cursor is floor_align(9 - 5, 4) = 4, at 13 it is 8. 0.5.23 keeps ceil_align(5, 4) = 8
    (cursor 4 only at 12 committed, 8 at 16)."""
    expected = {
        Rules(): [0, 4, 4, 4, 4, 8, 8, 8, 8],
        MAYBE_EVICT: [0, 4, 4, 4, 4, 8, 8, 8, 8],
        SCHEDULER_1: [0, 0, 0, 0, 4, 4, 4, 4, 8],
    }
    for rules, cursors in expected.items():
        mm = manager(rules, radix=True, page_size=4, window=5, ratio=0.5)
        mm.new_req("a", list(range(1, 9)))
        mm.extend(["a"])
        got = []
        for token in range(9, 18):
            mm.decode(["a"], [token])
            got.append(cursor(mm))
        assert got == cursors, rules.swa_window_release
        mm.finish(["a"])  # the release is kvpool's (cache_finished_req, free) for both
        check_all(mm.snapshot())


def test_a_restored_session_turn_does_not_slide_at_its_first_extend() -> None:
    """Chunk cache, page 1, window 2: turn 1 (6 tokens, two decodes) ends with cursor 5 under
    0.5.16's timing; turn 2 carries the row and the cursor. Its first extend holds no SGLang KV
    record yet (0.5.16 creates one at a request's first extend), so nothing slides there (0.5.23
    slides every request holding a row, at its prefix: cursor 8 - 2 = 6); its first decode
    does not slide either, its second does (11 committed: cursor 9)."""
    expected = {MAYBE_EVICT: [5, 5, 5, 9], SCHEDULER_1: [5, 6, 6, 9]}
    for rules, cursors in expected.items():
        mm = manager(rules)
        mm.open_session("s")
        mm.new_req("t1", [1, 2, 3, 4, 5, 6], session_id="s")
        mm.extend(["t1"])
        mm.decode(["t1"], [7])
        mm.decode(["t1"], [8])
        got = [cursor(mm, "t1")]
        mm.finish(["t1"])
        mm.new_req("t2", [9, 10], session_id="s")
        mm.extend(["t2"])
        got.append(cursor(mm, "t2"))
        for token in (11, 12):
            mm.decode(["t2"], [token])
            got.append(cursor(mm, "t2"))
        assert got == cursors, rules.swa_window_release
        mm.finish(["t2"])
        mm.close_session("s")
        snap = mm.snapshot()
        check_all(snap)
        assert snap.swa is not None and snap.swa.swa.available_size() == snap.swa.swa.size
