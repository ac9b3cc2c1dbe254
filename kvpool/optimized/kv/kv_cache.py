"""``KVCache`` (optimized twin): what every KV pool shares (the MHA and MLA pools,
:mod:`kvpool.optimized.kv.mha` and :mod:`kvpool.optimized.kv.mla`, and the storage variants).

Per layer a buffer is one device tensor of ``size + page_size`` rows (row = token slot; the
reserved page ``[0, page_size)`` takes the dummy writes of padded batches): MHA keeps
``k_buffer[l]`` of shape ``(rows, head_num, head_dim)`` and ``v_buffer[l]`` of shape
``(rows, head_num, v_head_dim)``; MLA keeps one fused ``kv_buffer[l]`` of shape
``(rows, 1, kv_lora_rank + qk_rope_head_dim)`` whose value view is its first ``kv_lora_rank``
channels. Layers are addressed by global id ``start_layer..end_layer``.

Same names, argument order, results and constructor checks (the sizes, the MHA heads, the MLA
widths, a move's slots: once each, here) as :mod:`kvpool.reference.kv.kv_cache`. Differences:

- fp8 dtypes (``torch.float8_e4m3fn`` / ``float8_e5m2`` or their reference names) are stored as
  ``uint8`` (indexed writes do not support fp8) and viewed back on every read and write; values
  are really quantised, so fp8 (and float16 / bfloat16) buffers cannot hold KV tags exactly. Tags
  (< 2**24) are exact in float32 and float64 buffers: the lifecycle uses float32.
- The argument checks are the reference's, same errors. Those that read slot or tag values
  (ranges, a move's repeated target) run on host values (a list, an array) in both modes, and
  on a tensor in checked mode only: reading a tensor is a device-to-host sync on a GPU, and the
  unchecked twin makes none on any device (tests/optimized/test_sync_free_manager.py counts a
  CPU tensor's reads as the syncs they would be). Unchecked, a bad slot inside a tensor is the
  caller's to avoid (README, "Checked mode"). Layer ids, scales, shapes and dtypes (host
  metadata) are always checked.
"""

from __future__ import annotations

from collections.abc import Collection, Sequence

import numpy as np
import numpy.typing as npt
import torch

from kvpool.errors import ConfigError, IndexOutOfRangeError, InvalidArgumentError
from kvpool.host_checks import as_int, int_list
from kvpool.optimized.host_view import (
    HostArray,
    float_ints,
    host_array,
    host_gather,
    in_bounds,
    store_at,
)
from kvpool.optimized.index_args import any_outside, index_tensor
from kvpool.optimized.key_match import is_integer_dtype
from kvpool.optimized.options import TwinOptions, twin_options
from kvpool.protocols.kv import LayerTransferCounter
from kvpool.reference.kv.kv_cache import TAG_LIMIT, tag_list

_DTYPE_NAMES: dict[str, torch.dtype] = {
    "float32": torch.float32,
    "float16": torch.float16,
    "bfloat16": torch.bfloat16,
    "float64": torch.float64,
    "fp8_e4m3": torch.float8_e4m3fn,
    "float8_e4m3fn": torch.float8_e4m3fn,
    "fp8_e5m2": torch.float8_e5m2,
    "float8_e5m2": torch.float8_e5m2,
}
FP8_DTYPES: tuple[torch.dtype, ...] = (torch.float8_e4m3fn, torch.float8_e5m2)

TensorLike = torch.Tensor | Sequence[object]
"""K/V data given by a caller: a tensor, or nested sequences of numbers."""
IndexLike = torch.Tensor | Sequence[object]
"""Slots or tags given by a caller: a 1-D integer tensor or array, or a sequence of ints
(typed loosely: every call checks it at run time and refuses anything else)."""


def data_tensor(what: str, data: object, device: torch.device) -> torch.Tensor:
    """K/V data as a tensor on ``device`` (the caller's own when it already is one; never
    written): InvalidArgumentError unless a real-valued tensor or array, or nested sequences
    of numbers (a bool, complex, string or ``None`` is not KV). Metadata only: both modes."""
    if not isinstance(data, torch.Tensor):
        if isinstance(data, str | bytes) or not isinstance(data, Collection):
            raise InvalidArgumentError(f"{what} must be a tensor or nested numbers, got {data!r}")
        try:
            data = torch.as_tensor(data, device=device)
        except (TypeError, ValueError, RuntimeError, OverflowError) as exc:
            # torch's own refusal of a ragged list, a string or None inside, a huge int
            raise InvalidArgumentError(f"{what} must hold numbers: {exc}") from None
    x = data.to(device)
    if not (x.is_floating_point() or is_integer_dtype(x.dtype)) or x.dtype == torch.bool:
        raise InvalidArgumentError(f"{what} must hold real numbers, got dtype {x.dtype}")
    return x


