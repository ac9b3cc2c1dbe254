"""``MHATokenToKVPoolFP4``: MHA KV stored as FP4 (e2m1, two values a byte) with one scale byte per
16 values (SGLang's ``MHATokenToKVPoolFP4``; the format: :mod:`kvpool.reference.kv.quant`).

Per layer and slot (row), K keeps ``[head_num][head_dim // 2]`` packed bytes and
``(head_num * head_dim) // 16`` scale bytes; V the same (SGLang sizes V with ``head_dim``, so
``v_head_dim`` must equal it). Scale blocks run over the token's heads flattened. All buffers start
at byte 0, which dequantises to 0.0.

- ``set_kv_buffer`` quantises ``cache_k / k_scale`` and ``cache_v / v_scale`` (float32
  arithmetic; the inputs are never mutated, where SGLang divides them in place); validates the
  layer, slots, shapes and finiteness before any write.
- ``get_key_buffer`` / ``get_value_buffer`` return the layer dequantised (a fresh
  ``[rows][head_num][head_dim]`` list, as SGLang returns a new tensor); ``get_raw_kv_buffer``
  the stored bytes ``(k, v, k_scales, v_scales)`` (live lists, for reading).
- Tags use the FP4 encoding of :mod:`kvpool.reference.kv.tag_codec`.
"""

from __future__ import annotations

from collections.abc import Sequence
from functools import lru_cache
from itertools import chain, islice
from operator import itemgetter

from kvpool.errors import ConfigError, IndexOutOfRangeError
from kvpool.host_checks import as_int
from kvpool.reference.kv.kv_cache import (
    KVCache,
    LayerBuffer,
    Row,
    as_scale,
    check_rows,
    layer_move_pairs,
)
from kvpool.reference.kv.quant import (
    FP4_BLOCK,
    check_finite,
    div32_all,
    fp4_dequantize_row,
    fp4_quantize_row,
)
from kvpool.reference.kv.tag_codec import fp4_read_tag, fp4_tag_row

ByteRows = list[list[list[int]]]
"""One layer's packed bytes: ``[rows][heads][dim // 2]``."""
ScaleRows = list[list[int]]
"""One layer's scale bytes: ``[rows][heads * dim // 16]``."""


def flatten(row: Sequence[Sequence[float]], scale: float | None) -> list[float]:
    """A ``[heads][dim]`` row as one float32 list, divided by ``scale`` when given
    (``div32`` of each value, the row converted in one go)."""
    return div32_all([float(x) for head in row for x in head], scale)


def unflatten(values: Sequence[float], heads: int, dim: int) -> Row:
    """A flat list back to ``[heads][dim]``."""
    return [list(values[h * dim : (h + 1) * dim]) for h in range(heads)]


def pack_rows(packed: Sequence[int], heads: int) -> list[list[int]]:
    """Packed bytes of one token as ``[heads][dim // 2]``."""
    per = len(packed) // heads
    return [list(packed[h * per : (h + 1) * per]) for h in range(heads)]


