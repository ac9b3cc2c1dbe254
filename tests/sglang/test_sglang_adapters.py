"""Opt-in (``--run-sglang-wheel``): SGLang's own classes, through kvpool.sglang's adapters, in
step with kvpool's reference on fixed scenarios (tests/sglang/scenarios.py), for each release
with a rules preset. The wheels come from ``$KVPOOL_SGLANG_CACHE`` (or ``~/.cache/kvpool/sglang``),
downloaded with ``pip download --no-deps`` when missing.

Every scenario runs the reference under the release's ``Rules`` preset; nothing is set aside.
"""

from __future__ import annotations

import sys
from typing import Any

import pytest

from kvpool.config import PoolConfig
from kvpool.reference.pools.paged_allocator import PagedTokenToKVPoolAllocator
from kvpool.reference.pools.req_to_token_pool import ReqToTokenPool
from kvpool.reference.pools.token_allocator import TokenToKVPoolAllocator
from kvpool.reference.radix.radix_cache import RadixCache
from kvpool.reference.radix_key import RadixKey
from kvpool.rules import Rules
from kvpool.sglang import (
    SGLangAllocator,
    SGLangModules,
    SGLangRadixCache,
    SGLangReqToTokenPool,
    implementation,
    load_sglang,
    make_radix_key,
)
from tests.sglang import scenarios
from tests.sglang.scenarios import Recorder, build_reference

pytestmark = pytest.mark.sglang_wheel

VERSIONS = ("0.5.16", "0.5.23")


@pytest.fixture(scope="module", params=VERSIONS)
def sgl(request: pytest.FixtureRequest) -> SGLangModules:
    return load_sglang(str(request.param))


def _config(sgl: SGLangModules, **kwargs: Any) -> PoolConfig:
    return PoolConfig(rules=Rules.for_sglang(sgl.version), **kwargs)


def _assert_same(ours: Recorder, theirs: Recorder) -> None:
    for step, (mine, other) in enumerate(zip(ours.trace, theirs.trace, strict=True)):
        assert mine[1:] == other[1:], f"step {step} {mine[0]}:\n kvpool: {mine}\n sglang: {other}"


def test_implementation_bundle(sgl: SGLangModules) -> None:
    impl = implementation(sgl.source.origin if sgl.source.wheel is None else str(sgl.source.wheel))
    assert impl.rules == Rules.for_sglang(sgl.version)
    # both releases: SGLang's own scheduler glue (kvpool.sglang.glue_manager, glue_v0516);
    # kvpool's lifecycle around the components when asked
    assert impl.manager is not None and impl.label.endswith("-glue")
    assert impl.provides("manager")
    kvpool_lifecycle = implementation(str(sgl.source.wheel or sgl.source.origin), glue=False)
    assert kvpool_lifecycle.manager is None
    assert impl.provides("radix_cache") and impl.provides("manager")
    config = _config(sgl, size=64, page_size=4)
    alloc = impl.allocator(config)  # type: ignore[misc]
    assert isinstance(alloc, SGLangAllocator) and alloc.available_size() == 64


@pytest.mark.parametrize("need_sort", [False, True])
def test_token_allocator(sgl: SGLangModules, need_sort: bool) -> None:
    config = _config(sgl, size=16, need_sort=need_sort)
    ref = Recorder(build_reference(TokenToKVPoolAllocator, config, 16, need_sort=need_sort))
    ours = Recorder(SGLangAllocator(sgl, 16, 1, need_sort))
    scenarios.token_allocator_steps(ref)
    scenarios.token_allocator_steps(ours)
    _assert_same(ref, ours)


def test_token_allocator_refusal_under_need_sort(sgl: SGLangModules) -> None:
    config = _config(sgl, size=16, need_sort=True)
    ref = Recorder(build_reference(TokenToKVPoolAllocator, config, 16, need_sort=True))
    ours = Recorder(SGLangAllocator(sgl, 16, 1, True))
    scenarios.token_allocator_refused_steps(ref)
    scenarios.token_allocator_refused_steps(ours)
    _assert_same(ref, ours)


def _paged(sgl: SGLangModules, need_sort: bool, naive: bool) -> tuple[Recorder, Recorder]:
    config = _config(sgl, size=64, page_size=4, need_sort=need_sort)
    ref = build_reference(PagedTokenToKVPoolAllocator, config, 64, 4, need_sort=need_sort)
    ours = SGLangAllocator(sgl, 64, 4, need_sort, naive_extend=naive)
    return Recorder(ref), Recorder(ours)


@pytest.mark.parametrize("naive", [False, True], ids=["triton-interpreter", "naive"])
def test_paged_allocator(sgl: SGLangModules, naive: bool) -> None:
    ref, ours = _paged(sgl, False, naive)
    scenarios.paged_allocator_steps(ref)
    scenarios.paged_allocator_steps(ours)
    _assert_same(ref, ours)


@pytest.mark.parametrize("naive", [False, True], ids=["triton-interpreter", "naive"])
def test_paged_allocator_need_sort(sgl: SGLangModules, naive: bool) -> None:
    ref, ours = _paged(sgl, True, naive)
    scenarios.paged_allocator_steps(ref)
    scenarios.paged_allocator_steps(ours)
    _assert_same(ref, ours)


