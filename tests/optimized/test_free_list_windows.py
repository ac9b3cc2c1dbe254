"""The twin's free list in windows (front, main, tail) against the reference's plain list.

The differential allocator test reads both snapshots after every call, and a read of
``free_pages`` joins the windows into one; here long runs of allocations and frees go by
without a read, so that takes from the front window, appends to the tail window, takes that
run from one window into the next, buffers that outgrow their room and restores of a backup
are all reached between two comparisons. Every result is compared with the reference's as it
comes; the snapshots every few dozen steps and at the end.

Two promises of the windows are checked too: a ``free_pages`` view read once keeps its values,
and so do the slots an allocation handed out (page size 1 hands out views of the free list),
however the list changes afterwards.

Deterministic: each case is one seeded :class:`random.Random` run.
"""

from __future__ import annotations

import random
from typing import Any

import pytest
import torch

from kvpool.optimized.options import TwinOptions
from kvpool.optimized.pools.paged_allocator import PagedTokenToKVPoolAllocator as TwinPaged
from kvpool.optimized.pools.token_allocator import TokenToKVPoolAllocator as TwinToken
from kvpool.reference.pools.paged_allocator import PagedTokenToKVPoolAllocator as RefPaged
from kvpool.reference.pools.token_allocator import TokenToKVPoolAllocator as RefToken
from kvpool.rules import Rules

STEPS = 400
"""Operations per run."""


