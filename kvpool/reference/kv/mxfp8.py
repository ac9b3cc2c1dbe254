"""``MHATokenToKVPoolMXFP8``: MHA KV stored as float8 e4m3fn with one power-of-two (UE8M0) scale
byte per 32 channels of a head (SGLang's ``MHATokenToKVPoolMXFP8``; the format:
:mod:`kvpool.reference.kv.quant`).

Per layer and slot: K ``[head_num][head_dim]`` e4m3 bytes and ``[head_num][head_dim // 32]``
scale bytes; V the same with ``v_head_dim``; both dims multiples of 32 (else ConfigError, as
SGLang). Scales are kept flat per slot (SGLang interleaves them for FA4 when ``page_size == 128``;
the bytes are the same, only their order differs, and that order is not modelled).

``set_kv_buffer`` takes float K/V and quantises them with SGLang's MXFP8 recipe (its fused
quantise-and-store path; the variant where the caller passes pre-quantised data and scale
tensors is not modelled), after dividing by ``k_scale`` / ``v_scale`` when given. Reads
dequantise (fresh lists); ``get_raw_kv_buffer`` returns the bytes, ``get_kv_scale_buffer`` the
scales. Tags use the MXFP8 encoding of :mod:`kvpool.reference.kv.tag_codec` in every head.
"""

from __future__ import annotations

from collections.abc import Sequence
from functools import lru_cache
from operator import itemgetter

from kvpool.errors import ConfigError, IndexOutOfRangeError
from kvpool.host_checks import as_int
from kvpool.reference.kv.kv_cache import (
    KVCache,
    LayerBuffer,
    as_scale,
    check_rows,
    layer_move_pairs,
)
from kvpool.reference.kv.quant import (
    MXFP8_BLOCK,
    check_finite,
    div32_all,
    mxfp8_dequantize_head,
    mxfp8_quantize_head,
)
from kvpool.reference.kv.tag_codec import mxfp8_read_tag, mxfp8_tag_head

ByteRows = list[list[list[int]]]
"""One layer's bytes (values or scales): ``[rows][heads][n]``."""


