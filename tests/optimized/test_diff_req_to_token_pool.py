"""Differential test: the reference ReqToTokenPool and the optimized twin (checked mode) in
lockstep. Each request exists twice (one copy per side); rows, errors, table contents and
snapshots must agree after every step."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import pytest
import torch
from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, precondition, rule

from kvpool import reference as ref
from kvpool.errors import ContextOverflowError
from kvpool.optimized.options import TwinOptions
from kvpool.optimized.pools import req_to_token_pool as opt
from kvpool.rules import GENERATION_ON_CLEAR, ROW_ORDERS, Rules
from tests.optimized.test_diff_allocators import same_outcome

CHECKED = TwinOptions.make(checked=True)


@dataclass
class Req:
    req_pool_idx: int | None = None
    is_chunked: int = 0
    kv_committed_len: int = 0


@dataclass
class Pair:
    """One request, seen by each side; ``tokens`` is what its row should hold."""

    ref: Req
    twin: Req
    tokens: list[int]

    def set(self, **fields: Any) -> None:
        for name, value in fields.items():
            setattr(self.ref, name, value)
            setattr(self.twin, name, value)


class ReqToTokenLockstep(RuleBasedStateMachine):
    def __init__(self) -> None:
        super().__init__()
        self.ref = ref.ReqToTokenPool(1, 1)
        self.twin = opt.ReqToTokenPool(1, 1, options=CHECKED)
        self.holders: list[Pair] = []

    @initialize(
        size=st.integers(1, 4),
        width=st.integers(1, 8),
        row_order=st.sampled_from(ROW_ORDERS),
        generation=st.sampled_from(GENERATION_ON_CLEAR),
    )
    def setup(self, size: int, width: int, row_order: str, generation: str) -> None:
        rules = Rules(row_order=row_order, generation_on_clear=generation)
        self.ref = ref.ReqToTokenPool(size, width, rules=rules)
        self.twin = opt.ReqToTokenPool(size, width, options=CHECKED, rules=rules)

    def snapshots(self) -> tuple[Any, Any]:
        rows = [(p.ref.req_pool_idx, len(p.tokens)) for p in self.holders if p.ref.req_pool_idx]
        return (lambda: self.ref.snapshot(rows)), (lambda: self.twin.snapshot(rows))

    def run(self, ref_call: Any, twin_call: Any, expect_error: bool = False) -> Any:
        ref_snap, twin_snap = self.snapshots()
        return same_outcome(ref_call, twin_call, ref_snap, twin_snap, expect_error, torch.int32)

    @rule(data=st.data(), new=st.integers(0, 3))
    def alloc(self, data: st.DataObject, new: int) -> None:
        kept = [p for p in self.holders if not data.draw(st.booleans())]
        for p in kept:  # legal reuse: chunked, or committed KV
            p.set(is_chunked=1) if data.draw(st.booleans()) else p.set(kv_committed_len=1)
        batch = kept + [Pair(Req(), Req(), []) for _ in range(new)]
        rows = self.run(
            lambda: self.ref.alloc([p.ref for p in batch]),
            lambda: self.twin.alloc([p.twin for p in batch]),
        )
        assert [p.ref.req_pool_idx for p in batch] == [p.twin.req_pool_idx for p in batch]
        if rows is not None:
            self.holders.extend(batch[len(kept) :])

    @rule(data=st.data(), kind=st.sampled_from(("not_chunked", "free_row", "shared", "row0")))
    def illegal_alloc(self, data: st.DataObject, kind: str) -> None:
        """Reuse without being chunked, keeping a free row, two requests naming one row, row 0."""
        free = self.ref.free_slots
        if kind == "not_chunked" and self.holders:
            pair = data.draw(st.sampled_from(self.holders))
            pair.set(is_chunked=0, kv_committed_len=0)
            batch = [pair]
        elif kind == "free_row" and free:
            batch = [Pair(Req(data.draw(st.sampled_from(free)), 1), Req(), [])]
            batch[0].twin.req_pool_idx, batch[0].twin.is_chunked = batch[0].ref.req_pool_idx, 1
        elif kind == "shared" and self.holders:
            pair = data.draw(st.sampled_from(self.holders))
            pair.set(is_chunked=1)
            batch = [pair, pair]
        elif kind == "row0":
            batch = [Pair(Req(0, 1), Req(0, 1), [])]
        else:
            return
        self.run(
            lambda: self.ref.alloc([p.ref for p in batch]),
            lambda: self.twin.alloc([p.twin for p in batch]),
            expect_error=True,
        )

    @precondition(lambda self: bool(self.holders))
    @rule(data=st.data(), twice=st.booleans())
    def free(self, data: st.DataObject, twice: bool) -> None:
        pair = self.holders.pop(data.draw(st.integers(0, len(self.holders) - 1)))
        row = pair.ref.req_pool_idx
        self.run(lambda: self.ref.free(pair.ref), lambda: self.twin.free(pair.twin))
        assert pair.ref.req_pool_idx is None and pair.twin.req_pool_idx is None
        if twice:  # the same row again: a double free; then no row at all
            pair.set(req_pool_idx=row)
            self.run(
                lambda: self.ref.free(pair.ref),
                lambda: self.twin.free(pair.twin),
                expect_error=True,
            )
            pair.set(req_pool_idx=None)
            self.run(
                lambda: self.ref.free(pair.ref),
                lambda: self.twin.free(pair.twin),
                expect_error=True,
            )

    @precondition(lambda self: bool(self.holders))
    @rule(data=st.data())
    def write(self, data: st.DataObject) -> None:
        pair = data.draw(st.sampled_from(self.holders))
        row = pair.ref.req_pool_idx
        assert row is not None
        width = self.ref.max_context_len
        start = data.draw(st.integers(0, min(len(pair.tokens), width)))
        stop = data.draw(st.integers(start, width))
        values = data.draw(
            st.lists(st.integers(1, 999), min_size=stop - start, max_size=stop - start)
        )
        as_list: bool = data.draw(st.booleans())
        twin_values: Any = values if as_list else torch.tensor(values, dtype=torch.int64)
        self.run(
            lambda: self.ref.write((row, slice(start, stop)), values),
            lambda: self.twin.write((row, slice(start, stop)), twin_values),
        )
        pair.tokens[start:stop] = values
        assert self.twin.read(row, 0, len(pair.tokens)).dtype == torch.int32

    @rule(data=st.data(), kind=st.sampled_from(("overflow", "row0", "past", "length", "step")))
    def bad_write(self, data: st.DataObject, kind: str) -> None:
        width = self.ref.max_context_len
        # a held row, so that only ``kind`` is wrong (a free row is refused on its own)
        held = [p.ref.req_pool_idx for p in self.holders if p.ref.req_pool_idx is not None]
        row, cols, values = (held[0] if held else 1), slice(0, 1), [5]
        if kind == "overflow":
            cols, values = slice(width - 1, width + 1), [5, 6]
        elif kind == "row0":
            row = 0
        elif kind == "past":
            row = self.ref.size + data.draw(st.integers(1, 3))
        elif kind == "length":
            values = [5, 6]
        else:
            cols = slice(0, 1, 2)
        self.run(
            lambda: self.ref.write((row, cols), values),
            lambda: self.twin.write((row, cols), torch.tensor(values)),
            expect_error=True,
        )
        self.run(
            lambda: self.ref.read(row, cols.start, cols.stop),
            lambda: self.twin.read(row, cols.start, cols.stop),
            expect_error=kind in ("overflow", "row0", "past") or not held,
        )

    @rule(now=st.integers(0, 3))
    def clear(self, now: int) -> None:
        if now != 3:  # rarely
            return
        self.run(self.ref.clear, self.twin.clear)
        self.holders = []

    @rule()
    def sizes_agree(self) -> None:
        assert self.ref.available_size() == self.twin.available_size()
        assert self.ref.req_generation == self.twin.req_generation


TestReqToTokenLockstep = ReqToTokenLockstep.TestCase
TestReqToTokenLockstep = pytest.mark.slow(TestReqToTokenLockstep)
TestReqToTokenLockstep.settings = settings(max_examples=2 * settings().max_examples)


def test_rows_are_lifo_and_generations_monotonic() -> None:
    pool = opt.ReqToTokenPool(3, 4, options=CHECKED)
    a, b = Req(), Req()
    assert pool.alloc([a, b]) == [2, 3]  # the tail block of [1, 2, 3], in list order
    pool.free(a)
    c = Req()
    assert pool.alloc([c]) == [2]  # the row freed last comes back first
    assert pool.req_generation == [0, 0, 2, 1]
    pool.clear()
    assert pool.free_slots == [1, 2, 3] and pool.req_generation == [0, 0, 2, 1]
    assert pool.req_to_token.dtype == torch.int32 and pool.req_to_token.shape == (4, 4)
    rows = pool.alloc([Req()])  # a held row: only the columns are wrong
    assert rows is not None
    try:
        pool.write((rows[0], slice(3, 5)), [1, 2])
    except ContextOverflowError:
        pass
    else:
        raise AssertionError("a write past max_context_len was accepted")


def test_row_order_and_generation_rules_agree_in_both_twins() -> None:
    """SGLang 0.5.16 (fifo, generations zeroed by clear) and the default (lifo, kept), with the
    very same calls on each twin."""
    for rules, first, reused, after_clear in (
        (Rules(row_order="fifo", generation_on_clear="reset"), [1, 2], [3], [0, 0, 0, 0]),
        (Rules(), [2, 3], [2], [0, 0, 2, 1]),
    ):
        for pool in (ref.ReqToTokenPool(3, 2, rules=rules), opt.ReqToTokenPool(3, 2, rules=rules)):
            a, b = Req(), Req()
            assert pool.alloc([a, b]) == first
            pool.free(a)
            assert pool.alloc([Req()]) == reused
            pool.clear()
            assert pool.free_slots == [1, 2, 3] and pool.req_generation == after_clear