def resolve_dtype(dtype: str | torch.dtype) -> torch.dtype:
    """A torch dtype from a torch dtype or a reference dtype name (ConfigError otherwise)."""
    if isinstance(dtype, torch.dtype):
        if dtype in _DTYPE_NAMES.values():
            return dtype
    elif dtype in _DTYPE_NAMES:
        return _DTYPE_NAMES[dtype]
    raise ConfigError(f"unknown dtype {dtype!r}; known: {sorted(_DTYPE_NAMES)}")


_HOST_TAG_DTYPES: dict[torch.dtype, type[np.float32] | type[np.float64]] = {
    torch.float32: np.float32,
    torch.float64: np.float64,
}
"""Buffer dtypes whose tag rows :meth:`KVCache._tag_rows_as` builds in NumPy."""

_VIEWABLE: frozenset[torch.dtype] = frozenset(
    {torch.float32, torch.float64, torch.float16, torch.uint8, torch.int8, torch.int64}
)
"""Storage dtypes :meth:`KVCache._store_all` writes through NumPy views (``Tensor.numpy``
supports them; bfloat16 and fp8 it does not)."""


_INTS_THEN_SLICES: dict[tuple[bool, ...], bool] = {
    (): True,
    (False,): True,
    (True,): True,
    (False, False): True,
    (False, True): True,
}
"""Index tails (True: a slice, False: an int) after which ``view[:, *tail][slots]`` equals
``view[slots, *tail]`` (ints, then slices: every int sits next to ``slots``, so numpy keeps the
rows first); :meth:`KVCache._host_take`'s tails. Any other tail takes the mixed gather."""

_TAKE_ROW_BYTES = 512
"""Rows of at most this many bytes are gathered whole (``take``) when the tail keeps a slice:
short rows copy faster than numpy gathers their strided sub-rows."""


