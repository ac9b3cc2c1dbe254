"""``MLATokenToKVPoolFP4`` (torch twin of :mod:`kvpool.reference.kv.mla_fp4`; the same bytes).

Per layer: ``kv_buffer[l]`` uint8 ``(rows, 1, kv_dim // 2)`` and ``kv_scale_buffer[l]`` uint8
``(rows, kv_dim // 16)``, SGLang's shapes. Reads dequantise to a new float32 tensor.
"""

from __future__ import annotations

import numpy as np
import numpy.typing as npt
import torch

from kvpool.optimized.kv.fp4 import Rows, fp4_snapshot_tags, quantizable
from kvpool.optimized.kv.kv_cache import IndexLike, KVCache, TensorLike
from kvpool.optimized.kv.quant import fp4_dequantize, fp4_quantize
from kvpool.optimized.kv.tag_codec import fp4_read_tags, fp4_tag_bytes
from kvpool.optimized.options import TwinOptions
from kvpool.reference.kv.fp4 import check_fp4_width
from kvpool.reference.kv.kv_cache import as_scale
from kvpool.reference.kv.quant import FP4_BLOCK


class MLATokenToKVPoolFP4(KVCache):
    """FP4 fused KV per layer (see the reference)."""

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
        super().__init__(
            size,
            page_size,
            dtype,
            layer_num,
            start_layer,
            options=options,
        )
        self._set_mla_dims(kv_lora_rank, qk_rope_head_dim)
        check_fp4_width(1, self.kv_dim)
        self.store_dtype = torch.uint8
        rows = self.num_rows
        self.kv_buffer = [
            torch.zeros((rows, 1, self.kv_dim // 2), dtype=torch.uint8, device=self.device)
            for _ in range(layer_num)
        ]
        self.kv_scale_buffer = [
            torch.zeros((rows, self.kv_dim // FP4_BLOCK), dtype=torch.uint8, device=self.device)
            for _ in range(layer_num)
        ]

    def set_kv_buffer(
        self,
        layer_id: int,
        loc: IndexLike,
        cache_k: TensorLike,
        cache_v: object = None,
        k_scale: float | None = None,
        v_scale: float | None = None,
    ) -> None:
        """Quantise and store ``cache_k / k_scale`` ``(n, 1, kv_dim)`` at ``loc``; ``cache_v``
        is ignored and ``v_scale`` only checked, as every pool's. All checks first."""
        local = self._layer(layer_id)
        slots = self._slots(loc)
        ks = as_scale("k_scale", k_scale)
        as_scale("v_scale", v_scale)
        k = quantizable(self.device, "cache_k", cache_k, (slots.numel(), 1, self.kv_dim), ks)
        self._store(local, slots, k)

    def _store(self, local: int, slots: torch.Tensor, k: Rows) -> None:
        """Write rows (float32 to quantise, or their ``(packed, scales)`` bytes made already)
        at checked ``slots``."""
        packed, sf = k if isinstance(k, tuple) else fp4_quantize(k)
        self._store_all(slots, [(self.kv_buffer[local], packed), (self.kv_scale_buffer[local], sf)])

    def get_key_buffer(self, layer_id: int) -> torch.Tensor:
        """The fused buffer of ``layer_id`` dequantised: new float32 ``(rows, 1, kv_dim)``."""
        local = self._wait(layer_id)
        return fp4_dequantize(self.kv_buffer[local], self.kv_scale_buffer[local])

    def get_value_buffer(self, layer_id: int) -> torch.Tensor:
        """The first ``kv_lora_rank`` channels of the dequantised buffer."""
        return self.get_key_buffer(layer_id)[..., : self.kv_lora_rank]

    def get_kv_buffer(self, layer_id: int) -> tuple[torch.Tensor, torch.Tensor]:
        """``(get_key_buffer, get_value_buffer)``."""
        key = self.get_key_buffer(layer_id)
        return key, key[..., : self.kv_lora_rank]

    def get_raw_kv_buffer(self, layer_id: int) -> tuple[torch.Tensor, torch.Tensor]:
        """The stored tensors of ``layer_id``: ``(kv, kv_scales)``."""
        local = self._wait(layer_id)
        return self.kv_buffer[local], self.kv_scale_buffer[local]

    def move_kv_cache(self, tgt_loc: IndexLike, src_loc: IndexLike) -> None:
        """Copy bytes and scales of rows ``src_loc`` to ``tgt_loc`` on every layer."""
        self._move((*self.kv_buffer, *self.kv_scale_buffer), tgt_loc, src_loc)

    def write_tags(self, loc: IndexLike, tags: IndexLike) -> None:
        """Store each tag (``[0, TAG_LIMIT)``) in FP4 form in every held layer; slots and tags
        checked first."""
        slots = self._slots(loc)
        values = [int(t) for t in self._tags(tags, slots.numel()).tolist()]
        rows = fp4_tag_bytes(values, 1, self.kv_dim, self.device)  # once for every layer
        for local in range(self.layer_num):
            self._store(local, slots, rows)

    def read_tags(self, loc: IndexLike) -> list[int]:
        """The tag each slot stores (the first held layer; 0 if none)."""
        slots = self._slots(loc)
        flat = fp4_dequantize(self.kv_buffer[0][slots], self.kv_scale_buffer[0][slots])
        return fp4_read_tags(flat.reshape(slots.numel(), -1))

    def _snapshot_tags(self, slots: npt.NDArray[np.int64]) -> list[int]:
        """:meth:`read_tags` of a manager's own slots (:func:`fp4_snapshot_tags` of the fused
        row)."""
        return fp4_snapshot_tags(self, self.kv_buffer[0], self.kv_scale_buffer[0], slots)


__all__ = ["MLATokenToKVPoolFP4"]
