"""SGLang's ``HybridReqToTokenPool`` (with its ``MambaPool`` and ``MambaSlotAllocator``) behind
the interface of kvpool's
:class:`~kvpool.reference.mamba.hybrid_req_to_token_pool.HybridReqToTokenPool`.

SGLang builds its Mamba state buffers on a device from the model's state shapes; the adapter
builds them on the CPU with the smallest shapes (one conv state of 1 x 1, one temporal state of
1 x 1 x 1 per layer and slot) in float32, so that a kvpool state tag (an int below 2**24) is held
exactly by every element. Every slot decision (rows, Mamba slots, track buffers, the row-to-slot
mappings, frees, copies and clears) is SGLang's code; the adapter only converts:

- **Requests.** :class:`MambaReqProxy` shows a kvpool request to SGLang: ``mamba_pool_idx`` as a
  0-d int64 tensor (SGLang stacks and unsqueezes it), the track buffer as an int64 tensor, and
  what SGLang stores back (a tensor element, a tensor) as kvpool's int and list. The track
  buffer is a fresh tensor at every read: SGLang's in-place writes into it (the extra buffer's
  donation and lazy mode, which the adapted calls do not reach) would be lost.
- **Track buffers.** kvpool's ``track_buffers`` 0, 1, 2 are SGLang's extra buffer off, on with
  the overlap scheduler off (one ping-pong slot), on with it (two). The lazy mode is off.
- **Results.** Slots come back as lists of ints, as the reference's; the Mamba steps of
  :mod:`kvpool.reference.mamba.lifecycle` (the scheduler's part, which kvpool models) then run
  unchanged over this adapter.
- **Open alloc group.** SGLang keeps no group when ``alloc_group_begin`` prefetched nothing (no
  request, or too few free slots); kvpool's snapshot still says a group is open. The adapter
  records the begin / end calls for that flag; the prefetched slots are read from SGLang's
  iterator (a copy of it: reading consumes nothing).
- **The model's forward.** :meth:`SGLangMambaPool.write_state` writes a tag into every element
  of a slot's buffers: the part a real forward would compute, not SGLang's pool code.

Validation that kvpool's steps call before their first change (``check_alloc``,
``check_slots``) is kvpool's own; SGLang's misuse checks are ``assert`` statements, and a
harness does not issue misuse to an implementation with ``Rules.rejects_misuse=False``.
"""

from __future__ import annotations

import copy
import types
from collections.abc import Sequence
from typing import Any

import numpy as np
import numpy.typing as npt
import torch

from kvpool.constants import RESERVED_INDEX
from kvpool.errors import IndexOutOfRangeError, ReservedIndexError, RowReuseError
from kvpool.sglang.allocators import as_index_tensor
from kvpool.sglang.loader import SGLangModules
from kvpool.sglang.req_to_token import ReqProxy
from kvpool.snapshot import (
    HybridReqToTokenSnapshot,
    MambaAllocatorSnapshot,
    MambaPoolSnapshot,
    ReqToTokenSnapshot,
)

MEMORY_POOL = "sglang.srt.mem_cache.memory_pool"
HYBRID_RELEASES = ("0.5.16", "0.5.23")
"""Releases whose hybrid pool (``HybridReqToTokenPool``, ``MambaPool``, ``MambaSlotAllocator``)
the adapters are audited against (specs/sglang.md); :func:`kvpool.sglang.implementation`
offers them for these only."""
MAMBA_RADIX_RELEASES = ("0.5.16",)
"""Releases with the legacy ``mamba_radix_cache.py`` (0.5.23 moved the Mamba tree into the
unified cache: :mod:`kvpool.sglang.unified_mamba_radix`)."""
_STATE_DTYPE = torch.float32


def _cache_params(num_layers: int) -> Any:
    """The state shapes and dtypes SGLang's ``MambaPool`` reads (its ``BaseLinearStateParams``
    fields): the smallest conv and temporal state, float32."""
    shape = types.SimpleNamespace(
        conv=[(1, 1)], temporal=(1, 1, 1), disable_conv_window_dedup=True, conv_shard_groups=None
    )
    dtype = types.SimpleNamespace(conv=_STATE_DTYPE, temporal=_STATE_DTYPE)
    return types.SimpleNamespace(shape=shape, dtype=dtype, is_kda=False,
                                 layers=list(range(num_layers)))  # fmt: skip


