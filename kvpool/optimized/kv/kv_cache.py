"""KV buffers (optimized twin): ``KVCache`` (base), ``MHATokenToKVPool``, ``MLATokenToKVPool``.

Per layer a buffer is one device tensor of ``size + page_size`` rows (row = token slot; the
reserved page ``[0, page_size)`` takes the dummy writes of padded batches): MHA keeps
``k_buffer[l]`` of shape ``(rows, head_num, head_dim)`` and ``v_buffer[l]`` of shape
``(rows, head_num, v_head_dim)``; MLA keeps one fused ``kv_buffer[l]`` of shape
``(rows, 1, kv_lora_rank + qk_rope_head_dim)`` whose value view is its first ``kv_lora_rank``
channels. Layers are addressed by global id ``start_layer..end_layer``.

Same names, argument order and results as :mod:`kvpool.reference.kv.kv_cache`. Differences:

- fp8 dtypes (``torch.float8_e4m3fn`` / ``float8_e5m2`` or their reference names) are stored as
  ``uint8`` (indexed writes do not support fp8) and viewed back on every read and write; values
  are really quantised, so fp8 (and float16 / bfloat16) buffers cannot hold KV tags exactly. Tags
  (< 2**24) are exact in float32 and float64 buffers: the lifecycle uses float32.
- Slot-range checks need a device-to-host read, so they run in checked mode only; layer ids and
  shapes (host metadata) are always checked.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch

from kvpool.errors import ConfigError, IndexOutOfRangeError, InvalidArgumentError
from kvpool.optimized.key_match import is_integer_dtype
from kvpool.optimized.options import TwinOptions, twin_options
from kvpool.reference.kv.kv_cache import LayerTransferCounter

_DTYPE_NAMES: dict[str, torch.dtype] = {
    "float32": torch.float32,
    "float16": torch.float16,
    "bfloat16": torch.bfloat16,
    "float64": torch.float64,
    "fp8_e4m3": torch.float8_e4m3fn,
    "float8_e4m3fn": torch.float8_e4m3fn,
    "fp8_e5m2": torch.float8_e5m2,
    "float8_e5m2": torch.float8_e5m2,
}
FP8_DTYPES: tuple[torch.dtype, ...] = (torch.float8_e4m3fn, torch.float8_e5m2)

TensorLike = torch.Tensor | Sequence[Any]


def resolve_dtype(dtype: str | torch.dtype) -> torch.dtype:
    """A torch dtype from a torch dtype or a reference dtype name (ConfigError otherwise)."""
    if isinstance(dtype, torch.dtype):
        if dtype in _DTYPE_NAMES.values():
            return dtype
    elif dtype in _DTYPE_NAMES:
        return _DTYPE_NAMES[dtype]
    raise ConfigError(f"unknown dtype {dtype!r}; known: {sorted(_DTYPE_NAMES)}")


class KVCache:
    """Shared bookkeeping: sizes, dtypes, layer range, the transfer hook, slot and tag helpers."""

    head_num: int

    def __init__(
        self,
        size: int,
        page_size: int,
        dtype: str | torch.dtype,
        layer_num: int,
        start_layer: int = 0,
        device: str | torch.device | None = None,
        checked: bool | None = None,
        *,
        options: TwinOptions | None = None,
    ) -> None:
        if size <= 0 or page_size <= 0 or layer_num <= 0 or start_layer < 0:
            raise ConfigError("size, page_size and layer_num must be positive, start_layer >= 0")
        self.size = size
        self.page_size = page_size
        self.dtype = resolve_dtype(dtype)
        self.store_dtype = torch.uint8 if self.dtype in FP8_DTYPES else self.dtype
        self.layer_num = layer_num
        self.start_layer = start_layer
        self.end_layer = start_layer + layer_num - 1
        self.options = opts = twin_options(options, device, checked)
        self.device = opts.device
        self.checked = opts.checked
        self.layer_transfer_counter: LayerTransferCounter | None = None

    @property
    def num_rows(self) -> int:
        """Rows per layer buffer: ``size + page_size``."""
        return self.size + self.page_size

    def register_layer_transfer_counter(self, counter: LayerTransferCounter) -> None:
        """Reads of a layer will first call ``counter.wait_until(layer_id - start_layer)``."""
        self.layer_transfer_counter = counter

    def _layer(self, layer_id: int) -> int:
        """Local index of global ``layer_id``; IndexOutOfRangeError outside the held range."""
        if not self.start_layer <= layer_id <= self.end_layer:
            raise IndexOutOfRangeError(
                f"layer {layer_id} outside {self.start_layer}..{self.end_layer}"
            )
        return layer_id - self.start_layer

    def _wait(self, layer_id: int) -> int:
        local = self._layer(layer_id)
        if self.layer_transfer_counter is not None:
            self.layer_transfer_counter.wait_until(local)  # SGLang passes the local index
        return local

    def _slots(self, loc: TensorLike) -> torch.Tensor:
        """``loc`` as a 1-D int64 tensor on the device (range-checked in checked mode)."""
        slots = torch.as_tensor(loc, device=self.device).reshape(-1)
        if slots.numel() and not is_integer_dtype(slots.dtype):  # metadata: both modes
            raise InvalidArgumentError(f"slots must be integers, got dtype {slots.dtype}")
        slots = slots.to(torch.int64)
        if self.checked and slots.numel():
            bad = (slots < 0) | (slots >= self.num_rows)
            if bool(bad.any()):
                raise IndexOutOfRangeError(
                    f"slots {slots[bad].tolist()} outside 0..{self.num_rows - 1}"
                )
        return slots

    def _stored(
        self, what: str, data: TensorLike, shape: tuple[int, ...], scale: float | None
    ) -> torch.Tensor:
        """``data / scale`` as a NEW tensor in the storage dtype (the caller's is never touched);
        InvalidArgumentError unless ``data`` has ``shape``."""
        x = torch.as_tensor(data, device=self.device)
        if tuple(x.shape) != shape:
            raise InvalidArgumentError(f"{what} must have shape {list(shape)}, got {list(x.shape)}")
        if scale is not None:
            x = x / float(scale)  # a new tensor: division is never done in place
        x = x.to(self.dtype)
        return x.view(self.store_dtype) if self.store_dtype != self.dtype else x

    def _view(self, buf: torch.Tensor) -> torch.Tensor:
        """A stored buffer seen in the logical dtype (fp8 bytes viewed back)."""
        return buf.view(self.dtype) if self.store_dtype != self.dtype else buf

    def _zeros(self, heads: int, dim: int) -> torch.Tensor:
        return torch.zeros((self.num_rows, heads, dim), dtype=self.store_dtype, device=self.device)

    def _move(
        self, buffers: Sequence[torch.Tensor], tgt_loc: TensorLike, src_loc: TensorLike
    ) -> None:
        tgt, src = self._slots(tgt_loc), self._slots(src_loc)
        if tgt.numel() != src.numel():
            raise InvalidArgumentError(f"{tgt.numel()} targets for {src.numel()} sources")
        for buf in buffers:
            buf[tgt] = buf[src]  # the gather copies the sources before any write

    @staticmethod
    def _tag_rows(
        tags: TensorLike, n: int, heads: int, dim: int, device: torch.device
    ) -> torch.Tensor:
        values = torch.as_tensor(tags, dtype=torch.float64, device=device).reshape(-1, 1)
        if values.shape[0] != n:  # metadata: one tag per slot, never broadcast
            raise InvalidArgumentError(f"{values.shape[0]} tags for {n} slots")
        rows = torch.zeros((n, heads, dim), dtype=torch.float64, device=device)
        rows[:, :, 0] = values
        return rows

    # --------------------------------------------------------- the buffer interface
    def set_kv_buffer(
        self,
        layer_id: int,
        loc: Any,
        cache_k: Any,
        cache_v: Any,
        k_scale: float | None = None,
        v_scale: float | None = None,
    ) -> None:
        """Store ``cache_k / k_scale`` and ``cache_v / v_scale`` at ``loc`` (subclasses)."""
        raise NotImplementedError

    def get_key_buffer(self, layer_id: int) -> Any:
        """K of global layer ``layer_id`` (subclasses)."""
        raise NotImplementedError

    def get_value_buffer(self, layer_id: int) -> Any:
        """V of global layer ``layer_id`` (subclasses)."""
        raise NotImplementedError

    def get_kv_buffer(self, layer_id: int) -> tuple[Any, Any]:
        """``(K, V)`` of global layer ``layer_id`` (subclasses)."""
        raise NotImplementedError

    def move_kv_cache(self, tgt_loc: Any, src_loc: Any) -> None:
        """Copy rows ``src_loc`` to ``tgt_loc`` on every layer (subclasses)."""
        raise NotImplementedError

    def write_tags(self, loc: TensorLike, tags: TensorLike) -> None:
        """Store ``tags[i]`` at slot ``loc[i]`` on every layer (subclasses)."""
        raise NotImplementedError

    def read_tags(self, loc: TensorLike) -> list[int]:
        """Tag at each slot: layer ``start_layer``, head 0, channel 0 of K (subclasses)."""
        raise NotImplementedError

    def _read_tags(self, buf: torch.Tensor, loc: TensorLike) -> list[int]:
        values = self._view(buf)[self._slots(loc), 0, 0]
        return [int(v) for v in values.to(torch.float64).tolist()]


class MHATokenToKVPool(KVCache):
    """Separate K ``(rows, head_num, head_dim)`` and V ``(rows, head_num, v_head_dim)`` tensors
    per layer."""

    def __init__(
        self,
        size: int,
        page_size: int,
        dtype: str | torch.dtype,
        head_num: int,
        head_dim: int,
        layer_num: int,
        start_layer: int = 0,
        v_head_dim: int | None = None,
        device: str | torch.device | None = None,
        checked: bool | None = None,
        *,
        options: TwinOptions | None = None,
    ) -> None:
        opts = twin_options(options, device, checked)
        super().__init__(size, page_size, dtype, layer_num, start_layer, options=opts)
        if head_num <= 0 or head_dim <= 0 or (v_head_dim is not None and v_head_dim <= 0):
            raise ConfigError("head_num, head_dim and v_head_dim must be positive")
        self.head_num = head_num
        self.head_dim = head_dim
        self.v_head_dim = head_dim if v_head_dim is None else v_head_dim
        self.k_buffer = [self._zeros(head_num, head_dim) for _ in range(layer_num)]
        self.v_buffer = [self._zeros(head_num, self.v_head_dim) for _ in range(layer_num)]

    def set_kv_buffer(
        self,
        layer_id: int,
        loc: TensorLike,
        cache_k: TensorLike,
        cache_v: TensorLike,
        k_scale: float | None = None,
        v_scale: float | None = None,
    ) -> None:
        """Store ``cache_k / k_scale`` ``(n, head_num, head_dim)`` and ``cache_v / v_scale``
        ``(n, head_num, v_head_dim)`` at slots ``loc`` of ``layer_id``. Validated before any
        write; the inputs are never mutated."""
        local = self._layer(layer_id)
        slots = self._slots(loc)
        n = slots.numel()
        k = self._stored("cache_k", cache_k, (n, self.head_num, self.head_dim), k_scale)
        v = self._stored("cache_v", cache_v, (n, self.head_num, self.v_head_dim), v_scale)
        self.k_buffer[local][slots] = k
        self.v_buffer[local][slots] = v

    def get_key_buffer(self, layer_id: int) -> torch.Tensor:
        return self._view(self.k_buffer[self._wait(layer_id)])

    def get_value_buffer(self, layer_id: int) -> torch.Tensor:
        return self._view(self.v_buffer[self._wait(layer_id)])

    def get_kv_buffer(self, layer_id: int) -> tuple[torch.Tensor, torch.Tensor]:
        local = self._wait(layer_id)
        return self._view(self.k_buffer[local]), self._view(self.v_buffer[local])

    def move_kv_cache(self, tgt_loc: TensorLike, src_loc: TensorLike) -> None:
        """Copy rows ``src_loc`` to ``tgt_loc`` on every layer (sources read before any write)."""
        self._move((*self.k_buffer, *self.v_buffer), tgt_loc, src_loc)

    def write_tags(self, loc: TensorLike, tags: TensorLike) -> None:
        """Store ``tags[i]`` at slot ``loc[i]`` on every layer (channel 0 of every head of K and
        V; other channels 0)."""
        n = self._slots(loc).numel()
        k = self._tag_rows(tags, n, self.head_num, self.head_dim, self.device)
        v = self._tag_rows(tags, n, self.head_num, self.v_head_dim, self.device)
        for layer_id in range(self.start_layer, self.end_layer + 1):
            self.set_kv_buffer(layer_id, loc, k, v)

    def read_tags(self, loc: TensorLike) -> list[int]:
        """Tag at each slot: layer ``start_layer``, head 0, channel 0 of K (0 if never written)."""
        return self._read_tags(self.k_buffer[0], loc)


class MLATokenToKVPool(KVCache):
    """One fused ``(rows, 1, kv_lora_rank + qk_rope_head_dim)`` tensor per layer; V is a view of
    its first ``kv_lora_rank`` channels, so ``set_kv_buffer`` ignores ``cache_v``."""

    def __init__(
        self,
        size: int,
        page_size: int,
        kv_lora_rank: int,
        qk_rope_head_dim: int,
        layer_num: int,
        start_layer: int = 0,
        dtype: str | torch.dtype = "float32",
        device: str | torch.device | None = None,
        checked: bool | None = None,
        *,
        options: TwinOptions | None = None,
    ) -> None:
        opts = twin_options(options, device, checked)
        super().__init__(size, page_size, dtype, layer_num, start_layer, options=opts)
        if kv_lora_rank <= 0 or qk_rope_head_dim < 0:
            raise ConfigError("kv_lora_rank must be positive and qk_rope_head_dim >= 0")
        self.head_num = 1
        self.kv_lora_rank = kv_lora_rank
        self.qk_rope_head_dim = qk_rope_head_dim
        self.kv_dim = kv_lora_rank + qk_rope_head_dim
        self.kv_buffer = [self._zeros(1, self.kv_dim) for _ in range(layer_num)]

    def set_kv_buffer(
        self,
        layer_id: int,
        loc: TensorLike,
        cache_k: TensorLike,
        cache_v: object = None,
        k_scale: float | None = None,
        v_scale: float | None = None,
    ) -> None:
        """Store ``cache_k / k_scale`` ``(n, 1, kv_lora_rank + qk_rope_head_dim)`` at ``loc``;
        ``cache_v`` and ``v_scale`` are ignored. The input is never mutated."""
        local = self._layer(layer_id)
        slots = self._slots(loc)
        k = self._stored("cache_k", cache_k, (slots.numel(), 1, self.kv_dim), k_scale)
        self.kv_buffer[local][slots] = k

    def get_key_buffer(self, layer_id: int) -> torch.Tensor:
        return self._view(self.kv_buffer[self._wait(layer_id)])

    def get_value_buffer(self, layer_id: int) -> torch.Tensor:
        """A view (no copy) of the first ``kv_lora_rank`` channels of the fused buffer."""
        return self.get_key_buffer(layer_id)[..., : self.kv_lora_rank]

    def get_kv_buffer(self, layer_id: int) -> tuple[torch.Tensor, torch.Tensor]:
        key = self.get_key_buffer(layer_id)
        return key, key[..., : self.kv_lora_rank]

    def move_kv_cache(self, tgt_loc: TensorLike, src_loc: TensorLike) -> None:
        """Copy rows ``src_loc`` to ``tgt_loc`` on every layer (sources read before any write)."""
        self._move(self.kv_buffer, tgt_loc, src_loc)

    def write_tags(self, loc: TensorLike, tags: TensorLike) -> None:
        """Store ``tags[i]`` at slot ``loc[i]`` on every layer (channel 0; others 0)."""
        n = self._slots(loc).numel()
        rows = self._tag_rows(tags, n, 1, self.kv_dim, self.device)
        for layer_id in range(self.start_layer, self.end_layer + 1):
            self.set_kv_buffer(layer_id, loc, rows)

    def read_tags(self, loc: TensorLike) -> list[int]:
        """Tag at each slot: layer ``start_layer``, channel 0 of the fused row."""
        return self._read_tags(self.kv_buffer[0], loc)


__all__ = [
    "FP8_DTYPES",
    "KVCache",
    "MHATokenToKVPool",
    "MLATokenToKVPool",
    "resolve_dtype",
]
