"""``MHATokenToKVPoolFP4`` (torch twin of :mod:`kvpool.reference.kv.fp4`; the same bytes).

Per layer: ``k_buffer[l]`` / ``v_buffer[l]`` uint8 ``(rows, head_num, head_dim // 2)`` (two e2m1
codes a byte) and ``k_scale_buffer[l]`` / ``v_scale_buffer[l]`` uint8
``(rows, head_num * head_dim // 16)``, SGLang's shapes. Reads dequantise to a new float32
tensor; ``get_raw_kv_buffer`` returns the stored tensors themselves.
"""

from __future__ import annotations

import numpy as np
import numpy.typing as npt
import torch

from kvpool.errors import InvalidArgumentError
from kvpool.optimized.host_view import in_bounds
from kvpool.optimized.kv.kv_cache import IndexLike, KVCache, TensorLike, data_tensor
from kvpool.optimized.kv.quant import as_float32, check_finite, fp4_dequantize, fp4_quantize
from kvpool.optimized.kv.tag_codec import fp4_host_tags, fp4_read_tags, fp4_tag_bytes
from kvpool.optimized.options import TwinOptions
from kvpool.reference.kv.fp4 import FP4_V_HEAD_DIM_ERROR, check_fp4_width
from kvpool.reference.kv.kv_cache import as_scale
from kvpool.reference.kv.quant import FP4_BLOCK
from kvpool.reference.kv.tag_codec import FP4_DIGITS

Rows = torch.Tensor | tuple[torch.Tensor, torch.Tensor]
"""Rows a quantised pool stores: float32 values, or their ``(codes, scales)`` bytes."""


def quantizable(
    device: torch.device, what: str, data: TensorLike, shape: tuple[int, ...], scale: float | None
) -> torch.Tensor:
    """``data / scale`` as a new, finite float32 tensor of ``shape``: InvalidArgumentError
    unless ``data`` is real numbers (:func:`~kvpool.optimized.kv.kv_cache.data_tensor`) of
    ``shape`` whose scaled values are finite (one host read, both modes: the formats have no
    code for NaN or infinity). ``scale`` is checked by the caller; the caller's tensor is never
    touched."""
    x = data_tensor(what, data, device)
    if tuple(x.shape) != shape:
        raise InvalidArgumentError(f"{what} must have shape {list(shape)}, got {list(x.shape)}")
    x = as_float32(x, scale)
    check_finite(x)
    return x


