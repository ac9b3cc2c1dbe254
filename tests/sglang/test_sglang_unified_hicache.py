"""Opt-in (``--run-sglang-wheel``): SGLang 0.5.23's host tier inside its ``UnifiedRadixCache``
(FULL component; :class:`kvpool.sglang.unified_hicache.SGLangUnifiedHiCache`) on the
``hiradix_cache`` machine: against kvpool's reference under 0.5.23's rules
(``Rules.hicache_host_tier == "unified"``) on both tree cores, SGLang's Python tree core in
lockstep with its Rust core (every result and snapshot equal, every ``INV-HOST-*`` invariant
on both after every step), ``kvpool verify --sglang 0.5.23 --component hiradix_cache`` end to
end, and a planted host-pool bug caught. The wheels come from ``$KVPOOL_SGLANG_CACHE``."""

from __future__ import annotations

import logging

import pytest
import torch

from kvpool.config import PoolConfig
from kvpool.reference.radix_key import RadixKey
from kvpool.rules import Rules
from kvpool.sglang.host_pool import SGLangHostPool
from kvpool.sglang.implementation import implementation_with_host_tier
from kvpool.testing.campaign import run_machine
from kvpool.testing.implementations import reference_implementation

pytestmark = pytest.mark.sglang_wheel

REACHED = (
    "insert:write-issued", "writing_check:acked", "evict:to-host", "evict:freed",
    "match_prefix:host-hit", "load_back:loaded", "loading_check:acked", "evict_host:freed",
)  # fmt: skip


def _campaign(seed: int) -> object:
    python_core = implementation_with_host_tier("0.5.23", "python")
    rust_core = implementation_with_host_tier("0.5.23", "rust")
    return run_machine("hiradix_cache", python_core, rust_core, 1e9, seed=seed,
                       steps_per_run=60, max_runs=25)  # fmt: skip


def _against_reference(core: str, seed: int, runs: int = 30) -> object:
    return run_machine("hiradix_cache", reference_implementation(),
                       implementation_with_host_tier("0.5.23", core), 1e9, seed=seed,
                       steps_per_run=60, max_runs=runs)  # fmt: skip


@pytest.mark.parametrize("core", ["python", "rust"])
def test_sglang_agrees_with_the_reference_under_the_unified_rules(
    core: str, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.ERROR)
    result = _against_reference(core, 23)
    assert result.failure is None, result.failure and result.failure.report  # type: ignore[attr-defined]
    assert result.steps == 30 * 60  # type: ignore[attr-defined]
    missing = [t for t in REACHED if not result.coverage.get(t)]  # type: ignore[attr-defined]
    assert not missing, missing


def test_the_reference_campaign_catches_a_leaking_host_free(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.ERROR)
    real_free = SGLangHostPool.free

    def leaky_free(self: SGLangHostPool, indices: object) -> int:
        slots = torch.as_tensor(indices, dtype=torch.int64).reshape(-1)
        return real_free(self, slots[1:])  # the first slot of every free leaks

    monkeypatch.setattr(SGLangHostPool, "free", leaky_free)
    result = _against_reference("rust", 23)
    assert result.failure is not None  # type: ignore[attr-defined]
    detector = result.failure.detector  # type: ignore[attr-defined]
    assert detector == "lockstep-diff" or detector.startswith("INV-HOST"), detector


def test_verify_cli_runs_the_unified_host_tier(capsys: pytest.CaptureFixture[str]) -> None:
    from kvpool.cli import main

    code = main(["verify", "--sglang", "0.5.23", "--component", "hiradix_cache", "--seconds",
                 "3", "--seed", "2", "--no-progress", "--workers", "0"])  # fmt: skip
    out = capsys.readouterr().out
    assert code == 0 and "failures         0" in out, out
    assert "sglang:0.5.23" in out and "hiradix_cache" in out


def test_python_core_and_rust_core_agree_with_the_host_tier(
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.ERROR)  # SGLang warns on write-back drops under host pressure
    result = _campaign(3)
    assert result.failure is None, result.failure and result.failure.report  # type: ignore[attr-defined]
    assert result.steps == 25 * 60  # type: ignore[attr-defined]
    assert result.invariant_checks > result.steps  # type: ignore[attr-defined]
    missing = [t for t in REACHED if not result.coverage.get(t)]  # type: ignore[attr-defined]
    assert not missing, missing


def test_a_host_free_that_skips_slots_is_caught(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.ERROR)
    real_free = SGLangHostPool.free

    def leaky_free(self: SGLangHostPool, indices: object) -> int:
        slots = torch.as_tensor(indices, dtype=torch.int64).reshape(-1)
        return real_free(self, slots[1:])  # the first slot of every free leaks

    monkeypatch.setattr(SGLangHostPool, "free", leaky_free)
    result = _campaign(3)
    assert result.failure is not None  # type: ignore[attr-defined]
    assert "INV-HOST" in result.failure.report  # type: ignore[attr-defined]


@pytest.mark.parametrize("core", ["python", "rust"])
def test_demote_load_back_and_evict_host_by_hand(core: str) -> None:
    impl = implementation_with_host_tier("0.5.23", core)
    assert impl.hiradix_cache and impl.req_to_token_pool and impl.allocator
    config = PoolConfig(size=16, page_size=1, rules=Rules.for_sglang("0.5.23"),
                        hicache_ratio=1.0, hicache_load_back_threshold=1)  # fmt: skip
    pool, alloc = impl.req_to_token_pool(config), impl.allocator(config)
    tree = impl.hiradix_cache(config, pool, alloc)
    assert tree.insert(RadixKey([1, 2, 3, 4]), alloc.alloc(4)) == 0
    # write-through: the backup is queued (host slots reserved), issued by the next check
    assert tree.host_snapshot().transfers[0].node_ids == (1,)
    assert tree.writing_check() == 1 and tree.host_snapshot().transfers == ()
    assert tree.evict(4) == 4 and alloc.available_size() == 16  # demoted to host
    node = tree.host_snapshot().tree.nodes[1]
    assert node.evicted and node.host_value == (0, 1, 2, 3)
    m = tree.match_prefix(RadixKey([1, 2, 3, 4, 9]))
    assert len(m.device_indices) == 0 and m.host_hit_length == 4
    loaded, _ = tree.init_load_back(m.last_host_node)
    assert len(loaded) == 4 and tree.ready_to_load_host_cache() >= 0
    assert tree.loading_check() == 1
    assert not tree.host_snapshot().tree.nodes[1].evicted  # back on device, backup kept
    assert tree.evict(4) == 4 and tree.evict_host(4) == 4
    assert len(tree.host_snapshot().tree.nodes) == 1
