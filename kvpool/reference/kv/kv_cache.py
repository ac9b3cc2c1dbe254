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
- A stored row is never changed in place: every write and every move puts a new row (list) in
  its slot, and the live buffers the getters return are for reading. So one row object may
  stand in many slots: a fresh buffer holds one zero row in every slot, and a tag write stores
  the rows it builds once in every layer. Code that edits a row it read would therefore edit
  every slot holding it; it must store a new row (``set_kv_buffer``) instead.
- The constructor checks every pool shares live here once: the sizes and layer range
  (:class:`KVCache`), the MHA head geometry (:meth:`KVCache._set_mha_heads`) and the MLA widths
  (:meth:`KVCache._set_mla_dims`), each with one ConfigError message; and the slot checks of a
  move (:meth:`KVCache._move_pairs`).
- Every public call checks all its arguments before its first write, naming the argument and
  the value (InvalidArgumentError, IndexOutOfRangeError for a layer or slot outside the pool):
  a layer id is an integer (not a bool) in ``start_layer..end_layer``; slots a sequence of
  integers in ``0..size + page_size - 1``; K/V data ``[n][heads][dim]`` real numbers (a bool,
  a string or ``None`` is not KV); a scale ``None`` or a finite real ``> 0`` (MLA checks the
  ``v_scale`` it ignores, as every pool); tags ``[0, TAG_LIMIT)``, one per slot; a move as many
  targets as sources and no target twice outside the reserved page (which row would it keep?);
  a layer-transfer counter has a callable ``wait_until``. Duplicate slots in a write stay legal
  (padded batches write the reserved page many times; the last row wins).
"""

from __future__ import annotations

import numbers
from collections.abc import Collection, Iterator, Sequence
from typing import Protocol

from kvpool.errors import ConfigError, IndexOutOfRangeError, InvalidArgumentError
from kvpool.host_checks import as_int, as_positive_real, int_list, int_span
from kvpool.protocols.kv import LayerTransferCounter

Row = list[list[float]]
"""One slot's data on one layer: ``[head][channel]``."""
LayerBuffer = list[Row]
"""One layer: ``size + page_size`` rows."""
KVRows = Sequence[Sequence[Sequence[float]]]
"""K or V data handed to ``set_kv_buffer``: ``[n][heads][channels]``, one row per slot."""

FP8_DTYPES: tuple[str, ...] = ("fp8_e4m3", "fp8_e5m2", "float8_e4m3fn", "float8_e5m2")
DTYPES: tuple[str, ...] = ("float32", "float16", "bfloat16", *FP8_DTYPES)
TAG_LIMIT = 2**24
"""KV tags lie in ``[0, TAG_LIMIT)``: exact in a float32 channel (:mod:`kvpool.tags`; 0 is the
tag of a slot never written)."""


def tag_list(tags: object, n: int) -> list[int]:
    """``tags`` as ``n`` integers in ``[0, TAG_LIMIT)``: InvalidArgumentError for anything else
    (a non-integer, a bool, a value out of range, another count), before any write."""
    values = int_list("tags", tags)  # type: ignore[arg-type]
    if len(values) != n:
        raise InvalidArgumentError(f"{len(values)} tags for {n} slots")
    bad = [t for t in values if not 0 <= t < TAG_LIMIT]
    if bad:
        raise InvalidArgumentError(f"tags {bad} outside [0, {TAG_LIMIT})")
    return values


def _is_nested(value: object) -> bool:
    return isinstance(value, Collection) and not isinstance(value, str | bytes)


def _is_real(value: object) -> bool:
    return isinstance(value, numbers.Real) and not isinstance(value, bool)


def check_rows(what: str, data: object, n: int, heads: int, dim: int) -> None:
    """InvalidArgumentError unless ``data`` is ``[n][heads][dim]`` real numbers (nested
    sequences; a bool, a string or ``None`` is not a number). Runs before any write."""
    shape = f"[{n}][{heads}][{dim}]"
    if not _is_nested(data) or len(data) != n:  # type: ignore[arg-type]
        raise InvalidArgumentError(f"{what} must have shape {shape}, got {data!r:.80}")
    for row in data:  # type: ignore[attr-defined]
        if not _is_nested(row) or len(row) != heads:
            raise InvalidArgumentError(f"{what} must have shape {shape}, got a row {row!r:.80}")
        for head in row:
            if not _is_nested(head) or len(head) != dim:
                raise InvalidArgumentError(
                    f"{what} must have shape {shape}, got a head {head!r:.80}"
                )
            if not all(_is_real(x) for x in head):
                raise InvalidArgumentError(f"{what} must hold real numbers, got {head!r:.80}")


