"""``MLATokenToKVPoolFP4``: MLA's fused row stored as FP4 (SGLang's ``MLATokenToKVPoolFP4``).

Per layer and slot: ``[1][kv_dim // 2]`` packed e2m1 bytes and ``kv_dim // 16`` scale bytes,
``kv_dim = kv_lora_rank + qk_rope_head_dim`` (a multiple of 16). ``set_kv_buffer`` quantises the
fused ``cache_k`` (``cache_v`` ignored, as MLA); ``get_key_buffer`` dequantises the layer,
``get_value_buffer`` is its first ``kv_lora_rank`` channels. Format and tags as
:mod:`kvpool.reference.kv.fp4`.
"""

from __future__ import annotations

from collections.abc import Sequence

from kvpool.reference.kv.fp4 import ByteRows, FP4Layer, ScaleRows, check_fp4_width, flatten
from kvpool.reference.kv.kv_cache import KVCache, LayerBuffer, as_scale
from kvpool.reference.kv.quant import check_finite
from kvpool.reference.kv.tag_codec import fp4_tag_row


class MLATokenToKVPoolFP4(KVCache):
    """FP4 fused KV per layer (see the module docstring)."""

    def __init__(
        self,
        size: int,
        page_size: int,
        kv_lora_rank: int,
        qk_rope_head_dim: int,
        layer_num: int,
        start_layer: int = 0,
        dtype: str = "float32",
    ) -> None:
        super().__init__(size, page_size, dtype, layer_num, start_layer)
        self._set_mla_dims(kv_lora_rank, qk_rope_head_dim)
        check_fp4_width(1, self.kv_dim)
        self.store_dtype = "uint8"
        self.kv_layers = [FP4Layer(self.num_rows, 1, self.kv_dim) for _ in range(layer_num)]

    def set_kv_buffer(
        self,
        layer_id: int,
        loc: Sequence[int],
        cache_k: Sequence[Sequence[Sequence[float]]],
        cache_v: object = None,
        k_scale: float | None = None,
        v_scale: float | None = None,
    ) -> None:
        """Quantise and store ``cache_k / k_scale`` (``[n][1][kv_dim]``) at slots ``loc``;
        ``cache_v`` is ignored and ``v_scale`` only checked, as every pool's. The layer, slots,
        shape, scales and the finiteness of the scaled values are checked before any write."""
        local = self._layer(layer_id)
        slots = self._slots(loc)
        self._check_shape("cache_k", cache_k, len(slots), 1, self.kv_dim)
        k_div = as_scale("k_scale", k_scale)
        as_scale("v_scale", v_scale)
        rows = [flatten(r, k_div) for r in cache_k]
        for flat in rows:
            check_finite(flat)
        self._store(local, slots, rows)

    def _store(self, local: int, slots: list[int], rows: list[list[float]]) -> None:
        for slot, flat in zip(slots, rows, strict=True):
            self.kv_layers[local]._store(slot, flat)

    def get_key_buffer(self, layer_id: int) -> LayerBuffer:
        """The fused buffer of ``layer_id`` dequantised: rows of ``[1][kv_dim]`` (fresh)."""
        return self.kv_layers[self._wait(layer_id)].dequantized()

    def get_value_buffer(self, layer_id: int) -> LayerBuffer:
        """The first ``kv_lora_rank`` channels of each dequantised row."""
        return [[row[0][: self.kv_lora_rank]] for row in self.get_key_buffer(layer_id)]

    def get_kv_buffer(self, layer_id: int) -> tuple[LayerBuffer, LayerBuffer]:
        """``(get_key_buffer, get_value_buffer)`` of global layer ``layer_id``."""
        key = self.get_key_buffer(layer_id)
        return key, [[row[0][: self.kv_lora_rank]] for row in key]

    def get_raw_kv_buffer(self, layer_id: int) -> tuple[ByteRows, ScaleRows]:
        """The stored bytes of ``layer_id``: ``(kv, kv_scales)`` (live lists)."""
        layer = self.kv_layers[self._wait(layer_id)]
        return layer.data, layer.scales

    def move_kv_cache(self, tgt_loc: Sequence[int], src_loc: Sequence[int]) -> None:
        """Copy bytes and scales of rows ``src_loc`` to ``tgt_loc`` on every layer."""
        tgt, src = self._move_pairs(tgt_loc, src_loc)
        for layer in self.kv_layers:
            layer._move(tgt, src)

    def write_tags(self, loc: Sequence[int], tags: Sequence[int]) -> None:
        """Store each tag (``[0, TAG_LIMIT)``) in FP4 form in every held layer; slots and tags
        checked first."""
        slots = self._slots(loc)
        # a tag row holds e2m1 grid values, exact in float32 (what ``flatten`` would round to),
        # and every layer stores the same bytes: each row is quantised once
        rows = [self.kv_layers[0]._quantized(fp4_tag_row(t, self.kv_dim))
                for t in self._tags(tags, len(slots))]  # fmt: skip
        for layer in self.kv_layers:
            for slot, row in zip(slots, rows, strict=True):
                layer._put(slot, row)

    def _tags_at(self, slots: list[int]) -> list[int]:
        """The tag each slot stores (the first held layer; 0 if none)."""
        # the tag lives in the first scale block (kvpool.reference.kv.tag_codec)
        return self.kv_layers[0]._tags_of(slots)


__all__ = ["MLATokenToKVPoolFP4"]
