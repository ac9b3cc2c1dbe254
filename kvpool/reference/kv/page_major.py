"""``PageMajorMHATokenToKVPool``: all layers' K and V in one raw buffer, page-major and
layer-major within a page (SGLang's ``PageMajorMHATokenToKVPool``, ``layout/page_major.py``).

The raw buffer is ``num_pages = (size + page_size) // page_size`` pages of
``page_size * layer_num * (K + V)`` float32 items (``K = head_num * head_dim``,
``V = head_num * v_head_dim``)::

    page p = [L0 K: ps rows of K | L0 V: ps rows of V | L1 K | L1 V | ...]

Token ``t`` is page ``t // page_size``, slot ``t % page_size``; its layer-``l`` K row starts at
item ``p * page_items + l * ps * (K + V) + slot * K`` and its V row ``ps * K`` items later.
Per-layer views (:class:`PageMajorView`) are strided windows over the one buffer: strides
``(page_items, K, head_dim, 1)`` for K (``V``, ``v_head_dim`` for V). Items are float32 (rounded
on write), so :meth:`PageMajorMHATokenToKVPool.raw_bytes` equals the twin's ``uint8`` buffer.
Only ``float32`` storage is modelled (ConfigError otherwise); ``size`` must be a multiple of
``page_size``. Tags as :class:`~kvpool.reference.kv.mha.MHATokenToKVPool` (channel 0).
"""

from __future__ import annotations

import struct
from collections.abc import Iterator, Sequence

from kvpool.errors import ConfigError, IndexOutOfRangeError
from kvpool.host_checks import as_int
from kvpool.reference.kv.kv_cache import KVCache, Row, as_scale, check_rows
from kvpool.reference.kv.quant import div32, f32_all


