"""SGLang 0.5.23's window and release in kvpool's SWA lifecycle (``Rules.swa_window_release ==
"scheduler"``, set by ``Rules.for_sglang("0.5.23")``): worked examples of the window slide
rule, the row release and the eviction demand on both twins, and the reference and the twin in
lockstep under 0.5.23's rules (specs/swa.md, "SGLang 0.5.23's window")."""

from __future__ import annotations

import dataclasses
from typing import Any

import pytest
import torch

from kvpool.config import PoolConfig
from kvpool.errors import ConfigError, InvalidArgumentError, OutOfMemoryError
from kvpool.invariants import check_all
from kvpool.optimized.lifecycle.swa_memory_manager import SWAMemoryManager as TwinSWAMemoryManager
from kvpool.optimized.swa import lifecycle as twin_lifecycle
from kvpool.reference.lifecycle.swa_memory_manager import SWAMemoryManager
from kvpool.reference.swa import lifecycle as ref_lifecycle
from kvpool.rules import Rules
from kvpool.testing.campaign import run_machine
from kvpool.testing.implementations import optimized_implementation, reference_implementation

RULES = Rules.for_sglang("0.5.23")
MANAGERS = [SWAMemoryManager, TwinSWAMemoryManager]


class Recorder:
    """A segment allocator that records its calls as (method, slots, start_pos)."""

    def __init__(self) -> None:
        self.calls: list[tuple[str, list[int], int]] = []

    def _record(self, name: str, index: Any, start_pos: int) -> None:
        slots = index.tolist() if isinstance(index, torch.Tensor) else list(index)
        self.calls.append((name, slots, start_pos))

    def free_swa_segment(self, free_index: Any, start_pos: int = 0) -> None:
        self._record("swa", free_index, start_pos)

    def free_full_segment(self, free_index: Any, start_pos: int = 0) -> None:
        self._record("full", free_index, start_pos)

    def free_segment(self, free_index: Any, start_pos: int = 0) -> None:
        self._record("both", free_index, start_pos)


ROW = list(range(100, 116))


@pytest.mark.parametrize("twin", [False, True])
def test_the_window_slide_rule_worked_example(twin: bool) -> None:
    """Window 3, page 2, protected prefix 2, cursor 0, before token 13: the cursor first rises
    to the protected prefix; a radix cache keeps ceil_align(max(3, 2), 2) = 4 tokens (frontier
    floor_align(13 - 4, 2) = 8), the chunk cache keeps 3 (frontier floor_align(10, 2) = 10);
    the columns between go back SWA-side in one segment at the old cursor."""
    lib = twin_lifecycle if twin else ref_lifecycle
    row: Any = torch.tensor(ROW) if twin else ROW
    for sharing, frontier in ((True, 8), (False, 10)):
        alloc = Recorder()
        got = lib.slide_swa_window(row, 0, 13, 2, 3, 2, alloc, sharing)
        assert got == frontier
        assert alloc.calls == [("swa", ROW[2:frontier], 2)]
    # not yet more than a window past the cursor: nothing moves, nothing is freed
    alloc = Recorder()
    assert lib.slide_swa_window(row, 8, 11, 0, 3, 2, alloc, True) == 8
    assert alloc.calls == []
    # a frontier at the cursor: the cursor still rises to the protected prefix
    assert lib.slide_swa_window(row, 0, 6, 4, 1, 2, alloc, True) == 4
    assert alloc.calls == []
    with pytest.raises(InvalidArgumentError):
        lib.slide_swa_window(row, 0, 13, 3, 3, 2, alloc, True)


