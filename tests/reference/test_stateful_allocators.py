"""Hypothesis state machines over the reference allocators and the request table.

Small pools (OOM is reached often), page sizes from SUPPORTED_PAGE_SIZES_TESTED, need_sort on and
off. A simple model keeps which pages / rows are held; every registered invariant runs after
every step against it, and each allocation is checked against the free list it started from.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import pytest
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, precondition, rule

from kvpool.constants import NO_LAST_LOC, SUPPORTED_PAGE_SIZES_TESTED
from kvpool.errors import DoubleFreeError, RowReuseError
from kvpool.invariants import check_allocator, check_req_to_token
from kvpool.invariants.req_to_token import contiguity_violations
from kvpool.reference import (
    BaseTokenToKVPoolAllocator,
    PagedTokenToKVPoolAllocator,
    ReqToTokenPool,
    TokenToKVPoolAllocator,
)
from kvpool.snapshot import AllocatorSnapshot, ReqToTokenSnapshot


def expected_pages(before: AllocatorSnapshot, num_pages: int, merge_test: bool) -> list[int]:
    """The pages an allocation of ``num_pages`` must take, given the free lists before it and
    SGLang's merge pre-test (``need_sort`` merges when it holds and release pages exist)."""
    free = list(before.free_pages)
    if merge_test and before.need_sort and before.release_pages:
        free = sorted(free + list(before.release_pages))
    return free[:num_pages]


