"""TwinOptions is the one route for device, checked mode and kernel backend (issue 20, item 4).

The harness's optimized implementation builds one options value and every component its
factories build carries that very object, sub-components included: a kernel backend or a checked
mode is never dropped on the way down. A tree is built over collaborators run by *other* options,
so that a tree which fell back to its allocator's options would be caught.
"""

from __future__ import annotations

import inspect
from collections.abc import Iterable
from typing import Any

import pytest

from kvpool.config import PoolConfig
from kvpool.errors import ConfigError
from kvpool.optimized.lifecycle.memory_manager import MemoryManager
from kvpool.optimized.lifecycle.swa_memory_manager import SWAMemoryManager
from kvpool.optimized.mamba.hybrid_req_to_token_pool import HybridReqToTokenPool
from kvpool.optimized.options import TwinOptions, edge_options, twin_options
from kvpool.optimized.pools.allocator_choice import allocator_for
from kvpool.optimized.pools.paged_allocator import PagedTokenToKVPoolAllocator
from kvpool.optimized.pools.req_to_token_pool import ReqToTokenPool
from kvpool.optimized.radix.radix_cache import RadixCache
from kvpool.optimized.swa.allocator import SWATokenToKVPoolAllocator
from kvpool.rules import Rules
from kvpool.testing.bundle import Implementation
from kvpool.testing.implementations import optimized_implementation

NEW = Rules.for_sglang("0.5.23")
PLAIN = PoolConfig(size=32, page_size=4, req_pool_size=4, max_context_len=32)
HOST = PoolConfig(size=16, req_pool_size=4, max_context_len=64, enable_hierarchical_cache=True,
                  hicache_ratio=1.0)  # fmt: skip
MAMBA = PoolConfig(size=64, req_pool_size=4, max_context_len=32, mamba_slots=3)
SWA = PoolConfig(size=32, page_size=1, sliding_window=4, swa_full_tokens_ratio=0.5)
OTHER = TwinOptions.make(checked=True, backend=None)
"""The collaborators' options: differ from the implementation's in checked mode and backend."""


def twin_parts(root: object, given: Iterable[object] = ()) -> list[object]:
    """Every object of the twin (its class defined under ``kvpool.optimized``) reachable from
    ``root`` through attributes, lists, tuples and dict values; ``given`` collaborators are not
    walked into (they were built elsewhere)."""
    seen = {id(g) for g in given}
    found: list[object] = []
    stack: list[object] = [root]
    while stack:
        obj = stack.pop()
        if id(obj) in seen:
            continue
        seen.add(id(obj))
        if isinstance(obj, (list, tuple)):
            stack.extend(obj)
        elif isinstance(obj, dict):
            stack.extend(obj.values())
        elif type(obj).__module__.startswith("kvpool.optimized") and not inspect.isroutine(obj):
            found.append(obj)
            stack.extend(getattr(obj, "__dict__", {}).values())
    return found


def carriers(root: object, opts: TwinOptions, given: Iterable[object] = ()) -> set[str]:
    """Class names of the parts of ``root`` that hold options, after checking each holds
    ``opts`` itself (and that a part's own ``checked`` / ``kernel_backend`` are its)."""
    names: set[str] = set()
    for part in twin_parts(root, given):
        held = getattr(part, "options", None)
        if isinstance(held, TwinOptions):
            assert held is opts, f"{type(part).__name__} runs with {held}, not {opts}"
            names.add(type(part).__name__)
        checked = getattr(part, "checked", None)
        if isinstance(checked, bool):
            assert checked is opts.checked, type(part).__name__
        if hasattr(part, "kernel_backend"):
            assert part.kernel_backend == opts.backend, type(part).__name__
    return names


@pytest.fixture(scope="module")
def impl() -> Implementation:
    return optimized_implementation("interpret", checked=False)


def impl_options(impl: Implementation) -> TwinOptions:
    """The implementation's one options value, read off its manager."""
    assert impl.manager is not None
    opts = impl.manager(PLAIN).options
    assert isinstance(opts, TwinOptions)
    assert (opts.checked, opts.backend) == (False, "interpret")
    return opts


def test_every_factory_hands_down_the_implementations_options(impl: Implementation) -> None:
    opts = impl_options(impl)
    f: Any = impl  # every factory of the optimized implementation is present
    for ps, name in ((1, "TokenToKVPoolAllocator"), (4, "PagedTokenToKVPoolAllocator")):
        assert name in carriers(f.allocator(PoolConfig(size=32, page_size=ps)), opts)
    assert "ReqToTokenPool" in carriers(f.req_to_token_pool(PLAIN), opts)
    assert "MHATokenToKVPool" in carriers(f.kv_cache(PLAIN), opts)
    hybrid = f.hybrid_req_to_token_pool(MAMBA)
    assert carriers(hybrid, opts) >= {"HybridReqToTokenPool", "MambaPool", "MambaSlotAllocator"}
    swa_alloc = f.swa_allocator(SWA)
    assert carriers(swa_alloc, opts) >= {"SWATokenToKVPoolAllocator", "TokenToKVPoolAllocator"}