class PageMajorView:
    """Layer ``l``'s K (or V) as a strided window over the raw list; indexed by token slot."""

    def __init__(
        self, raw: list[float], base: int, page_items: int, row: int, head_dim: int, ps: int
    ) -> None:
        self.raw, self.base, self.row_items, self.head_dim, self.page_size = (
            raw, base, row, head_dim, ps)  # fmt: skip
        self.stride = (page_items, row, head_dim, 1)
        self.num_pages = len(raw) // page_items
        self.shape = (self.num_pages, ps, row // head_dim, head_dim)

    def offset(self, token: int) -> int:
        """Raw item index where token ``token``'s row starts (``token``: an integer in
        ``0..len(self) - 1``, else InvalidArgumentError / IndexOutOfRangeError)."""
        return self._offset(self._token(token))

    def _token(self, token: object) -> int:
        out = as_int("token", token)
        if not 0 <= out < len(self):
            raise IndexOutOfRangeError(f"token {out} outside 0..{len(self) - 1}")
        return out

    def _offset(self, token: int) -> int:
        page, slot = divmod(token, self.page_size)
        return self.base + page * self.stride[0] + slot * self.stride[1]

    def __len__(self) -> int:
        return self.num_pages * self.page_size

    def __getitem__(self, token: int) -> Row:
        start = self._offset(token)
        d = self.head_dim
        return [self.raw[start + h * d : start + (h + 1) * d] for h in range(self.shape[2])]

    def __iter__(self) -> Iterator[Row]:
        return (self[t] for t in range(len(self)))

    def write(self, token: int, values: Sequence[float]) -> None:
        """Store ``values`` (the row's ``head_num * head_dim`` reals, heads flattened) as token
        ``token``'s row, rounded to float32; all checks first."""
        index = self._token(token)
        check_rows("values", [[values]], 1, 1, self.row_items)
        self._write(index, f32_all([float(x) for x in values]))

    def _write(self, token: int, values: Sequence[float]) -> None:
        start = self._offset(token)
        self.raw[start : start + self.row_items] = values


class PageMajorMHATokenToKVPool(KVCache):
    """One raw buffer, per-layer strided K/V views (see the module docstring)."""

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
        v_dim = self.v_head_dim
        if dtype != "float32":
            raise ConfigError("the page-major pool models float32 storage only")
        if size % page_size:
            raise ConfigError("page-major needs size + page_size divisible by page_size")
        k_row, v_row = head_num * head_dim, head_num * v_dim
        self.num_pages = self.num_rows // page_size
        self.page_items = page_size * layer_num * (k_row + v_row)
        self._raw: list[float] = [0.0] * (self.num_pages * self.page_items)
        self.k_buffer: list[PageMajorView] = []
        self.v_buffer: list[PageMajorView] = []
        for layer in range(layer_num):
            k_base = layer * page_size * (k_row + v_row)
            self.k_buffer.append(
                PageMajorView(self._raw, k_base, self.page_items, k_row, head_dim, page_size)
            )
            v_base = k_base + page_size * k_row
            self.v_buffer.append(
                PageMajorView(self._raw, v_base, self.page_items, v_row, v_dim, page_size)
            )
        # where each token's tag lives (``read_tags``): channel 0 of head 0 of its K row on the
        # first held layer is the row's first raw item, at the view's ``_offset``
        first_k = self.k_buffer[0]
        self._tag_items: list[int] = list(map(first_k._offset, range(len(first_k))))

    def raw_bytes(self) -> bytes:
        """The raw buffer as little-endian float32 bytes (what the twin's ``_raw`` holds)."""
        return struct.pack(f"<{len(self._raw)}f", *self._raw)

    def set_kv_buffer(
        self,
        layer_id: int,
        loc: Sequence[int],
        cache_k: Sequence[Sequence[Sequence[float]]],
        cache_v: Sequence[Sequence[Sequence[float]]],
        k_scale: float | None = None,
        v_scale: float | None = None,
    ) -> None:
        """Store ``cache_k / k_scale`` and ``cache_v / v_scale`` (float32) at tokens ``loc`` of
        ``layer_id``, through the layer's strided views. All checks (layer, slots, shapes and
        numbers, scales finite and > 0 or None) before any write."""
        local = self._layer(layer_id)
        slots = self._slots(loc)
        self._check_shape("cache_k", cache_k, len(slots), self.head_num, self.head_dim)
        self._check_shape("cache_v", cache_v, len(slots), self.head_num, self.v_head_dim)
        k_div, v_div = as_scale("k_scale", k_scale), as_scale("v_scale", v_scale)
        ks = [[div32(float(x), k_div) for h in r for x in h] for r in cache_k]
        vs = [[div32(float(x), v_div) for h in r for x in h] for r in cache_v]
        self._store(local, slots, ks, vs)

    def _store(
        self, local: int, slots: list[int], ks: list[list[float]], vs: list[list[float]]
    ) -> None:
        for slot, k, v in zip(slots, ks, vs, strict=True):
            self.k_buffer[local]._write(slot, k)
            self.v_buffer[local]._write(slot, v)

    def get_key_buffer(self, layer_id: int) -> PageMajorView:
        """Layer ``layer_id``'s K view: ``view[t]`` is token ``t``'s ``[head_num][head_dim]``."""
        return self.k_buffer[self._wait(layer_id)]

    def get_value_buffer(self, layer_id: int) -> PageMajorView:
        """Layer ``layer_id``'s V view (``[head_num][v_head_dim]`` per token)."""
        return self.v_buffer[self._wait(layer_id)]

    def get_kv_buffer(self, layer_id: int) -> tuple[PageMajorView, PageMajorView]:
        """``(K view, V view)`` of global layer ``layer_id``."""
        local = self._wait(layer_id)
        return self.k_buffer[local], self.v_buffer[local]

    def move_kv_cache(self, tgt_loc: Sequence[int], src_loc: Sequence[int]) -> None:
        """Copy tokens ``src_loc`` to ``tgt_loc`` on every layer (sources read first)."""
        tgt, src = self._move_pairs(tgt_loc, src_loc)
        for view in (*self.k_buffer, *self.v_buffer):
            rows = [[x for h in view[s] for x in h] for s in src]
            for t, row in zip(tgt, rows, strict=True):
                view._write(t, row)

    def write_tags(self, loc: Sequence[int], tags: Sequence[int]) -> None:
        """Tag (``[0, TAG_LIMIT)``) in channel 0 of every head of K and V on every held layer
        (others 0.0); slots and tags checked first."""
        slots = self._slots(loc)
        values = self._tags(tags, len(slots))
        k_rows = self._tag_rows(values, self.head_num, self.head_dim)
        v_rows = self._tag_rows(values, self.head_num, self.v_head_dim)
        # a tag (< 2**24) and 0.0 are exact in float32: the rows need no rounding (div32)
        ks = [[x for h in r for x in h] for r in k_rows]
        vs = [[x for h in r for x in h] for r in v_rows]
        for local in range(self.layer_num):
            self._store(local, slots, ks, vs)

    def _tags_at(self, slots: list[int]) -> list[int]:
        """The tag stored at each token of ``slots`` (K of the first held layer)."""
        # ``view[s][0][0]`` read straight from the raw list, without building the row's heads
        raw, items = self._raw, self._tag_items
        return [int(raw[items[s]]) for s in slots]


__all__ = ["PageMajorMHATokenToKVPool", "PageMajorView"]
