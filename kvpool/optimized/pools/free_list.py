"""The optimized allocators' free lists: ``free_pages`` held in windows, ``release_pages`` in parts.

:class:`FreeList` is owned by
:class:`~kvpool.optimized.pools.allocator.BaseTokenToKVPoolAllocator` (twin only: the reference
keeps plain lists). It holds the free list in up to three windows (a front the paged free writes
to, a main one, a tail page size 1's free appends to; see :meth:`FreeList.__init__`), so that a
free copies the freed pages only and a take is one view, where SGLang concatenates the whole list
on every free and slices it twice on every take; :attr:`FreeList.pages` joins them on read. The
``need_sort`` staging list is held as parts, joined on read; so are a free group's buffered
frees (:func:`joined_parts`).

Units: page ids ``1..num_pages`` as int64 tensors on ``device``; counts are pages. Contract:
a view :attr:`FreeList.pages` hands out never changes afterwards, nor do :meth:`FreeList.take`'s
pages unless :meth:`FreeList.prepend` runs (it writes only where pages were taken: the paged
allocator turns them into slots at once; page size 1, whose taken pages are its slots, only
appends), and a tensor given to it (a restored backup, a sort, a caller's list) is never written.
The checked-mode free mask is the allocator's: nothing here checks page ids.
"""

from __future__ import annotations

import contextlib
import weakref
from collections.abc import Callable

import numpy as np
import numpy.typing as npt
import torch

from kvpool.constants import RESERVED_INDEX