def _as_tuples(tags: npt.NDArray[np.int64]) -> tuple[tuple[int, ...], ...]:
    """Rows of tags as tuples of ints."""
    return tuple(tuple(row) for row in tags.tolist())


def _opt_int(value: Any) -> int | None:
    if value is None:
        return None
    if isinstance(value, torch.Tensor):
        return int(value.reshape(-1)[0])
    return int(value)


class MambaReqProxy(ReqProxy):
    """A kvpool hybrid request as SGLang reads it (see the module docstring)."""

    def __setattr__(self, name: str, value: Any) -> None:
        if isinstance(getattr(type(self), name, None), property):
            object.__setattr__(self, name, value)  # the property converts for kvpool
        else:
            setattr(self.req, name, value)

    @property
    def holds_mamba(self) -> bool:
        """0.5.23's ``ReqKvInfo.holds_mamba``: the request has a Mamba slot."""
        return self.req.mamba_pool_idx is not None

    @property
    def mamba_pool_idx(self) -> torch.Tensor | None:
        slot = self.req.mamba_pool_idx
        return None if slot is None else torch.tensor(int(slot), dtype=torch.int64)

    @mamba_pool_idx.setter
    def mamba_pool_idx(self, value: Any) -> None:
        self.req.mamba_pool_idx = _opt_int(value)

    @property
    def mamba_cow_src_index(self) -> torch.Tensor | None:
        slot = self.req.mamba_cow_src_index
        return None if slot is None else torch.tensor([int(slot)], dtype=torch.int64)

    @mamba_cow_src_index.setter
    def mamba_cow_src_index(self, value: Any) -> None:
        self.req.mamba_cow_src_index = _opt_int(value)

    @property
    def mamba_ping_pong_track_buffer(self) -> torch.Tensor | None:
        track = self.req.mamba_ping_pong_track_buffer
        return None if track is None else torch.tensor(list(track), dtype=torch.int64)

    @mamba_ping_pong_track_buffer.setter
    def mamba_ping_pong_track_buffer(self, value: Any) -> None:
        self.req.mamba_ping_pong_track_buffer = (
            None if value is None else [int(s) for s in value.tolist()]
        )


class SGLangMambaAllocator:
    """SGLang's ``MambaSlotAllocator`` with list results (see the module docstring)."""

    def __init__(self, impl: Any) -> None:
        self.impl = impl
        self.size = int(impl.size)
        self._open = False

    def available_size(self) -> int:
        return int(self.impl.available_size())

    def schedulable_available_size(self) -> int:
        return int(self.impl.schedulable_available_size())

    def alloc(self, need_size: int) -> list[int] | None:
        got = self.impl.alloc(need_size)
        return None if got is None else [int(s) for s in got.reshape(-1).tolist()]

    def free(self, indices: Any) -> None:
        self.impl.free(as_index_tensor(indices))

    def alloc_group_begin(self, num_reqs: int) -> None:
        self.impl.alloc_group_begin(num_reqs)
        self._open = True

    def alloc_group_end(self) -> None:
        self.impl.alloc_group_end()
        self._open = False

    def clear(self) -> None:
        self.impl.clear()

    def _prefetched(self) -> tuple[int, ...]:
        pending = self.impl._alloc_iter
        if pending is None:
            return ()
        return tuple(int(t.reshape(-1)[0]) for t in copy.copy(pending))

    def snapshot(self) -> MambaAllocatorSnapshot:
        return MambaAllocatorSnapshot(
            size=self.size,
            free_slots=tuple(int(s) for s in self.impl.free_slots.tolist()),
            group_slots=self._prefetched(),
            in_group=self._open,
        )