def layer_move_pairs(rows: int, tgt: object, src: object) -> tuple[list[int], list[int]]:
    """The checked slots of a storage layer's move (``FP4Layer.move``, ``MXFP8Layer.move``):
    integers in ``0..rows - 1`` (IndexOutOfRangeError), as many targets as sources and no
    target twice (InvalidArgumentError)."""
    targets, sources = int_list("tgt", tgt), int_list("src", src)  # type: ignore[arg-type]
    for name, slots in (("tgt", targets), ("src", sources)):
        bad = [s for s in slots if not 0 <= s < rows]
        if bad:
            raise IndexOutOfRangeError(f"{name}: slots {bad} outside 0..{rows - 1}")
    if len(targets) != len(sources):
        raise InvalidArgumentError(f"{len(targets)} targets for {len(sources)} sources")
    if len(set(targets)) != len(targets):
        raise InvalidArgumentError(f"tgt names a slot twice: {targets}")
    return targets, sources


def as_scale(name: str, value: object) -> float | None:
    """A K or V scale: ``None`` (no division) or a finite real ``> 0`` (InvalidArgumentError
    otherwise: a bool, a string, NaN, an infinity, zero, a negative number)."""
    return None if value is None else as_positive_real(name, value)


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
        (the local layer index, as SGLang). InvalidArgumentError (nothing registered) unless
        ``counter`` has a callable ``wait_until``."""
        if not callable(getattr(counter, "wait_until", None)):
            raise InvalidArgumentError(
                f"counter must have a callable wait_until (a LayerDoneCounter), got {counter!r}"
            )
        self.layer_transfer_counter = counter

    def _layer(self, layer_id: int) -> int:
        """Local index of global ``layer_id``; InvalidArgumentError unless it is an integer (not
        a bool), IndexOutOfRangeError outside the held range."""
        layer_id = as_int("layer_id", layer_id)
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

    def _slots(self, loc: Sequence[int], name: str = "loc") -> list[int]:
        """``loc`` as slot ids: InvalidArgumentError unless a sequence of integers,
        IndexOutOfRangeError for one outside ``0..num_rows - 1``."""
        slots, smallest, largest = int_span(name, loc)  # (the bounds its int64 check takes)
        rows = self.num_rows
        if smallest < 0 or largest >= rows:
            bad = [s for s in slots if not 0 <= s < rows]
            raise IndexOutOfRangeError(f"{name}: slots {bad} outside 0..{rows - 1}")
        return slots

    def _check_shape(self, what: str, data: object, n: int, heads: int, dim: int) -> None:
        check_rows(what, data, n, heads, dim)

    def _tags(self, tags: Sequence[int], n: int) -> list[int]:
        return tag_list(tags, n)

    def _move_pairs(
        self, tgt_loc: Sequence[int], src_loc: Sequence[int]
    ) -> tuple[list[int], list[int]]:
        """The checked slots of a move: both in range (:meth:`_slots`), as many targets as
        sources, and no target twice outside the reserved page (which row would it keep?),
        else InvalidArgumentError."""
        tgt, src = self._slots(tgt_loc, "tgt_loc"), self._slots(src_loc, "src_loc")
        if len(tgt) != len(src):
            raise InvalidArgumentError(f"{len(tgt)} targets for {len(src)} sources")
        real = [t for t in tgt if t >= self.page_size]
        if len(set(real)) != len(real):
            raise InvalidArgumentError(f"tgt_loc names a slot twice: {tgt}")
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
        """Tag at each slot: layer ``start_layer``, head 0, channel 0 of K (0 if never written);
        ``loc`` checked as every slot argument."""
        return self._tags_at(self._slots(loc))

    def _snapshot_tags(self, slots: list[int]) -> list[int]:
        """:meth:`read_tags` of ``slots``, a list of ints a snapshot read from the manager's own
        table (or every row): the same values and errors, with one range test in place of the
        element checks (the snapshot reads every committed slot at every step)."""
        if slots and (min(slots) < 0 or max(slots) >= self.num_rows):
            return self.read_tags(slots)  # (its IndexOutOfRangeError)
        return self._tags_at(slots)

    def _tags_at(self, slots: list[int]) -> list[int]:
        """The tag at each of ``slots``, ints in ``0..num_rows - 1`` (subclasses)."""
        raise NotImplementedError


class TagReader(Protocol):
    """A KV cache as a snapshot reads it: the tag stored at each slot (any storage variant, an
    SWA pool or one a user injects)."""

    def read_tags(self, loc: list[int]) -> list[int]: ...


def snapshot_tags(kv: TagReader, slots: list[int]) -> list[int]:
    """``kv.read_tags(slots)`` for a snapshot's read (``slots`` ints the manager took from its
    own table, or every row): through :meth:`KVCache._snapshot_tags` where ``kv`` has it (one
    range test instead of the element checks), else ``read_tags`` itself."""
    fast = getattr(kv, "_snapshot_tags", None)
    if fast is None:
        return kv.read_tags(slots)
    tags: list[int] = fast(slots)
    return tags


__all__ = [
    "DTYPES",
    "FP8_DTYPES",
    "TAG_LIMIT",
    "KVCache",
    "KVRows",
    "LayerBuffer",
    "LayerRows",
    "Row",
    "TagReader",
    "as_scale",
    "check_rows",
    "layer_move_pairs",
    "snapshot_tags",
    "tag_list",
]
