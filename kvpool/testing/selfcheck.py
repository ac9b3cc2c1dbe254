"""Seeded self-check campaign of the reference slot table and allocators (``kvpool verify``).

One configuration is a fresh ``ReqToTokenPool`` plus a token allocator (page size 1) or paged
allocator, with or without ``need_sort``, driven by a seeded random sequence of operations: raw
``alloc``/``free``, batched ``alloc_extend``/``alloc_decode`` of sequences that own table rows,
free groups (with duplicate slots of one page), EAGLE-style borrow (backup / alloc / restore),
``merge_and_sort_free`` and deliberate misuse. A simple model tracks which pages and rows are
held; after every step every registered allocator and table invariant runs against it.
Pools are small so that allocations run out (OOM) often.
"""

from __future__ import annotations

import random
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from kvpool.constants import NO_LAST_LOC, RESERVED_INDEX, SUPPORTED_PAGE_SIZES_TESTED
from kvpool.errors import DoubleFreeError, KVPoolError, ReservedIndexError
from kvpool.invariants import check_req_to_token
from kvpool.invariants.allocator import check_allocator
from kvpool.reference.pools.allocator import BaseTokenToKVPoolAllocator
from kvpool.reference.pools.allocator_choice import allocator_for
from kvpool.reference.pools.req_to_token_pool import ReqToTokenPool
from kvpool.snapshot import ReqToTokenSnapshot


class SelfCheckFailure(AssertionError):
    """The reference disagreed with the campaign's model (a result, not an invariant, was wrong)."""


@dataclass
class _Req:
    """The three fields ``ReqToTokenPool.alloc`` reads (``kvpool.protocols.ReqLike``)."""

    req_pool_idx: int | None = None
    is_chunked: int = 0
    kv_committed_len: int = 0
    slots: list[int] = field(default_factory=list)  # slot of each token, by position


@dataclass
class SelfCheckReport:
    """What a campaign checked: configurations run, operations, invariant checks, failed
    allocations (OOM) seen, and misuse errors provoked and verified."""

    configurations: int = 0
    steps: int = 0
    invariant_checks: int = 0
    ooms: int = 0
    misuse_checked: int = 0
    page_sizes: tuple[int, ...] = ()