class SGLangMambaPool:
    """SGLang's ``MambaPool`` (state buffers) with kvpool's tag view of its elements."""

    def __init__(self, impl: Any, num_layers: int) -> None:
        self.impl = impl
        self.size = int(impl.size)
        self.num_layers = num_layers

    def _buffers(self) -> tuple[list[torch.Tensor], torch.Tensor]:
        cache = self.impl.mamba_cache
        return list(cache.conv), cache.temporal

    def check_slots(self, indices: Sequence[int]) -> list[int]:
        """kvpool's validation: ReservedIndexError for slot 0, IndexOutOfRangeError outside
        ``1..size``."""
        slots = [int(s) for s in indices]
        for s in slots:
            if s == RESERVED_INDEX:
                raise ReservedIndexError(f"Mamba slot {RESERVED_INDEX} is reserved")
            if not RESERVED_INDEX < s <= self.size:
                raise IndexOutOfRangeError(f"Mamba slot {s} outside 1..{self.size}")
        return slots

    def clear_slots(self, indices: Any) -> None:
        """SGLang's ``clear_slots``."""
        self.impl.clear_slots(as_index_tensor(indices))

    def copy_from(self, src_indices: Any, dst_indices: Any) -> None:
        """SGLang's ``copy_from``."""
        self.impl.copy_from(as_index_tensor(src_indices), as_index_tensor(dst_indices))

    def write_state(self, indices: Any, tags: Any) -> None:
        """The model's forward: every element of each slot's buffers becomes its tag."""
        index = as_index_tensor(indices)
        values = torch.tensor([float(t) for t in tags], dtype=_STATE_DTYPE)
        convs, temporal = self._buffers()
        for buf in (*convs, temporal):
            shape = (1, len(values)) + (1,) * (buf.dim() - 2)
            buf[:, index] = values.view(shape).expand(buf.shape[0], len(values), *buf.shape[2:])

    def _layer_tags(self, buf: torch.Tensor) -> npt.NDArray[np.int64]:
        """Per layer and slot (rows, columns), the value all of the slot's elements hold, -1
        where they differ. In numpy: the buffers are tiny (one element per slot and layer, see
        ``_cache_params``), where torch's reductions cost more in dispatch than in work."""
        flat = buf.detach().cpu().reshape(buf.shape[0], buf.shape[1], -1).numpy()
        low, high = flat.min(axis=2), flat.max(axis=2)
        return np.where(low == high, low, -1.0).astype(np.int64)

    def snapshot(self) -> MambaPoolSnapshot:
        """kvpool's tags: per layer and slot, the value all of a buffer's elements hold (-1
        where they differ; the conv states of one layer agree or give -1)."""
        convs, temporal = self._buffers()
        conv = self._layer_tags(convs[0])
        for other in convs[1:]:
            tags = self._layer_tags(other)
            conv = np.where(conv == tags, conv, -1)
        return MambaPoolSnapshot(self.size, self.num_layers, _as_tuples(conv),
                                 _as_tuples(self._layer_tags(temporal)))  # fmt: skip

    def state_tags(self, indices: Sequence[int]) -> list[int]:
        snap = self.snapshot()
        return [snap.state_tag(s) for s in self.check_slots(indices)]


