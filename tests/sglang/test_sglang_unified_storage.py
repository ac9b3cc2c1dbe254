"""Opt-in (``--run-sglang-wheel``): storage prefetches through SGLang 0.5.23's own
``UnifiedRadixCache`` code on both tree cores (:mod:`kvpool.sglang.unified_storage`), on
the ``hiradix_cache`` machine, against kvpool's reference under 0.5.23's rules: the directed
traces of tests/reference/test_prefetch_unified.py in lockstep, a seeded campaign that reaches
a completion at the drain, and a planted release bug caught."""

from __future__ import annotations

import logging
from collections import Counter
from typing import Any

import pytest

from kvpool.reference.hicache.prefetch import StoragePrefetch
from kvpool.sglang.implementation import implementation_with_host_tier
from kvpool.sglang.unified_storage import StorageController
from kvpool.testing.campaign import run_machine
from kvpool.testing.implementations import reference_implementation, resolve_implementation
from kvpool.testing.runs import execute
from kvpool.testing.swarm import Op
from tests.reference.test_prefetch_unified import (
    PROMPT,
    ROOT_TRACE,
    SPLIT_TRACE,
    _config,
    _insert,
    _prefetch,
    _root_config,
    _split_config,
)

pytestmark = pytest.mark.sglang_wheel

TRACE = [
    _prefetch(0, PROMPT), Op("storage_hit", (0, 12)), Op("prefetch_io", (0, 1)),
    _insert([1, 2, 2, 2, 3, 3, 3, 1]), Op("writing_check", (8,)),
    Op("drain_storage_control_queues"), _prefetch(0, [9] * 8, "a"), Op("storage_hit", (0, 8)),
    Op("check_prefetch_progress", (0,)), Op("prefetch_io", (0, 1)),
    Op("drain_storage_control_queues"), _prefetch(1, [*PROMPT, 5, 5, 5, 5]),
    Op("storage_hit", (0, 8)), Op("release_aborted_request", (0,)), Op("prefetch_io", (0, 1)),
    Op("drain_storage_control_queues"), Op("evict", (16,)), Op("evict_host", (16,)),
]  # fmt: skip
"""A refill at the drain, an admission check before the worker's end, an abort after the
allocation, then eviction of everything (the prefetch machine's request indices)."""


CORES = ["python", "rust"]


def _sglang(core: str) -> Any:
    return implementation_with_host_tier("0.5.23", core)


@pytest.mark.parametrize("core", CORES)
@pytest.mark.parametrize("policy", ["write_through", "write_back"])
@pytest.mark.parametrize("ratio", [0.75, 2.0])
def test_the_directed_trace_agrees(core: str, policy: str, ratio: float) -> None:
    done = execute("hiradix_cache", reference_implementation(), _sglang(core),
                   _config(policy, ratio), ops=TRACE)  # fmt: skip
    assert done.failure is None, done.failure
    assert done.steps == len(TRACE)


@pytest.mark.parametrize("core", CORES)
def test_the_root_priority_trace_agrees(core: str) -> None:
    """The first campaign's finding (kvpool gave a prefetch below the root 0.5.16's floor;
    0.5.23's inserts raise the root): SGLang and the reference agree on it."""
    done = execute("hiradix_cache", reference_implementation(), _sglang(core), _root_config(),
                   ops=ROOT_TRACE)  # fmt: skip
    assert done.failure is None, done.failure


@pytest.mark.parametrize("core", CORES)
def test_the_split_anchor_trace_agrees(core: str) -> None:
    """The Rust-core campaign's finding (a split of the prefetch's anchor hands its host lock to
    both halves in 0.5.23; kvpool pinned the lower half only): SGLang and the reference agree."""
    done = execute("hiradix_cache", reference_implementation(), _sglang(core), _split_config(),
                   ops=SPLIT_TRACE)  # fmt: skip
    assert done.failure is None, done.failure


@pytest.mark.parametrize("core", CORES)
def test_a_campaign_agrees_and_completes_prefetches_at_the_drain(
    core: str, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.ERROR)  # SGLang warns on write-back drops under host pressure
    completed: Counter[str] = Counter()
    real = StoragePrefetch._complete

    def counting(self: StoragePrefetch, req_id: str) -> None:
        tokens = self.ongoing_prefetch[req_id][2].completed_tokens
        completed["with tokens" if tokens else "empty"] += 1
        real(self, req_id)

    monkeypatch.setattr(StoragePrefetch, "_complete", counting)
    result = run_machine("hiradix_cache", resolve_implementation("reference@0.5.23"), _sglang(core),
                         1e9, seed=4, steps_per_run=60, max_runs=80)  # fmt: skip
    assert result.failure is None, result.failure and result.failure.report
    assert result.steps == 80 * 60
    assert completed["with tokens"] > 0 and completed["empty"] > 0, completed
    for tag in ("prefetch:ok", "storage_hit:ok", "prefetch_io:ok", "release_aborted_request:ok"):
        assert result.coverage.get(tag), tag


def test_a_release_that_drops_a_page_is_caught(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """The controller queues every page of a release but the last: host slots leak."""
    caplog.set_level(logging.ERROR)
    real = StorageController.append_host_mem_release

    def leaky(self: StorageController, host_indices: Any = None, extra_pools: Any = None) -> None:
        if host_indices is not None and len(host_indices) > self.page_size:
            host_indices = host_indices[: -self.page_size]
        real(self, host_indices, extra_pools)

    monkeypatch.setattr(StorageController, "append_host_mem_release", leaky)
    done = execute("hiradix_cache", reference_implementation(), _sglang("python"),
                   _config("write_through", 2.0), ops=TRACE)  # fmt: skip
    assert done.failure is not None
    assert done.failure.detector == "lockstep-diff" or done.failure.detector.startswith(
        "INV-HOST"
    ), done.failure.detector
