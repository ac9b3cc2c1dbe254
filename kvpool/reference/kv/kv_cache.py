"""Reference KV buffers: ``KVCache`` (base), ``MHATokenToKVPool`` and ``MLATokenToKVPool``.

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
- ``get_key_buffer`` / ``get_kv_buffer`` return the live per-layer lists (like a tensor view);
  ``get_value_buffer`` of MLA returns a fresh list of the first ``kv_lora_rank`` channels.
- ``read_tags`` reads layer ``start_layer``, head 0, channel 0 of K (MLA: of the fused row).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Protocol

from kvpool.errors import ConfigError, IndexOutOfRangeError, InvalidArgumentError
from kvpool.host_checks import int_list

Row = list[list[float]]
"""One slot's data on one layer: ``[head][channel]``."""
LayerBuffer = list[Row]
"""One layer: ``size + page_size`` rows."""

FP8_DTYPES: tuple[str, ...] = ("fp8_e4m3", "fp8_e5m2", "float8_e4m3fn", "float8_e5m2")
DTYPES: tuple[str, ...] = ("float32", "float16", "bfloat16", *FP8_DTYPES)


class LayerTransferCounter(Protocol):
    """Optional hook (pipeline/disaggregation): reads of a layer wait until it has loaded."""

    def wait_until(self, threshold: int) -> None:
        """Return once local layer ``threshold`` (``layer_id - start_layer``) has loaded."""


