"""``NoOpMHATokenToKVPool``: a pool that keeps the scheduler's capacity (``size`` tokens) but
stores no KV (SGLang's ``NoOpMHATokenToKVPool``, for prefill-only work whose attention never
reads or writes the cache).

- Each layer has a placeholder of ``page_size`` zero rows (``[head_num][head_dim]``); the getters
  return it (after the layer-transfer wait, as every pool), so code that only looks at the
  buffers' shape keeps working.
- ``set_kv_buffer`` raises :class:`~kvpool.errors.KVStorageError` (SGLang raises there too);
  ``move_kv_cache`` validates its slots and does nothing else.
- KV integrity: there is no KV to witness, so ``write_tags`` records each slot's tag in a
  side table (``tag_record``, slot -> tag) that ``move_kv_cache`` moves with the slots it names
  and ``read_tags`` reads (0 for a slot never tagged). The record still catches a lifecycle that
  hands a request another request's slot; it says nothing about KV bytes, which do not exist.
"""

from __future__ import annotations

from collections.abc import Sequence
from itertools import repeat

from kvpool.errors import KVStorageError
from kvpool.reference.kv.kv_cache import KVCache, LayerBuffer


class NoOpMHATokenToKVPool(KVCache):
    """Capacity without storage (see the module docstring)."""

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
        self.k_buffer: list[LayerBuffer] = [self._placeholder(head_dim) for _ in range(layer_num)]
        self.v_buffer: list[LayerBuffer] = [
            self._placeholder(self.v_head_dim) for _ in range(layer_num)
        ]
        self.tag_record: dict[int, int] = {}

    def _placeholder(self, dim: int) -> LayerBuffer:
        # one zero row in every slot: nothing ever writes a placeholder
        return [[[0.0] * dim for _ in range(self.head_num)]] * self.page_size

    def get_kv_size_bytes(self) -> tuple[int, int]:
        """``(0, 0)``: the placeholders are not counted, as SGLang reports."""
        return 0, 0

    def set_kv_buffer(self, *args: object, **kwargs: object) -> None:
        """Always KVStorageError: nothing may write KV into this pool."""
        raise KVStorageError("NoOpMHATokenToKVPool stores no KV: set_kv_buffer is not allowed")

    def get_key_buffer(self, layer_id: int) -> LayerBuffer:
        """The placeholder of ``layer_id``: ``page_size`` zero rows."""
        return self.k_buffer[self._wait(layer_id)]

    def get_value_buffer(self, layer_id: int) -> LayerBuffer:
        """The V placeholder of ``layer_id``."""
        return self.v_buffer[self._wait(layer_id)]

    def get_kv_buffer(self, layer_id: int) -> tuple[LayerBuffer, LayerBuffer]:
        """``(get_key_buffer, get_value_buffer)``."""
        return self.get_key_buffer(layer_id), self.get_value_buffer(layer_id)

    def move_kv_cache(self, tgt_loc: Sequence[int], src_loc: Sequence[int]) -> None:
        """No KV moves; the tag record follows the slots (sources read before any write)."""
        tgt, src = self._move_pairs(tgt_loc, src_loc)
        moved = [self.tag_record.get(s, 0) for s in src]
        for t, tag in zip(tgt, moved, strict=True):
            self.tag_record[t] = tag

    def write_tags(self, loc: Sequence[int], tags: Sequence[int]) -> None:
        """Record ``tags[i]`` (``[0, TAG_LIMIT)``) for slot ``loc[i]`` (the side table; no KV is
        written); slots and tags checked first."""
        slots = self._slots(loc)
        for slot, tag in zip(slots, self._tags(tags, len(slots)), strict=True):
            self.tag_record[slot] = tag

    def _tags_at(self, slots: list[int]) -> list[int]:
        """The recorded tag of each slot (0 if never tagged)."""
        return list(map(self.tag_record.get, slots, repeat(0)))


__all__ = ["NoOpMHATokenToKVPool"]
