"""Opt-in (``--run-sglang-wheel``): SGLang 0.5.16's own ``HiRadixCache`` (its tree code, through
:class:`kvpool.sglang.hiradix.SGLangHiRadixCache`) in lockstep with kvpool's reference on the
``hiradix_cache`` machine: every result and every snapshot (tree with host fields, host pool,
transfers in flight, prefetches, content tags) equal after every step, every ``INV-HOST-*``
invariant on both, under all three write policies and every eviction policy, with storage
prefetches (SGLang's tree code; its threads as kvpool models them:
tests/sglang/test_sglang_hiradix_storage.py). SGLang 0.5.23 has no
``mem_cache/hiradix_cache.py``: its implementation offers the host tier inside the unified cache
as ``hiradix_cache`` (tests/sglang/test_sglang_unified_hicache.py).
The wheels come from ``$KVPOOL_SGLANG_CACHE``."""

from __future__ import annotations

import logging

import pytest

from kvpool.config import PoolConfig
from kvpool.rules import Rules
from kvpool.sglang import implementation
from kvpool.testing.campaign import run_machine
from kvpool.testing.implementations import reference_implementation
from kvpool.testing.runs import execute
from kvpool.testing.swarm import Op

pytestmark = pytest.mark.sglang_wheel

REACHED = (
    "insert:write-issued", "writing_check:acked", "evict:to-host", "evict:freed",
    "match_prefix:host-hit", "load_back:loaded", "loading_check:acked", "evict_host:freed",
    "inc_lock_ref:ok", "dec_lock_ref:ok", "prefetch:ok", "storage_hit:ok", "prefetch_io:ok",
    "prefetch:inserted", "prefetch:ended", "release_aborted_request:ok",
    "drain_storage_control_queues:ok",
)  # fmt: skip


def test_sglang_hiradix_cache_in_lockstep_with_the_reference(
    caplog: pytest.LogCaptureFixture,
) -> None:
    impl = implementation("0.5.16")
    assert impl.hiradix_cache is not None and impl.hiradix_storage
    caplog.set_level(logging.ERROR)  # SGLang warns on each load-back that finds no room
    result = run_machine("hiradix_cache", reference_implementation(), impl, 1e9, seed=7,
                         steps_per_run=60, max_runs=40)  # fmt: skip
    assert result.failure is None, result.failure and result.failure.report
    assert result.steps == 40 * 60 and result.invariant_checks > result.steps
    missing = [t for t in REACHED if not result.coverage.get(t)]
    assert not missing, missing


def test_a_full_host_drops_a_subtree_in_sglangs_order(caplog: pytest.LogCaptureFixture) -> None:
    """The shrunk trace of a 0.5.16 campaign (``--seed 20261202``, run 1952; specs/sglang.md,
    "Differences found against the reference"): write-back eviction stages both leaves to the
    12 host slots, their parent finds no room, and the subtree is dropped. SGLang releases the
    host slots in stack-walk order (the leaf inserted last first); kvpool walked breadth-first."""
    caplog.set_level(logging.ERROR)  # SGLang warns when it drops a subtree without a backup
    config = PoolConfig(size=20, page_size=4, eviction_policy="priority", hicache_ratio=0.5,
                        hicache_write_policy="write_back", hicache_load_back_threshold=4,
                        hicache_prefetch_threshold=4, rules=Rules.for_sglang("0.5.16"))  # fmt: skip
    no_key = (("extra_key", None),)
    ops = [Op("insert", ([2, 3, 3, 3, 1, 1, 1, 2, 2, 1, 2, 2],), no_key),
           Op("insert", ([2, 3, 3, 3, 1, 1, 3, 3, 2, 3],), no_key), Op("evict", (13,))]  # fmt: skip
    done = execute("hiradix_cache", reference_implementation(), implementation("0.5.16"), config,
                   ops=ops)  # fmt: skip
    assert done.failure is None, done.failure and str(done.failure)
    assert done.steps == 3 and done.coverage.get("evict:freed")


def test_sglang_0_5_23_offers_its_unified_host_tier_as_hiradix_cache() -> None:
    from kvpool.config import PoolConfig
    from kvpool.rules import Rules
    from kvpool.sglang.unified_hicache import SGLangUnifiedHiCache

    impl = implementation("0.5.23")
    assert impl.hiradix_cache is not None and impl.provides("hiradix_cache")
    # 0.5.23's storage prefetches run through its unified cache (kvpool.sglang.unified_storage)
    assert impl.rules_or_default().hicache_host_tier == "unified" and impl.hiradix_storage
    config = PoolConfig(size=16, rules=Rules.for_sglang("0.5.23"))
    assert impl.req_to_token_pool and impl.allocator
    tree = impl.hiradix_cache(config, impl.req_to_token_pool(config), impl.allocator(config))
    assert isinstance(tree, SGLangUnifiedHiCache)
