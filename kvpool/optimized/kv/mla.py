"""``MLATokenToKVPool`` (optimized twin): multi-head latent attention's fused KV buffer.

Per layer one ``kv_buffer[l]`` of shape ``(size + page_size, 1, kv_lora_rank +
qk_rope_head_dim)`` (row = token slot); the value is a view of its first ``kv_lora_rank``
channels. Same names, argument order and results as :mod:`kvpool.reference.kv.mla`.
"""

from __future__ import annotations

import numpy as np
import numpy.typing as npt
import torch

from kvpool.optimized.kv.kv_cache import IndexLike, KVCache, TensorLike
from kvpool.optimized.options import TwinOptions
from kvpool.reference.kv.kv_cache import as_scale


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
        *,
        options: TwinOptions | None = None,
    ) -> None:
        super().__init__(size, page_size, dtype, layer_num, start_layer, options=options)
        self._set_mla_dims(kv_lora_rank, qk_rope_head_dim)
        self.kv_buffer = [self._zeros(1, self.kv_dim) for _ in range(layer_num)]

    def set_kv_buffer(
        self,
        layer_id: int,
        loc: IndexLike,
        cache_k: TensorLike,
        cache_v: object = None,
        k_scale: float | None = None,
        v_scale: float | None = None,
    ) -> None:
        """Store ``cache_k / k_scale`` ``(n, 1, kv_lora_rank + qk_rope_head_dim)`` at ``loc``;
        ``cache_v`` is ignored and ``v_scale`` only checked, as every pool's. Validated before
        any write; the input is never mutated."""
        local = self._layer(layer_id)
        slots = self._slots(loc)
        ks = as_scale("k_scale", k_scale)
        as_scale("v_scale", v_scale)
        k = self._stored("cache_k", cache_k, (slots.numel(), 1, self.kv_dim), ks)
        self.kv_buffer[local][slots] = k

    def get_key_buffer(self, layer_id: int) -> torch.Tensor:
        return self._view(self.kv_buffer[self._wait(layer_id)])

    def get_value_buffer(self, layer_id: int) -> torch.Tensor:
        """A view (no copy) of the first ``kv_lora_rank`` channels of the fused buffer."""
        return self.get_key_buffer(layer_id)[..., : self.kv_lora_rank]

    def get_kv_buffer(self, layer_id: int) -> tuple[torch.Tensor, torch.Tensor]:
        key = self.get_key_buffer(layer_id)
        return key, key[..., : self.kv_lora_rank]

    def move_kv_cache(self, tgt_loc: IndexLike, src_loc: IndexLike) -> None:
        """Copy rows ``src_loc`` to ``tgt_loc`` on every layer (sources read before any write)."""
        self._move(self.kv_buffer, tgt_loc, src_loc)

    def write_tags(self, loc: IndexLike, tags: IndexLike) -> None:
        """Store ``tags[i]`` (``[0, TAG_LIMIT)``) at slot ``loc[i]`` on every layer (channel 0;
        others 0); slots and tags checked first."""
        slots = self._slots(loc)
        rows = self._tag_rows_as(self._tags(tags, slots.numel()), 1, self.kv_dim, self.dtype)
        if self.store_dtype != self.dtype:
            rows = rows.view(self.store_dtype)
        self._store_all(slots, [(buf, rows) for buf in self.kv_buffer])

    def read_tags(self, loc: IndexLike) -> list[int]:
        """Tag at each slot: layer ``start_layer``, channel 0 of the fused row."""
        return self._read_tags(self.kv_buffer[0], loc)

    def _snapshot_tags(self, slots: npt.NDArray[np.int64]) -> list[int]:
        """:meth:`read_tags` of a manager's own slots, from one host read."""
        return self._host_read_tags(self.kv_buffer[0], slots)


__all__ = ["MLATokenToKVPool"]
