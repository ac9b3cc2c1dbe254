"""Differential test: the reference slot allocators and the optimized twin (checked mode), driven
in lockstep by one hypothesis state machine.

Page sizes 1, 2, 4, 16, 64; need_sort on and off; pools of 1-6 pages so that OOM is frequent.
Every call runs on both: results must be equal element by element (the twin returns int64
tensors), invalid calls must raise the same error type on both and change neither, and the two
snapshots must be equal after every step.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, precondition, rule

from kvpool import reference as ref
from kvpool.constants import NO_LAST_LOC, SUPPORTED_PAGE_SIZES_TESTED
from kvpool.errors import KVPoolError
from kvpool.optimized.options import TwinOptions
from kvpool.optimized.pools import allocator as opt_allocator
from kvpool.optimized.pools import paged_allocator as opt_paged
from kvpool.optimized.pools import token_allocator as opt_token
from kvpool.optimized.pools.paged_ops import decode_new_pages_host, extend_new_pages_host
from kvpool.reference.pools import paged_ops as ref_ops
from kvpool.rules import RELEASE_ORDERS, UNALIGNED_ALLOC, Rules

CHECKED = TwinOptions.make(checked=True)


# --------------------------------------------------------------------------- lockstep helpers
def plain(value: Any) -> Any:
    """A twin result in the reference's terms (tensors become lists)."""
    if isinstance(value, torch.Tensor):
        return value.tolist()
    return value


def outcome(call: Callable[[], Any]) -> tuple[Any, type[BaseException] | None]:
    """``(result, None)``, or ``(None, error type)`` for a kvpool error."""
    try:
        return call(), None
    except KVPoolError as err:
        return None, type(err)


def same_outcome(
    ref_call: Callable[[], Any],
    twin_call: Callable[[], Any],
    ref_snapshot: Callable[[], Any],
    twin_snapshot: Callable[[], Any],
    expect_error: bool = False,
    dtype: torch.dtype = torch.int64,
) -> Any:
    """Run both calls: equal results (an index tensor must have ``dtype``) or the same error
    type with both states unchanged; equal snapshots afterwards. Returns the reference's result."""
    ref_before, twin_before = ref_snapshot(), twin_snapshot()
    assert ref_before == twin_before
    ref_result, ref_error = outcome(ref_call)
    twin_result, twin_error = outcome(twin_call)
    assert ref_error == twin_error, f"reference raised {ref_error}, twin raised {twin_error}"
    if expect_error:
        assert ref_error is not None, "an invalid call was accepted"
    if ref_error is not None:
        assert ref_snapshot() == ref_before
        assert twin_snapshot() == twin_before
        return None
    if isinstance(twin_result, torch.Tensor):
        assert twin_result.dtype == dtype
    assert plain(twin_result) == ref_result, f"twin {plain(twin_result)} != ref {ref_result}"
    assert ref_snapshot() == twin_snapshot()
    return ref_result


def some(data: st.DataObject, items: list[list[int]]) -> list[list[int]]:
    """A drawn sub-list of ``items`` (same order)."""
    # Hypothesis favours False: negate it so that most items are taken.
    keep: list[bool] = [not data.draw(st.booleans()) for _ in items]
    return [item for item, k in zip(items, keep, strict=True) if k]


def as_host(values: list[int], as_tensor: bool) -> Any:
    """A host copy of lengths, as a CPU tensor or a plain list (the twin accepts both)."""
    return torch.tensor(values, dtype=torch.int64) if as_tensor else list(values)


INVALID_EXTEND = (
    "num_tokens",
    "host_copy",
    "prefix_past_seq",
    "misaligned",
    "no_last_loc",
    "free_page",
    "past_pool",
)


