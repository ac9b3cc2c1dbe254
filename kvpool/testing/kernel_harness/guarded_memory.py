"""Guard-byte copies of a kernel launch's tensor arguments, and the bounds check on addresses.

The checked interpreter (:mod:`kvpool.testing.kernel_harness.interpreter`) runs a launch on host
copies of its tensor arguments, each storage placed between :data:`GUARD_BYTES` of poison so
that no two arguments are adjacent and a stray address lands in a guard zone rather than in a
neighbour.
Addresses are byte addresses; a :class:`Region` is the byte span of one tensor's elements.
Nothing here raises: :func:`out_of_bounds` reports the first bad lane and the interpreter turns it
into :class:`kvpool.testing.kernel_harness.interpreter.OutOfBoundsAccess`.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from typing import Any

import numpy as np
import torch

GUARD_BYTES = 4096
"""Bytes of poison placed before and after every tensor argument's storage copy."""

_POISON = 0xA5
"""Byte value of the guard zones; the bounds check stops any access before it reads one."""


@dataclasses.dataclass(frozen=True)
class Region:
    """Bytes ``[start, end)`` a kernel may touch, named for messages; ``zone`` is the guarded
    buffer around it (used only to say which tensor a stray address was closest to)."""

    name: str
    start: int
    end: int
    zone_start: int
    zone_end: int
    itemsize: int

    def shifted(self, delta: int) -> Region:
        """The same region ``delta`` bytes further on."""
        return dataclasses.replace(
            self,
            start=self.start + delta,
            end=self.end + delta,
            zone_start=self.zone_start + delta,
            zone_end=self.zone_end + delta,
        )


def region_of(name: str, t: torch.Tensor, zone: tuple[int, int] | None = None) -> Region:
    """The element span of ``t`` (its first to one-past-last element's bytes); ``zone``
    defaults to that span."""
    start = t.data_ptr()
    end = start
    if t.numel():
        last = sum((n - 1) * s for n, s in zip(t.shape, t.stride(), strict=True))
        end = start + (last + 1) * t.element_size()
    zs, ze = zone if zone is not None else (start, end)
    return Region(name, start, end, zs, ze, t.element_size())


def _span(t: torch.Tensor) -> tuple[int, int, int]:
    """``(storage address, first byte, end byte)`` of ``t``'s elements in its storage, aligned
    to its element size. An empty tensor spans no byte, at its storage offset."""
    base = t.untyped_storage().data_ptr()
    first = base + int(t.storage_offset()) * t.element_size()
    if not t.numel():
        return base, first, first
    last = sum((n - 1) * s for n, s in zip(t.shape, t.stride(), strict=True))
    return base, first, first + (last + 1) * t.element_size()


def _clusters(spans: list[tuple[int, int, int]]) -> list[tuple[int, int, int]]:
    """Spans of one storage merged where they overlap (touching is not overlapping)."""
    out: list[tuple[int, int, int]] = []
    for addr, lo, hi in sorted(spans):
        if out and out[-1][0] == addr and lo < out[-1][2] and lo >= out[-1][1]:
            out[-1] = (addr, out[-1][1], max(out[-1][2], hi))
        else:
            out.append((addr, lo, hi))
    return out


def _view_like(buf: torch.Tensor, t: torch.Tensor, offset: int) -> torch.Tensor:
    """A view of ``buf``'s bytes with ``t``'s dtype, shape and strides, ``offset`` elements in."""
    return torch.empty(0, dtype=t.dtype).set_(buf.untyped_storage(), offset, t.shape, t.stride())


