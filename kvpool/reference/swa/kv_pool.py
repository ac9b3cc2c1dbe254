"""``SWAKVPool``: the KV buffers of a hybrid sliding-window model (SGLang's SWAKVPool).

Full-attention layers keep their KV in a full pool of ``size`` tokens, sliding-window layers in
an SWA pool of ``size_swa`` tokens; both are :class:`~kvpool.reference.kv.mha.MHATokenToKVPool`
(``size + page_size`` rows per layer, row = slot). Layers are named by their global id; the
pool maps each to ``(local index, is_swa)``. Callers address tokens by **full slot**: a write or
move on an SWA layer goes to the SWA slot that ``full_to_swa_index_mapping`` (registered by the
allocator, shared, not copied) names. A token without an SWA slot (entry 0) writes the reserved
row 0, as SGLang's padded writes do, and reads back tag 0.
"""

from __future__ import annotations

from collections.abc import Sequence

from kvpool.constants import RESERVED_INDEX
from kvpool.errors import ConfigError, IndexOutOfRangeError, InvalidArgumentError
from kvpool.host_checks import as_int, int_list
from kvpool.reference.kv.kv_cache import LayerBuffer
from kvpool.reference.kv.mha import MHATokenToKVPool


class SWAKVPool:
    """Full and SWA buffers by layer kind (see the module docstring). ConfigError when the two
    layer id lists overlap or are both empty."""

    def __init__(
        self,
        size: int,
        size_swa: int,
        page_size: int,
        dtype: str,
        head_num: int,
        head_dim: int,
        swa_attention_layer_ids: Sequence[int],
        full_attention_layer_ids: Sequence[int],
        v_head_dim: int | None = None,
    ) -> None:
        swa_ids, full_ids = list(swa_attention_layer_ids), list(full_attention_layer_ids)
        if set(swa_ids) & set(full_ids) or not swa_ids or not full_ids:
            raise ConfigError("need disjoint, non-empty full and SWA layer id lists")
        self.size, self.size_swa, self.page_size = size, size_swa, page_size
        self.swa_kv_pool = MHATokenToKVPool(size_swa, page_size, dtype, head_num, head_dim,
                                            len(swa_ids), 0, v_head_dim)  # fmt: skip
        self.full_kv_pool = MHATokenToKVPool(size, page_size, dtype, head_num, head_dim,
                                             len(full_ids), 0, v_head_dim)  # fmt: skip
        self.layers_mapping: dict[int, tuple[int, bool]] = {}
        for local, layer in enumerate(full_ids):
            self.layers_mapping[layer] = (local, False)
        for local, layer in enumerate(swa_ids):
            self.layers_mapping[layer] = (local, True)
        self.full_to_swa_index_mapping: list[int] | None = None

    def register_mapping(self, full_to_swa_index_mapping: list[int]) -> None:
        """Share the allocator's mapping (the list itself: later updates are seen).
        InvalidArgumentError unless it is a list of ``size + page_size + 1`` integers ending
        with -1 (the allocator's shape), IndexOutOfRangeError for an entry outside the SWA
        pool; checked before the pool takes it."""
        mapping = full_to_swa_index_mapping
        want = self.size + self.page_size + 1
        if not isinstance(mapping, list) or len(mapping) != want:
            raise InvalidArgumentError(
                f"full_to_swa_index_mapping must be a list of {want} slots, got {mapping!r:.80}"
            )
        entries = int_list("full_to_swa_index_mapping", mapping)
        if entries[-1] != -1:
            raise InvalidArgumentError("full_to_swa_index_mapping must end with -1")
        limit = self.size_swa + self.page_size
        bad = [e for e in entries[:-1] if not 0 <= e < limit]
        if bad:
            raise IndexOutOfRangeError(f"SWA slots out of range [0, {limit}): {bad[:8]}")
        self.full_to_swa_index_mapping = mapping

    def translate_loc_from_full_to_swa(self, kv_indices: Sequence[int]) -> list[int]:
        """SWA slot of each full slot (0: none; -1 stays -1). InvalidArgumentError before a
        mapping is registered; IndexOutOfRangeError outside ``[-1, size + page_size)``."""
        mapping = self.full_to_swa_index_mapping
        if mapping is None:
            raise InvalidArgumentError("no full_to_swa_index_mapping registered")
        locs = int_list("slots", kv_indices)
        bad = [x for x in locs if not -1 <= x < len(mapping) - 1]
        if bad:
            raise IndexOutOfRangeError(f"full slots out of range: {bad}")
        return [mapping[x] for x in locs]

    def _pool(self, layer_id: int) -> tuple[MHATokenToKVPool, int, bool]:
        """The pool, local index and kind of ``layer_id``: InvalidArgumentError unless it is an
        integer (a bool or a float would hash like one), IndexOutOfRangeError for an unknown
        layer."""
        layer_id = as_int("layer_id", layer_id)
        if layer_id not in self.layers_mapping:
            raise IndexOutOfRangeError(f"layer {layer_id} is neither a full nor an SWA layer")
        local, is_swa = self.layers_mapping[layer_id]
        return (self.swa_kv_pool if is_swa else self.full_kv_pool), local, is_swa

    def get_key_buffer(self, layer_id: int) -> LayerBuffer:
        pool, local, _ = self._pool(layer_id)
        return pool.get_key_buffer(local)

    def get_value_buffer(self, layer_id: int) -> LayerBuffer:
        pool, local, _ = self._pool(layer_id)
        return pool.get_value_buffer(local)

    def get_kv_buffer(self, layer_id: int) -> tuple[LayerBuffer, LayerBuffer]:
        pool, local, _ = self._pool(layer_id)
        return pool.get_kv_buffer(local)

    def set_kv_buffer(
        self,
        layer_id: int,
        loc: Sequence[int],
        cache_k: Sequence[Sequence[Sequence[float]]],
        cache_v: Sequence[Sequence[Sequence[float]]],
        k_scale: float | None = None,
        v_scale: float | None = None,
        swa_loc: Sequence[int] | None = None,
    ) -> None:
        """Write K/V of ``layer_id`` for the tokens at full slots ``loc``: at ``loc`` on a full
        layer, at their SWA slots on an SWA layer (``swa_loc``: the translation, precomputed
        once per forward as SGLang's attention backend does; else translated here)."""
        pool, local, is_swa = self._pool(layer_id)
        if is_swa:
            loc = self.translate_loc_from_full_to_swa(loc) if swa_loc is None else swa_loc
        pool.set_kv_buffer(local, loc, cache_k, cache_v, k_scale, v_scale)

    def move_kv_cache(self, tgt_loc: Sequence[int], src_loc: Sequence[int]) -> None:
        """Copy full rows ``src_loc`` to ``tgt_loc`` and their SWA rows likewise."""
        tgt_swa = self.translate_loc_from_full_to_swa(tgt_loc)
        src_swa = self.translate_loc_from_full_to_swa(src_loc)
        self.full_kv_pool.move_kv_cache(tgt_loc, src_loc)
        self.swa_kv_pool.move_kv_cache(tgt_swa, src_swa)

    def write_tags(self, loc: Sequence[int], tags: Sequence[int]) -> None:
        """``tags[i]`` at full slot ``loc[i]`` on every full layer and at its SWA slot on every
        SWA layer (tokens without an SWA slot skip the SWA layers)."""
        swa = self.translate_loc_from_full_to_swa(loc)  # checked before the first write
        self.full_kv_pool.write_tags(loc, tags)
        pairs = [(s, t) for s, t in zip(swa, tags, strict=True) if s != RESERVED_INDEX]
        self.swa_kv_pool.write_tags([s for s, _ in pairs], [t for _, t in pairs])

    def read_tags(self, loc: Sequence[int]) -> list[int]:
        """The tag at each full slot (the first full layer)."""
        return self.full_kv_pool.read_tags(loc)

    def read_swa_tags(self, loc: Sequence[int]) -> list[int]:
        """The tag at each token's SWA slot (the first SWA layer); 0 for a token without one."""
        swa = self.translate_loc_from_full_to_swa(loc)
        tags = self.swa_kv_pool.read_tags(swa)
        return [t if s != RESERVED_INDEX else 0 for s, t in zip(swa, tags, strict=True)]


__all__ = ["SWAKVPool"]
