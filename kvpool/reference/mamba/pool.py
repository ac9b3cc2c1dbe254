"""``MambaPool``: the per-slot recurrent state of every Mamba layer (conv and temporal state).

Units: slots ``0..size`` (slot 0 is the reserved dummy padded batches write; the operations
below take slots ``1..size`` only). Each layer holds, per slot, a conv state (the sliding window
of recent inputs) and a temporal state (the SSM state). The model stores a content tag in each
instead of numbers (see :func:`kvpool.tags.mamba_state_tag`): a slot whose state was computed
from token history ``h`` holds ``mamba_state_tag(h)`` in every layer's conv and temporal state,
so a state read by the wrong request, or overwritten in place, shows a different tag.
"""

from __future__ import annotations

from collections.abc import Sequence

from kvpool.constants import RESERVED_INDEX
from kvpool.errors import (
    ConfigError,
    IndexOutOfRangeError,
    InvalidArgumentError,
    ReservedIndexError,
)
from kvpool.host_checks import int_list
from kvpool.snapshot import MambaPoolSnapshot

TAG_LIMIT = 2**24
"""State tags lie in ``[0, TAG_LIMIT)``: exact in the twin's float32 buffers
(:data:`kvpool.tags.TAG_MODULUS` is below it; 0 is a cleared slot)."""


def check_tags(values: list[int]) -> None:
    """Every tag in ``[0, TAG_LIMIT)`` (InvalidArgumentError naming the first one outside)."""
    for v in values:
        if not 0 <= v < TAG_LIMIT:
            raise InvalidArgumentError(f"tags: state tag {v} outside [0, {TAG_LIMIT})")


class MambaPool:
    """``conv[layer][slot]`` and ``temporal[layer][slot]`` state tags (0: cleared)."""

    def __init__(self, size: int, num_layers: int = 1) -> None:
        if not isinstance(size, int) or isinstance(size, bool) or size <= 0:
            raise ConfigError(f"size must be a positive number of Mamba slots, got {size!r}")
        if not isinstance(num_layers, int) or num_layers <= 0:
            raise ConfigError(f"num_layers must be positive, got {num_layers!r}")
        self.size = size
        self.num_layers = num_layers
        self.conv: list[list[int]] = [[0] * (size + 1) for _ in range(num_layers)]
        self.temporal: list[list[int]] = [[0] * (size + 1) for _ in range(num_layers)]

    def check_slots(self, indices: Sequence[int]) -> list[int]:
        """``indices`` as ints; ReservedIndexError for slot 0, IndexOutOfRangeError outside
        ``1..size``."""
        slots = int_list("Mamba slots", indices)
        for s in slots:
            if s == RESERVED_INDEX:
                raise ReservedIndexError(f"Mamba slot {RESERVED_INDEX} is reserved")
            if not RESERVED_INDEX < s <= self.size:
                raise IndexOutOfRangeError(f"Mamba slot {s} outside 1..{self.size}")
        return slots

    def clear_slots(self, indices: Sequence[int]) -> None:
        """Zero every layer's conv and temporal state of ``indices`` (a fresh request's state)."""
        slots = self.check_slots(indices)
        for buf in (self.conv, self.temporal):
            for layer in buf:
                for s in slots:
                    layer[s] = 0

    def copy_from(self, src_indices: Sequence[int], dst_indices: Sequence[int]) -> None:
        """``state[dst[i]] = state[src[i]]`` in every layer (copy-on-write of a cached state).
        The lists must have one length and share no slot (InvalidArgumentError): an overlap
        would read a slot the same copy writes."""
        src, dst = self.check_slots(src_indices), self.check_slots(dst_indices)
        if len(src) != len(dst):
            raise InvalidArgumentError(f"{len(src)} source slots for {len(dst)} destinations")
        if set(src) & set(dst) or len(set(dst)) != len(dst):
            raise InvalidArgumentError("copy_from needs distinct destinations apart from sources")
        for buf in (self.conv, self.temporal):
            for layer in buf:
                values = [layer[s] for s in src]
                for d, v in zip(dst, values, strict=True):
                    layer[d] = v

    def write_state(self, indices: Sequence[int], tags: Sequence[int]) -> None:
        """The forward pass: every layer's state of ``indices[i]`` becomes ``tags[i]``
        (InvalidArgumentError on a length mismatch, a slot named twice or a tag outside
        ``[0, TAG_LIMIT)``)."""
        slots = self.check_slots(indices)
        values = int_list("tags", tags)
        check_tags(values)
        if len(values) != len(slots) or len(set(slots)) != len(slots):
            raise InvalidArgumentError(f"{len(values)} tags for {len(slots)} distinct slots")
        for buf in (self.conv, self.temporal):
            for layer in buf:
                for s, v in zip(slots, values, strict=True):
                    layer[s] = v

    def state_tags(self, indices: Sequence[int]) -> list[int]:
        """Each slot's tag (-1 where layers or conv/temporal disagree)."""
        snap = self.snapshot()
        return [snap.state_tag(s) for s in self.check_slots(indices)]

    def snapshot(self) -> MambaPoolSnapshot:
        """Plain copy of every layer's tags."""
        return MambaPoolSnapshot(
            size=self.size,
            num_layers=self.num_layers,
            conv=tuple(map(tuple, self.conv)),
            temporal=tuple(map(tuple, self.temporal)),
        )


__all__ = ["TAG_LIMIT", "MambaPool", "check_tags"]
