"""The host tier inside the request lifecycle (``PoolConfig.enable_hierarchical_cache``): both
twins' ``MemoryManager`` load back a prefix found in host memory, acknowledgements are lifecycle
operations, the ``host`` invariants run with the ``pool`` ones on every snapshot, and the twin
agrees with the reference in lockstep over every write policy with small host pools."""

from __future__ import annotations

import dataclasses
from collections import Counter
from typing import Any

import pytest

from kvpool.config import PoolConfig
from kvpool.errors import ConfigError, InvalidArgumentError, InvariantViolation
from kvpool.invariants import check_all
from kvpool.optimized.lifecycle.memory_manager import MemoryManager as TwinManager
from kvpool.reference.lifecycle.memory_manager import MemoryManager as RefManager
from kvpool.testing.config_variants import WRITE_POLICIES
from kvpool.testing.implementations import optimized_implementation, reference_implementation
from kvpool.testing.machines.lifecycle import LifecyclePair, LifecycleTarget
from kvpool.testing.swarm import RandomChooser, draw_op

HOST = PoolConfig(size=16, req_pool_size=4, max_context_len=64, enable_hierarchical_cache=True,
                  hicache_ratio=1.0, hicache_load_back_threshold=1)  # fmt: skip


@pytest.mark.parametrize("manager", [RefManager, TwinManager])
def test_a_request_hits_in_host_memory_and_loads_back(manager: Any) -> None:
    mm = manager(HOST)
    mm.new_req("a", [1, 2, 3, 4, 5])
    mm.extend(["a"])
    mm.finish(["a"])
    assert mm.evict(16) == 0  # the write-through write is in flight: its node is locked
    assert mm.hicache_ack_writes(8) == 1
    assert mm.evict(16) == 5
    host_only = [n for n in mm.snapshot().host.tree.nodes if n.evicted]
    assert [n.key for n in host_only] == [(1, 2, 3, 4, 5)]
    mm.new_req("b", [1, 2, 3, 4, 7, 7])
    assert mm.match_prefix("b") == 4
    snap = mm.snapshot()
    assert check_all(snap) > 0
    assert [t.kind for t in snap.host.transfers] == ["load"]
    assert snap.tree.protected_size == 4  # the request's lock and the load's
    mm.extend(["b"])
    check_all(mm.snapshot())  # the prefix's KV tags arrived before the forward read them
    assert mm.hicache_ack_loads(8) == 1 and mm.hicache_ack_loads(8) == 0
    mm.finish(["b"])
    check_all(mm.snapshot())


@pytest.mark.parametrize("manager", [RefManager, TwinManager])
def test_below_the_threshold_nothing_loads_back(manager: Any) -> None:
    mm = manager(dataclasses.replace(HOST, hicache_load_back_threshold=8))
    mm.new_req("a", [1, 2, 3, 4, 5])
    mm.extend(["a"])
    mm.finish(["a"])
    mm.hicache_ack_writes(8)
    mm.evict(16)
    mm.new_req("b", [1, 2, 3, 4, 7])
    assert mm.match_prefix("b") == 0
    assert mm.snapshot().host.transfers == ()


@pytest.mark.parametrize("manager", [RefManager, TwinManager])
def test_acknowledgement_misuse_is_refused_unchanged(manager: Any) -> None:
    mm = manager(HOST)
    mm.new_req("a", [1, 2, 3])
    mm.extend(["a"])
    mm.finish(["a"])
    before = mm.snapshot()
    for call in (mm.hicache_ack_writes, mm.hicache_ack_loads):
        with pytest.raises(InvalidArgumentError):
            call(-1)
    assert mm.snapshot() == before
    plain = manager(PoolConfig(size=16))
    with pytest.raises(InvalidArgumentError):
        plain.hicache_ack_loads(1)
    assert plain.snapshot().host is None


def test_host_tier_needs_the_radix_cache_and_a_plain_model() -> None:
    for bad in ({"disable_radix_cache": True}, {"mamba_slots": 2}):
        with pytest.raises(ConfigError):
            PoolConfig(enable_hierarchical_cache=True, **bad)