class AllocatorMachine(RuleBasedStateMachine):
    def __init__(self) -> None:
        super().__init__()
        self.ps = 1
        self.alloc: BaseTokenToKVPoolAllocator = TokenToKVPoolAllocator(1)
        self.blobs: list[list[int]] = []  # raw alloc() results
        self.seqs: list[list[int]] = []  # token slots of each sequence, by position
        self.in_group = False

    @initialize(
        ps=st.sampled_from(SUPPORTED_PAGE_SIZES_TESTED),
        num_pages=st.integers(1, 6),
        need_sort=st.booleans(),
    )
    def setup(self, ps: int, num_pages: int, need_sort: bool) -> None:
        self.ps = ps
        self.alloc = (
            TokenToKVPoolAllocator(num_pages, need_sort)
            if ps == 1
            else PagedTokenToKVPoolAllocator(num_pages * ps, ps, need_sort)
        )

    def held(self) -> set[int]:
        return {s // self.ps for part in self.blobs + self.seqs for s in part}

    def check_taken(self, before: AllocatorSnapshot, new_pages: list[int], test: bool) -> None:
        assert new_pages == expected_pages(before, len(new_pages), test)

    @rule(pages=st.integers(0, 4))
    def alloc_pages(self, pages: int) -> None:
        before = self.alloc.snapshot()
        got = self.alloc.alloc(pages * self.ps)
        if got is None:
            assert pages > len(before.free_pages) + len(before.release_pages)
            assert self.alloc.snapshot() == before
            return
        taken = got[:: self.ps]
        self.check_taken(before, [s // self.ps for s in taken], pages > len(before.free_pages))
        assert got == [p + k for p in taken for k in range(self.ps)]
        if got:
            self.blobs.append(got)

    @precondition(lambda self: bool(self.blobs))
    @rule(data=st.data(), duplicate=st.booleans())
    def free_blob(self, data: st.DataObject, duplicate: bool) -> None:
        blob = self.blobs.pop(data.draw(st.integers(0, len(self.blobs) - 1)))
        if duplicate and self.ps > 1:
            blob = blob + blob[:1]  # a page named twice: freed once
        self.alloc.free(blob)

    @precondition(lambda self: bool(self.seqs))
    @rule(data=st.data())
    def finish_seq(self, data: st.DataObject) -> None:
        self.alloc.free(self.seqs.pop(data.draw(st.integers(0, len(self.seqs) - 1))))

    @rule(data=st.data(), new=st.integers(0, 2))
    def extend(self, data: st.DataObject, new: int) -> None:
        olds = [i for i in range(len(self.seqs)) if data.draw(st.booleans())]
        batch = [self.seqs[i] for i in olds] + [[] for _ in range(new)]
        grow = [data.draw(st.integers(1, 2 * self.ps + 1)) for _ in batch]
        prefix = [len(s) for s in batch]
        seq = [p + g for p, g in zip(prefix, grow, strict=True)]
        last = [s[-1] if s else NO_LAST_LOC for s in batch]
        before = self.alloc.snapshot()
        out = self.alloc.alloc_extend(prefix, prefix, seq, seq, last, sum(grow))
        if out is None:
            assert self.alloc.snapshot() == before
            return
        assert len(out) == sum(grow) and len(set(out)) == len(out)
        # SGLang's pre-test: page size 1 as alloc(n), paged the bound ext // ps + bs + 1.
        bound = sum(grow) if self.ps == 1 else sum(grow) // self.ps + len(batch) + 1
        merged = before.need_sort and bound > len(before.free_pages) and before.release_pages
        after = self.alloc.snapshot()
        assert after.release_pages == (() if merged else before.release_pages)
        assert not {s // self.ps for s in out} & (self.held() - {x // self.ps for x in last})
        cursor = 0
        for slots, g in zip(batch, grow, strict=True):
            slots.extend(out[cursor : cursor + g])
            cursor += g
        self.seqs.extend(batch[len(olds) :])

    @precondition(lambda self: bool(self.seqs))
    @rule(data=st.data())
    def decode(self, data: st.DataObject) -> None:
        batch = [s for s in self.seqs if data.draw(st.booleans())]
        seq = [len(s) + 1 for s in batch]
        last = [s[-1] for s in batch]
        before = self.alloc.snapshot()
        out = self.alloc.alloc_decode(seq, seq, last)
        if out is None:
            assert self.alloc.snapshot() == before
            return
        opened = [o // self.ps for o, s in zip(out, seq, strict=True) if (s - 1) % self.ps == 0]
        self.check_taken(before, opened, len(batch) > len(before.free_pages))
        for slots, o in zip(batch, out, strict=True):
            assert o == slots[-1] + 1 or (len(slots)) % self.ps == 0
            slots.append(o)

    @precondition(lambda self: bool(self.blobs or self.seqs))
    @rule(data=st.data())
    def free_group(self, data: st.DataObject) -> None:
        before = self.alloc.snapshot()
        self.alloc.free_group_begin()
        freed: list[int] = []
        for _ in range(data.draw(st.integers(1, 3))):
            use_blob = bool(self.blobs) and data.draw(st.booleans())
            pool = self.blobs if use_blob else self.seqs
            pool = pool or self.blobs
            if not pool:
                break
            part = pool.pop(data.draw(st.integers(0, len(pool) - 1)))
            self.alloc.free(part)
            freed.extend(part)
            if self.ps > 1 and part:
                self.alloc.free(part[:1])  # legal: the group frees the page once
        assert self.alloc.snapshot().free_pages == before.free_pages  # only buffered
        self.alloc.free_group_end()
        pages = sorted({s // self.ps for s in freed})
        after = self.alloc.snapshot()
        assert after.available_size() == before.available_size() + len(pages) * self.ps

    @rule(pages=st.integers(1, 3))
    def borrow(self, pages: int) -> None:
        before = self.alloc.snapshot()
        state = self.alloc.backup_state()
        self.alloc.alloc(pages * self.ps)
        self.alloc.restore_state(state)
        assert self.alloc.snapshot() == before

    @rule()
    def merge(self) -> None:
        before = self.alloc.snapshot()
        self.alloc.merge_and_sort_free()
        if before.release_pages:
            assert self.alloc.free_pages == sorted(before.free_pages + before.release_pages)
        else:  # nothing to merge: free_pages keeps its order (SGLang)
            assert tuple(self.alloc.free_pages) == before.free_pages

    @rule()
    def clear(self) -> None:
        self.alloc.clear()
        self.blobs, self.seqs = [], []

    @rule(data=st.data())
    def double_free_is_refused(self, data: st.DataObject) -> None:
        snap = self.alloc.snapshot()
        free = list(snap.free_pages + snap.release_pages)
        if not free:
            return
        page = data.draw(st.sampled_from(free))
        try:
            self.alloc.free([page * self.ps])
        except DoubleFreeError as err:
            assert err.indices == (page,)
        else:
            raise AssertionError("double free accepted")
        assert self.alloc.snapshot() == snap

    @invariant()
    def invariants_hold(self) -> None:
        check_allocator(self.alloc.snapshot(), self.held())
        for slots in self.seqs:
            assert contiguity_violations(slots, self.ps) == []


@dataclass
class Req:
    req_pool_idx: int | None = None
    is_chunked: int = 0
    kv_committed_len: int = 0
    tokens: list[int] = field(default_factory=list)


class ReqToTokenMachine(RuleBasedStateMachine):
    def __init__(self) -> None:
        super().__init__()
        self.pool = ReqToTokenPool(1, 1)
        self.holders: list[Req] = []
        self.previous: ReqToTokenSnapshot | None = None

    @initialize(size=st.integers(1, 4), width=st.integers(1, 8))
    def setup(self, size: int, width: int) -> None:
        self.pool = ReqToTokenPool(size, width)

    @rule(data=st.data(), new=st.integers(0, 3))
    def alloc(self, data: st.DataObject, new: int) -> None:
        kept = [r for r in self.holders if data.draw(st.booleans())]
        for r in kept:
            r.is_chunked = 1
        batch = kept + [Req() for _ in range(new)]
        before = self.pool.snapshot()
        rows = self.pool.alloc(batch)
        if rows is None:
            assert new > len(before.free_slots)
            assert self.pool.snapshot() == before
            return
        # Default rules (lifo): the last ``new`` free rows, as one block in list order.
        expected_fresh = list(before.free_slots)[len(before.free_slots) - new :]
        assert rows == [r.req_pool_idx for r in kept] + expected_fresh
        for row in expected_fresh:
            assert self.pool.req_generation[row] == before.req_generation[row] + 1
        self.holders.extend(batch[len(kept) :])

    @precondition(lambda self: bool(self.holders))
    @rule(data=st.data())
    def free(self, data: st.DataObject) -> None:
        req = self.holders.pop(data.draw(st.integers(0, len(self.holders) - 1)))
        row = req.req_pool_idx
        self.pool.free(req)
        assert req.req_pool_idx is None
        assert self.pool.free_slots[-1] == row

    @precondition(lambda self: bool(self.holders))
    @rule(data=st.data())
    def write(self, data: st.DataObject) -> None:
        req = data.draw(st.sampled_from(self.holders))
        width = self.pool.max_context_len
        start = data.draw(st.integers(0, min(len(req.tokens), width)))
        stop = data.draw(st.integers(start, width))
        values = data.draw(
            st.lists(st.integers(1, 999), min_size=stop - start, max_size=stop - start)
        )
        assert req.req_pool_idx is not None
        self.pool.write((req.req_pool_idx, slice(start, stop)), values)
        req.tokens[start:stop] = values

    @precondition(lambda self: bool(self.holders))
    @rule(data=st.data())
    def illegal_reuse_is_refused(self, data: st.DataObject) -> None:
        req = data.draw(st.sampled_from(self.holders))
        req.is_chunked, req.kv_committed_len = 0, 0
        before = self.pool.snapshot()
        try:
            self.pool.alloc([req])
        except RowReuseError:
            pass
        else:
            raise AssertionError("illegal reuse accepted")
        assert self.pool.snapshot() == before

    @rule()
    def clear(self) -> None:
        self.pool.clear()
        self.holders = []

    @invariant()
    def invariants_hold(self) -> None:
        rows = [(r.req_pool_idx, len(r.tokens)) for r in self.holders if r.req_pool_idx]
        snap = self.pool.snapshot(rows)
        assert [list(c) for _, c in snap.rows] == [r.tokens for r in self.holders]
        check_req_to_token(snap, {row for row, _ in rows}, self.previous)
        self.previous = snap


TestAllocatorMachine = AllocatorMachine.TestCase
TestAllocatorMachine = pytest.mark.slow(TestAllocatorMachine)
TestReqToTokenMachine = ReqToTokenMachine.TestCase
TestReqToTokenMachine = pytest.mark.slow(TestReqToTokenMachine)
