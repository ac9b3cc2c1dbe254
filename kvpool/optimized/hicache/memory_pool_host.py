"""The optimized twin's host KV pool: ``HostKVCache`` and its MHA / MLA kinds, on torch tensors.

Same sizes, allocation order, errors and tags as :mod:`kvpool.reference.hicache.memory_pool_host`
(see its docstring). What differs is the containers: ``free_slots`` is an int64 tensor, freed chunks
are kept as tensors in ``release_slots`` (concatenated only when an allocation needs them, as SGLang
does), ``slot_used`` is a bool tensor checked with one gather per call, and the tags are an int64
tensor.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol

import torch

from kvpool.errors import (
    AlignmentError,
    ConfigError,
    DoubleFreeError,
    IndexOutOfRangeError,
    InvalidArgumentError,
)
from kvpool.host_checks import as_count
from kvpool.optimized.index_args import index_tensor
from kvpool.protocols.hicache import TaggedKVPoolProtocol
from kvpool.reference.hicache.memory_pool_host import (  # pure helpers, shared
    ITEMSIZE,
    host_pool_size,
)
from kvpool.snapshot import HostPoolSnapshot

_LAYOUTS = ("layer_first", "page_first", "page_first_direct")


def _dtype_name(dtype: torch.dtype | str) -> str:
    """A store dtype as the reference names it (torch dtypes or names)."""
    if isinstance(dtype, torch.dtype):
        names = {torch.float32: "float32", torch.float16: "float16", torch.bfloat16: "bfloat16"}
        return names.get(dtype, "uint8")
    return str(dtype)


class DevicePoolOfHost(TaggedKVPoolProtocol[torch.Tensor], Protocol):
    """What a host pool reads of the device KV pool it backs: the tags and geometry of
    :class:`~kvpool.protocols.TaggedKVPoolProtocol`, its stored dtype and its layer count."""

    @property
    def store_dtype(self) -> torch.dtype | str: ...

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


class HostKVCache:
    """A host KV pool sized from ``device_pool`` (see the reference's module docstring)."""

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
        if layout not in _LAYOUTS:
            raise ConfigError(f"unknown host layout {layout!r}")
        self.device_pool = device_pool
        self.page_size = page_size
        self.layout = layout
        self.dtype = _dtype_name(device_pool.store_dtype)
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

    def clear(self) -> None:
        """Every slot free (in order), no release chunk, every tag 0."""
        self.free_slots = torch.arange(self.size, dtype=torch.int64)
        self.release_slots: list[torch.Tensor] = []
        self.num_release_slots = 0
        self.slot_used = torch.zeros(self.size, dtype=torch.bool)
        self.tags = torch.zeros(self.size, dtype=torch.int64)

    def available_size(self) -> int:
        """Free slots (tokens): ``free_slots`` plus the released chunks."""
        return int(self.free_slots.numel()) + self.num_release_slots

    def _merge_release_slots(self) -> None:
        if self.num_release_slots == 0:
            return
        self.free_slots = torch.cat([self.free_slots, *self.release_slots])
        self.release_slots = []
        self.num_release_slots = 0

    def alloc(self, need_size: int) -> torch.Tensor | None:
        """``need_size`` slots (a page multiple) from the front of the free list; None (nothing
        changed) when fewer are available. Checked as the reference."""
        need_size = as_count("need_size", need_size)
        if need_size % self.page_size:
            raise AlignmentError(f"{need_size} is not a multiple of page size {self.page_size}")
        if need_size > self.available_size():
            return None
        if need_size > self.free_slots.numel():
            self._merge_release_slots()
        out = self.free_slots[:need_size]
        self.free_slots = self.free_slots[need_size:]
        self.slot_used[out] = True
        return out

    def free(self, indices: torch.Tensor | Sequence[int]) -> int:
        """Release held slots (one chunk, kept as given: the caller must not modify it, as in
        SGLang); DoubleFreeError (nothing changed) if one is free or listed twice;
        InvalidArgumentError for a slot outside the pool or an argument that is not a 1-D
        integer index (host memory: checked in both modes)."""
        slots = index_tensor("indices", indices, "cpu")
        n = int(slots.numel())
        if n == 0:
            return 0
        if int(slots.min()) < 0 or int(slots.max()) >= self.size:
            outside = (slots < 0) | (slots >= self.size)
            raise InvalidArgumentError(
                f"host slots {slots[outside].tolist()} outside 0..{self.size - 1}"
            )
        used = self.slot_used[slots]
        repeated = n > 1 and bool((slots.sort().values.diff() == 0).any())
        if repeated or not bool(used.all()):
            unique, counts = torch.unique(slots, return_counts=True)
            bad = unique[(counts > 1) | ~self.slot_used[unique]]
            raise DoubleFreeError(f"host slots {bad.tolist()} are not currently allocated")
        self.slot_used[slots] = False
        self.release_slots.append(slots)
        self.num_release_slots += n
        return n

    def _copy_args(
        self, device_pool: object, host_indices: object, device_indices: object
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """A copy's checks, as the reference's: ``device_pool`` the pool this host pool backs,
        host slots inside the pool and held (host memory: both modes), device slots rows of
        that pool (a device read: checked mode, or host values), slot for slot."""
        if device_pool is not self.device_pool:
            raise InvalidArgumentError(
                f"device_pool must be the pool this host pool backs, got {device_pool!r}"
            )
        host = index_tensor("host_indices", host_indices, "cpu")
        dev_device = getattr(self.device_pool, "device", "cpu")
        device = index_tensor("device_indices", device_indices, dev_device)
        if host.numel() != device.numel():
            raise InvalidArgumentError(
                f"{host.numel()} host_indices for {device.numel()} device_indices"
            )
        listed = host.tolist()
        bad = [h for h in listed if not 0 <= h < self.size]
        if bad:
            raise IndexOutOfRangeError(f"host_indices {bad} outside 0..{self.size - 1}")
        free = [h for h in listed if not bool(self.slot_used[h])]
        if free:
            raise DoubleFreeError("host_indices: host slots not held (no copy to move)", free)
        checked = bool(getattr(self.device_pool, "checked", True))
        if checked or not isinstance(device_indices, torch.Tensor):
            rows = self.device_pool.num_rows
            out = [d for d in device.tolist() if not 0 <= d < rows]
            if out:
                raise IndexOutOfRangeError(f"device_indices {out} outside 0..{rows - 1}")
        return host, device

    def backup_from_device_all_layer(
        self,
        device_pool: TaggedKVPoolProtocol[torch.Tensor],
        host_indices: torch.Tensor,
        device_indices: torch.Tensor,
    ) -> None:
        """Copy the device slots' content (their tags) into the host slots, all layers
        (checked first: :meth:`_copy_args`)."""
        host, device = self._copy_args(device_pool, host_indices, device_indices)
        tags = torch.as_tensor(device_pool.read_tags(device), dtype=torch.int64)
        self.tags[host] = tags

    def load_to_device_all_layer(
        self,
        device_pool: TaggedKVPoolProtocol[torch.Tensor],
        host_indices: torch.Tensor,
        device_indices: torch.Tensor,
    ) -> None:
        """Copy the host slots' content (their tags) into the device slots, all layers
        (checked first: :meth:`_copy_args`)."""
        host, device = self._copy_args(device_pool, host_indices, device_indices)
        device_pool.write_tags(device, self.tags[host])

    def snapshot(self) -> HostPoolSnapshot:
        """Plain snapshot: free list, released chunks (flattened, in order) and tags."""
        released = torch.cat(self.release_slots).tolist() if self.release_slots else []
        return HostPoolSnapshot(self.size, self.page_size, tuple(self.free_slots.tolist()),
                                tuple(released), tuple(self.tags.tolist()))  # fmt: skip


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
]
