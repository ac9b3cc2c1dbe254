"""The SWA and Mamba families' protocols (:mod:`kvpool.protocols`) hold for kvpool's classes of
both twins and for SGLang's adapters.

mypy --strict checks every return below against its protocol (a missing member or a signature
that does not fit fails the type check); the tests build the twins' objects and call the
functions, so the protocol-typed values are the real ones. The adapters need SGLang's wheel to be
built: their functions are checked by mypy only (tests/sglang exercise the adapters themselves).
"""

from __future__ import annotations

import torch

from kvpool.optimized.mamba.hybrid_req_to_token_pool import (
    HybridReqToTokenPool as OptHybridPool,
)
from kvpool.optimized.mamba.radix_cache import MambaRadixCache as OptMambaTree
from kvpool.optimized.mamba.tree_node import MambaTreeNode as OptMambaNode
from kvpool.optimized.pools.token_allocator import TokenToKVPoolAllocator as OptTokens
from kvpool.optimized.swa.allocator import SWATokenToKVPoolAllocator as OptSWA
from kvpool.optimized.swa.radix_cache import SWARadixCache as OptSWATree
from kvpool.optimized.swa.tree_node import SWATreeNode as OptSWANode
from kvpool.protocols.mamba import (
    HybridReqToTokenPoolProtocol,
    MambaPoolProtocol,
    MambaSlotAllocatorProtocol,
    MambaTreeProtocol,
)
from kvpool.protocols.swa import SWAAllocatorProtocol, SWATreeProtocol
from kvpool.reference.mamba.hybrid_req_to_token_pool import HybridReqToTokenPool
from kvpool.reference.mamba.radix_cache import MambaRadixCache
from kvpool.reference.mamba.tree_node import MambaTreeNode
from kvpool.reference.pools.token_allocator import TokenToKVPoolAllocator
from kvpool.reference.swa.allocator import SWATokenToKVPoolAllocator
from kvpool.reference.swa.radix_cache import SWARadixCache
from kvpool.reference.swa.tree_node import SWATreeNode
from kvpool.sglang.hybrid import SGLangHybridReqToTokenPool, SGLangMambaAllocator, SGLangMambaPool
from kvpool.sglang.mamba_radix import SGLangMambaRadixCache
from kvpool.sglang.swa import SGLangSWAAllocator
from kvpool.sglang.swa_radix import SGLangSWARadixCache


def ref_swa(a: SWATokenToKVPoolAllocator) -> SWAAllocatorProtocol[list[int]]:
    return a


def opt_swa(a: OptSWA) -> SWAAllocatorProtocol[torch.Tensor]:
    return a


def sglang_swa(a: SGLangSWAAllocator) -> SWAAllocatorProtocol[torch.Tensor]:
    return a


def ref_swa_tree(t: SWARadixCache) -> SWATreeProtocol[SWATreeNode]:
    return t


def opt_swa_tree(t: OptSWATree) -> SWATreeProtocol[OptSWANode]:
    return t


def sglang_swa_tree(t: SGLangSWARadixCache) -> SWATreeProtocol[object]:
    return t


def ref_hybrid(p: HybridReqToTokenPool) -> tuple[
    HybridReqToTokenPoolProtocol, MambaSlotAllocatorProtocol, MambaPoolProtocol[list[int]]
]:  # fmt: skip
    return p, p.mamba_allocator, p.mamba_pool


def opt_hybrid(p: OptHybridPool) -> tuple[
    HybridReqToTokenPoolProtocol, MambaSlotAllocatorProtocol, MambaPoolProtocol[torch.Tensor]
]:  # fmt: skip
    return p, p.mamba_allocator, p.mamba_pool


def sglang_hybrid(
    p: SGLangHybridReqToTokenPool, a: SGLangMambaAllocator, s: SGLangMambaPool
) -> tuple[HybridReqToTokenPoolProtocol, MambaSlotAllocatorProtocol, MambaPoolProtocol[object]]:
    return p, a, s


def ref_mamba_tree(t: MambaRadixCache) -> MambaTreeProtocol[MambaTreeNode]:
    return t


def opt_mamba_tree(t: OptMambaTree) -> MambaTreeProtocol[OptMambaNode]:
    return t


def sglang_mamba_tree(t: SGLangMambaRadixCache) -> MambaTreeProtocol[object]:
    return t


def test_the_twins_swa_classes_are_the_swa_protocols() -> None:
    ref = ref_swa(SWATokenToKVPoolAllocator(16, 8, 1))
    opt = opt_swa(OptSWA(16, 8, 1))
    assert ref.available_size() == 8 and opt.available_size() == 8
    assert ref_swa(SWATokenToKVPoolAllocator(16, 8, 4)).page_size == 4
    ref_tree = ref_swa_tree(SWARadixCache(SWATokenToKVPoolAllocator(16, 8, 1), 1, 4))
    opt_tree = opt_swa_tree(OptSWATree(OptSWA(16, 8, 1), 1, 4))
    assert ref_tree.evict(0, 0) == (0, 0) == opt_tree.evict(0, 0)
    assert ref_tree.sliding_window_size == 4 == opt_tree.sliding_window_size


def test_the_twins_mamba_classes_are_the_mamba_protocols() -> None:
    ref_pool, ref_alloc, _ = ref_hybrid(HybridReqToTokenPool(4, 16, 3))
    opt_pool, opt_alloc, _ = opt_hybrid(OptHybridPool(4, 16, 3))
    assert ref_alloc.available_size() == 3 == opt_alloc.available_size()
    assert ref_pool.available_size() == opt_pool.available_size()
    ref_tree = ref_mamba_tree(MambaRadixCache(HybridReqToTokenPool(4, 16, 3),
                                              TokenToKVPoolAllocator(32)))  # fmt: skip
    opt_tree = opt_mamba_tree(OptMambaTree(OptHybridPool(4, 16, 3), OptTokens(32)))
    assert ref_tree.all_mamba_values() == [] == opt_tree.all_mamba_values()
