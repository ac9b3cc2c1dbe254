"""``NoOpMHATokenToKVPool`` (torch twin of :mod:`kvpool.reference.kv.noop`).

Per layer a ``(page_size, head_num, head_dim)`` zero placeholder (SGLang's shape) for K and V;
``set_kv_buffer`` raises :class:`~kvpool.errors.KVStorageError`; tags live in the side table
``tag_record`` (slot -> tag), which ``move_kv_cache`` moves.
"""

from __future__ import annotations

import numpy as np
import numpy.typing as npt
import torch

from kvpool.errors import KVStorageError
from kvpool.optimized.host_view import in_bounds
from kvpool.optimized.kv.kv_cache import IndexLike, KVCache
from kvpool.optimized.options import TwinOptions


class NoOpMHATokenToKVPool(KVCache):
    """Capacity without storage (see the reference)."""

    def __init__(
        self,
        size: int,
        page_size: int,
        dtype: str | torch.dtype,
        head_num: int,
        head_dim: int,
        layer_num: int,
        start_layer: int = 0,
        v_head_dim: int | None = None,
        *,
        options: TwinOptions | None = None,
    ) -> None:
        super().__init__(
            size,
            page_size,
            dtype,
            layer_num,
            start_layer,
            options=options,
        )
        self._set_mha_heads(head_num, head_dim, v_head_dim)
        self.k_buffer = [self._placeholder(head_dim) for _ in range(layer_num)]
        self.v_buffer = [self._placeholder(self.v_head_dim) for _ in range(layer_num)]
        self.tag_record: dict[int, int] = {}

    def _placeholder(self, dim: int) -> torch.Tensor:
        shape = (self.page_size, self.head_num, dim)
        return torch.zeros(shape, dtype=self.store_dtype, device=self.device)

    def get_kv_size_bytes(self) -> tuple[int, int]:
        """``(0, 0)``, as SGLang reports."""
        return 0, 0

    def set_kv_buffer(self, *args: object, **kwargs: object) -> None:
        """Always KVStorageError: nothing may write KV into this pool."""
        raise KVStorageError("NoOpMHATokenToKVPool stores no KV: set_kv_buffer is not allowed")

    def get_key_buffer(self, layer_id: int) -> torch.Tensor:
        """The placeholder of ``layer_id``: ``(page_size, head_num, head_dim)`` zeros."""
        return self._view(self.k_buffer[self._wait(layer_id)])

    def get_value_buffer(self, layer_id: int) -> torch.Tensor:
        """The V placeholder of ``layer_id``."""
        return self._view(self.v_buffer[self._wait(layer_id)])

    def get_kv_buffer(self, layer_id: int) -> tuple[torch.Tensor, torch.Tensor]:
        """``(get_key_buffer, get_value_buffer)``."""
        return self.get_key_buffer(layer_id), self.get_value_buffer(layer_id)

    def move_kv_cache(self, tgt_loc: IndexLike, src_loc: IndexLike) -> None:
        """No KV moves; the tag record follows the slots (sources read before any write)."""
        tgt_slots, src_slots = self._move_pairs(tgt_loc, src_loc)
        tgt, src = tgt_slots.tolist(), src_slots.tolist()
        moved = [self.tag_record.get(s, 0) for s in src]
        for t, tag in zip(tgt, moved, strict=True):
            self.tag_record[t] = tag

    def write_tags(self, loc: IndexLike, tags: IndexLike) -> None:
        """Record ``tags[i]`` (``[0, TAG_LIMIT)``) for slot ``loc[i]`` (the side table; no KV is
        written); slots and tags checked first."""
        slots = self._slots(loc).tolist()
        values = self._tags(tags, len(slots)).tolist()
        for slot, tag in zip(slots, values, strict=True):
            self.tag_record[slot] = int(tag)

    def read_tags(self, loc: IndexLike) -> list[int]:
        """The recorded tag of each slot (0 if never tagged)."""
        return [self.tag_record.get(s, 0) for s in self._slots(loc).tolist()]

    def _snapshot_tags(self, slots: npt.NDArray[np.int64]) -> list[int]:
        """:meth:`read_tags` of a manager's own slots (host values: no tensor is made)."""
        if not in_bounds(slots, self.num_rows):
            return self.read_tags(slots.tolist())  # its IndexOutOfRangeError
        record = self.tag_record
        return [record.get(s, 0) for s in slots.tolist()]


__all__ = ["NoOpMHATokenToKVPool"]