class FreeList:
    """``free_pages`` (in windows) and ``release_pages`` (in parts) of one allocator, on
    ``device``. ``appends_freed``: frees go to the tail (page size 1), so a list given to
    :meth:`replace` is kept as it is (else, paged, copied into a buffer of its own)."""

    def __init__(self, device: torch.device, appends_freed: bool) -> None:
        self.device = device
        self._on_cpu = device.type == "cpu"
        self._appends_freed = appends_freed
        # The free list is up to three windows, in order, so that neither a free nor a take
        # copies the whole list (SGLang concatenates it on every free):
        # - front _fr[_fr_lo:_fr_end] (a buffer made here, None while unused): the paged
        #   allocator's frees are written backwards into its room [0, _fr_lo) (LIFO);
        # - main _fl[_fl_head:_fl_tail]: someone's tensor (a restored list, a sort: _fl_np is
        #   None, _fl_room 0) or a buffer made here (then _fl_room entries past the tail are
        #   ours to write: page size 1 appends there while no tail window follows);
        # - tail _tl[:_tl_len] (a buffer made here, None while unused): page size 1 appends.
        # Takes come from the first window: one view (from_numpy of a slice of the *_np view
        # costs less than a tensor slice). pages joins the windows into the main one on
        # first read (one copy) and keeps that view (_fl_view). On the CPU the buffers are made
        # by numpy and their own copies (growing, joining, a take across windows) run there: a
        # free and a take issue the same tensor operations whatever the lengths (none, or one
        # copy of the freed pages), and no tensor is read back through .numpy() (to the
        # lifecycle's sync-free counters, a device read).
        # Nothing is ever written where a view handed out can see: the main window is never
        # written, the tail only past what it holds, the front only where pages were taken
        # (the paged allocator's taken pages become slots at once; page size 1, whose taken
        # pages are its slots, never writes to a front).
        self._fl = self._empty()
        self._fl_np: npt.NDArray[np.int64] | None = None
        self._fl_head = 0
        self._fl_tail = 0
        self._fl_room = 0
        self._fl_view: torch.Tensor | None = None
        self._fr: torch.Tensor | None = None
        self._fr_np: npt.NDArray[np.int64] | None = None
        self._fr_lo = 0
        self._fr_end = 0
        self._tl: torch.Tensor | None = None
        self._tl_np: npt.NDArray[np.int64] | None = None
        self._tl_len = 0
        # A tail buffer dropped before any view of it was handed out (a restore, a join that
        # copied it), reused by the next tail window: its memory is already paged in.
        self._spare: tuple[torch.Tensor, npt.NDArray[np.int64] | None] | None = None
        # The last backup's free list on the CPU and the numpy array it was made from:
        # restoring that tensor makes it the main window with its numpy view, no copy.
        self._backup: tuple[weakref.ref[torch.Tensor], npt.NDArray[np.int64]] | None = None
        self._release_parts: list[torch.Tensor] = []  # release_pages, joined on read
        self.release_count = 0
        """Pages in ``release_pages`` (kept here: no join to count them)."""

    def _empty(self) -> torch.Tensor:
        return torch.empty(0, dtype=torch.int64, device=self.device)

    # ----------------------------------------------------------------- free_pages
    @property
    def pages(self) -> torch.Tensor:
        """The free list (int64 page ids, in order): a view, made on first read after a change.
        Never written in place: a view read once keeps its values."""
        if self._tl_len or self._fr_lo < self._fr_end:
            self._join()
        view = self._fl_view
        if view is None:
            view = self._fl_view = self._fl[self._fl_head : self._fl_tail]
        return view

    @pages.setter
    def pages(self, pages: torch.Tensor) -> None:
        # Someone's tensor (a restored backup, a sort, a test's): read, never written.
        self._set_main(pages, None)

    def _set_main(self, pages: torch.Tensor, host: npt.NDArray[np.int64] | None) -> None:
        """The free list is ``pages``, no other window; ``host``: the numpy array ``pages`` was
        made from (a buffer of this allocator's), else None."""
        if self._tl is not None and self._tl is not pages:  # a tail no view has seen
            self._spare = (self._tl, self._tl_np)
        self._fl = self._fl_view = pages
        self._fl_np = host
        self._fl_head = 0
        self._fl_tail = pages.numel()
        self._fl_room = 0
        self._fr = self._fr_np = None
        self._fr_lo = self._fr_end = 0
        self._tl = self._tl_np = None
        self._tl_len = 0

    def count(self) -> int:
        """``len(pages)`` in pages, from the windows' bounds (no view made)."""
        return self._fr_end - self._fr_lo + self._fl_tail - self._fl_head + self._tl_len

    def _windows(self) -> list[torch.Tensor]:
        """The non-empty windows of the free list, in order (views; their concatenation is
        :attr:`pages`)."""
        windows = []
        if self._fr is not None and self._fr_lo < self._fr_end:
            windows.append(self._fr[self._fr_lo : self._fr_end])
        if self._fl_head < self._fl_tail:
            view = self._fl_view  # made already (a restored list, say): no new view
            windows.append(self._fl[self._fl_head : self._fl_tail] if view is None else view)
        if self._tl is not None and self._tl_len:
            windows.append(self._tl[: self._tl_len])
        return windows

    def _host_windows(self) -> list[npt.NDArray[np.int64]] | None:
        """The windows as numpy arrays when every one is a CPU buffer of this allocator's."""
        windows = []
        if self._fr_lo < self._fr_end:
            if self._fr_np is None:
                return None
            windows.append(self._fr_np[self._fr_lo : self._fr_end])
        if self._fl_head < self._fl_tail:
            if self._fl_np is None:
                return None
            windows.append(self._fl_np[self._fl_head : self._fl_tail])
        if self._tl_len:
            if self._tl_np is None:
                return None
            windows.append(self._tl_np[: self._tl_len])
        return windows

    def _buffer(self, n: int) -> tuple[torch.Tensor, npt.NDArray[np.int64] | None]:
        """A new int64 buffer on the device with room for ``n`` entries and as many again (a
        window that outgrows it moves to one twice its size: each entry is copied O(1) times
        on average). On the CPU it is made by numpy (returned too): the windows' own copies
        then run in numpy, no tensor operation, and a take is ``from_numpy`` of a slice."""
        if self._on_cpu:
            arr = np.empty(2 * n + 1024, dtype=np.int64)
            return torch.from_numpy(arr), arr
        return torch.empty(2 * n + 1024, dtype=torch.int64, device=self.device), None

    def _join(self) -> None:
        """Make the free list one window, the main one: the windows' concatenation (one copy:
        numpy's when every window is a CPU buffer of ours, else one tensor operation), or, when
        only a tail window is left, that window as it is (no copy, its room kept)."""
        if self._fl_head == self._fl_tail and self._fr_lo == self._fr_end and self._tl_len:
            assert self._tl is not None
            tail, tail_np, n = self._tl, self._tl_np, self._tl_len
            self._set_main(tail, tail_np)
            self._fl_tail, self._fl_room = n, tail.numel() - n
            self._fl_view = None
            return
        host = self._host_windows()
        if host is not None:
            arr = np.concatenate(host) if host else np.empty(0, dtype=np.int64)
            self._set_main(torch.from_numpy(arr), arr)
        else:
            windows = self._windows()
            self._set_main(torch.cat(windows) if windows else self._empty(), None)

    def append(self, pages: torch.Tensor, owned: bool) -> None:
        """Put ``pages`` (int64, on the device) at the tail of the free list: into the main
        buffer's room while no tail window follows, else into the tail window (a new buffer
        when it is full: a copy of the tail window only). Page size 1's free: one copy of
        ``pages``, whatever the lengths (numpy's, into a CPU buffer of ours). ``owned``:
        ``pages`` is the allocator's own fresh tensor (free_group_end's concatenation), never
        seen by a caller."""
        k = pages.numel()
        if owned and not self._tl_len and k > self._fl_room:
            # free_group_end's concatenation, due for an empty tail window: it becomes that
            # window as it is (no copy; full, so the next append moves it to a buffer).
            self._tl, self._tl_np, self._tl_len = pages, None, k
            return
        if not self._tl_len and k <= self._fl_room:
            buf, arr, at = self._fl, self._fl_np, self._fl_tail
            self._fl_tail = at + k
            self._fl_room -= k
            self._fl_view = None
        else:
            at = self._tl_len
            tail = self._tl
            if tail is None or at + k > tail.numel():
                spare = self._spare
                if spare is not None and at + k <= spare[0].numel():
                    buf, arr = spare
                else:
                    buf, arr = self._buffer(at + k)
                self._spare = None
                if tail is not None:
                    if arr is not None and self._tl_np is not None:
                        arr[:at] = self._tl_np[:at]
                    else:
                        buf[:at] = tail[:at]
                self._tl, self._tl_np = buf, arr
            else:
                buf, arr = tail, self._tl_np
            self._tl_len = at + k
        if arr is not None and type(pages) is torch.Tensor and pages.is_cpu:
            arr[at : at + k] = pages.numpy()  # half the time of the tensor slice assignment
        else:
            buf[at : at + k] = pages

    def prepend(self, pages: torch.Tensor, host: npt.NDArray[np.int64] | None) -> None:
        """Put ``pages`` (int64, on the device) at the head of the free list, in their order:
        written just before the front window (a new buffer when its room is used up: a copy
        of the front window only). ``host``: a numpy array of the allocator's holding the
        same pages (the paged free's de-duplicated pages): the front window takes it as it is
        when empty, else numpy copies it (no tensor operation); without it one tensor
        operation copies ``pages`` (``free_page_ids``)."""
        k = pages.numel()
        lo, front, front_np = self._fr_lo, self._fr, self._fr_np
        if lo == self._fr_end:  # the front window is empty: the pages become it
            if host is None:
                # Someone's pages (free_page_ids): a clone, cheaper than a numpy-made copy
                # (empty, from_numpy, copy_); a take across this window is then a torch.cat.
                pages = pages.clone()
            self._fr, self._fr_np, self._fr_lo, self._fr_end = pages, host, 0, k
            return
        if front is None or k > lo:
            n = self._fr_end - lo
            buf, arr = self._buffer(n + k)
            end = buf.numel()
            if arr is not None and front_np is not None:
                arr[end - n :] = front_np[lo : self._fr_end]
            else:
                assert front is not None
                buf[end - n :] = front[lo : self._fr_end]
            front, front_np, lo = buf, arr, end - n
            self._fr, self._fr_np, self._fr_end = front, front_np, end
        lo -= k
        if host is not None and front_np is not None:
            front_np[lo : lo + k] = host
        else:
            front[lo : lo + k] = pages
        self._fr_lo = lo

    def take(self, num_pages: int) -> torch.Tensor | None:
        """Remove ``num_pages`` from the head of the free list and return them (int64, in
        order: a view of a window, or one fresh tensor when the take runs past it); ``None``
        and no change when they do not fit."""
        lo = self._fr_lo
        if lo < self._fr_end:  # pages freed since the last join come first (paged: LIFO)
            end = lo + num_pages
            if end <= self._fr_end:
                arr = self._fr_np
                assert self._fr is not None
                taken = torch.from_numpy(arr[lo:end]) if arr is not None else self._fr[lo:end]
                self._fr_lo = end
                return taken
            if num_pages > self.count():
                return None
            return self._take_across(num_pages)
        head = self._fl_head
        end = head + num_pages
        if end > self._fl_tail:
            if num_pages > self.count():
                return None
            return self._take_across(num_pages)
        # One view (the taken pages; the rest is made when pages is read).
        arr = self._fl_np
        taken = torch.from_numpy(arr[head:end]) if arr is not None else self._fl[head:end]
        if num_pages:  # else nothing leaves the free list (a decode step opening no page)
            self._fl_head = end
            self._fl_view = None
        return taken

    def _take_across(self, num_pages: int) -> torch.Tensor:
        """A take that runs past the first window (``num_pages`` fit in the free list): the
        pages from the windows in order, as one fresh tensor (a copy of the taken pages only:
        numpy's when every piece is a CPU buffer of ours, else one tensor operation). A tail
        window it reaches becomes the main one (the main window is used up by then)."""
        pieces: list[tuple[torch.Tensor, npt.NDArray[np.int64] | None]] = []
        need = num_pages
        lo, n = self._fr_lo, min(need, self._fr_end - self._fr_lo)
        if n:
            assert self._fr is not None
            arr = self._fr_np
            pieces.append((self._fr[lo : lo + n], None if arr is None else arr[lo : lo + n]))
            self._fr_lo, need = lo + n, need - n
        head, n = self._fl_head, min(need, self._fl_tail - self._fl_head)
        if n:
            arr = self._fl_np
            pieces.append(
                (self._fl[head : head + n], None if arr is None else arr[head : head + n])
            )
            self._fl_head, self._fl_view, need = head + n, None, need - n
        if need:  # into the tail window: it becomes the main one, less the pages taken
            tail, arr, held = self._tl, self._tl_np, self._tl_len
            assert tail is not None
            pieces.append((tail[:need], None if arr is None else arr[:need]))
            self._set_main(tail, arr)
            self._fl_head, self._fl_tail, self._fl_room = need, held, tail.numel() - held
            self._fl_view = None
        host = [a for _, a in pieces if a is not None]
        if len(host) == len(pieces):
            return torch.from_numpy(np.concatenate(host))
        return torch.cat([t for t, _ in pieces])

    # ----------------------------------------------------------------- release_pages
    @property
    def release(self) -> torch.Tensor:
        """The ``need_sort`` staging list (int64 page ids, in order). Held as parts joined on
        the first read: staging a free adds a part (as SGLang 0.5.23's staged list), not a copy
        of everything staged so far."""
        parts = self._release_parts
        if len(parts) == 1:
            return parts[0]
        if not parts:
            return self._empty()
        joined = cat_index_parts(parts)
        self._release_parts = [joined]
        return joined

    @release.setter
    def release(self, pages: torch.Tensor) -> None:
        self._release_parts = [pages] if pages.numel() else []
        self.release_count = pages.numel()

    def stage(self, pages: torch.Tensor, at_tail: bool) -> None:
        """Add ``pages`` (a tensor owned here) to ``release_pages``: at its tail or its head."""
        if at_tail:
            self._release_parts.append(pages)
        else:
            self._release_parts.insert(0, pages)
        self.release_count += pages.numel()

    # ----------------------------------------------------------------- both lists
    def every_page(self, num_pages: int) -> tuple[torch.Tensor, npt.NDArray[np.int64] | None]:
        """Page ids ``1..num_pages`` ascending (a cleared free list) as an int64 tensor on the
        device, and on the CPU the numpy array it is made from (to :meth:`replace`: a buffer of
        this list's, restored with no copy), else None."""
        first = RESERVED_INDEX + 1  # page 0 is reserved: never free
        if self._on_cpu:
            arr = np.arange(first, num_pages + 1, dtype=np.int64)
            return torch.from_numpy(arr), arr
        return torch.arange(first, num_pages + 1, dtype=torch.int64, device=self.device), None

    def replace(
        self,
        free_pages: torch.Tensor,
        release_pages: torch.Tensor,
        host: npt.NDArray[np.int64] | None = None,
    ) -> None:
        """Replace both lists. ``free_pages`` becomes the main window, never written: as it is
        when the allocator made it (``host``, the numpy array it was made from, or the last
        :meth:`backup`'s) or at page size 1 (frees go to a tail window); else, paged, as a copy
        in a buffer of its own (one tensor operation, a list of pages), so that a take running
        past the front window joins the two in numpy, with no tensor operation."""
        if host is None and self._backup is not None and self._backup[0]() is free_pages:
            host = self._backup[1]  # the last backup, restored: its numpy view, no copy
        if host is not None:
            self._set_main(free_pages, host)
        elif self._appends_freed or free_pages.numel() == 0:
            self.pages = free_pages
        else:
            n = free_pages.numel()
            arr = np.empty(n, dtype=np.int64) if self._on_cpu else None
            main = (
                torch.from_numpy(arr)
                if arr is not None
                else torch.empty(n, dtype=torch.int64, device=self.device)
            )
            main.copy_(free_pages)
            self._set_main(main, arr)
        self.release = release_pages

    def backup(self) -> tuple[torch.Tensor, torch.Tensor]:
        """``(free_pages, release_pages)`` as clones. On the CPU, from buffers of its own, the
        free list's copy is made by numpy (no tensor operation) and remembered: restoring it
        (:meth:`replace`) needs no copy."""
        host = self._host_windows() if self._on_cpu else None
        if host is None:
            windows = self._windows()
            free = torch.cat(windows) if len(windows) > 1 else self.pages.clone()
        else:
            arr = np.concatenate(host) if host else np.empty(0, dtype=np.int64)
            free = torch.from_numpy(arr)
            self._backup = (weakref.ref(free), arr)
        return (free, self.release.clone())

    def merge_and_sort(self, num_pages: int) -> None:
        """``pages = sorted(pages + release)``; ``release`` empty (``num_pages``: the pool's
        largest page id). Call only with pages staged."""
        merged = cat_index_parts((*self._windows(), *self._release_parts))  # one copy
        self.pages = sorted_pages(merged, num_pages)
        self.release = self._empty()


