"""The host (CPU) KV pool behind the hierarchical cache: ``HostKVCache`` and its MHA / MLA kinds.

Units: sizes are tokens; host indices are host *slots* (one per token), handed out in whole
pages. Unlike the device pool, no host slot is reserved: slots ``0..size-1`` are all usable.

Sizing (SGLang 0.5.16): ``host_size`` > 0 is a budget in GB, ``host_size * 1e9 //
size_per_token`` tokens; otherwise ``device size * host_to_device_ratio`` tokens. Either is then
rounded to ``(size // page_size + 1)`` whole pages, so the pool always has at least one page.

Allocator (SGLang's): ``free_slots`` is handed out from the front; ``free`` appends the freed
slots to ``release_slots`` (a list of chunks), merged behind ``free_slots`` only when an
allocation needs more than ``free_slots`` holds. ``available_size`` counts both. Where SGLang
asserts on a double free, kvpool raises :class:`~kvpool.errors.DoubleFreeError` and changes
nothing.

Content: the model of the host buffers is one KV tag per host slot (:mod:`kvpool.tags`), copied
from the device pool's tags by :meth:`HostKVCache.backup_from_device_all_layer` and back by
:meth:`HostKVCache.load_to_device_all_layer`, so a restored slot can be checked against the
tokens it should hold.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence
from itertools import chain
from typing import Protocol

from kvpool.errors import (
    AlignmentError,
    ConfigError,
    DoubleFreeError,
    IndexOutOfRangeError,
    InvalidArgumentError,
)
from kvpool.host_checks import as_count, int_list
from kvpool.protocols.hicache import TaggedKVPoolProtocol
from kvpool.records import fast_record
from kvpool.snapshot import HostPoolSnapshot

ITEMSIZE: dict[str, int] = {
    "float32": 4,
    "float16": 2,
    "bfloat16": 2,
    "uint8": 1,
    "float8_e4m3fn": 1,
    "float8_e5m2": 1,
}
"""Bytes per element of a device pool's ``store_dtype``."""