class Run:
    """One reference allocator and one twin over the same calls; ``held`` lists the pages of
    every block allocated and not yet freed (each block: its pages, in slot order)."""

    def __init__(self, seed: int, page_size: int, need_sort: bool, checked: bool) -> None:
        self.rng = random.Random(seed)
        self.ps = page_size
        num_pages = self.rng.choice((24, 200))  # small: frees and refusals come often
        size = num_pages * page_size
        rules = Rules(release_order="append") if need_sort and self.rng.random() < 0.5 else None
        options = TwinOptions.make("cpu", checked=checked)
        if page_size == 1:
            self.ref: Any = RefToken(size, need_sort, rules=rules)
            self.twin: Any = TwinToken(size, need_sort, rules=rules, options=options)
        else:
            self.ref = RefPaged(size, page_size, need_sort, rules=rules)
            self.twin = TwinPaged(size, page_size, need_sort, rules=rules, options=options)
        self.held: list[list[int]] = []
        self.kept: list[tuple[torch.Tensor, list[int]]] = []  # views handed out, their values
        self.backup: tuple[Any, Any, list[list[int]]] | None = None

    # ---------------------------------------------------------------- helpers
    def same(self, want: Any, got: Any) -> None:
        plain = got.tolist() if isinstance(got, torch.Tensor) else got
        assert plain == want, f"reference {want} vs twin {plain}"

    def keep(self, view: torch.Tensor) -> None:
        self.kept.append((view, view.tolist()))

    def slots(self, pages: list[int], partial: bool) -> list[int]:
        """The slots of ``pages``, page by page; ``partial``: only a first part of each page."""
        ps = self.ps
        out: list[int] = []
        for p in pages:
            n = self.rng.randrange(1, ps + 1) if partial else ps
            out.extend(range(p * ps, p * ps + n))
        return out

    def as_tensor(self, slots: list[int]) -> torch.Tensor:
        """``slots`` as an int64 tensor of its own, or as a view: every second element of a
        longer tensor (not contiguous), or the middle of one (an offset into its storage). A
        free copies the values into the free list all the same."""
        how = self.rng.randrange(3)
        if how == 1:
            return torch.tensor([v for s in slots for v in (s, -1)], dtype=torch.int64)[::2]
        if how == 2:
            return torch.tensor([-1, *slots, -1], dtype=torch.int64)[1:-1]
        return torch.tensor(slots, dtype=torch.int64)

    def take_block(self) -> list[int]:
        """Some pages of a held block (removed from ``held``): a run of them, often all."""
        i = self.rng.randrange(len(self.held))
        block = self.held[i]
        if len(block) > 1 and self.rng.random() < 0.4:
            cut = self.rng.randrange(1, len(block))
            self.held[i], block = block[cut:], block[:cut]
        else:
            self.held.pop(i)
        return block

    # ---------------------------------------------------------------- operations
    def alloc(self) -> None:
        pages = self.rng.choice((1, 1, 2, 3, 8, 40))
        want = self.ref.alloc(pages * self.ps)
        got = self.twin.alloc(pages * self.ps)
        self.same(want, got)
        if want is not None:
            self.held.append([s // self.ps for s in want[:: self.ps]])
            if self.ps == 1:
                self.keep(got)  # a view of the free list: its values must never change

    def decode(self) -> None:
        bs = self.rng.choice((1, 4, 16))  # new requests (S = 1): each opens a page
        ones, none = [1] * bs, [-1] * bs
        want = self.ref.alloc_decode(ones, ones, none)
        got = self.twin.alloc_decode(
            torch.tensor(ones), torch.tensor(ones), torch.tensor(none, dtype=torch.int64)
        )
        self.same(want, got)
        if want is not None:
            self.held.extend([s // self.ps] for s in want)

    def free(self, in_group: bool = False) -> None:
        if not self.held:
            return
        block = self.take_block()
        how = self.rng.randrange(3)
        if how == 0 or self.ps == 1 or in_group:
            slots = self.slots(block, partial=self.ps > 1 and self.rng.random() < 0.5)
            self.ref.free(slots)
            self.twin.free(self.as_tensor(slots))
        elif how == 1:
            self.ref.free_page_ids(block)
            self.twin.free_page_ids(torch.tensor(block, dtype=torch.int64))
        else:
            slots = self.slots(block, partial=False)
            self.ref.free_segment(slots, start_pos=0)
            self.twin.free_segment(torch.tensor(slots, dtype=torch.int64), start_pos=0)

    def group(self) -> None:
        self.ref.free_group_begin()
        self.twin.free_group_begin()
        for _ in range(self.rng.randrange(1, 6)):
            self.free(in_group=True)
        self.ref.free_group_end()
        self.twin.free_group_end()

    def state(self) -> None:
        """Back up both, or restore both (the blocks held return to what they were)."""
        if self.backup is None or self.rng.random() < 0.5:
            self.backup = (self.ref.backup_state(), self.twin.backup_state(), list(self.held))
        else:
            ref_state, twin_state, held = self.backup
            self.ref.restore_state(ref_state)
            self.twin.restore_state(twin_state)
            self.held = list(held)
            self.backup = None

    def read(self) -> None:
        """Read ``free_pages`` (joins the windows) and keep the view: it must keep its values."""
        self.keep(self.twin.free_pages)

    def compare(self) -> None:
        assert self.ref.snapshot() == self.twin.snapshot()
        assert self.ref.available_size() == self.twin.available_size()

    def step(self) -> None:
        r = self.rng.random()
        if r < 0.30:
            self.alloc()
        elif r < 0.40:
            self.decode()
        elif r < 0.65:
            self.free()
        elif r < 0.80:
            self.group()
        elif r < 0.86:
            self.state()
        elif r < 0.90:
            self.read()
        elif r < 0.93 and self.ref.need_sort:
            self.ref.merge_and_sort_free()
            self.twin.merge_and_sort_free()
        self.same(self.ref.available_size(), self.twin.available_size())


@pytest.mark.parametrize("checked", [False, True])
@pytest.mark.parametrize("need_sort", [False, True])
@pytest.mark.parametrize("page_size", [1, 4, 16])
def test_windows_follow_the_reference(page_size: int, need_sort: bool, checked: bool) -> None:
    for seed in range(4):
        run = Run(1000 * page_size + 10 * seed + need_sort, page_size, need_sort, checked)
        for i in range(STEPS):
            run.step()
            if i % 37 == 36:
                run.compare()
        run.compare()
        for view, values in run.kept:
            assert view.tolist() == values, "a view handed out changed"


@pytest.mark.parametrize("page_size", [1, 4])
def test_a_restored_backup_is_never_written(page_size: int) -> None:
    """Restoring puts the backup's tensor in place (no copy); frees, before or after takes,
    never write into it."""
    unchecked = TwinOptions.make("cpu", checked=False)
    twin: Any = (
        TwinToken(64, options=unchecked)
        if page_size == 1
        else TwinPaged(64 * page_size, page_size, options=unchecked)
    )
    taken = twin.alloc(40 * page_size)
    assert taken is not None
    state = twin.backup_state()
    before = [t.tolist() for t in state]
    for _ in range(3):
        twin.restore_state(state)
        assert twin.alloc(2 * page_size) is not None
        twin.free(taken[: 10 * page_size])
        twin.free_page_ids(taken[10 * page_size :: page_size] // page_size)
        assert twin.alloc(30 * page_size) is not None
    assert [t.tolist() for t in state] == before