def test_req_to_token_pool_rows_follow_sglang(sgl: SGLangModules) -> None:
    """SGLang's row order, written out: FIFO from ``[1..size]`` up to 0.5.17; from 0.5.18 the
    batch takes the block ``free_slots[-n:]`` of the same initial list (so a fresh pool hands
    out its highest rows first, the first request getting the lower of them)."""
    pool = Recorder(SGLangReqToTokenPool(sgl, 4, 8))
    reqs = scenarios.req_to_token_steps(pool)
    first_batch = pool.trace[0][1]
    fifo = Rules.for_sglang(sgl.version).row_order == "fifo"
    assert first_batch == ([1, 2, 3] if fifo else [2, 3, 4])
    assert pool.trace[2][1][:3] == [11, 12, 13]  # read back what was written
    refused = pool.trace[5]
    assert refused[1] is None and pool.trace[6][1] == 0
    assert reqs[3] is reqs[0] and reqs[0].req_pool_idx == first_batch[0]  # kept its row
    assert all(r.req_pool_idx is not None for r in reqs[4:5])  # set on kvpool's own objects
    generations = pool.trace[-1][2].req_generation
    if sgl.version == "0.5.16":
        assert generations == (0, 1, 0, 0, 0)  # clear() zeroed them; then row 1 handed out
    else:
        assert sum(generations) == 6  # 0.5.23 keeps them across clear(): 6 rows handed out


def test_req_to_token_pool_against_reference(sgl: SGLangModules) -> None:
    config = _config(sgl, req_pool_size=4, max_context_len=8)
    ref = Recorder(build_reference(ReqToTokenPool, config, 4, 8))
    ours = Recorder(SGLangReqToTokenPool(sgl, 4, 8))
    scenarios.req_to_token_steps(ref)
    scenarios.req_to_token_steps(ours)
    _assert_same(ref, ours)


class _TreeRecorder(Recorder):
    """Records tree snapshots (hit counts included: the reference counts them as SGLang does)
    plus the allocator."""

    def __init__(self, component: Any, alloc: Any) -> None:
        super().__init__(component)
        self.alloc = alloc

    def snap(self) -> Any:
        return (self.component.snapshot(), self.alloc.snapshot())


def _radix_pair(
    sgl: SGLangModules, page_size: int, policy: str
) -> tuple[_TreeRecorder, _TreeRecorder, Any, Any]:
    config = _config(sgl, size=128, page_size=page_size, eviction_policy=policy)
    cls = TokenToKVPoolAllocator if page_size == 1 else PagedTokenToKVPoolAllocator
    args = (128,) if page_size == 1 else (128, page_size)
    ref_alloc = build_reference(cls, config, *args)
    ref_pool = build_reference(ReqToTokenPool, config, 4, 64)
    ref = RadixCache(ref_pool, ref_alloc, page_size, eviction_policy=policy)
    our_alloc = SGLangAllocator(sgl, 128, page_size)
    our_pool = SGLangReqToTokenPool(sgl, 4, 64)
    ours = SGLangRadixCache(sgl, our_pool, our_alloc, page_size, eviction_policy=policy)
    return _TreeRecorder(ref, ref_alloc), _TreeRecorder(ours, our_alloc), ref_alloc, our_alloc


@pytest.mark.parametrize("page_size", [1, 4])
@pytest.mark.parametrize("policy", ["lru", "mru", "lfu", "priority"])
def test_radix_cache(sgl: SGLangModules, page_size: int, policy: str) -> None:
    ref, ours, ref_alloc, our_alloc = _radix_pair(sgl, page_size, policy)
    scenarios.radix_steps(ref, ref_alloc, lambda t: RadixKey(t), page_size)
    scenarios.radix_steps(ours, our_alloc, lambda t: make_radix_key(sgl, t, None), page_size)
    _assert_same(ref, ours)


def test_radix_cache_hit_counts(sgl: SGLangModules) -> None:
    """SGLang counts a hit on every node an insert walks or creates (0.5.23: only past the
    request's ``inserted_len``), never in match_prefix; so does kvpool's reference."""
    cache = SGLangRadixCache(sgl, SGLangReqToTokenPool(sgl, 2, 8), SGLangAllocator(sgl, 32), 1)
    cache.insert(make_radix_key(sgl, [1, 2, 3], None), [1, 2, 3])
    cache.insert(make_radix_key(sgl, [1, 2, 3], None), [4, 5, 6])
    cache.match_prefix(make_radix_key(sgl, [1, 2], None))
    hits = {n.key: n.hit_count for n in cache.snapshot().nodes}
    assert hits[(1, 2)] == 2 and hits[(3,)] == 2  # two inserts; the match counted nothing


def test_loading_imports_no_heavy_dependency(sgl: SGLangModules) -> None:
    SGLangRadixCache(sgl, SGLangReqToTokenPool(sgl, 2, 8), SGLangAllocator(sgl, 64, 4), 4)
    heavy = ("sglang", "sgl_kernel", "flashinfer", "vllm", "transformers")
    assert [m for m in sys.modules if m.partition(".")[0] in heavy] == []
    paged = sgl.module("sglang.srt.mem_cache.allocator.paged")
    assert paged.__name__.startswith("_kvpool_sglang_") and "sglang" not in sys.modules
