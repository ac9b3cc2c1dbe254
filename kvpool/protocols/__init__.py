"""The contract of every component, as ``typing.Protocol`` classes both twins satisfy: one module
per family (``requests``, ``pools``, ``kv``, ``radix``, ``lifecycle``, ``hicache``, ``swa``,
``mamba``; the type variables in ``index``), every class exported here.

``IdxT`` is the index-container type of a twin: ``list[int]`` in :mod:`kvpool.reference`,
``torch.Tensor`` (int64 for slots, int32 for table rows) in :mod:`kvpool.optimized`. Results are
compared across twins after converting with ``list(x)`` / ``x.tolist()``; they must be equal
element by element, in order.

Shared rules (both twins, every method):
- Misuse raises a subclass of :class:`kvpool.errors.KVPoolError` and changes nothing.
- A pool allocation that does not fit returns ``None`` and changes nothing.
- A lifecycle helper (memory manager) that cannot get memory even after eviction raises
  :class:`kvpool.errors.OutOfMemoryError`, again leaving every pool, lock and size unchanged
  (a ``match_prefix`` split or access-time refresh done on the way may remain).
- Index 0 (:data:`kvpool.constants.RESERVED_INDEX`) is never handed out: not row 0, not slot 0,
  not page 0.
"""

from kvpool.protocols.hicache import (
    AckT,
    HostControllerProtocol,
    HostPoolProtocol,
    HostTierTreeProtocol,
    NodeT,
    TaggedKVPoolProtocol,
)
from kvpool.protocols.index import IdxT, IdxT_co, IdxT_contra
from kvpool.protocols.kv import KVCacheProtocol, KVPoolProtocol, LayerTransferCounter
from kvpool.protocols.lifecycle import MemoryManagerProtocol
from kvpool.protocols.mamba import (
    HybridReqToTokenPoolProtocol,
    MambaNodeT_contra,
    MambaPoolProtocol,
    MambaSlotAllocatorProtocol,
    MambaTreeProtocol,
)
from kvpool.protocols.pools import (
    PagedAllocatorProtocol,
    ReqToTokenPoolProtocol,
    SegmentAllocatorProtocol,
    TokenAllocatorProtocol,
)
from kvpool.protocols.radix import RadixCacheProtocol
from kvpool.protocols.requests import MambaReqLike, ReqLike
from kvpool.protocols.swa import SWAAllocatorProtocol, SWANodeT_contra, SWATreeProtocol

__all__ = [
    "AckT",
    "HostControllerProtocol",
    "HostPoolProtocol",
    "HostTierTreeProtocol",
    "HybridReqToTokenPoolProtocol",
    "IdxT",
    "IdxT_co",
    "IdxT_contra",
    "KVCacheProtocol",
    "KVPoolProtocol",
    "LayerTransferCounter",
    "MambaNodeT_contra",
    "MambaPoolProtocol",
    "MambaReqLike",
    "MambaSlotAllocatorProtocol",
    "MambaTreeProtocol",
    "MemoryManagerProtocol",
    "NodeT",
    "PagedAllocatorProtocol",
    "RadixCacheProtocol",
    "ReqLike",
    "ReqToTokenPoolProtocol",
    "SWAAllocatorProtocol",
    "SWANodeT_contra",
    "SWATreeProtocol",
    "SegmentAllocatorProtocol",
    "TaggedKVPoolProtocol",
    "TokenAllocatorProtocol",
]