class _Campaign:
    """One configuration: pools, the model of held pages/rows, and the operations."""

    def __init__(self, page_size: int, need_sort: bool, rng: random.Random) -> None:
        self.rng, self.ps = rng, page_size
        num_pages = rng.randint(3, 12)
        self.alloc: BaseTokenToKVPoolAllocator = allocator_for(
            num_pages * page_size, page_size, need_sort
        )
        self.table = ReqToTokenPool(rng.randint(2, 6), max_context_len=page_size * 6)
        self.blobs: list[list[int]] = []
        self.seqs: list[_Req] = []
        self.previous: ReqToTokenSnapshot | None = None
        self.report = SelfCheckReport()

    # ------------------------------------------------------------ model and checks
    def held_pages(self) -> set[int]:
        slots = [s for blob in self.blobs for s in blob] + [s for q in self.seqs for s in q.slots]
        return {s // self.ps for s in slots}

    def check(self) -> None:
        self.report.invariant_checks += check_allocator(self.alloc.snapshot(), self.held_pages())
        rows = [(q.req_pool_idx, len(q.slots)) for q in self.seqs if q.req_pool_idx is not None]
        snap = self.table.snapshot(rows)
        for (row, contents), q in zip(snap.rows, self.seqs, strict=True):
            if list(contents) != q.slots:
                raise SelfCheckFailure(f"row {row} holds {list(contents)}, model {q.slots}")
        self.report.invariant_checks += check_req_to_token(
            snap, {row for row, _ in rows}, self.previous, self.ps
        )
        self.previous = snap

    def _fresh(self, slots: Sequence[int], before: set[int]) -> None:
        """Newly taken pages must not be held by anyone already."""
        reused = sorted({s // self.ps for s in slots} & before)
        if reused:
            raise SelfCheckFailure(f"allocation handed out held pages {reused}")

    def _unchanged_on_none(self, op: Callable[[], object]) -> object:
        before = self.alloc.snapshot()
        result = op()
        if result is None:
            self.report.ooms += 1
            if self.alloc.snapshot() != before:
                raise SelfCheckFailure("a failed allocation changed the allocator")
        return result

    # ------------------------------------------------------------ operations
    def op_alloc(self) -> None:
        held = self.held_pages()
        got = self._unchanged_on_none(lambda: self.alloc.alloc(self.ps * self.rng.randint(0, 4)))
        if isinstance(got, list) and got:
            self._fresh(got, held)
            self.blobs.append(got)

    def _free_blob(self) -> None:
        blob = self.blobs.pop(self.rng.randrange(len(self.blobs)))
        self.alloc.free(blob)

    def _finish_seq(self) -> None:
        q = self.seqs.pop(self.rng.randrange(len(self.seqs)))
        self.alloc.free(q.slots)
        self.table.free(q)

    def op_free(self) -> None:
        if self.blobs:
            self._free_blob()

    def op_finish(self) -> None:
        if self.seqs:
            self._finish_seq()

    def op_group(self) -> None:
        self.alloc.free_group_begin()
        for _ in range(self.rng.randint(1, 3)):
            if self.seqs and self.rng.random() < 0.5:
                self._finish_seq()
            elif self.blobs:
                blob = self.blobs.pop(self.rng.randrange(len(self.blobs)))
                if self.ps > 1:  # name one page twice: the group frees it once
                    self.alloc.free(blob[:1])
                self.alloc.free(blob)
        self.alloc.free_group_end()

    def op_extend(self) -> None:
        batch = [q for q in self.seqs if self.rng.random() < 0.5]
        batch += [_Req() for _ in range(self.rng.randint(0, 2))]
        limit = self.table.max_context_len
        grow = [min(self.rng.randint(1, 2 * self.ps + 1), limit - len(q.slots)) for q in batch]
        batch = [q for q, g in zip(batch, grow, strict=True) if g > 0]
        grow = [g for g in grow if g > 0]
        for q in batch:
            q.kv_committed_len = len(q.slots)
        rows = self.table.alloc(batch)
        if rows is None:
            self.report.ooms += 1
            return
        prefix = [len(q.slots) for q in batch]
        seq = [p + g for p, g in zip(prefix, grow, strict=True)]
        last = [q.slots[-1] if q.slots else NO_LAST_LOC for q in batch]
        held = self.held_pages()
        out = self._unchanged_on_none(
            lambda: self.alloc.alloc_extend(prefix, prefix, seq, seq, last, sum(grow))
        )
        new = [q for q in batch if not q.slots]
        if not isinstance(out, list):
            for q in new:  # roll back the rows of requests that got no slots
                self.table.free(q)
            return
        self._fresh([s for s in out if s // self.ps not in {x // self.ps for x in last}], held)
        cursor = 0
        for q, p, s in zip(batch, prefix, seq, strict=True):
            q.slots.extend(out[cursor : cursor + s - p])
            cursor += s - p
            assert q.req_pool_idx is not None
            self.table.write((q.req_pool_idx, slice(p, s)), q.slots[p:s])
        self.seqs.extend(new)

    def op_decode(self) -> None:
        batch = [q for q in self.seqs if len(q.slots) < self.table.max_context_len]
        batch = [q for q in batch if self.rng.random() < 0.6]
        seq = [len(q.slots) + 1 for q in batch]
        last = [q.slots[-1] for q in batch]
        out = self._unchanged_on_none(lambda: self.alloc.alloc_decode(seq, seq, last))
        if not isinstance(out, list):
            return
        for q, slot in zip(batch, out, strict=True):
            q.slots.append(slot)
            assert q.req_pool_idx is not None
            self.table.write((q.req_pool_idx, slice(len(q.slots) - 1, len(q.slots))), [slot])

    def op_borrow(self) -> None:
        before = self.alloc.snapshot()
        state = self.alloc.backup_state()
        self.alloc.alloc(self.ps * self.rng.randint(1, 3))
        self.alloc.restore_state(state)
        if self.alloc.snapshot() != before:
            raise SelfCheckFailure("backup_state/restore_state did not restore the free lists")

    def op_merge(self) -> None:
        self.alloc.merge_and_sort_free()

    def op_misuse(self) -> None:
        """A double free and a free of the reserved page must raise and change nothing."""
        before = self.alloc.snapshot()
        free_now = list(before.free_pages) + list(before.release_pages)
        attempts: list[tuple[list[int], type[KVPoolError]]] = [
            ([RESERVED_INDEX], ReservedIndexError)
        ]
        if free_now:
            attempts.append(([self.rng.choice(free_now) * self.ps], DoubleFreeError))
        for slots, expected in attempts:
            try:
                self.alloc.free(slots)
            except expected:
                self.report.misuse_checked += 1
            else:
                raise SelfCheckFailure(f"free({slots}) did not raise {expected.__name__}")
            if self.alloc.snapshot() != before:
                raise SelfCheckFailure(f"free({slots}) raised but changed the allocator")

    def step(self) -> str:
        ops: list[tuple[str, Callable[[], None], int]] = [
            ("alloc", self.op_alloc, 3),
            ("free", self.op_free, 2),
            ("extend", self.op_extend, 4),
            ("decode", self.op_decode, 4),
            ("finish", self.op_finish, 2),
            ("group", self.op_group, 2),
            ("borrow", self.op_borrow, 1),
            ("merge", self.op_merge, 1),
            ("misuse", self.op_misuse, 1),
        ]
        name, fn, _ = self.rng.choices(ops, weights=[w for _, _, w in ops])[0]
        fn()
        self.report.steps += 1
        return name


def run_configuration(page_size: int, need_sort: bool, seed: int, steps: int) -> SelfCheckReport:
    """Run one configuration for ``steps`` operations; raises on the first violation, with the
    configuration, step number and operation in the message."""
    camp = _Campaign(page_size, need_sort, random.Random(seed))
    camp.check()
    for i in range(steps):
        name = "?"
        try:
            name = camp.step()
            camp.check()
        except AssertionError as exc:  # InvariantViolation or SelfCheckFailure
            where = f"page_size={page_size} need_sort={need_sort} seed={seed} step={i} op={name}"
            raise SelfCheckFailure(f"{where}: {exc}") from exc
    camp.report.configurations = 1
    camp.report.page_sizes = (page_size,)
    return camp.report


def run_campaign(
    seconds: float,
    seed: int = 0,
    page_sizes: Sequence[int] = SUPPORTED_PAGE_SIZES_TESTED,
    steps_per_config: int = 200,
    max_configs: int | None = None,
) -> SelfCheckReport:
    """Cycle configurations (each page size, with and without ``need_sort``) until ``seconds``
    have passed or ``max_configs`` ran, at least one per page size. Seeded: configuration ``k``
    uses seed ``seed * 1_000_003 + k``."""
    total = SelfCheckReport(page_sizes=tuple(page_sizes))
    deadline = time.monotonic() + seconds
    k = 0
    while True:
        ps = page_sizes[k % len(page_sizes)]
        need_sort = (k // len(page_sizes)) % 2 == 1
        rep = run_configuration(ps, need_sort, seed * 1_000_003 + k, steps_per_config)
        total.configurations += 1
        total.steps += rep.steps
        total.invariant_checks += rep.invariant_checks
        total.ooms += rep.ooms
        total.misuse_checked += rep.misuse_checked
        k += 1
        if max_configs is not None and k >= max_configs:
            break
        if k >= len(page_sizes) and time.monotonic() >= deadline:
            break
    return total


__all__ = ["SelfCheckFailure", "SelfCheckReport", "run_campaign", "run_configuration"]