class MHATokenToKVPoolFP4(KVCache):
    """FP4 K and V per layer (see the module docstring and the reference)."""

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
        *,
        options: TwinOptions | None = None,
    ) -> None:
        super().__init__(
            size,
            page_size,
            dtype,
            layer_num,
            start_layer,
            options=options,
        )
        self._set_mha_heads(head_num, head_dim, v_head_dim, v_sized_by_k=FP4_V_HEAD_DIM_ERROR)
        check_fp4_width(head_num, head_dim)
        self.store_dtype = torch.uint8
        rows, sf = self.num_rows, head_num * head_dim // FP4_BLOCK
        self.k_buffer = [self._bytes(rows, head_num, head_dim // 2) for _ in range(layer_num)]
        self.v_buffer = [self._bytes(rows, head_num, head_dim // 2) for _ in range(layer_num)]
        self.k_scale_buffer = [self._bytes(rows, sf) for _ in range(layer_num)]
        self.v_scale_buffer = [self._bytes(rows, sf) for _ in range(layer_num)]

    def _bytes(self, *shape: int) -> torch.Tensor:
        return torch.zeros(shape, dtype=torch.uint8, device=self.device)

    def set_kv_buffer(
        self,
        layer_id: int,
        loc: IndexLike,
        cache_k: TensorLike,
        cache_v: TensorLike,
        k_scale: float | None = None,
        v_scale: float | None = None,
    ) -> None:
        """Quantise ``cache_k / k_scale``, ``cache_v / v_scale`` ``(n, head_num, head_dim)`` and
        store bytes and scales at ``loc``. All checks (layer, slots, scales, data) before any
        write."""
        local = self._layer(layer_id)
        slots = self._slots(loc)
        shape = (slots.numel(), self.head_num, self.head_dim)
        ks, vs = as_scale("k_scale", k_scale), as_scale("v_scale", v_scale)
        k = quantizable(self.device, "cache_k", cache_k, shape, ks)
        v = quantizable(self.device, "cache_v", cache_v, shape, vs)
        self._store(local, slots, k, v)

    def _store(self, local: int, slots: torch.Tensor, k: Rows, v: Rows) -> None:
        """Write K and V rows (float32 to quantise, or their ``(packed, scales)`` bytes made
        already: ``write_tags`` makes them once for every layer) at checked ``slots``."""
        k_packed, k_sf = k if isinstance(k, tuple) else fp4_quantize(k)
        v_packed, v_sf = v if isinstance(v, tuple) else fp4_quantize(v)
        self._store_all(
            slots,
            [
                (self.k_buffer[local], k_packed),
                (self.v_buffer[local], v_packed),
                (self.k_scale_buffer[local], k_sf),
                (self.v_scale_buffer[local], v_sf),
            ],
        )

    def get_key_buffer(self, layer_id: int) -> torch.Tensor:
        """K of ``layer_id`` dequantised: a new float32 ``(rows, head_num, head_dim)``."""
        local = self._wait(layer_id)
        return fp4_dequantize(self.k_buffer[local], self.k_scale_buffer[local])

    def get_value_buffer(self, layer_id: int) -> torch.Tensor:
        """V of ``layer_id`` dequantised (a new tensor)."""
        local = self._wait(layer_id)
        return fp4_dequantize(self.v_buffer[local], self.v_scale_buffer[local])

    def get_kv_buffer(self, layer_id: int) -> tuple[torch.Tensor, torch.Tensor]:
        """``(get_key_buffer, get_value_buffer)``."""
        return self.get_key_buffer(layer_id), self.get_value_buffer(layer_id)

    def get_raw_kv_buffer(
        self, layer_id: int
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
        """The stored tensors of ``layer_id``: ``(k, v, k_scales, v_scales)``."""
        local = self._wait(layer_id)
        return (self.k_buffer[local], self.v_buffer[local],
                self.k_scale_buffer[local], self.v_scale_buffer[local])  # fmt: skip

    def move_kv_cache(self, tgt_loc: IndexLike, src_loc: IndexLike) -> None:
        """Copy bytes and scales of rows ``src_loc`` to ``tgt_loc`` on every layer."""
        buffers = (*self.k_buffer, *self.v_buffer, *self.k_scale_buffer, *self.v_scale_buffer)
        self._move(buffers, tgt_loc, src_loc)

    def write_tags(self, loc: IndexLike, tags: IndexLike) -> None:
        """Store each tag (``[0, TAG_LIMIT)``) in FP4 form (kv_tag_codec) in K and V of every
        held layer; slots and tags checked first."""
        slots = self._slots(loc)
        values = [int(t) for t in self._tags(tags, slots.numel()).tolist()]
        # K and V of every layer hold the same rows: their bytes are made once
        rows = fp4_tag_bytes(values, self.head_num, self.head_dim, self.device)
        for local in range(self.layer_num):
            self._store(local, slots, rows, rows)

    def read_tags(self, loc: IndexLike) -> list[int]:
        """The tag each slot stores (K of the first held layer; 0 if none)."""
        slots = self._slots(loc)
        flat = fp4_dequantize(self.k_buffer[0][slots], self.k_scale_buffer[0][slots])
        return fp4_read_tags(flat.reshape(slots.numel(), -1))

    def _snapshot_tags(self, slots: npt.NDArray[np.int64]) -> list[int]:
        """:meth:`read_tags` of a manager's own slots (:func:`fp4_snapshot_tags` of K)."""
        return fp4_snapshot_tags(self, self.k_buffer[0], self.k_scale_buffer[0], slots)


def fp4_snapshot_tags(
    pool: KVCache, packed: torch.Tensor, scales: torch.Tensor, slots: npt.NDArray[np.int64]
) -> list[int]:
    """The tags an FP4 pool's ``read_tags`` gives for ``slots``, from the layer's ``packed``
    bytes and ``scales``: the first scale block of each slot, read once on the host and decoded
    there (:func:`~kvpool.optimized.kv.tag_codec.fp4_host_tags`); slots out of range go to
    ``read_tags`` for its IndexOutOfRangeError."""
    if not in_bounds(slots, pool.num_rows):
        return pool.read_tags(slots.tolist())
    block = pool._host_take(packed, slots, slice(0, (FP4_DIGITS + 2) // 2), flat=True)
    return fp4_host_tags(block, pool._host_take(scales, slots, 0))


__all__ = ["MHATokenToKVPoolFP4", "fp4_snapshot_tags", "quantizable"]