@pytest.mark.parametrize("twin", [False, True])
def test_a_row_segment_frees_its_window_dead_columns_full_side_only(twin: bool) -> None:
    """Columns [4, 12) with protected prefix 6 and cursor 8: [6, 8) full side only, then the
    live pieces [4, 6) and [8, 12), each at its first column."""
    lib = twin_lifecycle if twin else ref_lifecycle
    slots = list(range(200, 208))
    alloc = Recorder()
    lib.free_kv_row_segment(torch.tensor(slots) if twin else slots, 4, 8, 6, alloc)
    assert alloc.calls == [("full", [202, 203], 6), ("both", [200, 201], 4),
                           ("both", [204, 205, 206, 207], 8)]  # fmt: skip
    alloc = Recorder()  # a segment wholly past the cursor: one free
    lib.free_kv_row_segment(torch.tensor(slots) if twin else slots, 8, 8, 0, alloc)
    assert alloc.calls == [("both", slots, 8)]


def test_the_eviction_demand_follows_the_rules() -> None:
    demand = ref_lifecycle.swa_eviction_demand
    assert demand(Rules(), 32, 17, 2, 16) == 32  # kvpool: the new pages' tokens
    assert demand(RULES, 32, 17, 2, 16) == 17 + 2 * 16  # SGLang's paged over-estimate
    assert demand(RULES, 2, 0, 2, 16) == 32  # a paged decode: one page per request
    assert demand(RULES, 5, 5, 2, 1) == 5  # page size 1: the tokens themselves
    assert demand(RULES, 32, 0, 0, 16) == 32  # no batch (a direct eviction): no bound


@pytest.mark.parametrize("cls", MANAGERS)
def test_the_window_slides_from_the_second_decode_once_the_interval_is_due(cls: type) -> None:
    """Chunk cache, window 2, a 6-token prompt. kvpool's rule slides after every decode
    (cursor 4, 5, 6). 0.5.23 slides before a decode's allocation, from the request's second
    decode on (the first follows its prefill), once ``swa_eviction_interval`` tokens left the
    window: interval 1 gives 0, 5, 6; interval 6 waits for the third decode (0, 0, 6)."""
    expected = {(Rules(), None): [4, 5, 6], (RULES, 1): [0, 5, 6], (RULES, 6): [0, 0, 6]}
    for (rules, interval), cursors in expected.items():
        if interval is not None:
            rules = dataclasses.replace(rules, swa_eviction_interval=interval)
        mm = cls(PoolConfig(size=64, page_size=1, disable_radix_cache=True, sliding_window=2,
                            rules=rules))  # fmt: skip
        mm.new_req("a", [1, 2, 3, 4, 5, 6])
        mm.extend(["a"])
        got = []
        for token in (7, 8, 9):
            mm.decode(["a"], [token])
            snap = mm.snapshot()
            check_all(snap)
            got.append(snap.reqs[0].swa_evicted_seqlen)
        assert got == cursors, (rules.swa_window_release, interval)


@pytest.mark.parametrize("cls", MANAGERS)
def test_an_eagle_v2_step_slides_the_window_before_its_allocation(cls: type) -> None:
    """Chunk cache, page 1, window 2, interval 1, a 6-token prompt, three EAGLE v2 steps of
    reserve 1 (accepting 2, 1, then 0 tokens). 0.5.23 slides as a decode does
    (``eagle_prepare_for_decode`` calls ``maybe_evict_swa`` first): not at the first step after
    the prefill; at the second, at the 8 tokens committed before it (cursor 8 - 2 = 6), not at
    the 9 after it; at the third, to 7. kvpool's rule slides nothing in a spec step. Each step
    allocates the reserve (up to committed + 2) in both pools; the slid columns go back
    SWA-side only."""
    expected = {
        Rules(): [(2, 0, 43), (2, 0, 41), (1, 0, 40)],
        # (slots allocated, cursor, free SWA slots): 43 + 6 slid - 2 = 47, + 1 slid - 1 = 47
        dataclasses.replace(RULES, swa_eviction_interval=1): [(2, 0, 43), (2, 6, 47),
                                                              (1, 7, 47)],
    }  # fmt: skip
    for rules, steps in expected.items():
        mm = cls(PoolConfig(size=64, page_size=1, disable_radix_cache=True, sliding_window=2,
                            rules=rules))  # fmt: skip
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
        assert snap.reqs[0].kv_committed_len == 9
        assert got == steps, rules.swa_window_release