class MXFP8Layer:
    """e4m3 bytes and UE8M0 scales of K or V on one layer: ``rows`` slots of ``heads`` heads of
    ``dim`` channels. The public methods check their arguments (a slot is an integer in
    ``0..rows - 1``; a row ``[heads][dim]`` finite reals) before any change; the pool, which
    checks once per call, uses the unchecked ``_store``, ``_put`` and ``_move``. A row is
    replaced, never edited in place (:mod:`kvpool.reference.kv.kv_cache`)."""

    def __init__(self, rows: int, heads: int, dim: int) -> None:
        self.heads, self.dim = heads, dim
        # one zero row in every slot: rows are replaced, never changed in place (kv_cache)
        self.data: ByteRows = [[[0] * dim for _ in range(heads)]] * rows
        self.scales: ByteRows = [[[0] * (dim // MXFP8_BLOCK) for _ in range(heads)]] * rows

    def _slot(self, name: str, slot: object) -> int:
        out = as_int(name, slot)
        if not 0 <= out < len(self.data):
            raise IndexOutOfRangeError(f"{name} {out} outside 0..{len(self.data) - 1}")
        return out

    def store(self, slot: int, row: Sequence[Sequence[float]]) -> None:
        """Quantise ``row`` (``[heads][dim]`` finite reals) into row ``slot``."""
        index = self._slot("slot", slot)
        check_rows("row", [row], 1, self.heads, self.dim)
        self._store(index, _scaled(row, None))

    def _store(self, slot: int, row: Sequence[Sequence[float]]) -> None:
        self._put(slot, self._quantized(row))

    def _quantized(self, row: Sequence[Sequence[float]]) -> tuple[list[list[int]], list[list[int]]]:
        """``row`` (``[heads][dim]`` finite float32 values) quantised: its e4m3 bytes and its
        scale bytes, both ``[heads][n]``."""
        quantized = [mxfp8_quantize_head(head) for head in row]
        return [codes for codes, _ in quantized], [scales for _, scales in quantized]

    def _put(self, slot: int, row: tuple[list[list[int]], list[list[int]]]) -> None:
        """Store a :meth:`_quantized` row in slot ``slot`` (the lists themselves, so a row
        quantised once may stand in many layers: rows are never changed in place)."""
        self.data[slot], self.scales[slot] = row

    def row(self, slot: int) -> list[list[float]]:
        """Row ``slot`` dequantised: ``[heads][dim]`` floats."""
        return self._row(self._slot("slot", slot))

    def _row(self, slot: int) -> list[list[float]]:
        data, scales = self.data[slot], self.scales[slot]
        return [list(_head_values(tuple(c), tuple(s))) for c, s in zip(data, scales, strict=True)]

    def dequantized(self) -> LayerBuffer:
        """Every row dequantised: ``[rows][heads][dim]`` floats (a fresh list)."""
        return [self._row(s) for s in range(len(self.data))]

    def move(self, tgt: Sequence[int], src: Sequence[int]) -> None:
        """Copy rows ``src`` to ``tgt`` (as many of each, slots in range, no target twice);
        sources read before any write."""
        targets, sources = layer_move_pairs(len(self.data), tgt, src)
        self._move(targets, sources)

    def _move(self, tgt: Sequence[int], src: Sequence[int]) -> None:
        rows = [([list(h) for h in self.data[s]], [list(h) for h in self.scales[s]]) for s in src]
        for t, (data, scales) in zip(tgt, rows, strict=True):
            self.data[t], self.scales[t] = data, scales


def _scaled(row: Sequence[Sequence[float]], scale: float | None) -> list[list[float]]:
    out = [div32_all([float(x) for x in head], scale) for head in row]
    for head in out:
        check_finite(head)
    return out


class MHATokenToKVPoolMXFP8(KVCache):
    """MXFP8 K and V per layer (see the module docstring)."""

    MXFP8_SCALE_BLOCK_SIZE = MXFP8_BLOCK

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
        if head_dim % MXFP8_BLOCK or v_dim % MXFP8_BLOCK:
            raise ConfigError(f"MXFP8 needs head_dim and v_head_dim divisible by {MXFP8_BLOCK}")
        self.store_dtype = "float8_e4m3fn"
        self.k_layers = [MXFP8Layer(self.num_rows, head_num, head_dim) for _ in range(layer_num)]
        self.v_layers = [MXFP8Layer(self.num_rows, head_num, v_dim) for _ in range(layer_num)]

    def set_kv_buffer(
        self,
        layer_id: int,
        loc: Sequence[int],
        cache_k: Sequence[Sequence[Sequence[float]]],
        cache_v: Sequence[Sequence[Sequence[float]]],
        k_scale: float | None = None,
        v_scale: float | None = None,
    ) -> None:
        """Quantise and store ``cache_k / k_scale`` (``[n][head_num][head_dim]``) and
        ``cache_v / v_scale`` (``[n][head_num][v_head_dim]``) at ``loc``; all checks (layer,
        slots, shapes, scales, finite scaled values) first."""
        local = self._layer(layer_id)
        slots = self._slots(loc)
        self._check_shape("cache_k", cache_k, len(slots), self.head_num, self.head_dim)
        self._check_shape("cache_v", cache_v, len(slots), self.head_num, self.v_head_dim)
        k_div, v_div = as_scale("k_scale", k_scale), as_scale("v_scale", v_scale)
        ks = [_scaled(r, k_div) for r in cache_k]
        vs = [_scaled(r, v_div) for r in cache_v]
        self._store(local, slots, ks, vs)

    def _store(
        self, local: int, slots: list[int], ks: list[list[list[float]]], vs: list[list[list[float]]]
    ) -> None:
        for slot, k, v in zip(slots, ks, vs, strict=True):
            self.k_layers[local]._store(slot, k)
            self.v_layers[local]._store(slot, v)

    def get_key_buffer(self, layer_id: int) -> LayerBuffer:
        """K of ``layer_id`` dequantised: rows of ``[head_num][head_dim]`` (fresh)."""
        return self.k_layers[self._wait(layer_id)].dequantized()

    def get_value_buffer(self, layer_id: int) -> LayerBuffer:
        """V of ``layer_id`` dequantised: rows of ``[head_num][v_head_dim]`` (fresh)."""
        return self.v_layers[self._wait(layer_id)].dequantized()

    def get_kv_buffer(self, layer_id: int) -> tuple[LayerBuffer, LayerBuffer]:
        """``(get_key_buffer, get_value_buffer)`` of global layer ``layer_id``."""
        return self.get_key_buffer(layer_id), self.get_value_buffer(layer_id)

    def get_raw_kv_buffer(self, layer_id: int) -> tuple[ByteRows, ByteRows]:
        """The e4m3 bytes of ``layer_id``: ``(k, v)`` (live lists)."""
        local = self._wait(layer_id)
        return self.k_layers[local].data, self.v_layers[local].data

    def get_kv_scale_buffer(self, layer_id: int) -> tuple[ByteRows, ByteRows]:
        """The UE8M0 scale bytes of ``layer_id``: ``(k_scales, v_scales)`` (live lists)."""
        local = self._layer(layer_id)
        return self.k_layers[local].scales, self.v_layers[local].scales

    def move_kv_cache(self, tgt_loc: Sequence[int], src_loc: Sequence[int]) -> None:
        """Copy bytes and scales of rows ``src_loc`` to ``tgt_loc`` on every layer."""
        tgt, src = self._move_pairs(tgt_loc, src_loc)
        for layer in (*self.k_layers, *self.v_layers):
            layer._move(tgt, src)

    def write_tags(self, loc: Sequence[int], tags: Sequence[int]) -> None:
        """Store each tag (``[0, TAG_LIMIT)``) in MXFP8 form in every head of K and V of every
        held layer; slots and tags checked first."""
        slots = self._slots(loc)
        values = self._tags(tags, len(slots))
        # a tag head holds integers up to 448, exact (and finite) in float32: what ``_scaled``
        # would round to; every layer stores the same bytes, so each row is quantised once
        quantize_k, quantize_v = self.k_layers[0]._quantized, self.v_layers[0]._quantized
        k = [quantize_k([mxfp8_tag_head(t, self.head_dim)] * self.head_num) for t in values]
        v = [quantize_v([mxfp8_tag_head(t, self.v_head_dim)] * self.head_num) for t in values]
        for k_layer, v_layer in zip(self.k_layers, self.v_layers, strict=True):
            for slot, k_row, v_row in zip(slots, k, v, strict=True):
                k_layer._put(slot, k_row)
                v_layer._put(slot, v_row)

    def _tags_at(self, slots: list[int]) -> list[int]:
        """The tag each slot stores (head 0 of K on the first held layer; 0 if none)."""
        # the tag lives in head 0's first scale block (kvpool.reference.kv.tag_codec)
        layer = self.k_layers[0]
        # (in C, per slot: head 0's first block of codes as a tuple, and its scale)
        heads = map(_FIRST, map(layer.data.__getitem__, slots))
        # (a head of exactly one block, the usual width, is the block as it is)
        firsts = (
            heads if layer.dim == MXFP8_BLOCK else map(itemgetter(slice(0, MXFP8_BLOCK)), heads)
        )
        codes = map(tuple, firsts)
        scales = map(_FIRST, map(_FIRST, map(layer.scales.__getitem__, slots)))
        return list(map(_block_tag, codes, scales))


_FIRST = itemgetter(0)
"""A row's first head, a head's first scale."""


@lru_cache(maxsize=4096)
def _block_tag(codes: tuple[int, ...], scale: int) -> int:
    """The tag of head 0's first block (32 e4m3 bytes, one scale byte): a pure function of
    them, memoised because the lockstep harness reads every committed slot's tag after every
    step."""
    return mxfp8_read_tag(mxfp8_dequantize_head(codes, (scale,)))


@lru_cache(maxsize=1024)
def _head_values(codes: tuple[int, ...], scales: tuple[int, ...]) -> tuple[float, ...]:
    """A stored head dequantised: a pure function of its bytes, memoised because a layer read
    dequantises every head and most heads hold zeros or a tag."""
    return tuple(mxfp8_dequantize_head(codes, scales))


__all__ = ["MHATokenToKVPoolMXFP8"]
