"""EAGLE's bigram keys against SGLang's own trees (opt-in: ``--run-sglang-wheel``): with
``CacheInitParams.is_eagle`` SGLang keys its radix tree by adjacent token pairs; kvpool's
reference under ``PoolConfig.is_eagle`` must agree on both releases and both 0.5.23 tree cores,
and a campaign over EAGLE configurations must see a tree that was not told."""

from __future__ import annotations

import dataclasses
from typing import Any

import pytest

from kvpool.config import PoolConfig
from kvpool.rules import Rules
from kvpool.sglang import implementation
from kvpool.testing.implementations import reference_implementation
from kvpool.testing.runs import focused_runs

SIDES = [("0.5.23", {}), ("0.5.23", {"tree_core": "python"}), ("0.5.16", {})]


def _directed(manager: Any) -> tuple[int, int, list[Any]]:
    """A finished request of 12 committed tokens, then a prompt agreeing on 11 and differing at
    the 12th: (its matched prefix, free slots, the tree's nodes)."""
    manager.new_req("a", list(range(1, 12)))
    manager.extend(["a"])
    manager.decode(["a"], [50])
    manager.finish(["a"])
    manager.new_req("b", [*range(1, 12), 7, 7])
    prefix = manager.match_prefix("b")
    snap = manager.snapshot()
    return prefix, snap.allocator.available_size(), sorted((n.key, n.value)
                                                           for n in snap.tree.nodes)  # fmt: skip


@pytest.mark.parametrize(("source", "options"), SIDES)
@pytest.mark.parametrize("ps", [1, 4])
def test_sglangs_bigram_tree_matches_the_reference(
    source: str, options: dict[str, Any], ps: int
) -> None:
    config = PoolConfig(size=64, page_size=ps, is_eagle=True, rules=Rules.for_sglang(source))
    candidate = implementation(source, **options)
    assert candidate.manager is not None and candidate.manager_models_eagle
    ours = _directed(reference_implementation().manager(config))  # type: ignore[misc]
    theirs = _directed(candidate.manager(config))
    assert ours == theirs
    assert ours[0] == (10 if ps == 1 else 8)  # the pair (11, 7) is not (11, 50)
    plain = _directed(candidate.manager(dataclasses.replace(config, is_eagle=False)))
    assert plain[0] == (11 if ps == 1 else 8) and plain != theirs


def _directed_host(manager: Any) -> tuple[int, list[Any]]:
    """The same with the host tier: the finished request written to host, evicted from the
    device, then matched (loaded back): (the prefix, the tree's nodes)."""
    manager.new_req("a", list(range(1, 12)))
    manager.extend(["a"])
    manager.decode(["a"], [50])
    manager.finish(["a"])
    manager.hicache_ack_writes(8)
    manager.evict(64)
    manager.new_req("b", [*range(1, 12), 7, 7])
    prefix = manager.match_prefix("b")
    snap = manager.snapshot()
    assert snap.host is not None and snap.host.bigram_keys
    return prefix, sorted((n.key, n.value, n.host_value) for n in snap.tree.nodes)


@pytest.mark.parametrize(("source", "options"), SIDES)
def test_sglangs_host_tier_keeps_bigram_keys_as_the_reference(
    source: str, options: dict[str, Any]
) -> None:
    config = PoolConfig(size=64, is_eagle=True, enable_hierarchical_cache=True,
                        rules=Rules.for_sglang(source))  # fmt: skip
    ours = _directed_host(reference_implementation().manager(config))  # type: ignore[misc]
    theirs = _directed_host(implementation(source, **options).manager(config))  # type: ignore[misc]
    assert ours == theirs and ours[0] == 10


def _eagle_campaign(candidate: Any, seed: int, runs: int, host: bool = False) -> tuple[int, Any]:
    """The lifecycle campaign's EAGLE configurations (with the host tier only: ``host``)."""

    def keep(config: PoolConfig) -> bool:
        return config.is_eagle and (config.enable_hierarchical_cache or not host)

    return focused_runs("manager", reference_implementation(), candidate, seed, runs, keep)