def test_trees_take_the_implementations_options_not_their_allocators(
    impl: Implementation,
) -> None:
    opts = impl_options(impl)
    f: Any = impl
    pool = ReqToTokenPool(4, 64, options=OTHER)
    alloc = allocator_for(PLAIN.size, PLAIN.page_size, options=OTHER)
    given = (pool, alloc)
    assert "RadixCache" in carriers(f.radix_cache(PLAIN, pool, alloc), opts, given)
    assert "UnifiedRadixCache" in carriers(f.unified_radix_cache(PLAIN, pool, alloc), opts, given)
    host_alloc = allocator_for(HOST.size, HOST.page_size, options=OTHER)
    hi = f.hiradix_cache(HOST, pool, host_alloc)
    assert carriers(hi, opts, (pool, host_alloc)) >= {"HiRadixCache", "MHATokenToKVPool"}
    hybrid = HybridReqToTokenPool(4, 32, 3, options=OTHER)
    token = allocator_for(MAMBA.size, 1, options=OTHER)
    mamba_given = (hybrid, token)
    assert "MambaRadixCache" in carriers(f.mamba_radix_cache(MAMBA, hybrid, token), opts,
                                         mamba_given)  # fmt: skip
    unified_mamba = f.unified_mamba_radix_cache(MAMBA, hybrid, token)
    assert "UnifiedMambaRadixCache" in carriers(unified_mamba, opts, mamba_given)
    swa_alloc = SWATokenToKVPoolAllocator(SWA.size, SWA.swa_size, 1, options=OTHER)
    assert "SWARadixCache" in carriers(f.swa_radix_cache(SWA, swa_alloc), opts, (swa_alloc,))
    unified_swa = f.unified_swa_radix_cache(SWA, swa_alloc)
    assert "UnifiedSWARadixCache" in carriers(unified_swa, opts, (swa_alloc,))


@pytest.mark.parametrize(
    "config",
    [
        PLAIN,
        PoolConfig(size=32, page_size=1, disable_radix_cache=True),
        HOST,
        MAMBA,
        PoolConfig(size=64, req_pool_size=4, max_context_len=32, mamba_slots=3, rules=NEW),
    ],
    ids=["radix", "chunk", "host-tier", "mamba", "unified-mamba"],
)
def test_the_manager_hands_its_options_to_every_part(
    impl: Implementation, config: PoolConfig
) -> None:
    opts = impl_options(impl)
    assert impl.manager is not None
    names = carriers(impl.manager(config), opts)
    assert names >= {"MemoryManager", "ReqToTokenPool" if config.mamba_slots is None else
                     "HybridReqToTokenPool", "MHATokenToKVPool"}  # fmt: skip
    assert names & {"RadixCache", "ChunkCache", "HiRadixCache", "MambaLifecycleCache",
                    "UnifiedMambaLifecycleCache"}  # fmt: skip


@pytest.mark.parametrize(
    "config",
    [SWA, PoolConfig(size=32, page_size=1, sliding_window=4, swa_full_tokens_ratio=0.5,
                     disable_radix_cache=True),
     PoolConfig(size=32, page_size=1, sliding_window=4, swa_full_tokens_ratio=0.5, rules=NEW)],
    ids=["radix", "chunk", "scheduler"],
)  # fmt: skip
def test_the_swa_manager_hands_its_options_to_every_part(
    impl: Implementation, config: PoolConfig
) -> None:
    opts = impl_options(impl)
    assert impl.swa_manager is not None
    names = carriers(impl.swa_manager(config), opts)
    assert names >= {"SWAMemoryManager", "SWATokenToKVPoolAllocator", "SWAKVPool"}
    assert names & {"SWARadixCache", "UnifiedSWARadixCache", "SWAChunkCache"}


def test_the_edges_keep_the_shorthand_and_components_take_options_only() -> None:
    built = MemoryManager(PLAIN, checked=False, kernel_backend="interpret")
    assert (built.options.checked, built.options.backend) == (False, "interpret")
    assert carriers(built, built.options) >= {"MemoryManager", "PagedTokenToKVPoolAllocator"}
    swa = SWAMemoryManager(SWA, checked=False, kernel_backend="interpret")
    assert carriers(swa, swa.options) >= {"SWAMemoryManager", "SWAKVPool"}
    with pytest.raises(ConfigError, match="not both"):
        edge_options(OTHER, checked=True)
    assert edge_options(OTHER) is OTHER
    assert twin_options(OTHER) is OTHER
    assert twin_options() == TwinOptions.make()
    with pytest.raises(ConfigError, match="TwinOptions"):
        twin_options("cpu")  # type: ignore[arg-type]
    for name in ("device", "checked", "kernel_backend"):  # one route: no loose keywords
        params = inspect.signature(PagedTokenToKVPoolAllocator).parameters
        assert name not in params
        assert name not in inspect.signature(RadixCache).parameters
