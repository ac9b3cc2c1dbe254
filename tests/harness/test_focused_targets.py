"""The focused lifecycle targets. ``--component mamba_manager``: every configuration is a hybrid
(Mamba) model's, half of them with the Mamba tree on at page size 1. ``--component
hicache_manager``: every configuration has the host tier and no layer-wise loading. For each, a
seeded campaign of the twin against the reference passes and reaches the paths it exists for,
and an implementation that cannot run them is refused."""

from __future__ import annotations

import dataclasses
import random

import pytest

from kvpool.rules import Rules
from kvpool.testing.campaign import run_machine
from kvpool.testing.implementations import optimized_implementation, reference_implementation
from kvpool.testing.machines import TARGETS
from kvpool.testing.swarm import RandomChooser


@pytest.mark.parametrize("release", [None, "0.5.23"])
def test_every_configuration_is_hybrid_and_half_have_the_tree(release: str | None) -> None:
    impl = optimized_implementation()
    if release is not None:
        impl = dataclasses.replace(impl, rules=Rules.for_sglang(release))
    target = TARGETS["mamba_manager"]
    configs = [target.draw_config(RandomChooser(random.Random(f"7/{i}")), impl)
               for i in range(60)]  # fmt: skip
    assert all(c.mamba_slots is not None for c in configs)
    tree = [c for c in configs if not c.disable_radix_cache]
    assert 15 <= len(tree) <= 45, len(tree)
    assert all(c.page_size == 1 and c.need_sort for c in tree)


@pytest.mark.slow
def test_a_campaign_passes_and_reaches_the_mamba_tree() -> None:
    result = run_machine("mamba_manager", reference_implementation(), optimized_implementation(),
                         seconds=120.0, seed=5, max_runs=40)  # fmt: skip
    assert result.failure is None, result.failure
    assert result.configurations == 40
    for tag in ("mamba-radix:donated", "mamba-radix:evicted", "session:hybrid-restore"):
        assert result.coverage[tag] > 0, (tag, result.coverage)


def test_a_manager_that_runs_no_hybrid_model_is_refused() -> None:
    impl = dataclasses.replace(optimized_implementation(), manager_runs_hybrid=False)
    assert not impl.provides("mamba_manager")
    with pytest.raises(ValueError, match="runs hybrid models"):
        TARGETS["mamba_manager"].draw_config(RandomChooser(random.Random(0)), impl)


@pytest.mark.parametrize("release", [None, "0.5.23"])
def test_every_host_configuration_has_the_host_tier_and_no_layer_loading(
    release: str | None,
) -> None:
    impl = optimized_implementation()
    if release is not None:
        impl = dataclasses.replace(impl, rules=Rules.for_sglang(release))
    target = TARGETS["hicache_manager"]
    configs = [target.draw_config(RandomChooser(random.Random(f"3/{i}")), impl)
               for i in range(40)]  # fmt: skip
    assert all(c.enable_hierarchical_cache and not c.disable_radix_cache for c in configs)
    assert all(not c.layerwise_loading and c.req_pool_size in (3, 6) for c in configs)
    assert {c.hicache_write_policy for c in configs} >= {"write_through", "write_back"}


@pytest.mark.slow
@pytest.mark.parametrize("release", [None, "0.5.23"])
def test_a_host_campaign_passes_and_reaches_the_host_tier(release: str | None) -> None:
    impl = optimized_implementation()
    ref = reference_implementation()
    if release is not None:
        impl = dataclasses.replace(impl, rules=Rules.for_sglang(release))
        ref = dataclasses.replace(ref, rules=Rules.for_sglang(release))
    result = run_machine("hicache_manager", ref, impl, seconds=120.0, seed=3, max_runs=30)
    assert result.failure is None, result.failure
    for tag in ("host:write-issued", "host:to-host-only", "hicache_ack_writes:acked"):
        assert result.coverage[tag] > 0, (tag, result.coverage)


def test_an_implementation_without_a_host_tier_is_refused() -> None:
    impl = dataclasses.replace(optimized_implementation(), hiradix_cache=None)
    assert not impl.provides("hicache_manager")
    with pytest.raises(ValueError, match="host tier"):
        TARGETS["hicache_manager"].draw_config(RandomChooser(random.Random(0)), impl)