class AllocatorLockstep(RuleBasedStateMachine):
    """Reference and twin allocators side by side; ``blobs`` are ``alloc`` results still held,
    ``seqs`` the slots of growing sequences (extend / decode)."""

    def __init__(self) -> None:
        super().__init__()
        self.ps = 1
        self.ref: ref.BaseTokenToKVPoolAllocator = ref.TokenToKVPoolAllocator(1)
        self.twin: opt_allocator.BaseTokenToKVPoolAllocator = opt_token.TokenToKVPoolAllocator(
            1, options=CHECKED
        )
        self.blobs: list[list[int]] = []
        self.seqs: list[list[int]] = []

    @initialize(
        ps=st.sampled_from(SUPPORTED_PAGE_SIZES_TESTED),
        num_pages=st.integers(1, 6),
        need_sort=st.booleans(),
        unchanged=st.booleans(),
        unaligned=st.sampled_from(UNALIGNED_ALLOC),
        release=st.sampled_from(RELEASE_ORDERS),
    )
    def setup(
        self,
        ps: int,
        num_pages: int,
        need_sort: bool,
        unchanged: bool,
        unaligned: str,
        release: str,
    ) -> None:
        self.ps = ps
        rules = Rules(
            refused_alloc_unchanged=unchanged,
            unaligned_paged_alloc=unaligned,
            release_order=release,
        )
        if ps == 1:
            self.ref = ref.TokenToKVPoolAllocator(num_pages, need_sort, rules=rules)
            self.twin = opt_token.TokenToKVPoolAllocator(
                num_pages, need_sort, options=CHECKED, rules=rules
            )
        else:
            self.ref = ref.PagedTokenToKVPoolAllocator(num_pages * ps, ps, need_sort, rules=rules)
            self.twin = opt_paged.PagedTokenToKVPoolAllocator(
                num_pages * ps, ps, need_sort, options=CHECKED, rules=rules
            )
        assert self.ref.snapshot() == self.twin.snapshot()

    def run(
        self, name: str, *args: Any, twin_args: tuple[Any, ...] | None = None, **kw: Any
    ) -> Any:
        """Call method ``name`` on both (the twin gets ``twin_args`` if given, else ``args``)."""
        targs = args if twin_args is None else twin_args
        return same_outcome(
            lambda: getattr(self.ref, name)(*args),
            lambda: getattr(self.twin, name)(*targs),
            self.ref.snapshot,
            self.twin.snapshot,
            **kw,
        )

    def free_slots(self, slots: list[int], expect_error: bool = False) -> None:
        self.run(
            "free",
            slots,
            twin_args=(torch.tensor(slots, dtype=torch.int64),),
            expect_error=expect_error,
        )

    def held_pages(self) -> set[int]:
        return {s // self.ps for part in self.blobs + self.seqs for s in part}

    # ----------------------------------------------------------------- alloc / free
    @rule(data=st.data())
    def alloc(self, data: st.DataObject) -> None:
        aligned = data.draw(st.booleans())
        if aligned:
            need = data.draw(st.integers(0, 7)) * self.ps
        else:
            need = data.draw(st.integers(-1, 7 * self.ps))
        got = self.run("alloc", need)
        if got:
            self.blobs.append(got)

    @precondition(lambda self: bool(self.blobs))
    @rule(data=st.data())
    def free_blob(self, data: st.DataObject) -> None:
        blob = self.blobs.pop(data.draw(st.integers(0, len(self.blobs) - 1)))
        if self.ps > 1 and data.draw(st.booleans()):
            blob = blob[::-1] + blob[:1]  # reversed, one page named twice: freed once, sorted
        self.free_slots(blob)

    @precondition(lambda self: bool(self.seqs))
    @rule(data=st.data())
    def finish_seq(self, data: st.DataObject) -> None:
        self.free_slots(self.seqs.pop(data.draw(st.integers(0, len(self.seqs) - 1))))

    @rule(
        data=st.data(), kind=st.sampled_from(("reserved", "past_pool", "negative", "free", "twice"))
    )
    def invalid_free(self, data: st.DataObject, kind: str) -> None:
        snap = self.ref.snapshot()
        free = list(snap.free_pages + snap.release_pages)
        limit = (snap.num_pages + 1) * self.ps
        if kind == "reserved":
            slots = [data.draw(st.integers(0, self.ps - 1))]
        elif kind == "past_pool":
            slots = [data.draw(st.integers(limit, limit + 3))]
        elif kind == "negative":
            slots = [-1]
        elif kind == "free" and free:
            slots = [data.draw(st.sampled_from(free)) * self.ps]
        elif kind == "twice" and self.ps == 1 and self.blobs:
            slots = [self.blobs[-1][0], self.blobs[-1][0]]
        else:
            return
        self.free_slots(slots, expect_error=True)

    # ----------------------------------------------------------------- batch operations
    def extend_args(
        self, data: st.DataObject
    ) -> tuple[list[list[int]], list[int], list[int], list[int]]:
        """A valid batch: some held sequences (continued) and up to 3 new ones."""
        olds = some(data, self.seqs)
        batch = olds + [[] for _ in range(data.draw(st.integers(1, 3)))]
        # New requests get at least one token (hypothesis favours 0); held ones may get none.
        grow = [data.draw(st.integers(0 if s else 1, 2 * self.ps + 1)) for s in batch]
        prefix = [len(s) for s in batch]
        seq = [p + g for p, g in zip(prefix, grow, strict=True)]
        last = [s[-1] if s else NO_LAST_LOC for s in batch]
        return batch, prefix, seq, last

    def extend_call(
        self,
        data: st.DataObject,
        lens: tuple[list[int], list[int], list[int], list[int]],
        num: int,
        expect_error: bool = False,
    ) -> list[int] | None:
        """``alloc_extend`` on both; ``lens`` is (prefix, seq, seq_cpu, last_loc)."""
        prefix, seq, seq_cpu, last = lens
        host = data.draw(st.booleans())
        dtype = data.draw(st.sampled_from((torch.int64, torch.int32)))
        twin_args = (
            torch.tensor(prefix, dtype=dtype),
            as_host(prefix, host),
            torch.tensor(seq, dtype=dtype),
            as_host(seq_cpu, host),
            torch.tensor(last, dtype=torch.int64),
            num,
        )
        result: list[int] | None = self.run(
            "alloc_extend",
            prefix,
            prefix,
            seq,
            seq_cpu,
            last,
            num,
            twin_args=twin_args,
            expect_error=expect_error,
        )
        return result

    @rule(data=st.data())
    def extend(self, data: st.DataObject) -> None:
        batch, prefix, seq, last = self.extend_args(data)
        num = sum(s - p for p, s in zip(prefix, seq, strict=True))
        out = self.extend_call(data, (prefix, seq, seq, last), num)
        if out is None:
            return
        cursor = 0
        for slots, p, s in zip(batch, prefix, seq, strict=True):
            was_new = not slots
            slots.extend(out[cursor : cursor + s - p])
            cursor += s - p
            if was_new and slots:
                self.seqs.append(slots)

    @rule(data=st.data(), kind=st.sampled_from(INVALID_EXTEND))
    def invalid_extend(self, data: st.DataObject, kind: str) -> None:
        _, prefix, seq, last = self.extend_args(data)
        if not prefix:
            return
        i = data.draw(st.integers(0, len(prefix) - 1))
        seq_cpu = list(seq)
        mid = prefix[i] % self.ps
        free = list(self.ref.snapshot().free_pages)
        delta = 0
        if kind == "num_tokens":
            delta = data.draw(st.sampled_from((-1, 1)))
        elif kind == "host_copy":
            seq_cpu[i] += 1
        elif kind == "prefix_past_seq" and prefix[i] > 0:
            seq[i] = seq_cpu[i] = prefix[i] - 1
        elif kind == "misaligned" and mid:
            last[i] += 1
        elif kind == "no_last_loc" and prefix[i] > 0:
            last[i] = NO_LAST_LOC
        elif kind == "free_page" and mid and free:
            last[i] = data.draw(st.sampled_from(free)) * self.ps + mid - 1
        elif kind == "past_pool" and mid:
            last[i] = (self.ref.num_pages + 1) * self.ps + mid - 1
        else:
            return
        num = sum(s - p for p, s in zip(prefix, seq, strict=True)) + delta
        self.extend_call(data, (prefix, seq, seq_cpu, last), num, expect_error=True)

    @precondition(lambda self: bool(self.seqs))
    @rule(
        data=st.data(),
        broken=st.sampled_from((None, None, None, None, "zero_len", "misaligned", "host_copy")),
    )
    def decode(self, data: st.DataObject, broken: str | None) -> None:
        batch = some(data, self.seqs)
        seq = [len(s) + 1 for s in batch]
        last = [s[-1] for s in batch]
        seq_cpu = list(seq)
        if broken is not None:
            if not batch or (broken == "misaligned" and (self.ps == 1 or seq[0] % self.ps == 1)):
                return
            if broken == "zero_len":
                seq[0] = seq_cpu[0] = 0
            elif broken == "misaligned":
                last[0] += 1
            else:
                seq_cpu[0] += 1
        host = data.draw(st.booleans())
        twin_args = (torch.tensor(seq), as_host(seq_cpu, host), torch.tensor(last))
        out = self.run(
            "alloc_decode", seq, seq_cpu, last, twin_args=twin_args, expect_error=broken is not None
        )
        if out is not None:
            for slots, o in zip(batch, out, strict=True):
                slots.append(o)

    # ----------------------------------------------------------------- groups and state
    @precondition(lambda self: bool(self.blobs or self.seqs))
    @rule(data=st.data())
    def free_group(self, data: st.DataObject) -> None:
        self.run("free_group_begin")
        self.run("free_group_begin", expect_error=True)  # not nestable
        for _ in range(data.draw(st.integers(1, 3))):
            from_blobs: bool = data.draw(st.booleans())
            pool = self.blobs if self.blobs and from_blobs else self.seqs
            pool = pool or self.blobs
            if not pool:
                break
            part = pool.pop(data.draw(st.integers(0, len(pool) - 1)))
            self.free_slots(part)
            again: bool = data.draw(st.booleans())
            if part and again:
                # Paged: the group frees a page once, so this is legal; page size 1: double free.
                self.free_slots(part[:1], expect_error=self.ps == 1)
            if data.draw(st.booleans()):
                self.borrow(data.draw(st.integers(1, 3)))
        self.run("free_group_end")
        self.run("free_group_end", expect_error=True)

    @rule(pages=st.integers(1, 3))
    def borrow(self, pages: int) -> None:
        """EAGLE v1: backup, allocate, restore: nothing changes on either side."""
        before = self.ref.snapshot()
        ref_state, twin_state = self.ref.backup_state(), self.twin.backup_state()
        self.run("alloc", pages * self.ps)
        self.run("restore_state", ref_state, twin_args=(twin_state,))
        assert self.ref.snapshot() == before

    @rule(kind=st.sampled_from(("sizes", "merge", "sizes", "merge", "clear")))
    def maintenance(self, kind: str) -> None:
        """Rare whole-pool operations (hypothesis favours the first, harmless choice)."""
        if kind == "sizes":
            assert self.run("available_size") == self.twin.available_size()
        elif kind == "merge":
            self.run("merge_and_sort_free")
        else:  # a clear forgets every holder
            self.run("clear")
            self.blobs, self.seqs = [], []


TestAllocatorLockstep = AllocatorLockstep.TestCase
TestAllocatorLockstep = pytest.mark.slow(TestAllocatorLockstep)
# Four times the profile's example count: the machine is cheap (about 3 s per 60 examples).
TestAllocatorLockstep.settings = settings(max_examples=4 * settings().max_examples)


def run_fixed_batches(backend: str | None, ps: int) -> None:
    """A fixed extend / decode / free history on both twins; the twin's kernels on ``backend``."""
    r = ref.PagedTokenToKVPoolAllocator(16 * ps, ps) if ps > 1 else ref.TokenToKVPoolAllocator(16)
    t: opt_allocator.BaseTokenToKVPoolAllocator
    if ps > 1:
        t = opt_paged.PagedTokenToKVPoolAllocator(
            16 * ps, ps, options=TwinOptions.make(checked=True, backend=backend)
        )
    else:
        t = opt_token.TokenToKVPoolAllocator(
            16, options=TwinOptions.make(checked=True, backend=backend)
        )
    prefix, seq = [0, 0, 0], [ps + 1, 2 * ps, 1]
    out = r.alloc_extend(prefix, prefix, seq, seq, [NO_LAST_LOC] * 3, sum(seq))
    got = t.alloc_extend(
        torch.tensor(prefix),
        prefix,
        torch.tensor(seq),
        seq,
        torch.tensor([NO_LAST_LOC] * 3),
        sum(seq),
    )
    assert out is not None and got is not None and got.tolist() == out
    last = [out[ps], out[3 * ps], out[3 * ps + 1]]  # last slot of each request
    more = [s + 2 for s in seq]
    out2 = r.alloc_extend(seq, seq, more, more, last, 6)
    got2 = t.alloc_extend(torch.tensor(seq), seq, torch.tensor(more), more, torch.tensor(last), 6)
    assert out2 is not None and got2 is not None and got2.tolist() == out2
    last = out2[1::2]
    dec = [s + 1 for s in more]
    out3 = r.alloc_decode(dec, dec, last)
    got3 = t.alloc_decode(torch.tensor(dec), torch.tensor(dec), torch.tensor(last))
    assert out3 is not None and got3 is not None and got3.tolist() == out3
    r.free(out + out2 + out3)
    t.free(torch.cat((got, got2, got3)))
    assert r.snapshot() == t.snapshot()


def test_kernel_backends_agree_with_reference() -> None:
    """The allocator's batch operations give the reference's slots on every kernel backend,
    the Triton kernels included (through the interpreter on a CPU)."""
    for backend in ("interpret", "torch", "python", None):
        for ps in (1, 4, 16):
            run_fixed_batches(backend, ps)


def test_alloc_extend_worked_example() -> None:
    """specs/sglang_behaviour.md (paged allocator): ps 4, free pages [9, 3, 7], P 6, last_loc
    25, S 15."""
    t = opt_paged.PagedTokenToKVPoolAllocator(40, 4, options=CHECKED)
    assert t.alloc(4 * 10) is not None  # take every page, then hand back 6, 9, 3, 7 in order
    t.restore_state((torch.tensor([9, 3, 7]), torch.tensor([], dtype=torch.int64)))
    # last_loc 25 sits in page 6, which is held.
    out = t.alloc_extend(torch.tensor([6]), [6], torch.tensor([15]), [15], torch.tensor([25]), 9)
    assert out is not None
    assert out.tolist() == [26, 27, 36, 37, 38, 39, 12, 13, 14]
    assert t.free_pages.tolist() == [7]


@given(
    lens=st.lists(st.tuples(st.integers(0, 300), st.integers(0, 300)), max_size=80),
    ps=st.sampled_from(SUPPORTED_PAGE_SIZES_TESTED),
)
def test_host_page_counts_match_the_reference(lens: list[tuple[int, int]], ps: int) -> None:
    """Page counts from host copies, as lists and as CPU tensors (small and large batches)."""
    prefix = [min(a, b) for a, b in lens]
    seq = [max(a, b) for a, b in lens]
    want = sum(ref_ops.extend_new_pages(p, s, ps) for p, s in zip(prefix, seq, strict=True))
    assert extend_new_pages_host(prefix, seq, ps) == want
    assert extend_new_pages_host(torch.tensor(prefix), torch.tensor(seq), ps) == want
    dec = [s + 1 for s in seq]
    assert decode_new_pages_host(dec, ps) == ref_ops.decode_new_pages(dec, ps)
    assert decode_new_pages_host(torch.tensor(dec), ps) == ref_ops.decode_new_pages(dec, ps)
