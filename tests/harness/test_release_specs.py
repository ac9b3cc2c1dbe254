"""kvpool's twins standing in for an SGLang release (``reference@0.5.23``,
``optimized[torch]@0.5.16``, ``kvpool verify --rules``): the spec names the release's rules
preset and its server's tree, and a lifecycle between two of kvpool's own sides compares their
unified trees exactly (only a side whose tree snapshot is a tree core's is compared coarsely)."""

from __future__ import annotations

import dataclasses

import pytest

from kvpool.config import PoolConfig
from kvpool.errors import ConfigError
from kvpool.rules import Rules, server_builds_unified_tree
from kvpool.testing.implementations import (
    builtin_spec,
    following_release,
    reference_implementation,
    resolve_implementation,
)
from kvpool.testing.machines.lifecycle import LifecyclePair, coarse_pool


@pytest.mark.parametrize(
    ("spec", "label", "release", "unified"),
    [
        ("reference@0.5.23", "reference@0.5.23", "0.5.23", True),
        ("optimized@0.5.16", "optimized[torch]@0.5.16", "0.5.16", False),
        ("optimized[torch]@0.5.30", "optimized[torch]@0.5.30", "0.5.30", True),
        ("reference@0.5.18", "reference@0.5.18", "0.5.18", False),
    ],
)
def test_a_spec_at_a_release_follows_its_preset_and_its_servers_tree(
    spec: str, label: str, release: str, unified: bool
) -> None:
    impl = resolve_implementation(spec)
    assert impl.label == label
    assert impl.rules == Rules.for_sglang(release)
    assert impl.unified_lifecycle is unified
    assert not impl.coarse_unified_tree  # kvpool's own snapshots are whole


@pytest.mark.parametrize("release", ["0.4.9", "latest", "1.0.0"])
def test_a_release_without_a_preset_is_a_config_error(release: str) -> None:
    with pytest.raises(ConfigError, match=r"no rules preset|not a release number"):
        resolve_implementation(f"reference@{release}")
    with pytest.raises(ConfigError):
        server_builds_unified_tree(release)


def test_only_kvpools_own_specs_are_builtin() -> None:
    yes = ["reference", "optimized", "optimized[interpret]", "reference@0.5.23",
           "optimized[torch]@0.5.16"]  # fmt: skip
    no = ["sglang:0.5.23", "mod:f", "path/to/m.py:f", "optimizedx", "optimized[torch"]
    assert all(builtin_spec(s) for s in yes)
    assert not any(builtin_spec(s) for s in no)


def test_the_unified_server_starts_at_0_5_23() -> None:
    assert [server_builds_unified_tree(v) for v in ("0.5.16", "0.5.22", "0.5.23", "0.5.31")] == [
        False, False, True, True,
    ]  # fmt: skip


def test_two_of_kvpools_sides_compare_their_unified_trees_exactly() -> None:
    config = PoolConfig(size=32, page_size=2, req_pool_size=3, max_context_len=24,
                        rules=Rules.for_sglang("0.5.23"))  # fmt: skip
    ref = following_release(reference_implementation(), "0.5.23")
    exact = LifecyclePair(ref, ref, config, ("a", "b"))
    assert exact.lockstep.normalize is None
    assert type(exact.lockstep.b.tree_cache).__name__ == "UnifiedRadixCache"
    core = dataclasses.replace(ref, coarse_unified_tree=True)  # as SGLang's tree cores report
    assert LifecyclePair(ref, core, config, ("a", "b")).lockstep.normalize is coarse_pool