_BELOW_AUTOGRAD: Callable[[], contextlib.AbstractContextManager[object]] = getattr(
    torch._C, "_AutoDispatchBelowADInplaceOrView", contextlib.nullcontext
)
"""Torch's guard that dispatches below its autograd layers (a no-op context where a torch
release lacks it)."""

PARTS_BELOW_AUTOGRAD = 64
"""Parts from which :func:`cat_index_parts` skips autograd's layer: entering the guard has a
fixed cost, which a join of a few parts does not win back (``benchmarks/bench_allocators.py``'s
join rows time 16, 64 and 1,024 parts)."""


def cat_index_parts(parts: list[torch.Tensor] | tuple[torch.Tensor, ...]) -> torch.Tensor:
    """``torch.cat(parts)`` of integer index tensors (tokens, slots or pages; never one that
    requires grad). Of many parts (a free group of 1,024 frees) it runs below torch's autograd
    layer: for integer tensors that layer records nothing, yet it visits every part (about a
    third of a 1,024-part concatenation on the CPU: the benchmark's join rows). The result is
    an ordinary tensor, not an inference tensor: its holder may write it in place later."""
    if len(parts) < PARTS_BELOW_AUTOGRAD:
        return torch.cat(parts)
    with _BELOW_AUTOGRAD():
        return torch.cat(parts)


