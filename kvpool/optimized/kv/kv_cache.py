"""``KVCache`` (optimized twin): what every KV pool shares (the MHA and MLA pools,
:mod:`kvpool.optimized.kv.mha` and :mod:`kvpool.optimized.kv.mla`, and the storage variants).

Per layer a buffer is one device tensor of ``size + page_size`` rows (row = token slot; the
reserved page ``[0, page_size)`` takes the dummy writes of padded batches): MHA keeps
``k_buffer[l]`` of shape ``(rows, head_num, head_dim)`` and ``v_buffer[l]`` of shape
``(rows, head_num, v_head_dim)``; MLA keeps one fused ``kv_buffer[l]`` of shape
``(rows, 1, kv_lora_rank + qk_rope_head_dim)`` whose value view is its first ``kv_lora_rank``
channels. Layers are addressed by global id ``start_layer..end_layer``.

Same names, argument order, results and constructor checks (the sizes, the MHA heads, the MLA
widths, a move's slots: once each, here) as :mod:`kvpool.reference.kv.kv_cache`. Differences:

- fp8 dtypes (``torch.float8_e4m3fn`` / ``float8_e5m2`` or their reference names) are stored as
  ``uint8`` (indexed writes do not support fp8) and viewed back on every read and write; values
  are really quantised, so fp8 (and float16 / bfloat16) buffers cannot hold KV tags exactly. Tags
  (< 2**24) are exact in float32 and float64 buffers: the lifecycle uses float32.
- Slot-range checks need a device-to-host read, so they run in checked mode only; layer ids and
  shapes (host metadata) are always checked.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from kvpool.errors import ConfigError, IndexOutOfRangeError, InvalidArgumentError
from kvpool.optimized.key_match import is_integer_dtype
from kvpool.optimized.options import TwinOptions, twin_options
from kvpool.protocols.kv import LayerTransferCounter

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

TensorLike = torch.Tensor | Sequence[object]
"""Slots, tags or K/V data given by a caller: a tensor, or (nested) sequences of numbers."""


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
        self.options = opts = twin_options(options)
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

    def _move_pairs(
        self, tgt_loc: TensorLike, src_loc: TensorLike
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """The checked slots of a move (:meth:`_slots`) and as many targets as sources, else
        InvalidArgumentError."""
        tgt, src = self._slots(tgt_loc), self._slots(src_loc)
        if tgt.numel() != src.numel():
            raise InvalidArgumentError(f"{tgt.numel()} targets for {src.numel()} sources")
        return tgt, src

    def _move(
        self, buffers: Sequence[torch.Tensor], tgt_loc: TensorLike, src_loc: TensorLike
    ) -> None:
        tgt, src = self._move_pairs(tgt_loc, src_loc)
        for buf in buffers:
            buf[tgt] = buf[src]  # the gather copies the sources before any write

    # ----------------------------------------------------------------- geometry
    def _set_mha_heads(
        self, head_num: int, head_dim: int, v_head_dim: int | None, *, v_sized_by_k: str = ""
    ) -> None:
        """Check and record the geometry every MHA-shaped pool shares (as the reference's
        :meth:`~kvpool.reference.kv.kv_cache.KVCache._set_mha_heads`, same errors)."""
        if v_sized_by_k:
            if head_num <= 0 or head_dim <= 0:
                raise ConfigError("head_num and head_dim must be positive")
            if v_head_dim not in (None, head_dim):
                raise ConfigError(v_sized_by_k)
        v_dim = head_dim if v_head_dim is None else v_head_dim
        if head_num <= 0 or head_dim <= 0 or v_dim <= 0:
            raise ConfigError("head_num, head_dim and v_head_dim must be positive")
        self.head_num, self.head_dim, self.v_head_dim = head_num, head_dim, v_dim

    def _set_mla_dims(self, kv_lora_rank: int, qk_rope_head_dim: int) -> None:
        """Check and record MLA's fused row (as the reference's
        :meth:`~kvpool.reference.kv.kv_cache.KVCache._set_mla_dims`, same error)."""
        if kv_lora_rank <= 0 or qk_rope_head_dim < 0:
            raise ConfigError("kv_lora_rank must be positive and qk_rope_head_dim >= 0")
        self.head_num = 1
        self.kv_lora_rank = kv_lora_rank
        self.qk_rope_head_dim = qk_rope_head_dim
        self.kv_dim = kv_lora_rank + qk_rope_head_dim

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
        loc: TensorLike,
        cache_k: TensorLike,
        cache_v: TensorLike,
        k_scale: float | None = None,
        v_scale: float | None = None,
    ) -> None:
        """Store ``cache_k / k_scale`` and ``cache_v / v_scale`` at ``loc`` (subclasses)."""
        raise NotImplementedError

    def get_key_buffer(self, layer_id: int) -> torch.Tensor:
        """K of global layer ``layer_id`` (subclasses)."""
        raise NotImplementedError

    def get_value_buffer(self, layer_id: int) -> torch.Tensor:
        """V of global layer ``layer_id`` (subclasses)."""
        raise NotImplementedError

    def get_kv_buffer(self, layer_id: int) -> tuple[torch.Tensor, torch.Tensor]:
        """``(K, V)`` of global layer ``layer_id`` (subclasses)."""
        raise NotImplementedError

    def move_kv_cache(self, tgt_loc: TensorLike, src_loc: TensorLike) -> None:
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


__all__ = ["FP8_DTYPES", "KVCache", "TensorLike", "resolve_dtype"]