class FP4Layer:
    """Packed bytes and scales of one tensor (K, V or MLA's fused row) on one layer: ``rows``
    slots of ``heads * dim`` values each. The public methods check their arguments (a slot is
    an integer in ``0..rows - 1``; a row ``heads * dim`` finite reals) before any change; the
    pools, which check once per call, use the unchecked ``_store``, ``_put`` and ``_move``.
    A row is replaced, never edited in place (:mod:`kvpool.reference.kv.kv_cache`)."""

    def __init__(self, rows: int, heads: int, dim: int) -> None:
        self.heads, self.dim = heads, dim
        # one zero row in every slot: rows are replaced, never changed in place (kv_cache)
        self.data: ByteRows = [[[0] * (dim // 2) for _ in range(heads)]] * rows
        self.scales: ScaleRows = [[0] * (heads * dim // FP4_BLOCK)] * rows

    def _slot(self, name: str, slot: object) -> int:
        out = as_int(name, slot)
        if not 0 <= out < len(self.data):
            raise IndexOutOfRangeError(f"{name} {out} outside 0..{len(self.data) - 1}")
        return out

    def store(self, slot: int, flat: Sequence[float]) -> None:
        """Quantise ``flat`` (``heads * dim`` finite reals, the token's heads flattened) into
        row ``slot``."""
        index = self._slot("slot", slot)
        check_rows("flat", [[flat]], 1, 1, self.heads * self.dim)
        values = [float(x) for x in flat]
        check_finite(values)
        self._store(index, values)

    def _store(self, slot: int, flat: Sequence[float]) -> None:
        self._put(slot, self._quantized(flat))

    def _quantized(self, flat: Sequence[float]) -> tuple[list[list[int]], list[int]]:
        """``flat`` (``heads * dim`` finite float32 values) quantised: its packed bytes as
        ``[heads][dim // 2]`` and its scale bytes."""
        packed, scales = fp4_quantize_row(flat)
        return pack_rows(packed, self.heads), scales

    def _put(self, slot: int, row: tuple[list[list[int]], list[int]]) -> None:
        """Store a :meth:`_quantized` row in slot ``slot`` (the lists themselves, so a row
        quantised once may stand in many layers: rows are never changed in place)."""
        self.data[slot], self.scales[slot] = row

    def flat(self, slot: int) -> list[float]:
        """Row ``slot`` dequantised: ``heads * dim`` floats."""
        return self._flat(self._slot("slot", slot))

    def _flat(self, slot: int) -> list[float]:
        packed = tuple(chain.from_iterable(self.data[slot]))  # the heads' bytes in order
        return list(_row_values(packed, tuple(self.scales[slot])))

    def tag(self, slot: int) -> int:
        """The tag row ``slot`` stores: :func:`fp4_read_tag` of :meth:`flat`, which reads only
        the first scale block, so only its bytes and scale are decoded."""
        return self._tag(self._slot("slot", slot))

    def _tag(self, slot: int) -> int:
        data = self.data[slot]
        head = data[0]
        if len(head) >= FP4_BLOCK // 2:
            packed = tuple(head[: FP4_BLOCK // 2])
        else:  # heads narrower than a block: the block runs over several
            packed = tuple(islice(chain.from_iterable(data), FP4_BLOCK // 2))
        return _block_tag(packed, self.scales[slot][0])

    def _tags_of(self, slots: Sequence[int]) -> list[int]:
        """:meth:`_tag` of each of ``slots`` (in range), in one call for a whole read."""
        half = FP4_BLOCK // 2
        data, scales = self.data, self.scales
        heads = list(map(_FIRST, map(data.__getitem__, slots)))
        widths = set(map(len, heads))
        if widths and min(widths) >= half:  # every first head spans the block
            # (first heads of exactly one block, the usual widths, are the block as they are)
            firsts = heads if widths == {half} else map(itemgetter(slice(0, half)), heads)
            blocks = map(tuple, firsts)
            return list(map(_block_tag, blocks, map(_FIRST, map(scales.__getitem__, slots))))
        out: list[int] = []
        append = out.append
        for slot in slots:
            rows = data[slot]
            head = rows[0]
            if len(head) >= half:
                packed = tuple(head[:half])
            else:  # heads narrower than a block: the block runs over several
                packed = tuple(islice(chain.from_iterable(rows), half))
            append(_block_tag(packed, scales[slot][0]))
        return out

    def dequantized(self) -> LayerBuffer:
        """Every row dequantised: ``[rows][heads][dim]`` floats (a fresh list)."""
        return [unflatten(self._flat(s), self.heads, self.dim) for s in range(len(self.data))]

    def move(self, tgt: Sequence[int], src: Sequence[int]) -> None:
        """Copy rows ``src`` to ``tgt`` (as many of each, slots in range, no target twice);
        sources read before any write."""
        targets, sources = layer_move_pairs(len(self.data), tgt, src)
        self._move(targets, sources)

    def _move(self, tgt: Sequence[int], src: Sequence[int]) -> None:
        rows = [([list(h) for h in self.data[s]], list(self.scales[s])) for s in src]
        for t, (data, scales) in zip(tgt, rows, strict=True):
            self.data[t], self.scales[t] = data, scales


_FIRST = itemgetter(0)
"""A row's first head / first scale."""


@lru_cache(maxsize=4096)
def _block_tag(packed: tuple[int, ...], scale: int) -> int:
    """The tag of a first block (8 packed bytes, one scale byte): a pure function of them,
    memoised because the lockstep harness reads every committed slot's tag after every step."""
    return fp4_read_tag(fp4_dequantize_row(packed, (scale,)))


@lru_cache(maxsize=1024)
def _row_values(packed: tuple[int, ...], scales: tuple[int, ...]) -> tuple[float, ...]:
    """A stored row dequantised: a pure function of its bytes, memoised because a layer read
    dequantises every row and most rows hold zeros or a tag."""
    return tuple(fp4_dequantize_row(packed, scales))


FP4_V_HEAD_DIM_ERROR = "the FP4 pool sizes V with head_dim: v_head_dim must equal it"
"""The ConfigError message for an FP4 pool given a ``v_head_dim`` other than ``head_dim``."""


def check_fp4_width(heads: int, dim: int) -> None:
    """ConfigError unless ``dim`` is even and ``heads * dim`` a multiple of 16."""
    if dim % 2 or (heads * dim) % FP4_BLOCK:
        raise ConfigError(
            f"FP4 needs an even head_dim and head_num * head_dim divisible by {FP4_BLOCK}"
        )


class MHATokenToKVPoolFP4(KVCache):
    """FP4 K and V per layer (see the module docstring)."""

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
        self._set_mha_heads(head_num, head_dim, v_head_dim, v_sized_by_k=FP4_V_HEAD_DIM_ERROR)
        check_fp4_width(head_num, head_dim)
        self.store_dtype = "uint8"
        self.k_layers = [FP4Layer(self.num_rows, head_num, head_dim) for _ in range(layer_num)]
        self.v_layers = [FP4Layer(self.num_rows, head_num, head_dim) for _ in range(layer_num)]

    def set_kv_buffer(
        self,
        layer_id: int,
        loc: Sequence[int],
        cache_k: Sequence[Sequence[Sequence[float]]],
        cache_v: Sequence[Sequence[Sequence[float]]],
        k_scale: float | None = None,
        v_scale: float | None = None,
    ) -> None:
        """Quantise and store ``cache_k / k_scale``, ``cache_v / v_scale``
        (``[n][head_num][head_dim]``) at slots ``loc`` of ``layer_id``. The layer, slots,
        shapes, scales (finite and > 0, or None) and the finiteness of the scaled values are
        checked before any write."""
        local = self._layer(layer_id)
        slots = self._slots(loc)
        self._check_shape("cache_k", cache_k, len(slots), self.head_num, self.head_dim)
        self._check_shape("cache_v", cache_v, len(slots), self.head_num, self.head_dim)
        k_div, v_div = as_scale("k_scale", k_scale), as_scale("v_scale", v_scale)
        ks = [flatten(r, k_div) for r in cache_k]
        vs = [flatten(r, v_div) for r in cache_v]
        for flat in (*ks, *vs):
            check_finite(flat)
        self._store(local, slots, ks, vs)

    def _store(
        self, local: int, slots: list[int], ks: list[list[float]], vs: list[list[float]]
    ) -> None:
        for slot, k, v in zip(slots, ks, vs, strict=True):
            self.k_layers[local]._store(slot, k)
            self.v_layers[local]._store(slot, v)

    def get_key_buffer(self, layer_id: int) -> LayerBuffer:
        """K of global layer ``layer_id``, dequantised: rows (by slot) of
        ``[head_num][head_dim]`` floats (a fresh list)."""
        return self.k_layers[self._wait(layer_id)].dequantized()

    def get_value_buffer(self, layer_id: int) -> LayerBuffer:
        """V of global layer ``layer_id``, dequantised (a fresh list)."""
        return self.v_layers[self._wait(layer_id)].dequantized()

    def get_kv_buffer(self, layer_id: int) -> tuple[LayerBuffer, LayerBuffer]:
        """``(get_key_buffer, get_value_buffer)`` of global layer ``layer_id``."""
        return self.get_key_buffer(layer_id), self.get_value_buffer(layer_id)

    def get_raw_kv_buffer(self, layer_id: int) -> tuple[ByteRows, ByteRows, ScaleRows, ScaleRows]:
        """The stored bytes of ``layer_id``: ``(k, v, k_scales, v_scales)`` (live lists)."""
        local = self._wait(layer_id)
        k, v = self.k_layers[local], self.v_layers[local]
        return k.data, v.data, k.scales, v.scales

    def move_kv_cache(self, tgt_loc: Sequence[int], src_loc: Sequence[int]) -> None:
        """Copy bytes and scales of rows ``src_loc`` to ``tgt_loc`` on every layer."""
        tgt, src = self._move_pairs(tgt_loc, src_loc)
        for layer in (*self.k_layers, *self.v_layers):
            layer._move(tgt, src)

    def write_tags(self, loc: Sequence[int], tags: Sequence[int]) -> None:
        """Store each tag (``[0, TAG_LIMIT)``) in FP4 form (kv_tag_codec) in K and V of every
        held layer; slots and tags checked first."""
        slots = self._slots(loc)
        width = self.head_num * self.head_dim
        # a tag row holds e2m1 grid values, exact in float32 (what ``flatten`` would round to),
        # and every layer stores the same bytes: each row is quantised once
        rows = [self.k_layers[0]._quantized(fp4_tag_row(t, width))
                for t in self._tags(tags, len(slots))]  # fmt: skip
        for layer in (*self.k_layers, *self.v_layers):
            for slot, row in zip(slots, rows, strict=True):
                layer._put(slot, row)

    def _tags_at(self, slots: list[int]) -> list[int]:
        """The tag each slot stores (K of the first held layer; 0 if none)."""
        # the tag lives in the first scale block (kvpool.reference.kv.tag_codec)
        return self.k_layers[0]._tags_of(slots)


__all__ = [
    "FP4_V_HEAD_DIM_ERROR",
    "FP4Layer",
    "MHATokenToKVPoolFP4",
    "check_fp4_width",
    "flatten",
    "unflatten",
]