def joined_parts(parts: list[torch.Tensor], device: torch.device, on_cpu: bool) -> torch.Tensor:
    """1-D int64 tensors buffered in order (a free group's frees) as one on ``device``
    (``on_cpu``: it is the CPU): no copy for a single one already there, an empty tensor for
    none; parts on another device are moved here."""
    if not parts:
        return torch.empty(0, dtype=torch.int64, device=device)
    try:
        joined = parts[0] if len(parts) == 1 else cat_index_parts(parts)
    except RuntimeError:  # on different devices: each moved first
        joined = torch.cat([p.to(device) for p in parts])
    if joined.is_cpu if on_cpu else joined.device == device:
        return joined
    return joined.to(device)


_COUNTING_SORT_PAGES_PER_ID = 8
"""Counting sort when ``pages * this >= num_pages``: its cost is linear in the pool's page ids."""


def sorted_pages(pages: torch.Tensor, num_pages: int) -> torch.Tensor:
    """``torch.sort(pages).values``. For many page ids of a CPU pool, a counting sort over the
    ids ``0..num_pages`` instead (linear, about 3x faster than torch's comparison sort on a
    50k-page merge); it keeps duplicates, so it equals the sort on any state, even one an
    unchecked misuse corrupted (ids out of ``0..num_pages`` take the sort)."""
    n = pages.numel()
    if (
        n
        and pages.is_cpu
        and pages.dtype is torch.int64
        and n * _COUNTING_SORT_PAGES_PER_ID >= num_pages
    ):
        ids = pages.numpy()
        if ids.min() >= 0 and ids.max() <= num_pages:
            counts = np.bincount(ids, minlength=num_pages + 1)
            return torch.from_numpy(np.repeat(np.arange(num_pages + 1, dtype=np.int64), counts))
    return torch.sort(pages).values


__all__ = ["PARTS_BELOW_AUTOGRAD", "FreeList", "cat_index_parts", "joined_parts", "sorted_pages"]
