"""``MambaPool`` (optimized twin): per-layer conv and temporal state buffers on the device.

Units: slots ``0..size`` (slot 0 the reserved dummy). ``conv[0]`` is a float32 tensor
``[num_layers, size + 1, conv_width]`` (the sliding window of recent inputs) and ``temporal``
``[num_layers, size + 1, state_dim]`` (the SSM state), as SGLang lays them out (SGLang keeps a
list of conv tensors; one suffices here). The model writes a state tag
(:func:`kvpool.tags.mamba_state_tag`, exact in float32) into every element of a slot's state;
the snapshot reads it back and reports -1 for a slot whose elements disagree. Same API, results
and errors as :mod:`kvpool.reference.mamba.pool`; every operation is one batched index op per
buffer, with no device-to-host sync unless ``checked`` (then slot ranges are checked first).
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from contextlib import contextmanager

import numpy as np
import torch

from kvpool.constants import RESERVED_INDEX
from kvpool.errors import (
    ConfigError,
    IndexOutOfRangeError,
    InvalidArgumentError,
    ReservedIndexError,
)
from kvpool.host_checks import int_list
from kvpool.optimized.host_view import host_array
from kvpool.optimized.index_args import index_tensor
from kvpool.optimized.options import TwinOptions, twin_options
from kvpool.reference.mamba.pool import check_tags
from kvpool.snapshot import MambaPoolSnapshot

IndexLike = torch.Tensor | Sequence[int]

_EXACT_TAG_LIMIT = float(2**53)
"""Below this magnitude a state value converts to int64 exactly (truncation, as torch's)."""
_PYTHON_SIZE = 512
"""A state buffer of at most this many values is decoded in Python (numpy calls cost more)."""


@contextmanager
def _out_of_range() -> Iterator[None]:
    """Unchecked mode names no slot range before an indexed op; an op given a slot past the
    buffers fails on the CPU before it writes anything (every buffer has the same slot
    dimension, so the first one fails): that failure is IndexOutOfRangeError, not torch's."""
    try:
        yield
    except IndexError as exc:
        raise IndexOutOfRangeError(f"Mamba slots outside 0..size: {exc}") from None


class MambaPool:
    """``conv`` (list of one tensor) and ``temporal`` state buffers; every element of a slot's
    state holds its tag (0: cleared)."""

    def __init__(
        self,
        size: int,
        num_layers: int = 1,
        conv_width: int = 3,
        state_dim: int = 4,
        *,
        options: TwinOptions | None = None,
    ) -> None:
        if not isinstance(size, int) or isinstance(size, bool) or size <= 0:
            raise ConfigError(f"size must be a positive number of Mamba slots, got {size!r}")
        if not isinstance(num_layers, int) or num_layers <= 0:
            raise ConfigError(f"num_layers must be positive, got {num_layers!r}")
        self.size = size
        self.num_layers = num_layers
        self.options = opts = twin_options(options)
        self.device = opts.device
        self.checked = opts.checked
        shape = (num_layers, size + 1)
        self.conv: list[torch.Tensor] = [
            torch.zeros((*shape, conv_width), dtype=torch.float32, device=self.device)
        ]
        self.temporal = torch.zeros((*shape, state_dim), dtype=torch.float32, device=self.device)

    def _buffers(self) -> list[torch.Tensor]:
        return [*self.conv, self.temporal]

    def _host_views(self, slots: torch.Tensor) -> bool:
        """Whether indexed stores of ``slots`` may go through NumPy views: checked mode (the
        slots were range-checked, so both stores write the same) with the slots and every
        buffer on the CPU."""
        return self.checked and slots.is_cpu and all(buf.is_cpu for buf in self._buffers())

    def check_slots_host(self, slots: Sequence[int]) -> list[int]:
        """Host ints: ReservedIndexError for slot 0, IndexOutOfRangeError outside ``1..size``
        (a tensor or array given here is read to the host: a 1-D integer index, else
        InvalidArgumentError)."""
        if isinstance(slots, torch.Tensor | np.ndarray):
            out = index_tensor("Mamba slots", slots, "cpu").tolist()
        else:
            out = int_list("Mamba slots", slots)
        for s in out:
            if s == RESERVED_INDEX:
                raise ReservedIndexError(f"Mamba slot {RESERVED_INDEX} is reserved")
            if not RESERVED_INDEX < s <= self.size:
                raise IndexOutOfRangeError(f"Mamba slot {s} outside 1..{self.size}")
        return out

    def check_slots(self, indices: IndexLike) -> torch.Tensor:
        """``indices`` as an int64 tensor on the device; a host sequence is always checked as
        :meth:`check_slots_host`, a tensor only in checked mode (that syncs). A tensor must be
        1-D of an integer dtype (InvalidArgumentError: metadata, both modes)."""
        if not isinstance(indices, torch.Tensor):
            return torch.tensor(self.check_slots_host(indices), dtype=torch.int64).to(self.device)
        slots = index_tensor("Mamba slots", indices, self.device)
        if self.checked:
            self.check_slots_host(slots.tolist())
        return slots

    def clear_slots(self, indices: IndexLike) -> None:
        """Zero every layer's conv and temporal state of ``indices``."""
        slots = self.check_slots(indices)
        with _out_of_range():
            if self._host_views(slots):  # NumPy views of CPU buffers: no tensor operation
                index = slots.numpy()
                for buf in self._buffers():
                    buf.numpy()[:, index] = 0
                return
            for buf in self._buffers():
                buf[:, slots] = 0

    def copy_from(self, src_indices: IndexLike, dst_indices: IndexLike) -> None:
        """``state[dst[i]] = state[src[i]]`` in every layer (copy-on-write of a cached state);
        one length, no shared slot (InvalidArgumentError; the overlap check syncs and runs in
        checked mode or for host sequences)."""
        host = not isinstance(src_indices, torch.Tensor)
        src, dst = self.check_slots(src_indices), self.check_slots(dst_indices)
        if src.numel() != dst.numel():
            raise InvalidArgumentError(f"{src.numel()} source slots for {dst.numel()} destinations")
        if self.checked or host:
            s, d = src.tolist(), dst.tolist()
            if set(s) & set(d) or len(set(d)) != len(d):
                raise InvalidArgumentError(
                    "copy_from needs distinct destinations apart from sources"
                )
        with _out_of_range():
            for buf in self._buffers():
                buf[:, dst] = buf[:, src]

    def write_state(self, indices: IndexLike, tags: IndexLike) -> None:
        """The forward pass: every element of the state of ``indices[i]`` becomes ``tags[i]``
        (integers in ``[0, TAG_LIMIT)``: host tags always checked, a tag tensor's values in
        checked mode; its dtype and shape in both)."""
        host = not isinstance(indices, torch.Tensor)
        slots = self.check_slots(indices)
        if isinstance(tags, torch.Tensor):
            tag_index = index_tensor("tags", tags, self.device)
            if self.checked:
                check_tags(tag_index.tolist())
        else:
            host_tags = int_list("tags", tags)
            check_tags(host_tags)
            tag_index = torch.tensor(host_tags, dtype=torch.int64, device=self.device)
        values = tag_index.to(torch.float32)
        if values.numel() != slots.numel():
            raise InvalidArgumentError(f"{values.numel()} tags for {slots.numel()} slots")
        if (self.checked or host) and len(set(slots.tolist())) != slots.numel():
            raise InvalidArgumentError(f"{values.numel()} tags for repeated slots")
        self._store_state(slots, values)

    def _store_state(self, slots: torch.Tensor, values: torch.Tensor) -> None:
        """The store of :meth:`write_state`: ``values[i]`` (float32, one per slot) into every
        element of the state of ``slots[i]`` (int64, on the device), for slots and tags that
        passed its checks (or the same checks on the host: the forward pass's
        :func:`~kvpool.optimized.mamba.lifecycle.forward_state`)."""
        with _out_of_range():
            if self._host_views(slots) and values.is_cpu:  # NumPy views, as clear_slots
                rows = values.numpy().reshape(1, -1, 1)
                index = slots.numpy()
                for buf in self._buffers():
                    buf.numpy()[:, index] = rows
                return
            for buf in self._buffers():
                buf[:, slots] = values.view(1, -1, 1).expand(buf.shape[0], -1, buf.shape[2])

    def state_tags(self, indices: IndexLike) -> list[int]:
        """Each slot's tag (-1 where layers or elements disagree); syncs."""
        snap = self.snapshot()
        with _out_of_range():
            return [snap.state_tag(int(s)) for s in self.check_slots(indices).tolist()]

    def _tags(self, buf: torch.Tensor) -> tuple[tuple[int, ...], ...]:
        first = buf[:, :, 0]
        agree = (buf == first.unsqueeze(-1)).all(dim=-1)
        tags = torch.where(agree, first, torch.full_like(first, -1.0)).to(torch.int64)
        return tuple(tuple(int(v) for v in row) for row in tags.tolist())

    def _host_tags(self, buf: torch.Tensor) -> tuple[tuple[int, ...], ...]:
        """:meth:`_tags` of ``buf`` from one host read (a view on the CPU), decided in numpy (in
        Python for a small buffer); a tag a float cannot give as int64 exactly (infinite, huge,
        NaN) takes :meth:`_tags`."""
        if buf.numel() <= _PYTHON_SIZE:  # a few slots: Python beats numpy's per-call cost
            out: list[tuple[int, ...]] = []
            # torch lists every dtype as the Python floats of its values (the host view's)
            # without the view's own cost
            for layer in buf.tolist():
                tags_of: list[int] = []
                for values in layer:
                    first_value = values[0]
                    if not -_EXACT_TAG_LIMIT < first_value < _EXACT_TAG_LIMIT:  # NaN too
                        return self._tags(buf)
                    agree = values.count(first_value) == len(values)
                    tags_of.append(int(first_value) if agree else -1)
                out.append(tuple(tags_of))
            return tuple(out)
        state = host_array(buf)
        first = state[:, :, 0]
        agree = (state == first[:, :, None]).all(axis=-1)
        tags = np.where(agree, first, np.float32(-1.0))
        if tags.size and not bool(np.abs(tags).max() < _EXACT_TAG_LIMIT):
            return self._tags(buf)
        rows: list[list[int]] = tags.astype(np.int64).tolist()
        return tuple(map(tuple, rows))

    def snapshot(self) -> MambaPoolSnapshot:
        """Plain copy of every layer's tags (one device-to-host copy per buffer)."""
        return MambaPoolSnapshot(
            size=self.size,
            num_layers=self.num_layers,
            conv=self._host_tags(self.conv[0]),
            temporal=self._host_tags(self.temporal),
        )


__all__ = ["MambaPool"]
