"""``KVCache``: what every reference KV pool shares (the MHA and MLA pools and their storage
variants derive from it: :mod:`kvpool.reference.kv.mha`, :mod:`kvpool.reference.kv.mla`, ``fp4``,
``mxfp8``, ``mla_fp4``, ``page_major``, ``noop``).

Pure Python. Per layer a buffer has ``size + page_size`` rows (row = token slot; the reserved page
``[0, page_size)`` exists so padded batches can write there). A row is a list of heads, a head a
list of float channels: MHA ``[head_num][head_dim]`` for K and ``[head_num][v_head_dim]`` for V;
MLA one fused ``[1][kv_lora_rank + qk_rope_head_dim]`` whose value view is the first
``kv_lora_rank`` channels. Layers are addressed by global id ``start_layer..end_layer``.

Decisions:

- fp8 dtype names (``fp8_e4m3``, ``fp8_e5m2``, ``float8_e4m3fn``, ``float8_e5m2``) are accepted and
  recorded as ``store_dtype == "uint8"`` (SGLang stores fp8 as bytes), but the reference keeps
  exact Python floats: no quantisation, so values round-trip exactly whatever the dtype.
- ``set_kv_buffer`` stores ``x / scale`` when a scale is given and never mutates its inputs.
- ``read_tags`` reads layer ``start_layer``, head 0, channel 0 of K (MLA: of the fused row).
- The constructor checks every pool shares live here once: the sizes and layer range
  (:class:`KVCache`), the MHA head geometry (:meth:`KVCache._set_mha_heads`) and the MLA widths
  (:meth:`KVCache._set_mla_dims`), each with one ConfigError message; and the slot checks of a
  move (:meth:`KVCache._move_pairs`).
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from typing import Protocol

from kvpool.errors import ConfigError, IndexOutOfRangeError, InvalidArgumentError
from kvpool.host_checks import int_list
from kvpool.protocols.kv import LayerTransferCounter

Row = list[list[float]]
"""One slot's data on one layer: ``[head][channel]``."""
LayerBuffer = list[Row]
"""One layer: ``size + page_size`` rows."""
KVRows = Sequence[Sequence[Sequence[float]]]
"""K or V data handed to ``set_kv_buffer``: ``[n][heads][channels]``, one row per slot."""

FP8_DTYPES: tuple[str, ...] = ("fp8_e4m3", "fp8_e5m2", "float8_e4m3fn", "float8_e5m2")
DTYPES: tuple[str, ...] = ("float32", "float16", "bfloat16", *FP8_DTYPES)


class LayerRows(Protocol):
    """What a buffer getter returns: one :data:`Row` per slot, indexed by slot id (a
    :data:`LayerBuffer`, or the page-major pool's strided view)."""

    def __len__(self) -> int: ...

    def __getitem__(self, slot: int, /) -> Row: ...

    def __iter__(self) -> Iterator[Row]: ...


