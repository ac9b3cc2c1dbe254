"""EAGLE's bigram keys (``PoolConfig.is_eagle``, specs/radix_cache.md "EAGLE bigram keys"):
both twins key the radix tree by adjacent token pairs, so a sequence of ``n`` tokens caches the
slots of its first ``floor_align(n - 1)`` and a match needs the token after the last matched
one to agree too. Directed cases on both twins and both release rules, then a seeded lockstep
campaign over EAGLE configurations only."""

from __future__ import annotations

import dataclasses
import random
from typing import Any

import numpy as np
import pytest

from kvpool.config import PoolConfig
from kvpool.errors import ConfigError
from kvpool.host_checks import TOKEN_ID_LIMIT
from kvpool.optimized import radix_key as twin_key
from kvpool.reference.radix_key import RadixKey, bigram_codes, bigram_key, cached_len
from kvpool.rules import Rules
from kvpool.testing.implementations import optimized_implementation, reference_implementation
from kvpool.testing.runs import focused_runs


def _eagle(config: PoolConfig) -> bool:
    return config.is_eagle


RULES = {"0.5.16": Rules.for_sglang("0.5.16"), "0.5.23": Rules.for_sglang("0.5.23")}


def _managers(config: PoolConfig) -> list[Any]:
    return [impl.manager(config) for impl in (reference_implementation(),  # type: ignore[misc]
                                              optimized_implementation("torch"))]  # fmt: skip


def _cached_then_matched(manager: Any, prompt: list[int]) -> int:
    """Request "a" (11 prompt tokens and one decoded: 12 committed) finished into the tree,
    then request "b" of ``prompt`` matched: its prefix (tokens)."""
    manager.new_req("a", list(range(1, 12)))
    manager.extend(["a"])
    manager.decode(["a"], [50])
    manager.finish(["a"])
    manager.new_req("b", prompt)
    return int(manager.match_prefix("b"))


def _tree(manager: Any) -> list[tuple[tuple[int, ...], tuple[int, ...]]]:
    return [(n.key, n.value) for n in manager.snapshot().tree.nodes]


def test_bigram_codes_pair_adjacent_tokens() -> None:
    assert bigram_codes([]) == [] and bigram_codes([5]) == []
    assert bigram_codes([1, 2, 3]) == [1 * TOKEN_ID_LIMIT + 2, 2 * TOKEN_ID_LIMIT + 3]
    key = bigram_key(RadixKey([4, 4, 9], "ns"))
    assert key.token_ids == [4 * TOKEN_ID_LIMIT + 4, 4 * TOKEN_ID_LIMIT + 9]
    assert key.extra_key == "ns"


def test_twin_bigram_key_gives_the_reference_codes() -> None:
    rng = random.Random(7)
    for n in (0, 1, 2, 17):
        tokens = [rng.choice((0, 1, TOKEN_ID_LIMIT - 1, rng.randrange(TOKEN_ID_LIMIT)))
                  for _ in range(n)]  # fmt: skip
        for given in (tokens, np.asarray(tokens, dtype=np.int64)):
            got = twin_key.bigram_key(twin_key.RadixKey(given, "x"))
            assert got.token_ids == bigram_codes(tokens) and got.extra_key == "x"


@pytest.mark.parametrize(("n", "ps", "want"), [(0, 1, 0), (1, 1, 0), (2, 1, 1), (9, 4, 8),
                                               (8, 4, 4), (5, 4, 4), (4, 4, 0)])  # fmt: skip
def test_cached_len_is_one_short_under_eagle(n: int, ps: int, want: int) -> None:
    assert cached_len(n, ps, True) == want
    assert cached_len(n, ps, False) == n // ps * ps


@pytest.mark.parametrize("release", sorted(RULES))
@pytest.mark.parametrize("ps", [1, 4])
def test_finish_caches_one_token_fewer(release: str, ps: int) -> None:
    """11 prompt tokens and one decoded: 12 committed, ``floor_align(11)`` cached; the slot of
    the decoded token always goes back with the tail."""
    config = PoolConfig(size=64, page_size=ps, is_eagle=True, rules=RULES[release])
    plain = dataclasses.replace(config, is_eagle=False)
    for eagle, m in [(True, x) for x in _managers(config)] + [(False, x) for x in _managers(plain)]:
        m.new_req("a", list(range(1, 12)))
        m.extend(["a"])
        m.decode(["a"], [50])
        m.finish(["a"])
        snap = m.snapshot()
        held = snap.tree.evictable_size + snap.tree.protected_size
        assert held == cached_len(12, ps, eagle)
        assert snap.allocator.available_size() == 64 - held


@pytest.mark.parametrize("release", sorted(RULES))
def test_match_needs_the_next_token_too(release: str) -> None:
    """A prompt that agrees with a cached one on 11 tokens and differs at the 12th reuses 10
    slots with bigram keys (the pair (t10, t11) differs), 11 without."""
    for eagle in (True, False):
        config = PoolConfig(size=64, is_eagle=eagle, rules=RULES[release])
        trees, prefixes = [], []
        for m in _managers(config):
            prefixes.append(_cached_then_matched(m, [*range(1, 12), 7, 7]))
            trees.append(_tree(m))
        assert prefixes == [10, 10] if eagle else prefixes == [11, 11]
        assert trees[0] == trees[1]
        codes = {c for key, _ in trees[0] for c in key}
        assert (max(codes) >= TOKEN_ID_LIMIT) == eagle  # the tree holds pair codes