class SGLangHybridReqToTokenPool:
    """SGLang's ``HybridReqToTokenPool`` of ``size`` rows, ``max_context_len`` columns and
    ``mamba_size`` Mamba slots of ``num_mamba_layers`` layers, with ``track_buffers`` (0, 1 or 2)
    ping-pong track slots per request, on the CPU. ``impl`` is SGLang's object."""

    def __init__(
        self,
        modules: SGLangModules,
        size: int,
        max_context_len: int,
        mamba_size: int,
        num_mamba_layers: int = 1,
        track_buffers: int = 0,
    ) -> None:
        cls = modules.attr(MEMORY_POOL, "HybridReqToTokenPool")
        if cls is None:
            raise AttributeError(f"SGLang {modules.version} has no HybridReqToTokenPool")
        self.impl: Any = cls(
            size=size,
            mamba_size=mamba_size,
            mamba_spec_state_size=mamba_size,
            max_context_len=max_context_len,
            device="cpu",
            enable_memory_saver=False,
            cache_params=_cache_params(num_mamba_layers),
            mamba_layer_ids=list(range(num_mamba_layers)),
            enable_mamba_extra_buffer=track_buffers > 0,
            enable_overlap_schedule=track_buffers == 2,
        )
        self.size = size
        self.max_context_len = max_context_len
        self.track_buffers = track_buffers
        self.mamba_allocator = SGLangMambaAllocator(self.impl.mamba_allocator)
        self.mamba_pool = SGLangMambaPool(self.impl.mamba_pool, num_mamba_layers)

    # ------------------------------------------------------------------ kvpool's checks
    @property
    def free_slots(self) -> list[int]:
        return [int(r) for r in self.impl.free_slots]

    @property
    def _free_set(self) -> set[int]:
        return set(self.free_slots)

    def _check_row(self, row: int) -> int:
        return int(row)

    def check_alloc(self, reqs: Sequence[Any]) -> int:
        """Rows ``alloc`` would hand out, after SGLang's reuse rule (RowReuseError otherwise)."""
        fresh = 0
        for i, req in enumerate(reqs):
            if req.req_pool_idx is None:
                fresh += 1
            elif not (req.is_chunked > 0 or req.kv_committed_len > 0):
                raise RowReuseError(f"request {i} keeps row {req.req_pool_idx} illegally")
        return fresh

    def mamba_slots_needed(self, reqs: Sequence[Any]) -> int:
        """Mamba slots SGLang's ``alloc`` takes for ``reqs`` (one per request without a slot,
        ``track_buffers`` per request without track buffers)."""
        need = sum(1 for r in reqs if r.mamba_pool_idx is None)
        if self.track_buffers:
            need += self.track_buffers * sum(
                1 for r in reqs if r.mamba_ping_pong_track_buffer is None
            )
        return need

    # ------------------------------------------------------------------ SGLang's operations
    def alloc(self, reqs: Sequence[Any]) -> list[int] | None:
        """SGLang's ``alloc``: rows, then Mamba slots and track buffers (it asserts when those
        are short, after taking the rows: a harness under ``Rules.mamba_slot_shortage=
        "assert"`` does not ask for that)."""
        rows = self.impl.alloc([MambaReqProxy(r) for r in reqs])
        return None if rows is None else [int(r) for r in rows]

    def free(self, req: Any) -> None:
        self.impl.free(MambaReqProxy(req))

    def free_mamba_cache(
        self, req: Any, mamba_ping_pong_track_buffer_to_keep: int | None = None
    ) -> None:
        """SGLang's ``free_mamba_cache``: running slot, then the track slots of the request's
        row except the one kept."""
        self.impl.free_mamba_cache(
            MambaReqProxy(req),
            mamba_ping_pong_track_buffer_to_keep=mamba_ping_pong_track_buffer_to_keep,
        )

    def get_mamba_indices(self, rows: Sequence[int]) -> list[int]:
        got = self.impl.get_mamba_indices(as_index_tensor(rows))
        return [int(s) for s in got.tolist()]

    def available_size(self) -> int:
        return int(self.impl.available_size())

    def clear(self) -> None:
        self.impl.clear()

    # ------------------------------------------------------------------ snapshots
    def snapshot(self, rows: Sequence[tuple[int, int]] = ()) -> ReqToTokenSnapshot:
        table = self.impl.req_to_token
        return ReqToTokenSnapshot(
            size=self.size,
            max_context_len=self.max_context_len,
            free_slots=tuple(self.free_slots),
            req_generation=tuple(int(g) for g in self.impl.req_generation.tolist()),
            rows=tuple((row, tuple(table[row, :length].tolist())) for row, length in rows),
        )

    def hybrid_snapshot(self, rows: Sequence[tuple[int, int]] = ()) -> HybridReqToTokenSnapshot:
        impl = self.impl
        if self.track_buffers:
            track = tuple(
                tuple(int(s) for s in row)
                for row in impl.req_index_to_mamba_ping_pong_track_buffer_mapping.tolist()
            )
        else:
            track = tuple(() for _ in range(self.size + 1))
        return HybridReqToTokenSnapshot(
            table=self.snapshot(rows),
            mamba_allocator=self.mamba_allocator.snapshot(),
            mamba_pool=self.mamba_pool.snapshot(),
            mamba_mapping=tuple(int(s) for s in impl.req_index_to_mamba_index_mapping.tolist()),
            track_mapping=track,
        )


__all__ = [
    "HYBRID_RELEASES",
    "MAMBA_RADIX_RELEASES",
    "MambaReqProxy",
    "SGLangHybridReqToTokenPool",
    "SGLangMambaAllocator",
    "SGLangMambaPool",
]
