"""EAGLE's bigram keys with a sliding window (``PoolConfig.is_eagle`` with ``sliding_window``;
specs/radix_cache.md, "EAGLE with a sliding window"). The trees (0.5.16's ``SWARadixCache``,
the FULL + SWA ``UnifiedSWARadixCache``) walk a key's bigrams, so a key of ``n + 1`` tokens
names ``n`` slots and every length they check counts slots; the SWA lifecycle hands
``floor_align(n - 1)`` slots of ``n`` tokens to the tree under every release's rules, and under
SGLang 0.5.23's slides the window at the key's last slot at a checkpoint. Directed cases on
both twins and a planted tree that ignores the flag (the planted frontier of SGLang's #34870 is
in the quality suite: tests/quality/mutants_swa.py); the machines' EAGLE configurations in
lockstep are in tests/reference/test_eagle_bigram.py."""

from __future__ import annotations

from typing import Any

import pytest

from kvpool.config import PoolConfig
from kvpool.errors import InvalidArgumentError
from kvpool.host_checks import TOKEN_ID_LIMIT
from kvpool.rules import Rules
from kvpool.testing.bundle import Implementation
from kvpool.testing.implementations import (
    optimized_implementation,
    reference_implementation,
    resolve_implementation,
)
from kvpool.testing.runs import focused_runs

TREES = ("swa_radix_cache", "unified_swa_radix_cache")
IMPLS = (reference_implementation(), optimized_implementation("torch"))


def _tree(impl: Implementation, kind: str, config: PoolConfig) -> tuple[Any, Any]:
    assert impl.swa_allocator is not None
    alloc = impl.swa_allocator(config)
    factory = impl.swa_radix_cache if kind == "swa_radix_cache" else impl.unified_swa_radix_cache
    assert factory is not None
    return alloc, factory(config, alloc)


def _config(ps: int, eagle: bool = True, window: int = 4) -> PoolConfig:
    return PoolConfig(size=64, page_size=ps, sliding_window=window, is_eagle=eagle,
                      rules=Rules.for_sglang("0.5.23"))  # fmt: skip


def _key(impl: Implementation, tokens: list[int]) -> Any:
    assert impl.radix_key is not None
    return impl.radix_key(tokens, None)


def _insert(impl: Implementation, alloc: Any, tree: Any, tokens: list[int], gone: int = 0) -> Any:
    """Slots for the bigrams of ``tokens`` (one fewer than the tokens), the first ``gone`` of
    them out of the window, inserted: (slots, tokens already cached)."""
    slots = alloc.alloc(len(tokens) - 1)
    assert slots is not None
    if gone:
        alloc.free_swa(slots[:gone])
    return [int(s) for s in slots], tree.insert(_key(impl, tokens), slots, 0, gone)


@pytest.mark.parametrize("impl", IMPLS, ids=["reference", "optimized"])
@pytest.mark.parametrize("kind", TREES)
def test_a_key_of_n_plus_one_tokens_caches_n_slots(impl: Implementation, kind: str) -> None:
    alloc, tree = _tree(impl, kind, _config(ps=1))
    tokens = list(range(1, 10))  # 9 tokens: 8 bigrams
    slots, cached = _insert(impl, alloc, tree, tokens)
    assert cached == 0
    nodes = tree.snapshot().nodes
    assert sum(len(n.value) for n in nodes) == 8
    assert all(c >= TOKEN_ID_LIMIT for n in nodes for c in n.key)  # pair codes
    got = tree.match_prefix(_key(impl, tokens))
    assert [int(s) for s in got.device_indices] == slots
    # token 8's slot is reused only if token 9 agrees too
    other = tree.match_prefix(_key(impl, [*tokens[:-1], 99]))
    assert [int(s) for s in other.device_indices] == slots[:7]
    # the same 9 tokens as a plain key would have cached 9 slots; 8 tokens match 7
    assert len(tree.match_prefix(_key(impl, tokens[:8])).device_indices) == 7


@pytest.mark.parametrize("impl", IMPLS, ids=["reference", "optimized"])
@pytest.mark.parametrize("kind", TREES)
def test_a_window_cursor_counts_bigrams(impl: Implementation, kind: str) -> None:
    """``swa_evicted_seqlen`` is a slot (= token) position: up to the key's bigrams, which a
    tombstone then covers; one past them is refused and changes nothing."""
    alloc, tree = _tree(impl, kind, _config(ps=1, window=2))
    tokens = list(range(1, 10))  # 8 bigrams
    before = alloc.snapshot()
    with pytest.raises(InvalidArgumentError):
        assert impl.index is not None
        tree.insert(_key(impl, tokens), impl.index(range(1, 10)), 0, 10)
    assert alloc.snapshot() == before and len(tree.snapshot().nodes) == 1
    _, cached = _insert(impl, alloc, tree, tokens, gone=4)
    assert cached == 0
    nodes = tree.snapshot().nodes[1:]
    assert sum(len(n.value) for n in nodes if n.swa_tombstone) == 4
    assert sum(len(n.value) for n in nodes if not n.swa_tombstone) == 4