class GuardedArgs:
    """Guarded host copies of a launch's tensor arguments.

    Arguments whose element spans overlap in one storage share a copy (a kernel may write
    through one and read through the other); every other argument gets its own copy, even when
    it is a disjoint slice of a storage another argument also slices, so that a stray access
    never lands in a neighbour's elements. ``args`` is the call's arguments with every tensor
    replaced by the same view into its guarded copy; ``regions`` holds those views' element
    spans, in argument order."""

    def __init__(self, call_args: dict[str, Any]) -> None:
        self.args: dict[str, Any] = {}
        self.regions: list[Region] = []
        self._copies: list[tuple[torch.Tensor, torch.Tensor]] = []  # (original bytes, guarded)
        self._moves: list[tuple[int, int, int]] = []  # original [start, end) -> copy start
        self._views: list[tuple[str, int, torch.Tensor]] = []  # (argument, copy index, view)
        self._index: dict[tuple[int, int, int], int] = {}  # cluster -> index into _copies
        spans: list[tuple[int, int, int]] = []  # (storage address, first byte, end byte)
        for arg in call_args.values():
            if isinstance(arg, torch.Tensor):
                spans.append(_span(arg))
        clusters = _clusters(spans)
        for name, arg in call_args.items():
            if not isinstance(arg, torch.Tensor):
                self.args[name] = arg
                continue
            storage_addr, lo, _ = _span(arg)
            key = next(
                c
                for c in clusters
                if c[0] == storage_addr and c[1] <= lo and (lo < c[2] or lo == c[1] == c[2])
            )
            if key not in self._index:
                self._add_copy(arg, key)
            index = self._index[key]
            buf = self._copies[index][1]
            offset_bytes = GUARD_BYTES + lo - key[1]
            view = _view_like(buf, arg, offset_bytes // arg.element_size())
            self.args[name] = view
            self._views.append((name, index, view))
            self.regions.append(
                region_of(name, view, (buf.data_ptr(), buf.data_ptr() + buf.numel()))
            )

    def _add_copy(self, arg: torch.Tensor, key: tuple[int, int, int]) -> None:
        """A guarded copy of bytes ``[key[1], key[2])`` of ``arg``'s storage."""
        storage_addr, lo, hi = key
        storage = arg.untyped_storage()
        whole = torch.empty(0, dtype=torch.uint8).set_(storage)
        original = whole[lo - storage_addr : hi - storage_addr] if storage.nbytes() else whole
        buf = torch.full((2 * GUARD_BYTES + original.numel(),), _POISON, dtype=torch.uint8)
        buf[GUARD_BYTES : GUARD_BYTES + original.numel()].copy_(original)
        self._index[key] = len(self._copies)
        self._copies.append((original, buf))
        self._moves.append((lo, hi, buf.data_ptr() + GUARD_BYTES))

    def translate(self, region: Region) -> Region:
        """``region`` moved into the guarded copy when it lies in a copied storage."""
        for start, end, new in self._moves:
            if start <= region.start and region.end <= end:
                return region.shifted(new - start)
        return region

    def snapshot(self) -> list[torch.Tensor]:
        """The current bytes of every guarded copy (guards included)."""
        return [buf.clone() for _, buf in self._copies]

    def restore(self, snap: list[torch.Tensor]) -> None:
        """Put back the bytes of a :meth:`snapshot`."""
        for (_, buf), saved in zip(self._copies, snap, strict=True):
            buf.copy_(saved)

    def copy_back(self) -> None:
        """Write the guarded copies' contents back into the caller's storages."""
        for original, buf in self._copies:
            original.copy_(buf[GUARD_BYTES : GUARD_BYTES + original.numel()])

    def first_difference(self, expected: list[torch.Tensor]) -> str | None:
        """Where the current memory differs from ``expected`` (a snapshot): the first differing
        element of the first differing argument, or None when none differs."""
        for name, index, view in self._views:
            if view.numel() == 0:
                continue
            now = view.reshape(-1)
            then = _view_like(expected[index], view, int(view.storage_offset())).reshape(-1)
            diff = (now != then).nonzero()
            if diff.numel():
                k = int(diff[0, 0])
                return f"{name}[{k}] is {now[k].item()} instead of {then[k].item()}"
        return None


def describe(addr: int, regions: Sequence[Region]) -> str:
    """``addr`` as an element of the tensor whose guarded zone holds it, for messages."""
    for r in regions:
        if r.zone_start <= addr < r.zone_end:
            k = (addr - r.start) // r.itemsize
            n = (r.end - r.start) // r.itemsize
            return f"element {k} of '{r.name}' (valid elements: 0..{n - 1})"
    if addr < GUARD_BYTES:
        return f"address {addr:#x} (the null pointer an empty tensor argument has)"
    if addr >= 1 << 63:  # a negative offset from the null pointer of an empty tensor
        return f"address -{(1 << 64) - addr} (before the null pointer an empty tensor has)"
    return f"address {addr:#x}, outside every tensor argument"


def live_lanes(ptrs: Any, mask: Any) -> np.ndarray | None:
    """Which lanes of an interpreter pointer block the mask lets through (None: all of them)."""
    if mask is None:
        return None
    return np.broadcast_to(np.asarray(mask.data, dtype=bool), np.shape(ptrs.data))


def masked_addresses(ptrs: Any, live: np.ndarray | None) -> np.ndarray:
    """The byte addresses of the ``live`` lanes of ``ptrs``, flattened."""
    addrs = np.asarray(ptrs.data, dtype=np.uint64)
    return addrs[live] if live is not None else addrs.reshape(-1)


def out_of_bounds(addrs: np.ndarray, size: int, regions: Sequence[Region]) -> tuple[int, int]:
    """``(first bad address, number of bad lanes)`` among ``addrs`` for accesses of ``size``
    bytes that must each lie wholly inside one of ``regions``; ``(0, 0)`` when all do."""
    ok = np.zeros(addrs.shape, dtype=bool)
    for r in regions:
        if r.end - r.start < size:
            continue  # an empty tensor (data pointer 0) allows no access at all
        # ``addrs + size <= end`` would wrap around for a negative offset from a null pointer
        # (element -1 of an empty tensor is address 2**64 - itemsize): compare without adding.
        ok |= (addrs >= np.uint64(r.start)) & (addrs <= np.uint64(r.end - size))
    if ok.all():
        return 0, 0
    return int(addrs[~ok][0]), int((~ok).sum())