@pytest.mark.parametrize("cls", MANAGERS)
def test_a_refused_eagle_v2_step_slides_no_window(cls: type) -> None:
    """Capacity is checked before the slide: with 1 free SWA slot, a step that needs 2 raises
    OutOfMemoryError and changes nothing, although its due slide would have freed 6. A step
    that grows nothing (reserve 0) still slides; the next one then fits."""
    rules = dataclasses.replace(RULES, swa_eviction_interval=1)
    mm = cls(PoolConfig(size=12, page_size=1, disable_radix_cache=True, sliding_window=2,
                        rules=rules))  # fmt: skip
    mm.new_req("a", [1, 2, 3, 4, 5, 6])
    mm.extend(["a"])
    mm.spec_step(["a"], [[7, 8]], 1)
    before = mm.snapshot()
    assert before.swa is not None and before.swa.swa.available_size() == 1
    with pytest.raises(OutOfMemoryError):
        mm.spec_step(["a"], [[9]], 1)
    assert mm.snapshot() == before
    assert len(mm.spec_step(["a"], [[]], 0)) == 0
    snap = mm.snapshot()
    assert snap.reqs[0].swa_evicted_seqlen == 6
    assert snap.swa is not None and snap.swa.swa.available_size() == 7
    mm.spec_step(["a"], [[9]], 1)
    check_all(mm.snapshot())


@pytest.mark.parametrize("cls", MANAGERS)
def test_a_finish_on_the_unified_tree_checkpoints_and_frees_dead_columns_full_side(
    cls: type,
) -> None:
    """Radix cache (0.5.23: the unified FULL+SWA tree), page 2, window 2, interval 1: after
    four decodes the cursor is 6; the finish checkpoints the 10 committed tokens: the first 6
    become a tombstone node, the rest keeps SWA slots, its leaf capped at a window (one page)
    with the older page split off above it."""
    rules = dataclasses.replace(RULES, swa_eviction_interval=1)
    mm = cls(PoolConfig(size=32, page_size=2, disable_radix_cache=False, sliding_window=2,
                        swa_full_tokens_ratio=0.5, rules=rules))  # fmt: skip
    mm.new_req("a", [1, 2, 3, 4, 5, 6])
    mm.extend(["a"])
    for token in (7, 8, 9, 10):
        mm.decode(["a"], [token])
    snap = mm.snapshot()
    assert snap.reqs[0].swa_evicted_seqlen == 6
    check_all(snap)
    mm.finish(["a"])
    snap = mm.snapshot()
    check_all(snap)
    assert [(n.key, n.swa_tombstone) for n in snap.tree.nodes[1:]] == [
        ((1, 2, 3, 4, 5, 6), True),
        ((7, 8), False),
        ((9, 10), False),
    ]
    assert snap.swa is not None and snap.tree.swa_evictable_size == 4


def test_the_rules_knobs_are_checked() -> None:
    assert (RULES.swa_window_release, RULES.swa_eviction_interval) == ("scheduler", 128)
    assert (Rules().swa_window_release, Rules().swa_eviction_interval) == ("decode", 1)
    for bad in ({"swa_window_release": "never"}, {"swa_eviction_interval": 0},
                {"swa_eviction_interval": True}):  # fmt: skip
        with pytest.raises(ConfigError):
            Rules(**bad)


@pytest.mark.slow
def test_reference_and_twin_agree_under_the_0_5_23_rules() -> None:
    twin = dataclasses.replace(optimized_implementation("torch", checked=True), rules=RULES)
    result = run_machine("swa_manager", reference_implementation(), twin, 1e9, seed=23,
                         steps_per_run=60, max_runs=30)  # fmt: skip
    assert result.failure is None, result.failure and result.failure.report
    assert result.steps >= 30 * 40
    for tag in (
        "decode:window-slid",
        "radix:tombstoned",
        "session:restore",
        "extend:chunked",
        "spec_step:ok",
        "spec_step:window-slid",
    ):
        assert result.coverage.get(tag), (tag, dict(result.coverage))
