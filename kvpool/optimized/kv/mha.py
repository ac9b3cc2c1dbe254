"""``MHATokenToKVPool`` (optimized twin): multi-head-attention KV buffers, K and V apart.

Per layer ``k_buffer[l]`` of shape ``(size + page_size, head_num, head_dim)`` and ``v_buffer[l]``
of shape ``(size + page_size, head_num, v_head_dim)`` (row = token slot; dtype rules of
:mod:`kvpool.optimized.kv.kv_cache`). Same names, argument order and results as
:mod:`kvpool.reference.kv.mha`.
"""

from __future__ import annotations

import numpy as np
import numpy.typing as npt
import torch

from kvpool.optimized.kv.kv_cache import IndexLike, KVCache, TensorLike
from kvpool.optimized.options import TwinOptions
from kvpool.reference.kv.kv_cache import as_scale


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
        *,
        options: TwinOptions | None = None,
    ) -> None:
        super().__init__(size, page_size, dtype, layer_num, start_layer, options=options)
        self._set_mha_heads(head_num, head_dim, v_head_dim)
        self.k_buffer = [self._zeros(head_num, head_dim) for _ in range(layer_num)]
        self.v_buffer = [self._zeros(head_num, self.v_head_dim) for _ in range(layer_num)]

    def set_kv_buffer(
        self,
        layer_id: int,
        loc: IndexLike,
        cache_k: TensorLike,
        cache_v: TensorLike,
        k_scale: float | None = None,
        v_scale: float | None = None,
    ) -> None:
        """Store ``cache_k / k_scale`` ``(n, head_num, head_dim)`` and ``cache_v / v_scale``
        ``(n, head_num, v_head_dim)`` at slots ``loc`` of ``layer_id``. Validated (layer, slots,
        data, scales finite and > 0 or None) before any write; the inputs are never mutated."""
        local = self._layer(layer_id)
        slots = self._slots(loc)
        n = slots.numel()
        ks, vs = as_scale("k_scale", k_scale), as_scale("v_scale", v_scale)
        k = self._stored("cache_k", cache_k, (n, self.head_num, self.head_dim), ks)
        v = self._stored("cache_v", cache_v, (n, self.head_num, self.v_head_dim), vs)
        self._write(local, slots, k, v)

    def _write(self, local: int, slots: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> None:
        self._store_rows(self.k_buffer[local], slots, k)
        self._store_rows(self.v_buffer[local], slots, v)

    def get_key_buffer(self, layer_id: int) -> torch.Tensor:
        return self._view(self.k_buffer[self._wait(layer_id)])

    def get_value_buffer(self, layer_id: int) -> torch.Tensor:
        return self._view(self.v_buffer[self._wait(layer_id)])

    def get_kv_buffer(self, layer_id: int) -> tuple[torch.Tensor, torch.Tensor]:
        local = self._wait(layer_id)
        return self._view(self.k_buffer[local]), self._view(self.v_buffer[local])

    def move_kv_cache(self, tgt_loc: IndexLike, src_loc: IndexLike) -> None:
        """Copy rows ``src_loc`` to ``tgt_loc`` on every layer (sources read before any write)."""
        self._move((*self.k_buffer, *self.v_buffer), tgt_loc, src_loc)

    def write_tags(self, loc: IndexLike, tags: IndexLike) -> None:
        """Store ``tags[i]`` (``[0, TAG_LIMIT)``) at slot ``loc[i]`` on every layer (channel 0
        of every head of K and V; other channels 0); slots and tags checked first."""
        slots = self._slots(loc)
        values = self._tags(tags, slots.numel())
        k = self._tag_rows_as(values, self.head_num, self.head_dim, self.dtype)
        if self.v_head_dim == self.head_dim:  # V holds the same rows (stores copy them)
            v = k
        else:
            v = self._tag_rows_as(values, self.head_num, self.v_head_dim, self.dtype)
        if self.store_dtype != self.dtype:
            k, v = k.view(self.store_dtype), v.view(self.store_dtype)
        stores: list[tuple[torch.Tensor, torch.Tensor]] = []
        for local in range(self.layer_num):  # :meth:`_write`'s stores, K then V
            stores += ((self.k_buffer[local], k), (self.v_buffer[local], v))
        self._store_all(slots, stores)

    def read_tags(self, loc: IndexLike) -> list[int]:
        """Tag at each slot: layer ``start_layer``, head 0, channel 0 of K (0 if never written)."""
        return self._read_tags(self.k_buffer[0], loc)

    def _snapshot_tags(self, slots: npt.NDArray[np.int64]) -> list[int]:
        """:meth:`read_tags` of a manager's own slots, from one host read."""
        return self._host_read_tags(self.k_buffer[0], slots)


__all__ = ["MHATokenToKVPool"]