@pytest.mark.parametrize("kind", TREES)
def test_both_twins_build_the_same_bigram_tree(kind: str) -> None:
    config = _config(ps=1)
    states = []
    for impl in IMPLS:
        alloc, tree = _tree(impl, kind, config)
        _insert(impl, alloc, tree, [1, 2, 3, 4, 5, 6])
        _insert(impl, alloc, tree, [1, 2, 3, 4, 9, 9, 9], gone=2)
        states.append((alloc.snapshot(), tree.snapshot()))
    assert states[0] == states[1]


RULES = {"own": Rules(), "0.5.16": Rules.for_sglang("0.5.16"), "0.5.23": Rules.for_sglang("0.5.23")}
"""kvpool's own window rule (0.5.16's legacy hand-overs), 0.5.16's (its unified tree) and
0.5.23's (the checkpoint)."""
R0523 = RULES["0.5.23"]


def _swa_managers(config: PoolConfig) -> list[Any]:
    return [impl.swa_manager(config) for impl in IMPLS]  # type: ignore[misc]


@pytest.mark.parametrize("rules", list(RULES))
@pytest.mark.parametrize("ps", [1, 2, 4])
def test_a_finished_request_caches_one_token_fewer(ps: int, rules: str) -> None:
    """12 committed tokens cache ``floor_align(11)`` slots (a wide window: nothing slides); a
    prompt that agrees on 11 tokens then differs reuses the slots of the first 10 only (token
    11's slot needs token 12 to agree too), without EAGLE all 11 (page-aligned). Under every
    release's hand-overs."""
    for eagle in (True, False):
        config = PoolConfig(size=96, page_size=ps, sliding_window=64, is_eagle=eagle,
                            rules=RULES[rules])  # fmt: skip
        states, prefixes = [], []
        for m in _swa_managers(config):
            m.new_req("a", list(range(1, 12)))
            m.extend(["a"])
            m.decode(["a"], [50])
            m.finish(["a"])
            m.new_req("b", [*range(1, 12), 7, 7])
            prefixes.append(int(m.match_prefix("b")))
            states.append(m.snapshot())
        assert states[0] == states[1]
        nodes = states[0].tree.nodes[1:]
        cached = sum(len(n.value) for n in nodes)
        assert cached == (11 if eagle else 12) // ps * ps
        assert prefixes == [(10 if eagle else 11) // ps * ps] * 2
        assert any(c >= TOKEN_ID_LIMIT for n in nodes for c in n.key) == eagle


@pytest.mark.parametrize(("ps", "window", "chunk"), [(1, 1, 5), (2, 3, 8), (4, 4, 13), (2, 2, 9)])
def test_a_chunk_checkpoint_keeps_a_window_below_its_bigram_key(
    ps: int, window: int, chunk: int
) -> None:
    """SGLang 0.5.23's frontier for bigram keys (the fix of its #34870): a chunk's checkpoint
    inserts ``floor_align(chunk - 1)`` slots and slides the window at its key's last slot, so
    the leaf keeps at least a window of live SWA slots and a match of the same tokens reaches
    it. Both twins agree."""
    config = PoolConfig(size=96, page_size=ps, sliding_window=window, is_eagle=True, rules=R0523)
    prompt = list(range(1, 22))
    states = []
    for m in _swa_managers(config):
        m.new_req("a", prompt)
        m.extend(["a"], [chunk])
        req = next(r for r in m.snapshot().reqs if r.rid == "a")
        assert req.cache_protected_len == (chunk - 1) // ps * ps
        assert req.cache_protected_len - req.swa_evicted_seqlen >= window
        m.new_req("b", [*prompt[:chunk], 99])
        assert int(m.match_prefix("b")) == req.cache_protected_len
        states.append(m.snapshot())
    assert states[0] == states[1]


def _eagle(config: PoolConfig) -> bool:
    return config.is_eagle


@pytest.mark.slow
def test_an_swa_tree_that_ignores_eagle_is_caught() -> None:
    """Planted: the twin's unified SWA tree built without ``is_eagle`` (token keys: one more
    slot per key than the allocation holds) is caught on the EAGLE configurations."""
    from dataclasses import replace

    from kvpool.optimized.unified.swa_radix_cache import UnifiedSWARadixCache

    ref = resolve_implementation("reference@0.5.23", "unified_swa_radix_cache")
    twin = resolve_implementation("optimized@0.5.23", "unified_swa_radix_cache")

    def forgetful(config: PoolConfig, alloc: Any) -> Any:
        return UnifiedSWARadixCache(alloc, config.page_size, config.sliding_window or 1,
                                    eviction_policy=config.eviction_policy, rules=config.rules,
                                    options=alloc.options)  # fmt: skip

    planted = replace(twin, unified_swa_radix_cache=forgetful)
    _, failure = focused_runs("unified_swa_radix_cache", ref, planted, 5, 60, _eagle)
    assert failure is not None, "the planted tree was not caught"
    # its first insert keeps a slot the machine never allocated to it: the accounting or the
    # comparison with the reference says so
    assert failure.detector in ("INV-SWA-ACCOUNTING", "lockstep-diff"), failure.detector