class KVCache:
    """Shared bookkeeping: sizes, dtypes, layer range, the transfer hook, slot and tag helpers."""

    head_num: int

    def __init__(
        self,
        size: int,
        page_size: int,
        dtype: str | torch.dtype,
        layer_num: int,
        start_layer: int = 0,
        *,
        options: TwinOptions | None = None,
    ) -> None:
        if size <= 0 or page_size <= 0 or layer_num <= 0 or start_layer < 0:
            raise ConfigError("size, page_size and layer_num must be positive, start_layer >= 0")
        self.size = size
        self.page_size = page_size
        self.dtype = resolve_dtype(dtype)
        self.store_dtype = torch.uint8 if self.dtype in FP8_DTYPES else self.dtype
        self.layer_num = layer_num
        self.start_layer = start_layer
        self.end_layer = start_layer + layer_num - 1
        self.options = opts = twin_options(options)
        self.device = opts.device
        self.checked = opts.checked
        self.layer_transfer_counter: LayerTransferCounter | None = None
        # each buffer's view in its own dtype; see :meth:`_numpy_of`
        self._numpy_views: dict[int, tuple[torch.Tensor, int, HostArray]] = {}

    @property
    def num_rows(self) -> int:
        """Rows per layer buffer: ``size + page_size``."""
        return self.size + self.page_size

    def register_layer_transfer_counter(self, counter: LayerTransferCounter) -> None:
        """Reads of a layer will first call ``counter.wait_until(layer_id - start_layer)``.
        InvalidArgumentError (nothing registered) unless ``counter`` has a callable
        ``wait_until``."""
        if not callable(getattr(counter, "wait_until", None)):
            raise InvalidArgumentError(
                f"counter must have a callable wait_until (a LayerDoneCounter), got {counter!r}"
            )
        self.layer_transfer_counter = counter

    def _layer(self, layer_id: int) -> int:
        """Local index of global ``layer_id``; InvalidArgumentError unless it is an integer (not
        a bool), IndexOutOfRangeError outside the held range (host values: both modes)."""
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

    def _slots(self, loc: IndexLike, name: str = "loc") -> torch.Tensor:
        """``loc`` as a 1-D int64 tensor on the device: InvalidArgumentError unless a 1-D
        integer index (:func:`~kvpool.optimized.index_args.index_tensor`; both modes);
        IndexOutOfRangeError for a slot outside ``0..num_rows - 1``, checked for host values
        (a list, an array) in both modes and for a tensor in checked mode only (a device
        read)."""
        if isinstance(loc, torch.Tensor):
            slots = index_tensor(name, loc, self.device)
            on_host = loc.device.type == "cpu"
            values = (loc if on_host else slots) if self._reads(loc) and slots.numel() else None
        elif isinstance(loc, np.ndarray):
            slots = index_tensor(name, loc, self.device)
            values = torch.from_numpy(loc.astype(np.int64)) if loc.size else None
        else:
            host = int_list(name, loc)
            slots = torch.tensor(host, dtype=torch.int64, device=self.device)
            values = (slots if slots.device.type == "cpu" else slots.cpu()) if host else None
        if values is not None and any_outside(values, 0, self.num_rows):
            bad = (values < 0) | (values >= self.num_rows)
            if bool(bad.any()):
                raise IndexOutOfRangeError(
                    f"{name}: slots {values[bad].tolist()} outside 0..{self.num_rows - 1}"
                )
        return slots

    def _reads(self, value: object) -> bool:
        """Whether a check of ``value``'s contents runs: always for host values (a list, an
        array), in checked mode only for a tensor (reading it is a device sync on a GPU)."""
        return self.checked or not isinstance(value, torch.Tensor)

    def _tags(self, tags: IndexLike, n: int) -> torch.Tensor:
        """``tags`` as ``n`` int64 values on the device: InvalidArgumentError for a non-integer
        index argument, another count (metadata: both modes), or a value outside
        ``[0, TAG_LIMIT)`` (host values: both modes; a tensor's: checked mode)."""
        if not isinstance(tags, torch.Tensor | np.ndarray):
            return torch.tensor(tag_list(tags, n), dtype=torch.int64, device=self.device)
        values = index_tensor("tags", tags, self.device)
        if values.numel() != n:  # metadata: one tag per slot, never broadcast
            raise InvalidArgumentError(f"{values.numel()} tags for {n} slots")
        if self._reads(tags) and n and any_outside(values, 0, TAG_LIMIT):
            bad = (values < 0) | (values >= TAG_LIMIT)
            if bool(bad.any()):
                raise InvalidArgumentError(f"tags {values[bad].tolist()} outside [0, {TAG_LIMIT})")
        return values

    def _stored(
        self, what: str, data: TensorLike, shape: tuple[int, ...], scale: float | None
    ) -> torch.Tensor:
        """``data / scale`` as a NEW tensor in the storage dtype (the caller's is never touched);
        InvalidArgumentError unless ``data`` is real numbers (:func:`data_tensor`) of ``shape``.
        ``scale``: checked by the caller (:func:`~kvpool.reference.kv.kv_cache.as_scale`)."""
        x = data_tensor(what, data, self.device)
        if tuple(x.shape) != shape:
            raise InvalidArgumentError(f"{what} must have shape {list(shape)}, got {list(x.shape)}")
        if scale is not None:
            x = x / scale  # a new tensor: division is never done in place
        x = x.to(self.dtype)
        return x.view(self.store_dtype) if self.store_dtype != self.dtype else x

    def _view(self, buf: torch.Tensor) -> torch.Tensor:
        """A stored buffer seen in the logical dtype (fp8 bytes viewed back)."""
        return buf.view(self.dtype) if self.store_dtype != self.dtype else buf

    def _zeros(self, heads: int, dim: int) -> torch.Tensor:
        return torch.zeros((self.num_rows, heads, dim), dtype=self.store_dtype, device=self.device)

    def _move_pairs(
        self, tgt_loc: IndexLike, src_loc: IndexLike
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """The checked slots of a move (:meth:`_slots`), as many targets as sources (both
        modes) and no target twice outside the reserved page (host values: both modes; a
        tensor's: checked mode), else InvalidArgumentError."""
        tgt, src = self._slots(tgt_loc, "tgt_loc"), self._slots(src_loc, "src_loc")
        if tgt.numel() != src.numel():
            raise InvalidArgumentError(f"{tgt.numel()} targets for {src.numel()} sources")
        if self._reads(tgt_loc) and tgt.numel() > 1:
            real = tgt[tgt >= self.page_size]
            if torch.unique(real).numel() != real.numel():
                raise InvalidArgumentError(f"tgt_loc names a slot twice: {tgt.tolist()}")
        return tgt, src

    def _move(
        self, buffers: Sequence[torch.Tensor], tgt_loc: IndexLike, src_loc: IndexLike
    ) -> None:
        tgt, src = self._move_pairs(tgt_loc, src_loc)
        for buf in buffers:
            buf[tgt] = buf[src]  # the gather copies the sources before any write

    # ----------------------------------------------------------------- geometry
    def _set_mha_heads(
        self, head_num: int, head_dim: int, v_head_dim: int | None, *, v_sized_by_k: str = ""
    ) -> None:
        """Check and record the geometry every MHA-shaped pool shares (as the reference's
        :meth:`~kvpool.reference.kv.kv_cache.KVCache._set_mha_heads`, same errors)."""
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
        """Check and record MLA's fused row (as the reference's
        :meth:`~kvpool.reference.kv.kv_cache.KVCache._set_mla_dims`, same error)."""
        if kv_lora_rank <= 0 or qk_rope_head_dim < 0:
            raise ConfigError("kv_lora_rank must be positive and qk_rope_head_dim >= 0")
        self.head_num = 1
        self.kv_lora_rank = kv_lora_rank
        self.qk_rope_head_dim = qk_rope_head_dim
        self.kv_dim = kv_lora_rank + qk_rope_head_dim

    @staticmethod
    def _tag_rows(values: torch.Tensor, heads: int, dim: int) -> torch.Tensor:
        """Checked tags (:meth:`_tags`) as float64 ``(n, heads, dim)`` rows: the tag in
        channel 0 of every head, other channels 0."""
        rows = torch.zeros((values.numel(), heads, dim), dtype=torch.float64, device=values.device)
        rows[:, :, 0] = values.reshape(-1, 1).to(torch.float64)
        return rows

    def _store_rows(self, buffer: torch.Tensor, slots: torch.Tensor, rows: torch.Tensor) -> None:
        """``buffer[slots] = rows`` for checked ``slots``: :func:`store_at` in checked mode
        (its slots are range-checked, so the NumPy store writes exactly what the indexed
        store would); unchecked mode keeps the indexed store itself."""
        if self.checked:
            store_at(buffer, slots, rows)
        else:
            buffer[slots] = rows

    def _numpy_of(self, buffer: torch.Tensor) -> HostArray:
        """``buffer.numpy()`` (a view) of a CPU buffer of a :data:`_VIEWABLE` dtype, made once per
        buffer (``Tensor.numpy`` costs more than a small store): a state buffer is never
        resized, so its view stays its view; another tensor (a replaced buffer, a copy: a new
        object or new memory) gets its own. Any other tensor: one host copy
        (:func:`~kvpool.optimized.host_view.host_array`), kept by no one."""
        if not (buffer.is_cpu and buffer.dtype in _VIEWABLE and not buffer.requires_grad):
            return host_array(buffer)
        held = self._numpy_views.get(id(buffer))
        if held is not None and held[0] is buffer and held[1] == buffer.data_ptr():
            return held[2]
        view = buffer.numpy()
        self._numpy_views[id(buffer)] = (buffer, buffer.data_ptr(), view)
        return view

    def _host_take(
        self,
        buf: torch.Tensor,
        slots: npt.NDArray[np.int64],
        *rest: int | slice,
        flat: bool = False,
    ) -> HostArray:
        """:func:`~kvpool.optimized.host_view.host_gather` of ``buf`` (the same values), through
        the buffer's kept view (:meth:`_numpy_of`) when it has one to keep."""
        if not (buf.is_cpu and buf.dtype in _VIEWABLE and not buf.requires_grad):
            return host_gather(buf, slots, *rest, flat=flat)
        view = self._numpy_of(buf)
        if flat:
            view = view.reshape(view.shape[0], -1)
        kinds = tuple([type(r) is slice for r in rest])
        if _INTS_THEN_SLICES.get(kinds, False):
            # the same values: the other axes taken first (a view), then one gather of rows
            # (numpy's 1-D gather is cheaper than its mixed one)
            axes = (slice(None), *rest)
            if True in kinds and view.strides[0] <= _TAKE_ROW_BYTES:
                # a slice left in the tail: numpy gathers strided sub-rows slowly; whole short
                # rows taken (contiguous copies), then sliced, are the same values
                rows: HostArray = view.take(slots, axis=0)[axes]
                return rows
            rows = view[axes][slots]
            return rows
        where = (slots, *rest)
        taken: HostArray = view[where]
        return taken

    def _store_all(
        self, slots: torch.Tensor, stores: Sequence[tuple[torch.Tensor, torch.Tensor]]
    ) -> None:
        """``buffer[slots] = rows`` for every ``(buffer, rows)`` of ``stores``, in order, for
        checked ``slots`` (a tag write's every layer): :meth:`_store_rows` of each. In checked
        mode on the CPU the stores :func:`store_at` makes, through one NumPy view of ``slots``
        and of each distinct ``rows`` for them all (a write repeats the same rows per layer)."""
        if self.checked and slots.is_cpu and slots.dtype is torch.int64 and slots.dim() == 1:
            index = slots.numpy()
            # the rows in their own dtype (float, or the bytes of fp8 / fp4 storage)
            sources: dict[int, HostArray] = {}
            for buffer, rows in stores:
                if not (
                    buffer.is_cpu
                    and rows.is_cpu
                    and rows.dtype is buffer.dtype
                    and buffer.dtype in _VIEWABLE
                ):
                    self._store_rows(buffer, slots, rows)
                    continue
                source = sources.get(id(rows))  # rows live in ``stores``: ids stay theirs
                if source is None:
                    source = sources[id(rows)] = rows.numpy()
                self._numpy_of(buffer)[index] = source
            return
        for buffer, rows in stores:
            self._store_rows(buffer, slots, rows)

    def _tag_rows_as(
        self, values: torch.Tensor, heads: int, dim: int, dtype: torch.dtype
    ) -> torch.Tensor:
        """``_tag_rows(values, heads, dim).to(dtype)`` (a new tensor). Built in NumPy in checked
        mode for CPU tags and a float32 / float64 ``dtype``: a tag (``< TAG_LIMIT = 2**24``) is
        exact in both, so skipping the float64 step changes no value. Unchecked mode keeps the
        tensor operations (what a GPU runs: no read of the tags)."""
        if self.checked and values.device.type == "cpu" and dtype in _HOST_TAG_DTYPES:
            rows = np.zeros((values.numel(), heads, dim), dtype=_HOST_TAG_DTYPES[dtype])
            rows[:, :, 0] = values.numpy().reshape(-1, 1)
            return torch.from_numpy(rows)
        return KVCache._tag_rows(values, heads, dim).to(dtype)

    # --------------------------------------------------------- the buffer interface
    def set_kv_buffer(
        self,
        layer_id: int,
        loc: IndexLike,
        cache_k: TensorLike,
        cache_v: TensorLike,
        k_scale: float | None = None,
        v_scale: float | None = None,
    ) -> None:
        """Store ``cache_k / k_scale`` and ``cache_v / v_scale`` at ``loc`` (subclasses)."""
        raise NotImplementedError

    def get_key_buffer(self, layer_id: int) -> torch.Tensor:
        """K of global layer ``layer_id`` (subclasses)."""
        raise NotImplementedError

    def get_value_buffer(self, layer_id: int) -> torch.Tensor:
        """V of global layer ``layer_id`` (subclasses)."""
        raise NotImplementedError

    def get_kv_buffer(self, layer_id: int) -> tuple[torch.Tensor, torch.Tensor]:
        """``(K, V)`` of global layer ``layer_id`` (subclasses)."""
        raise NotImplementedError

    def move_kv_cache(self, tgt_loc: IndexLike, src_loc: IndexLike) -> None:
        """Copy rows ``src_loc`` to ``tgt_loc`` on every layer (subclasses)."""
        raise NotImplementedError

    def write_tags(self, loc: IndexLike, tags: IndexLike) -> None:
        """Store ``tags[i]`` at slot ``loc[i]`` on every layer (subclasses)."""
        raise NotImplementedError

    def read_tags(self, loc: IndexLike) -> list[int]:
        """Tag at each slot: layer ``start_layer``, head 0, channel 0 of K (subclasses)."""
        raise NotImplementedError

    def _read_tags(self, buf: torch.Tensor, loc: IndexLike) -> list[int]:
        values = self._view(buf)[self._slots(loc), 0, 0]
        return [int(v) for v in values.to(torch.float64).tolist()]

    def _snapshot_tags(self, slots: npt.NDArray[np.int64]) -> list[int]:
        """:meth:`read_tags` of ``slots`` (1-D int64, read from a manager's own table) for a
        snapshot: the same values and errors. Subclasses read their tag buffer once on the host
        (:mod:`kvpool.optimized.host_view`); this default is ``read_tags`` of the list."""
        return self.read_tags(slots.tolist())

    def _host_read_tags(self, buf: torch.Tensor, slots: npt.NDArray[np.int64]) -> list[int]:
        """:meth:`_read_tags` of ``slots`` (1-D int64) from one host read of channel 0 of head 0;
        a slot out of range takes the checked path (its IndexOutOfRangeError)."""
        if not in_bounds(slots, self.num_rows):
            return self._read_tags(buf, slots.tolist())
        return float_ints(self._host_take(self._view(buf), slots, 0, 0))


__all__ = [
    "FP8_DTYPES",
    "IndexLike",
    "KVCache",
    "TensorLike",
    "data_tensor",
    "resolve_dtype",
]
