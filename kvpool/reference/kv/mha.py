"""``MHATokenToKVPool``: the reference's multi-head-attention KV buffers, K and V apart.

Per layer ``size + page_size`` rows (row = token slot), each ``[head_num][head_dim]`` floats for
K and ``[head_num][v_head_dim]`` for V (the layout and dtype rules of
:mod:`kvpool.reference.kv.kv_cache`). ``get_key_buffer`` / ``get_kv_buffer`` return the live
per-layer lists (like a tensor view), for reading: a row is replaced, never edited in place.
"""

from __future__ import annotations

from collections.abc import Sequence

from kvpool.reference.kv.kv_cache import KVCache, KVRows, LayerBuffer, as_scale


class MHATokenToKVPool(KVCache):
    """Separate K (``[head_num][head_dim]``) and V (``[head_num][v_head_dim]``) rows per layer."""

    def __init__(
        self,
        size: int,
        page_size: int,
        dtype: str,
        head_num: int,
        head_dim: int,
        layer_num: int,
        start_layer: int = 0,
        v_head_dim: int | None = None,
    ) -> None:
        super().__init__(size, page_size, dtype, layer_num, start_layer)
        self._set_mha_heads(head_num, head_dim, v_head_dim)
        self.k_buffer: list[LayerBuffer] = [self._zeros(head_dim) for _ in range(layer_num)]
        self.v_buffer: list[LayerBuffer] = [self._zeros(self.v_head_dim) for _ in range(layer_num)]

    def _zeros(self, dim: int) -> LayerBuffer:
        # one zero row in every slot: rows are replaced, never changed in place (kv_cache)
        return [[[0.0] * dim for _ in range(self.head_num)]] * self.num_rows

    def set_kv_buffer(
        self,
        layer_id: int,
        loc: Sequence[int],
        cache_k: KVRows,
        cache_v: KVRows,
        k_scale: float | None = None,
        v_scale: float | None = None,
    ) -> None:
        """Store ``cache_k / k_scale`` and ``cache_v / v_scale`` at ``loc`` of ``layer_id``.
        Everything (layer, slots, shapes and numbers, scales: finite and > 0) is validated
        before any write; inputs are never mutated."""
        local = self._layer(layer_id)
        slots = self._slots(loc)
        self._check_shape("cache_k", cache_k, len(slots), self.head_num, self.head_dim)
        self._check_shape("cache_v", cache_v, len(slots), self.head_num, self.v_head_dim)
        ks, vs = as_scale("k_scale", k_scale), as_scale("v_scale", v_scale)
        self._write(local, slots, cache_k, cache_v, 1.0 if ks is None else ks,
                    1.0 if vs is None else vs)  # fmt: skip

    def _write(
        self, local: int, slots: list[int], cache_k: KVRows, cache_v: KVRows, ks: float, vs: float
    ) -> None:
        """The write itself, on checked arguments."""
        kbuf, vbuf = self.k_buffer[local], self.v_buffer[local]
        for i, slot in enumerate(slots):
            kbuf[slot] = [[float(x) / ks for x in head] for head in cache_k[i]]
            vbuf[slot] = [[float(x) / vs for x in head] for head in cache_v[i]]

    def get_key_buffer(self, layer_id: int) -> LayerBuffer:
        """K of global layer ``layer_id``: ``size + page_size`` rows (by slot) of
        ``[head_num][head_dim]``; IndexOutOfRangeError outside the held layers."""
        return self.k_buffer[self._wait(layer_id)]

    def get_value_buffer(self, layer_id: int) -> LayerBuffer:
        """V of global layer ``layer_id``: rows (by slot) of ``[head_num][v_head_dim]``."""
        return self.v_buffer[self._wait(layer_id)]

    def get_kv_buffer(self, layer_id: int) -> tuple[LayerBuffer, LayerBuffer]:
        """``(K, V)`` of global layer ``layer_id`` (see :meth:`get_key_buffer`)."""
        local = self._wait(layer_id)
        return self.k_buffer[local], self.v_buffer[local]

    def move_kv_cache(self, tgt_loc: Sequence[int], src_loc: Sequence[int]) -> None:
        """Copy rows ``src_loc`` to ``tgt_loc`` on every layer (sources read before any write)."""
        tgt, src = self._move_pairs(tgt_loc, src_loc)
        for buf in (*self.k_buffer, *self.v_buffer):
            rows = [[list(h) for h in buf[s]] for s in src]
            for t, row in zip(tgt, rows, strict=True):
                buf[t] = row

    def write_tags(self, loc: Sequence[int], tags: Sequence[int]) -> None:
        """Write one integer tag (``[0, TAG_LIMIT)``) per slot of ``loc`` into K and V of every
        held layer; slots and tags checked first."""
        slots = self._slots(loc)
        values = self._tags(tags, len(slots))
        k_rows = self._tag_rows(values, self.head_num, self.head_dim)
        same_dim = self.v_head_dim == self.head_dim
        v_rows = k_rows if same_dim else self._tag_rows(values, self.head_num, self.v_head_dim)
        # what ``_write`` with scale 1.0 stores (x / 1.0 == x), the same rows in every layer
        for kbuf, vbuf in zip(self.k_buffer, self.v_buffer, strict=True):
            for slot, k_row, v_row in zip(slots, k_rows, v_rows, strict=True):
                kbuf[slot], vbuf[slot] = k_row, v_row

    def _tags_at(self, slots: list[int]) -> list[int]:
        """The tag stored at each of ``slots`` (K of the first held layer)."""
        buf = self.k_buffer[0]
        return [int(buf[s][0][0]) for s in slots]


__all__ = ["MHATokenToKVPool"]
