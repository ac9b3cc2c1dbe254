"""``MLATokenToKVPool``: the reference's multi-head latent attention KV buffer, one fused row.

Per layer ``size + page_size`` rows (row = token slot) of ``[1][kv_lora_rank +
qk_rope_head_dim]`` floats; the value is the first ``kv_lora_rank`` channels, so
``set_kv_buffer`` ignores ``cache_v`` and ``get_value_buffer`` returns a fresh list of those
channels (the reference has no views). Layout and dtype rules: :mod:`kvpool.reference.kv.kv_cache`.
"""

from __future__ import annotations

from collections.abc import Sequence

from kvpool.reference.kv.kv_cache import KVCache, KVRows, LayerBuffer, as_scale


class MLATokenToKVPool(KVCache):
    """One fused row ``[1][kv_lora_rank + qk_rope_head_dim]`` per slot and layer; V is its first
    ``kv_lora_rank`` channels, so ``set_kv_buffer`` ignores ``cache_v``."""

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
        # one zero row in every slot: rows are replaced, never changed in place (kv_cache)
        self.kv_buffer: list[LayerBuffer] = [
            [[[0.0] * self.kv_dim]] * self.num_rows for _ in range(layer_num)
        ]

    def set_kv_buffer(
        self,
        layer_id: int,
        loc: Sequence[int],
        cache_k: KVRows,
        cache_v: object = None,
        k_scale: float | None = None,
        v_scale: float | None = None,
    ) -> None:
        """Store ``cache_k / k_scale`` ([n][1][kv_lora_rank + qk_rope_head_dim]) at ``loc``;
        ``cache_v`` is ignored and ``v_scale`` only checked (finite and > 0, or None), as every
        pool's. Everything is validated before any write."""
        local = self._layer(layer_id)
        slots = self._slots(loc)
        self._check_shape("cache_k", cache_k, len(slots), 1, self.kv_dim)
        ks = as_scale("k_scale", k_scale)
        as_scale("v_scale", v_scale)
        self._write(local, slots, cache_k, 1.0 if ks is None else ks)

    def _write(self, local: int, slots: list[int], cache_k: KVRows, ks: float) -> None:
        """The write itself, on checked arguments."""
        buf = self.kv_buffer[local]
        for i, slot in enumerate(slots):
            buf[slot] = [[float(x) / ks for x in cache_k[i][0]]]

    def get_key_buffer(self, layer_id: int) -> LayerBuffer:
        """The fused buffer of global layer ``layer_id``: rows (by slot) of
        ``[1][kv_lora_rank + qk_rope_head_dim]``."""
        return self.kv_buffer[self._wait(layer_id)]

    def get_value_buffer(self, layer_id: int) -> LayerBuffer:
        """The first ``kv_lora_rank`` channels of each row (a copy; the reference has no views)."""
        buf = self.kv_buffer[self._wait(layer_id)]
        return [[row[0][: self.kv_lora_rank]] for row in buf]

    def get_kv_buffer(self, layer_id: int) -> tuple[LayerBuffer, LayerBuffer]:
        """``(get_key_buffer, get_value_buffer)`` of global layer ``layer_id``."""
        return self.get_key_buffer(layer_id), self.get_value_buffer(layer_id)

    def move_kv_cache(self, tgt_loc: Sequence[int], src_loc: Sequence[int]) -> None:
        """Copy rows ``src_loc`` to ``tgt_loc`` on every layer (sources read before any write)."""
        tgt, src = self._move_pairs(tgt_loc, src_loc)
        for buf in self.kv_buffer:
            rows = [[list(buf[s][0])] for s in src]
            for t, row in zip(tgt, rows, strict=True):
                buf[t] = row

    def write_tags(self, loc: Sequence[int], tags: Sequence[int]) -> None:
        """Write one integer tag (``[0, TAG_LIMIT)``) per slot of ``loc`` into every held layer;
        slots and tags checked first."""
        slots = self._slots(loc)
        rows = self._tag_rows(self._tags(tags, len(slots)), 1, self.kv_dim)
        # what ``_write`` with scale 1.0 stores (x / 1.0 == x), the same rows in every layer
        for buf in self.kv_buffer:
            for slot, row in zip(slots, rows, strict=True):
                buf[slot] = row

    def _tags_at(self, slots: list[int]) -> list[int]:
        """The tag stored at each of ``slots`` (the first held layer)."""
        buf = self.kv_buffer[0]
        return [int(buf[s][0][0]) for s in slots]


__all__ = ["MLATokenToKVPool"]