class KVCache:
    """Shared bookkeeping: sizes, dtype, layer range, the transfer hook and tag helpers."""

    head_num: int

    def __init__(
        self, size: int, page_size: int, dtype: str, layer_num: int, start_layer: int = 0
    ) -> None:
        if size <= 0 or page_size <= 0 or layer_num <= 0 or start_layer < 0:
            raise ConfigError("size, page_size and layer_num must be positive, start_layer >= 0")
        if dtype not in DTYPES:
            raise ConfigError(f"unknown dtype {dtype!r}; known: {DTYPES}")
        self.size = size
        self.page_size = page_size
        self.dtype = dtype
        self.store_dtype = "uint8" if dtype in FP8_DTYPES else dtype
        self.layer_num = layer_num
        self.start_layer = start_layer
        self.end_layer = start_layer + layer_num - 1
        self.layer_transfer_counter: LayerTransferCounter | None = None

    @property
    def num_rows(self) -> int:
        """Rows per layer buffer: ``size + page_size``."""
        return self.size + self.page_size

    def register_layer_transfer_counter(self, counter: LayerTransferCounter) -> None:
        """Make every later buffer read first call ``counter.wait_until(layer_id - start_layer)``
        (the local layer index, as SGLang)."""
        self.layer_transfer_counter = counter

    def _layer(self, layer_id: int) -> int:
        """Local index of global ``layer_id``; IndexOutOfRangeError outside the held range."""
        if not self.start_layer <= layer_id <= self.end_layer:
            raise IndexOutOfRangeError(
                f"layer {layer_id} outside {self.start_layer}..{self.end_layer}"
            )
        return layer_id - self.start_layer

    def _wait(self, layer_id: int) -> int:
        local = self._layer(layer_id)
        if self.layer_transfer_counter is not None:
            self.layer_transfer_counter.wait_until(local)  # SGLang passes the local index
        return local

    def _slots(self, loc: Sequence[int]) -> list[int]:
        slots = int_list("slots", loc)
        bad = [s for s in slots if not 0 <= s < self.num_rows]
        if bad:
            raise IndexOutOfRangeError(f"slots {bad} outside 0..{self.num_rows - 1}")
        return slots

    def _check_shape(
        self, what: str, data: Sequence[Sequence[Sequence[float]]], n: int, heads: int, dim: int
    ) -> None:
        if len(data) != n or any(len(r) != heads or any(len(h) != dim for h in r) for r in data):
            raise InvalidArgumentError(f"{what} must have shape [{n}][{heads}][{dim}]")

    def _move_pairs(
        self, tgt_loc: Sequence[int], src_loc: Sequence[int]
    ) -> tuple[list[int], list[int]]:
        """The checked slots of a move: both in range (:meth:`_slots`) and as many targets as
        sources, else InvalidArgumentError."""
        tgt, src = self._slots(tgt_loc), self._slots(src_loc)
        if len(tgt) != len(src):
            raise InvalidArgumentError(f"{len(tgt)} targets for {len(src)} sources")
        return tgt, src

    # ----------------------------------------------------------------- geometry
    def _set_mha_heads(
        self, head_num: int, head_dim: int, v_head_dim: int | None, *, v_sized_by_k: str = ""
    ) -> None:
        """Check and record the geometry every MHA-shaped pool shares: ``head_num`` heads of
        ``head_dim`` channels for K and ``v_head_dim`` (``head_dim`` when None) for V; ConfigError
        unless all are positive. ``v_sized_by_k`` (FP4, which sizes V with ``head_dim``): the
        ConfigError message for a ``v_head_dim`` other than None or ``head_dim``."""
        if v_sized_by_k:
            if head_num <= 0 or head_dim <= 0:
                raise ConfigError("head_num and head_dim must be positive")
            if v_head_dim not in (None, head_dim):
                raise ConfigError(v_sized_by_k)
        v_dim = head_dim if v_head_dim is None else v_head_dim
        if head_num <= 0 or head_dim <= 0 or v_dim <= 0:
            raise ConfigError("head_num, head_dim and v_head_dim must be positive")
        self.head_num, self.head_dim, self.v_head_dim = head_num, head_dim, v_dim

    def _set_mla_dims(self, kv_lora_rank: int, qk_rope_head_dim: int) -> None:
        """Check and record MLA's fused row: one head of ``kv_dim = kv_lora_rank +
        qk_rope_head_dim`` channels; ConfigError unless ``kv_lora_rank > 0`` and
        ``qk_rope_head_dim >= 0``."""
        if kv_lora_rank <= 0 or qk_rope_head_dim < 0:
            raise ConfigError("kv_lora_rank must be positive and qk_rope_head_dim >= 0")
        self.head_num = 1
        self.kv_lora_rank = kv_lora_rank
        self.qk_rope_head_dim = qk_rope_head_dim
        self.kv_dim = kv_lora_rank + qk_rope_head_dim

    # ----------------------------------------------------------------- tags
    def _tag_rows(self, tags: Sequence[int], heads: int, dim: int) -> list[Row]:
        return [[[float(t)] + [0.0] * (dim - 1) for _ in range(heads)] for t in tags]

    # --------------------------------------------------------- the buffer interface
    def set_kv_buffer(
        self,
        layer_id: int,
        loc: Sequence[int],
        cache_k: KVRows,
        cache_v: KVRows,
        k_scale: float | None = None,
        v_scale: float | None = None,
    ) -> None:
        """Store ``cache_k / k_scale`` and ``cache_v / v_scale`` at ``loc`` (subclasses)."""
        raise NotImplementedError

    def get_key_buffer(self, layer_id: int) -> LayerRows:
        """K of global layer ``layer_id`` (subclasses)."""
        raise NotImplementedError

    def get_value_buffer(self, layer_id: int) -> LayerRows:
        """V of global layer ``layer_id`` (subclasses)."""
        raise NotImplementedError

    def get_kv_buffer(self, layer_id: int) -> tuple[LayerRows, LayerRows]:
        """``(K, V)`` of global layer ``layer_id`` (subclasses)."""
        raise NotImplementedError

    def move_kv_cache(self, tgt_loc: Sequence[int], src_loc: Sequence[int]) -> None:
        """Copy rows ``src_loc`` to ``tgt_loc`` on every layer (subclasses)."""
        raise NotImplementedError

    def write_tags(self, loc: Sequence[int], tags: Sequence[int]) -> None:
        """Store ``tags[i]`` at slot ``loc[i]`` on every layer (channel 0 of every head of K and
        V; other channels 0.0)."""
        raise NotImplementedError

    def read_tags(self, loc: Sequence[int]) -> list[int]:
        """Tag at each slot: layer ``start_layer``, head 0, channel 0 of K (0 if never written)."""
        raise NotImplementedError


__all__ = ["DTYPES", "FP8_DTYPES", "KVCache", "KVRows", "LayerBuffer", "LayerRows", "Row"]