class KVCache:
    """Shared bookkeeping: sizes, dtype, layer range, the transfer hook and tag helpers."""

    head_num: int
    k_dim: int

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

    # ----------------------------------------------------------------- tags
    def _tag_rows(self, tags: Sequence[int], heads: int, dim: int) -> list[Row]:
        return [[[float(t)] + [0.0] * (dim - 1) for _ in range(heads)] for t in tags]

    # --------------------------------------------------------- the buffer interface
    def set_kv_buffer(
        self,
        layer_id: int,
        loc: Any,
        cache_k: Any,
        cache_v: Any,
        k_scale: float | None = None,
        v_scale: float | None = None,
    ) -> None:
        """Store ``cache_k / k_scale`` and ``cache_v / v_scale`` at ``loc`` (subclasses)."""
        raise NotImplementedError

    def get_key_buffer(self, layer_id: int) -> Any:
        """K of global layer ``layer_id`` (subclasses)."""
        raise NotImplementedError

    def get_value_buffer(self, layer_id: int) -> Any:
        """V of global layer ``layer_id`` (subclasses)."""
        raise NotImplementedError

    def get_kv_buffer(self, layer_id: int) -> tuple[Any, Any]:
        """``(K, V)`` of global layer ``layer_id`` (subclasses)."""
        raise NotImplementedError

    def move_kv_cache(self, tgt_loc: Any, src_loc: Any) -> None:
        """Copy rows ``src_loc`` to ``tgt_loc`` on every layer (subclasses)."""
        raise NotImplementedError

    def write_tags(self, loc: Sequence[int], tags: Sequence[int]) -> None:
        """Store ``tags[i]`` at slot ``loc[i]`` on every layer (channel 0 of every head of K and
        V; other channels 0.0)."""
        raise NotImplementedError

    def read_tags(self, loc: Sequence[int]) -> list[int]:
        """Tag at each slot: layer ``start_layer``, head 0, channel 0 of K (0 if never written)."""
        raise NotImplementedError


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
        if head_num <= 0 or head_dim <= 0 or (v_head_dim is not None and v_head_dim <= 0):
            raise ConfigError("head_num, head_dim and v_head_dim must be positive")
        self.head_num = head_num
        self.head_dim = head_dim
        self.v_head_dim = head_dim if v_head_dim is None else v_head_dim
        self.k_buffer: list[LayerBuffer] = [self._zeros(head_dim) for _ in range(layer_num)]
        self.v_buffer: list[LayerBuffer] = [self._zeros(self.v_head_dim) for _ in range(layer_num)]

    def _zeros(self, dim: int) -> LayerBuffer:
        return [[[0.0] * dim for _ in range(self.head_num)] for _ in range(self.num_rows)]

    def set_kv_buffer(
        self,
        layer_id: int,
        loc: Sequence[int],
        cache_k: Sequence[Sequence[Sequence[float]]],
        cache_v: Sequence[Sequence[Sequence[float]]],
        k_scale: float | None = None,
        v_scale: float | None = None,
    ) -> None:
        """Store ``cache_k / k_scale`` and ``cache_v / v_scale`` at ``loc`` of ``layer_id``.
        Everything is validated before any write; inputs are never mutated."""
        local = self._layer(layer_id)
        slots = self._slots(loc)
        self._check_shape("cache_k", cache_k, len(slots), self.head_num, self.head_dim)
        self._check_shape("cache_v", cache_v, len(slots), self.head_num, self.v_head_dim)
        ks = 1.0 if k_scale is None else float(k_scale)
        vs = 1.0 if v_scale is None else float(v_scale)
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
        tgt, src = self._slots(tgt_loc), self._slots(src_loc)
        if len(tgt) != len(src):
            raise InvalidArgumentError(f"{len(tgt)} targets for {len(src)} sources")
        for buf in (*self.k_buffer, *self.v_buffer):
            rows = [[list(h) for h in buf[s]] for s in src]
            for t, row in zip(tgt, rows, strict=True):
                buf[t] = row

    def write_tags(self, loc: Sequence[int], tags: Sequence[int]) -> None:
        """Write one integer tag per slot of ``loc`` into K and V of every held layer."""
        k_rows = self._tag_rows(tags, self.head_num, self.head_dim)
        v_rows = self._tag_rows(tags, self.head_num, self.v_head_dim)
        for layer_id in range(self.start_layer, self.end_layer + 1):
            self.set_kv_buffer(layer_id, loc, k_rows, v_rows)

    def read_tags(self, loc: Sequence[int]) -> list[int]:
        """The tag stored at each slot of ``loc`` (K of the first held layer)."""
        buf = self.k_buffer[0]
        return [int(buf[s][0][0]) for s in self._slots(loc)]


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
        if kv_lora_rank <= 0 or qk_rope_head_dim < 0:
            raise ConfigError("kv_lora_rank must be positive and qk_rope_head_dim >= 0")
        self.head_num = 1
        self.kv_lora_rank = kv_lora_rank
        self.qk_rope_head_dim = qk_rope_head_dim
        self.kv_dim = kv_lora_rank + qk_rope_head_dim
        self.kv_buffer: list[LayerBuffer] = [
            [[[0.0] * self.kv_dim] for _ in range(self.num_rows)] for _ in range(layer_num)
        ]

    def set_kv_buffer(
        self,
        layer_id: int,
        loc: Sequence[int],
        cache_k: Sequence[Sequence[Sequence[float]]],
        cache_v: object = None,
        k_scale: float | None = None,
        v_scale: float | None = None,
    ) -> None:
        """Store ``cache_k / k_scale`` ([n][1][kv_lora_rank + qk_rope_head_dim]) at ``loc``."""
        local = self._layer(layer_id)
        slots = self._slots(loc)
        self._check_shape("cache_k", cache_k, len(slots), 1, self.kv_dim)
        ks = 1.0 if k_scale is None else float(k_scale)
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
        tgt, src = self._slots(tgt_loc), self._slots(src_loc)
        if len(tgt) != len(src):
            raise InvalidArgumentError(f"{len(tgt)} targets for {len(src)} sources")
        for buf in self.kv_buffer:
            rows = [[list(buf[s][0])] for s in src]
            for t, row in zip(tgt, rows, strict=True):
                buf[t] = row

    def write_tags(self, loc: Sequence[int], tags: Sequence[int]) -> None:
        """Write one integer tag per slot of ``loc`` into every held layer."""
        rows = self._tag_rows(tags, 1, self.kv_dim)
        for layer_id in range(self.start_layer, self.end_layer + 1):
            self.set_kv_buffer(layer_id, loc, rows)

    def read_tags(self, loc: Sequence[int]) -> list[int]:
        """The tag stored at each slot of ``loc`` (the first held layer)."""
        buf = self.kv_buffer[0]
        return [int(buf[s][0][0]) for s in self._slots(loc)]


__all__ = [
    "DTYPES",
    "FP8_DTYPES",
    "KVCache",
    "MHATokenToKVPool",
    "MLATokenToKVPool",
]