def test_pool_invariants_see_host_only_nodes_and_host_checks_fire() -> None:
    mm = RefManager(HOST)
    mm.new_req("a", [1, 2, 3, 4, 5])
    mm.extend(["a"])
    mm.finish(["a"])
    mm.hicache_ack_writes(8)
    mm.evict(16)
    snap = mm.snapshot()
    check_all(snap)  # a host-only node (no device slots) is not a malformed tree node
    assert snap.host is not None
    node = next(n for n in snap.tree.nodes if n.evicted)
    bad_node = dataclasses.replace(node, evicted=False)  # on device without device slots
    tree = dataclasses.replace(snap.tree, nodes=tuple(bad_node if n is node else n
                                                       for n in snap.tree.nodes))  # fmt: skip
    host = dataclasses.replace(snap.host, tree=tree)
    with pytest.raises(InvariantViolation):
        check_all(dataclasses.replace(snap, tree=tree, host=host))


def _host_configs() -> list[PoolConfig]:
    out = []
    for i, policy in enumerate(WRITE_POLICIES * 2):
        ps = (1, 2, 4)[i % 3]
        out.append(PoolConfig(size=(12 if ps < 4 else 8) * ps, page_size=ps, req_pool_size=4,
                              max_context_len=12 * ps + 8, eviction_policy=("lru", "fifo")[i % 2],
                              kv_layout=("mha", "mla")[i // 3 % 2],
                              enable_hierarchical_cache=True, hicache_write_policy=policy,
                              hicache_ratio=(0.5, 1.0)[i % 2],
                              hicache_load_back_threshold=(0, ps)[i // 2 % 2]))  # fmt: skip
    return out


FOCUS = ("new_req", "twin_req", "extend", "extend", "finish", "finish", "evict", "match_prefix",
         "match_prefix", "abort", "retract", "ack_writes", "ack_loads")  # fmt: skip
"""Kinds that lead to host hits: requests finish, writes are acknowledged, nodes evicted to
host, then requests sharing their prefixes are admitted."""


@pytest.mark.slow
def test_lockstep_over_host_configurations_is_clean_and_loads_back() -> None:
    coverage: Counter[str] = Counter()
    ref, twin = reference_implementation(), optimized_implementation("torch", checked=True)
    for seed, config in enumerate(_host_configs()):
        for run in range(4):
            pair = LifecyclePair(ref, twin, config, ("reference", "optimized"))
            chooser = RandomChooser(seed * 100 + run)
            for step in range(60):
                if step % 2:  # the swarm's own mix, then a step of the host-tier focus
                    op = pair.draw(chooser)
                else:
                    op = draw_op(chooser, pair.lockstep.view(), chooser.choice(FOCUS))
                pair.run(op)  # a disagreement or an invariant raises
            coverage.update(pair.coverage)
    for tag in ("host:load-back", "host:to-host-only", "host:write-issued",
                "hicache_ack_writes:acked", "hicache_ack_loads:acked"):  # fmt: skip
        assert coverage[tag] > 0, (tag, coverage)


def test_the_swarm_draws_host_tiers_for_implementations_with_one() -> None:
    target = LifecycleTarget()
    drawn = [target.draw_config(RandomChooser(s), reference_implementation()) for s in range(60)]
    host = [c for c in drawn if c.enable_hierarchical_cache]
    assert host and len(host) < len(drawn)
    assert {c.hicache_write_policy for c in host} == set(WRITE_POLICIES)
    assert all(not c.disable_radix_cache for c in host)


@pytest.mark.parametrize("manager", [RefManager, TwinManager])
@pytest.mark.parametrize(
    "storage",
    [
        {"kv_storage": "mxfp8", "head_num": 1, "head_dim": 32},
        {"kv_storage": "fp4", "head_num": 1, "head_dim": 16},
        {"kv_storage": "page_major"},
    ],
    ids=lambda s: s["kv_storage"],
)
def test_the_host_tier_sizes_and_backs_up_every_storage_variant(
    manager: Any, storage: dict[str, Any]
) -> None:
    # The campaign once drew a host tier over MXFP8 buffers, whose element type the host pool's
    # size table lacked: the manager could not be built.
    mm = manager(dataclasses.replace(HOST, **storage))
    mm.new_req("a", [1, 2, 3, 4, 5])
    mm.extend(["a"])
    mm.finish(["a"])
    assert mm.hicache_ack_writes(8) == 1
    assert mm.evict(16) == 5
    mm.new_req("b", [1, 2, 3, 4, 7, 7])
    assert mm.match_prefix("b") == 4
    mm.extend(["b"])
    check_all(mm.snapshot())  # the tags came back through the variant's storage