def host_pool_size(
    device_size: int, size_per_token: int, ratio: float, host_size: float, page_size: int
) -> int:
    """Host pool tokens (see the module docstring): always a positive page multiple."""
    if host_size > 0:
        size = int(host_size * 1e9 // size_per_token)
    else:
        size = int(device_size * ratio)
    return (size // page_size + 1) * page_size


class DevicePoolOfHost(TaggedKVPoolProtocol[list[int]], Protocol):
    """What a host pool reads of the device KV pool it backs: the tags and geometry of
    :class:`~kvpool.protocols.TaggedKVPoolProtocol`, its stored dtype and its layer count."""

    @property
    def store_dtype(self) -> str: ...

    @property
    def layer_num(self) -> int: ...


class MHADevicePool(DevicePoolOfHost, Protocol):
    """An MHA device pool's per-layer K/V geometry (heads x channels)."""

    @property
    def head_num(self) -> int: ...

    @property
    def head_dim(self) -> int: ...


class MLADevicePool(DevicePoolOfHost, Protocol):
    """An MLA device pool's fused per-layer row geometry (channels)."""

    @property
    def kv_lora_rank(self) -> int: ...

    @property
    def qk_rope_head_dim(self) -> int: ...


_HOST_POOL = fast_record(HostPoolSnapshot)
"""Builds a :class:`HostPoolSnapshot` (every field by keyword: :func:`fast_record`)."""


class HostKVCache:
    """A host KV pool sized from ``device_pool`` (see the module docstring)."""

    device_pool: DevicePoolOfHost

    def __init__(
        self,
        device_pool: DevicePoolOfHost,
        host_to_device_ratio: float,
        host_size: float = 0,
        page_size: int = 1,
        layout: str = "layer_first",
    ) -> None:
        if host_to_device_ratio <= 0 and host_size <= 0:
            raise ConfigError("host_to_device_ratio or host_size must be positive")
        if page_size != device_pool.page_size:
            raise ConfigError(f"page_size {page_size} != device pool's {device_pool.page_size}")
        if layout not in ("layer_first", "page_first", "page_first_direct"):
            raise ConfigError(f"unknown host layout {layout!r}")
        self.device_pool = device_pool
        self.page_size = page_size
        self.layout = layout
        self.dtype = device_pool.store_dtype
        self.layer_num = device_pool.layer_num
        self.size_per_token = self.get_size_per_token()
        self.size = host_pool_size(
            device_pool.size, self.size_per_token, host_to_device_ratio, host_size, page_size
        )
        self.page_num = self.size // page_size
        self.clear()

    def get_size_per_token(self) -> int:
        """Bytes one token takes on the host, all layers (the kind decides)."""
        raise NotImplementedError

    # ----------------------------------------------------------------- allocator
    def clear(self) -> None:
        """Every slot free (in order), no release chunk, every tag 0."""
        self.free_slots: list[int] = list(range(self.size))
        self.release_slots: list[list[int]] = []
        self.num_release_slots = 0
        self.slot_used = [False] * self.size
        self.tags = [0] * self.size

    def available_size(self) -> int:
        """Free slots (tokens): ``free_slots`` plus the released chunks."""
        return len(self.free_slots) + self.num_release_slots

    def _merge_release_slots(self) -> None:
        for chunk in self.release_slots:
            self.free_slots.extend(chunk)
        self.release_slots = []
        self.num_release_slots = 0

    def alloc(self, need_size: int) -> list[int] | None:
        """``need_size`` slots (a page multiple) from the front of the free list, merging the
        released chunks first when the free list alone is too short; None (nothing changed)
        when fewer are available. InvalidArgumentError for a size that is not a count,
        AlignmentError for one that is not a page multiple."""
        need_size = as_count("need_size", need_size)
        if need_size % self.page_size:
            raise AlignmentError(f"{need_size} is not a multiple of page size {self.page_size}")
        if need_size > self.available_size():
            return None
        if need_size > len(self.free_slots):
            self._merge_release_slots()
        out = self.free_slots[:need_size]
        self.free_slots = self.free_slots[need_size:]
        for slot in out:
            self.slot_used[slot] = True
        return out

    def free(self, indices: Sequence[int]) -> int:
        """Release held slots (appended as one chunk); returns how many. DoubleFreeError
        (nothing changed) if one is free already or listed twice; InvalidArgumentError for a
        slot outside the pool or an argument that is not a sequence of integers."""
        slots = int_list("indices", indices)
        if not slots:
            return 0
        bad = [s for s in slots if not 0 <= s < self.size]
        if bad:
            raise InvalidArgumentError(f"host slots {bad} outside 0..{self.size - 1}")
        counts = Counter(slots)
        twice = sorted(s for s, c in counts.items() if not self.slot_used[s] or c > 1)
        if twice:
            raise DoubleFreeError(f"host slots {twice} are not currently allocated")
        for slot in slots:
            self.slot_used[slot] = False
        self.release_slots.append(slots)
        self.num_release_slots += len(slots)
        return len(slots)

    # ----------------------------------------------------------------- content
    def _copy_args(
        self, device_pool: object, host_indices: object, device_indices: object
    ) -> tuple[list[int], list[int]]:
        """A copy's checks, before it moves anything: ``device_pool`` is the pool this host
        pool backs, host slots in ``0..size-1`` and held (DoubleFreeError), device slots rows
        of that pool, slot for slot (InvalidArgumentError, IndexOutOfRangeError)."""
        if device_pool is not self.device_pool:
            raise InvalidArgumentError(
                f"device_pool must be the pool this host pool backs, got {device_pool!r}"
            )
        host = int_list("host_indices", host_indices)  # type: ignore[arg-type]
        device = int_list("device_indices", device_indices)  # type: ignore[arg-type]
        if len(host) != len(device):
            raise InvalidArgumentError(f"{len(host)} host_indices for {len(device)} device_indices")
        bad = [h for h in host if not 0 <= h < self.size]
        if bad:
            raise IndexOutOfRangeError(f"host_indices {bad} outside 0..{self.size - 1}")
        free = [h for h in host if not self.slot_used[h]]
        if free:
            raise DoubleFreeError("host_indices: host slots not held (no copy to move)", free)
        rows = self.device_pool.num_rows
        bad = [d for d in device if not 0 <= d < rows]
        if bad:
            raise IndexOutOfRangeError(f"device_indices {bad} outside 0..{rows - 1}")
        return host, device

    def backup_from_device_all_layer(
        self,
        device_pool: TaggedKVPoolProtocol[list[int]],
        host_indices: Sequence[int],
        device_indices: Sequence[int],
    ) -> None:
        """Copy the device slots' content (their tags) into the host slots, all layers
        (checked first: :meth:`_copy_args`)."""
        host, device = self._copy_args(device_pool, host_indices, device_indices)
        tags = device_pool.read_tags(device)
        for h, tag in zip(host, tags, strict=True):
            self.tags[h] = tag

    def load_to_device_all_layer(
        self,
        device_pool: TaggedKVPoolProtocol[list[int]],
        host_indices: Sequence[int],
        device_indices: Sequence[int],
    ) -> None:
        """Copy the host slots' content (their tags) into the device slots, all layers
        (checked first: :meth:`_copy_args`)."""
        host, device = self._copy_args(device_pool, host_indices, device_indices)
        device_pool.write_tags(device, [self.tags[h] for h in host])

    def snapshot(self) -> HostPoolSnapshot:
        """Plain snapshot: free list, released chunks (flattened, in order) and tags."""
        return _HOST_POOL(
            size=self.size,
            page_size=self.page_size,
            free_slots=tuple(self.free_slots),
            release_slots=tuple(chain.from_iterable(self.release_slots)),
            tags=tuple(self.tags),
        )


class MHATokenToKVPoolHost(HostKVCache):
    """Host pool of an MHA device pool: K and V of ``head_num * head_dim`` per layer."""

    device_pool: MHADevicePool  # built by host_pool_for for a pool without ``kv_lora_rank``

    def get_size_per_token(self) -> int:
        pool = self.device_pool
        return int(pool.head_dim * pool.head_num * pool.layer_num * ITEMSIZE[self.dtype] * 2)


class MLATokenToKVPoolHost(HostKVCache):
    """Host pool of an MLA device pool: one ``kv_lora_rank + qk_rope_head_dim`` row per layer."""

    device_pool: MLADevicePool  # built by host_pool_for for a pool with ``kv_lora_rank``

    def get_size_per_token(self) -> int:
        pool = self.device_pool
        dim = pool.kv_lora_rank + pool.qk_rope_head_dim
        return int(dim * pool.layer_num * ITEMSIZE[self.dtype])


def host_pool_for(device_pool: DevicePoolOfHost, ratio: float, host_size: float = 0) -> HostKVCache:
    """The host pool kind matching ``device_pool`` (MLA when it has ``kv_lora_rank``)."""
    kind = MLATokenToKVPoolHost if hasattr(device_pool, "kv_lora_rank") else MHATokenToKVPoolHost
    return kind(device_pool, ratio, host_size, device_pool.page_size)


__all__ = [
    "HostKVCache",
    "MHATokenToKVPoolHost",
    "MLATokenToKVPoolHost",
    "host_pool_for",
    "host_pool_size",
]
