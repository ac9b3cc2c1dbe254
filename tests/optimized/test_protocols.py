"""Both twins satisfy the shared contracts of :mod:`kvpool.protocols`.

Statically: mypy checks this module, where each instance is assigned to a variable typed with its
Protocol (``list[int]`` indices for the reference, ``torch.Tensor`` for the twin). At run time:
every Protocol member exists on both, with the Protocol's parameter names in the same order.
"""

from __future__ import annotations

import inspect
from typing import Any

import pytest
import torch

from kvpool import optimized as opt
from kvpool import reference as ref
from kvpool.config import PoolConfig
from kvpool.optimized.lifecycle.memory_manager import MemoryManager as TwinManager
from kvpool.optimized.radix.radix_cache import RadixCache as TwinRadixCache
from kvpool.protocols.kv import KVCacheProtocol
from kvpool.protocols.lifecycle import MemoryManagerProtocol
from kvpool.protocols.pools import (
    PagedAllocatorProtocol,
    ReqToTokenPoolProtocol,
    TokenAllocatorProtocol,
)
from kvpool.protocols.radix import RadixCacheProtocol
from kvpool.protocols.requests import ReqLike
from kvpool.reference.kv.mha import MHATokenToKVPool as RefMHA
from kvpool.reference.kv.mla import MLATokenToKVPool as RefMLA
from kvpool.reference.lifecycle.memory_manager import MemoryManager as RefManager
from kvpool.reference.radix.radix_cache import RadixCache as RefRadixCache
from tests.optimized.test_diff_req_to_token_pool import Req

# ----------------------------------------------------------------------------- static (mypy)
ref_table: ReqToTokenPoolProtocol[list[int]] = ref.ReqToTokenPool(4, 8)
twin_table: ReqToTokenPoolProtocol[torch.Tensor] = opt.ReqToTokenPool(4, 8)
ref_tokens: TokenAllocatorProtocol[list[int]] = ref.TokenToKVPoolAllocator(8)
twin_tokens: TokenAllocatorProtocol[torch.Tensor] = opt.TokenToKVPoolAllocator(8)
ref_paged: PagedAllocatorProtocol[list[int]] = ref.PagedTokenToKVPoolAllocator(16, 4)
twin_paged: PagedAllocatorProtocol[torch.Tensor] = opt.PagedTokenToKVPoolAllocator(16, 4)
ref_paged_ps1: PagedAllocatorProtocol[list[int]] = ref.TokenToKVPoolAllocator(8)
twin_paged_ps1: PagedAllocatorProtocol[torch.Tensor] = opt.TokenToKVPoolAllocator(8)
ref_mha: KVCacheProtocol = RefMHA(8, 4, "float32", 1, 2, 2)
twin_mha: KVCacheProtocol = opt.MHATokenToKVPool(8, 4, torch.float32, 1, 2, 2)
ref_mla: KVCacheProtocol = RefMLA(8, 4, 2, 1, 2)
twin_mla: KVCacheProtocol = opt.MLATokenToKVPool(8, 4, 2, 1, 2)
a_request: ReqLike = Req()
ref_tree: RadixCacheProtocol[list[int]] = RefRadixCache(
    ref.ReqToTokenPool(4, 8), ref.PagedTokenToKVPoolAllocator(16, 4), 4
)
twin_tree: RadixCacheProtocol[torch.Tensor] = TwinRadixCache(
    opt.ReqToTokenPool(4, 8), opt.PagedTokenToKVPoolAllocator(16, 4), 4
)
ref_manager: MemoryManagerProtocol[list[int]] = RefManager(PoolConfig(size=16, page_size=4))
twin_manager: MemoryManagerProtocol[torch.Tensor] = TwinManager(PoolConfig(size=16, page_size=4))

PAIRS: list[tuple[type, Any, Any]] = [
    (ReqToTokenPoolProtocol, ref_table, twin_table),
    (TokenAllocatorProtocol, ref_tokens, twin_tokens),
    (PagedAllocatorProtocol, ref_paged, twin_paged),
    (PagedAllocatorProtocol, ref_paged_ps1, twin_paged_ps1),
    (KVCacheProtocol, ref_mha, twin_mha),
    (KVCacheProtocol, ref_mla, twin_mla),
    (RadixCacheProtocol, ref_tree, twin_tree),
    (MemoryManagerProtocol, ref_manager, twin_manager),
]


def protocol_members(protocol: type) -> dict[str, Any]:
    """Public methods and annotated attributes a Protocol declares (its bases included)."""
    members: dict[str, Any] = {}
    for klass in reversed(protocol.__mro__):
        if not klass.__module__.startswith("kvpool.protocols"):
            continue
        members.update({n: None for n in getattr(klass, "__annotations__", {})})
        members.update(
            {n: f for n, f in vars(klass).items() if callable(f) and not n.startswith("_")}
        )
    return members


@pytest.mark.parametrize(("protocol", "reference", "twin"), PAIRS)
def test_both_twins_have_every_member_with_the_same_parameters(
    protocol: type, reference: Any, twin: Any
) -> None:
    members = protocol_members(protocol)
    assert members, protocol
    for name, func in members.items():
        for impl in (reference, twin):
            assert hasattr(impl, name), f"{type(impl).__qualname__} lacks {name}"
            if func is None:
                continue
            wanted = list(inspect.signature(func).parameters)[1:]  # without self
            got = list(inspect.signature(getattr(impl, name)).parameters)
            assert got[: len(wanted)] == wanted, f"{type(impl).__qualname__}.{name}: {got}"


def test_request_like_is_runtime_checkable() -> None:
    assert isinstance(a_request, ReqLike)
    assert twin_table.alloc([a_request]) == ref_table.alloc([Req()]) == [4]