@pytest.mark.slow
@pytest.mark.parametrize(("source", "options"), SIDES)
def test_eagle_campaign_passes(source: str, options: dict[str, Any]) -> None:
    ran, failure = _eagle_campaign(implementation(source, **options), seed=3, runs=90)
    assert failure is None, str(failure)
    assert ran >= 8


@pytest.mark.slow
@pytest.mark.parametrize(("source", "options"), SIDES)
def test_eagle_host_tier_campaign_passes(source: str, options: dict[str, Any]) -> None:
    ran, failure = _eagle_campaign(implementation(source, **options), seed=4, runs=300,
                                   host=True)  # fmt: skip
    assert failure is None, str(failure)
    assert ran >= 10


@pytest.mark.slow
def test_a_tree_not_told_of_eagle_is_caught() -> None:
    """Planted: SGLang's tree built without ``is_eagle`` (a server that forgot the flag), under a
    lifecycle that asks for bigram keys: the campaign reports a difference."""
    candidate = implementation("0.5.23")
    tree = candidate.unified_radix_cache
    assert tree is not None

    def untold(config: PoolConfig, pool: Any, alloc: Any) -> Any:
        return tree(dataclasses.replace(config, is_eagle=False), pool, alloc)

    ran, failure = _eagle_campaign(dataclasses.replace(candidate, unified_radix_cache=untold),
                                   seed=3, runs=90)  # fmt: skip
    assert failure is not None and ran >= 1
    assert failure.detector == "lockstep-diff", str(failure)


@pytest.mark.parametrize(("source", "options"), SIDES)
def test_sglang_keeps_token_keys_for_a_mamba_model(source: str, options: dict[str, Any]) -> None:
    """A hybrid Mamba model under EAGLE: SGLang's tree (FULL + MAMBA) keeps token keys, as
    kvpool's model says. A prompt that extends the 12 finished tokens by one reuses all 12
    (their state sits at the node's end); bigram keys would cache only 11."""
    config = PoolConfig(size=64, mamba_slots=4, is_eagle=True, rules=Rules.for_sglang(source))
    candidate = implementation(source, **options)
    assert candidate.manager is not None
    seen = []
    for manager in (reference_implementation().manager, candidate.manager):
        assert manager is not None
        m = manager(config)
        m.new_req("a", list(range(1, 12)))
        m.extend(["a"])
        m.decode(["a"], [50])
        m.finish(["a"])
        m.new_req("b", [*range(1, 12), 50, 7])
        snap = m.snapshot()
        seen.append((m.match_prefix("b"), sorted((n.key, n.value) for n in snap.tree.nodes)))
    assert seen[0] == seen[1]
    assert seen[0][0] == 12


@pytest.mark.slow
@pytest.mark.parametrize(
    ("component", "source", "options"),
    [
        ("radix_cache", "0.5.16", {}),
        ("radix_cache", "0.5.23", {}),
        ("unified_radix_cache", "0.5.23", {}),
        ("unified_radix_cache", "0.5.23", {"tree_core": "python"}),
        ("hiradix_cache", "0.5.16", {}),
        ("hiradix_cache", "0.5.23", {}),
        ("hiradix_cache", "0.5.23", {"tree_core": "python"}),
        ("swa_radix_cache", "0.5.16", {}),
        ("unified_swa_radix_cache", "0.5.16", {}),
        ("unified_swa_radix_cache", "0.5.23", {}),
        ("unified_swa_radix_cache", "0.5.23", {"tree_core": "python"}),
    ],
)
def test_sglangs_trees_driven_directly_on_eagle_configurations(
    component: str, source: str, options: dict[str, Any]
) -> None:
    """The tree machines against SGLang's trees built with ``is_eagle`` (token keys in: the
    tree views them as bigrams itself), the host tier's and the sliding-window trees too."""
    from kvpool.testing.implementations import resolve_implementation

    candidate = implementation(source, **options)
    assert candidate.radix_models_eagle
    ref = resolve_implementation(f"reference@{source}", component)
    ran, failure = focused_runs(component, ref, candidate, 6, 150, lambda c: c.is_eagle)
    assert failure is None, str(failure)
    assert ran >= 10