def test_eagle_is_refused_where_it_is_not_modelled() -> None:
    """Storage prefetches (an SWA manager's refusal: tests/reference/test_eagle_swa.py)."""
    with pytest.raises(ConfigError, match="is_eagle"):
        PoolConfig(is_eagle=True, enable_hierarchical_cache=True, hicache_storage=True)


@pytest.mark.slow
@pytest.mark.parametrize("release", ["", "@0.5.16", "@0.5.23"])
@pytest.mark.parametrize(("component", "seed", "runs"), [("manager", 3, 120),
                                                          ("swa_manager", 5, 150)])  # fmt: skip
def test_lockstep_on_eagle_configurations(
    component: str, seed: int, runs: int, release: str
) -> None:
    """The twin against the reference on the lifecycle machines' EAGLE configurations (each
    gives ``is_eagle`` to one radix configuration in three or so): the full-attention lifecycle
    and the sliding-window one (chunked prefills, decodes, speculative steps, sessions, the
    window sliding; tests/reference/test_eagle_swa.py has its directed cases)."""
    from kvpool.testing.implementations import resolve_implementation

    ref = resolve_implementation("reference" + release)
    twin = resolve_implementation("optimized" + release)
    ran, failure = focused_runs(component, ref, twin, seed, runs, _eagle)
    assert failure is None, str(failure)
    assert ran >= 10


@pytest.mark.slow
def test_a_twin_that_caches_the_last_token_is_caught(monkeypatch: pytest.MonkeyPatch) -> None:
    """Planted: the twin's release paths count a request's tokens as a plain tree does (the
    last token's slot cached under bigram keys too); the campaign on EAGLE configurations
    reports it."""
    from kvpool.optimized.radix.radix_cache import RadixCache as TwinRadixCache
    from kvpool.reference.radix_key import cached_len as exact

    def plain_count(self: TwinRadixCache, num_tokens: int) -> int:
        return exact(num_tokens + self.is_eagle, self.page_size, self.is_eagle)

    monkeypatch.setattr(TwinRadixCache, "_cached_len", plain_count)
    ref, twin = reference_implementation(), optimized_implementation("torch")
    _, failure = focused_runs("manager", ref, twin, 3, 120, _eagle)
    assert failure is not None, "the planted release was not caught"
    assert failure.detector != "crash", str(failure)


@pytest.mark.parametrize("release", sorted(RULES))
def test_the_host_tier_keeps_and_loads_back_bigram_keys(release: str) -> None:
    """With the host tier: the finished request's 11 bigrams are written to host, evicted from
    the device and loaded back for a prompt that agrees on 11 tokens and differs at the 12th:
    10 slots come back (the pair (11, 7) is not cached). Both twins agree, and the host tags
    (checked by the invariants from the decoded keys) hold."""
    from kvpool.invariants import check_all

    config = PoolConfig(size=64, is_eagle=True, enable_hierarchical_cache=True,
                        rules=RULES[release])  # fmt: skip
    seen = []
    for m in _managers(config):
        m.new_req("a", list(range(1, 12)))
        m.extend(["a"])
        m.decode(["a"], [50])
        m.finish(["a"])
        m.hicache_ack_writes(8)
        assert m.evict(64) == 11  # the 11 cached slots; the decoded token's went with the tail
        m.new_req("b", [*range(1, 12), 7, 7])
        prefix = m.match_prefix("b")
        snap = m.snapshot()
        assert snap.host is not None and snap.host.bigram_keys
        check_all(snap, None)
        seen.append((prefix, _tree(m)))
    assert seen[0] == seen[1]
    assert seen[0][0] == 10


@pytest.mark.parametrize("release", sorted(RULES))
def test_a_mamba_models_tree_keeps_token_keys(release: str) -> None:
    """SGLang turns bigram keys off when the tree has a MAMBA component: a hybrid Mamba run
    leaves the same state with ``is_eagle`` as without, on both twins."""
    plain = PoolConfig(size=64, mamba_slots=4, rules=RULES[release])
    states = []
    for config in (plain, dataclasses.replace(plain, is_eagle=True)):
        for m in _managers(config):
            prefix = _cached_then_matched(m, [*range(1, 12), 7, 7])
            states.append((prefix, _tree(m), m.snapshot().allocator))
    assert all(s == states[0] for s in states)
    assert max(c for key, _ in states[0][1] for c in key) < TOKEN_ID_LIMIT  # token keys


@pytest.mark.slow
@pytest.mark.parametrize(
    ("component", "release", "runs"),
    [
        ("radix_cache", "", 60),
        ("radix_cache", "@0.5.16", 60),
        ("unified_radix_cache", "@0.5.23", 60),
        ("hiradix_cache", "", 150),
        ("hiradix_cache", "@0.5.16", 150),
        ("hiradix_cache", "@0.5.23", 150),
        ("swa_radix_cache", "@0.5.16", 60),
        ("unified_swa_radix_cache", "@0.5.23", 60),
        ("unified_swa_radix_cache", "@0.5.16", 60),
    ],
)
def test_the_tree_machines_on_eagle_configurations(component: str, release: str, runs: int) -> None:
    """The tree machines drive the trees directly (token keys in, bigram codes stored; an
    insert takes the slots its bigrams keep, a handle names its node with one token more): the
    twin against the reference on the EAGLE configurations of seed 5 (one page count in three;
    the host tier's without storage prefetches; the sliding-window trees' too)."""
    from kvpool.testing.implementations import resolve_implementation

    ref = resolve_implementation("reference" + release, component)
    twin = resolve_implementation("optimized" + release, component)
    ran, failure = focused_runs(component, ref, twin, 5, runs, _eagle)
    assert failure is None, str(failure)
    assert ran >= 10
