"""SGLang 0.5.23's host tier inside the request lifecycle (``Rules.hicache_host_tier ==
"unified"``) in both twins: the checkpoint's inserts free the request's duplicates past its
protected prefix, a batch's write-through backups are issued as one transfer when the batch
ends, a host hit is loaded back at admission and acknowledged later. A worked example on both
twins, then lockstep campaigns of the reference against the twin over host configurations."""

from __future__ import annotations

import dataclasses
from typing import Any

import pytest

from kvpool.config import PoolConfig
from kvpool.rules import Rules
from kvpool.tags import kv_tags
from kvpool.testing.campaign import run_machine
from kvpool.testing.implementations import optimized_implementation, reference_implementation
from kvpool.testing.machines.lifecycle import manager_factory
from kvpool.testing.swarm import Chooser, draw_config

NEW = Rules.for_sglang("0.5.23")
TWINS = [reference_implementation, optimized_implementation]


def draw_host_config(c: Chooser, rules: Rules = NEW) -> PoolConfig:
    """A lifecycle configuration with a host tier (the swarm's draw, pinned to the radix cache
    and 3 rows so that :func:`~kvpool.testing.config_variants.host_tier_fields` applies)."""
    return draw_config(c, host=True, rules=rules, disable_radix_cache=False, req_pool_size=3)


def _manager(make: Any, policy: str = "write_through") -> Any:
    config = PoolConfig(size=16, page_size=1, req_pool_size=3, rules=NEW,
                        enable_hierarchical_cache=True, hicache_ratio=1.0,
                        hicache_write_policy=policy, hicache_load_back_threshold=0)  # fmt: skip
    return manager_factory(dataclasses.replace(make(), rules=NEW))(config)


def _node(mm: Any, key: tuple[int, ...]) -> Any:
    return next(n for n in mm.snapshot().tree.nodes if n.key == key)


@pytest.mark.parametrize("make", TWINS)
def test_a_host_hit_goes_through_write_demotion_load_back_and_acks(make: Any) -> None:
    mm = _manager(make)
    assert mm.tree_cache.unified  # the lifecycle runs the rules' host tier
    mm.new_req("r1", [1, 2, 3, 4])
    mm.extend(["r1"])
    mm.finish(["r1"])
    host = mm.snapshot().host
    # the finish's write-through was queued by the insert and issued when the batch ended
    assert [t.kind for t in host.transfers] == ["write"]
    assert len(host.transfers[0].device_indices) == 4
    assert _node(mm, (1, 2, 3, 4)).lock_ref == 1  # locked until the acknowledgement
    assert mm.hicache_ack_writes(5) == 1
    assert _node(mm, (1, 2, 3, 4)).lock_ref == 0
    assert mm.evict(4) == 4
    assert _node(mm, (1, 2, 3, 4)).evicted  # demoted: host only
    free_before = mm.token_to_kv_pool_allocator.available_size()
    mm.new_req("r2", [1, 2, 3, 4, 5])
    assert mm.match_prefix("r2") == 4  # the host hit, loaded back at admission
    assert mm.token_to_kv_pool_allocator.available_size() == free_before - 4
    loads = [t for t in mm.snapshot().host.transfers if t.kind == "load"]
    assert len(loads) == 1
    mm.extend(["r2"])  # the forward waits for the content; the acknowledgement stays pending
    slots = [int(s) for s in loads[0].device_indices]
    assert [int(t) for t in mm.kv_cache.read_tags(slots)] == kv_tags([1, 2, 3, 4], None)
    assert mm.hicache_ack_loads(1) == 1
    assert mm.hicache_ack_loads(1) == 0
    mm.finish(["r2"])  # the protected prefix is the tree's: the insert frees none of it
    snap = mm.snapshot()
    assert snap.tree.evictable_size + snap.tree.protected_size == 5
    in_flight = sum(len(t.device_indices) for t in snap.host.transfers)
    assert in_flight == 1  # only the new token [5] is written through
    assert mm.hicache_ack_writes(1) == 1
    assert mm.token_to_kv_pool_allocator.available_size() == 16 - 5


@pytest.mark.parametrize("make", TWINS)
def test_a_finished_duplicate_is_freed_by_the_insert_once(make: Any) -> None:
    """Two requests compute the same prompt side by side; the second's finish frees its own
    copy through the insert (past its protected prefix, which is empty) and nothing twice."""
    mm = _manager(make, "write_back")
    for rid in ("a", "b"):
        mm.new_req(rid, [7, 8, 9])
    mm.extend(["a", "b"])
    mm.finish(["a"])
    mm.finish(["b"])
    assert mm.token_to_kv_pool_allocator.available_size() == 16 - 3
    assert mm.snapshot().host.transfers == ()  # write-back writes nothing at insert


@pytest.mark.slow
@pytest.mark.parametrize("seed", [1, 2])
def test_the_twins_agree_on_the_unified_host_tier_lifecycle(seed: int) -> None:
    reference = dataclasses.replace(reference_implementation(), rules=NEW)
    twin = dataclasses.replace(optimized_implementation("torch", checked=True), rules=NEW)
    result = run_machine("manager", reference, twin, 1e9, seed=seed, steps_per_run=60,
                         max_runs=25, config_drawer=draw_host_config)  # fmt: skip
    assert result.failure is None, result.failure and result.failure.report
    assert result.steps == 25 * 60
    for tag in ("host:to-host-only", "host:write-issued", "hicache_ack_writes:acked"):
        assert result.coverage.get(tag), (tag, dict(result.coverage))
