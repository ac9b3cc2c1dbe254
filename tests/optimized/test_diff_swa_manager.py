"""Differential test of the hybrid sliding-window lifecycle: the reference ``SWAMemoryManager``
and the optimized twin (checked mode), driven in lockstep by the ``swa_manager`` machine (every
pool invariant after every step, ``INV-SWA-WINDOW`` and the ``INV-SWA-*`` checks among them),
and ``kvpool verify --component swa_manager`` end to end."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import pytest

from kvpool.cli import main
from kvpool.config import PoolConfig
from kvpool.errors import ConfigError
from kvpool.invariants import check_all
from kvpool.optimized.lifecycle.swa_memory_manager import SWAMemoryManager as TwinSWAMemoryManager
from kvpool.reference.lifecycle.swa_memory_manager import SWAMemoryManager
from kvpool.testing.campaign import run_machine
from kvpool.testing.implementations import optimized_implementation, reference_implementation
from kvpool.testing.machines.coverage import CATALOGUE


@pytest.mark.slow
def test_lockstep_campaign_is_clean_and_reaches_every_tag() -> None:
    # session:window-carried (a session's slid window handed to its next turn) comes about
    # once in 75 runs: the seed is one whose 40 runs reach it (runs are deterministic)
    result = run_machine("swa_manager", reference_implementation(),
                         optimized_implementation("torch", checked=True), 1e9, seed=20,
                         steps_per_run=60, max_runs=40)  # fmt: skip
    assert result.failure is None, result.failure and result.failure.report
    assert result.invariant_checks > result.steps >= 40 * 40
    missing = [t for t in CATALOGUE["swa_manager"] if not result.coverage.get(t)]
    assert not missing, missing


def test_configs_outside_the_model_are_refused() -> None:
    chunk = PoolConfig(disable_radix_cache=True)
    for config in (chunk, dataclasses.replace(chunk, sliding_window=4, kv_layout="mla"),
                   dataclasses.replace(chunk, sliding_window=4, num_layers=1)):  # fmt: skip
        with pytest.raises(ConfigError):
            SWAMemoryManager(config)


def test_radix_lifecycle_finish_leaves_a_tombstone_and_a_match_recovers_nothing_stale() -> None:
    config = PoolConfig(size=32, page_size=2, disable_radix_cache=False, sliding_window=2,
                        swa_full_tokens_ratio=0.5)  # fmt: skip
    mm = SWAMemoryManager(config)
    mm.new_req("a", [1, 2, 3, 4, 5])
    mm.extend(["a"])
    for tok in (6, 7, 8, 9):
        mm.decode(["a"], [tok])
    assert mm.snapshot().reqs[0].swa_evicted_seqlen == 6
    mm.finish(["a"])
    snap = mm.snapshot()
    nodes = [(n.key, n.swa_tombstone) for n in snap.tree.nodes[1:]]
    assert nodes == [((1, 2, 3, 4, 5, 6), True), ((7, 8), False)]
    assert snap.swa is not None and snap.swa.swa.available_size() == 16 - 2
    check_all(snap)


@pytest.mark.parametrize("cls", [SWAMemoryManager, TwinSWAMemoryManager])
def test_a_finish_over_a_tombstone_recovers_it_from_the_requests_slots(cls: type) -> None:
    mm = cls(PoolConfig(size=32, page_size=1, sliding_window=4, swa_full_tokens_ratio=0.5))
    for rid, tokens in (("a", [1, 2, 3, 4, 5, 6, 7, 8]), ("c", [1, 2, 3, 4, 50, 51, 52, 53, 54])):
        mm.new_req(rid, tokens)
        mm.extend([rid])
        mm.finish([rid])
    assert mm.tree_cache.evict(0, 8) == (4, 8)  # leaf (5..8) deleted, (1..4) tombstoned
    nodes = mm.snapshot().tree.nodes[1:]
    assert [(n.key, n.swa_tombstone) for n in nodes] == [
        ((1, 2, 3, 4), True),
        ((50, 51, 52, 53, 54), False),
    ]
    mm.new_req("b", [1, 2, 3, 4, 50, 60, 61])
    assert mm.match_prefix("b") == 0  # one window-token past the tombstone is not enough
    mm.extend(["b"])
    mm.finish(["b"])
    snap = mm.snapshot()
    assert [(n.node_id, n.swa_tombstone) for n in snap.tree.nodes[1:3]] == [(2, False), (4, False)]
    check_all(snap)


@pytest.mark.parametrize("cls", [SWAMemoryManager, TwinSWAMemoryManager])
def test_a_session_carries_its_window_to_the_next_turn(cls: type) -> None:
    mm = cls(PoolConfig(size=32, page_size=2, sliding_window=2, swa_full_tokens_ratio=0.5))
    mm.open_session("s")
    mm.new_req("t1", [1, 2, 3, 4, 5], session_id="s")
    mm.extend(["t1"])
    for tok in (6, 7, 8, 9):
        mm.decode(["t1"], [tok])
    mm.finish(["t1"])
    held = mm.snapshot()
    assert held.sessions[0].swa_evicted_seqlen == 6  # the session keeps the slid window
    check_all(held)
    mm.new_req("t2", [10], session_id="s")
    mm.extend(["t2"])
    assert mm.snapshot().reqs[0].swa_evicted_seqlen == 6
    mm.decode(["t2"], [11])
    check_all(mm.snapshot())
    mm.finish(["t2"])
    mm.close_session("s")
    snap = mm.snapshot()
    check_all(snap)
    assert snap.swa is not None and snap.tree.nodes[1:] == ()
    assert snap.swa.full.available_size() == 32 and snap.swa.swa.available_size() == 16


@pytest.mark.slow
def test_verify_component_swa_manager(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    report = tmp_path / "verify.json"
    code = main(["verify", "--component", "swa_manager", "--seconds", "2", "--seed", "4",
                 "--no-progress", "--workers", "0", "--report", str(report)])  # fmt: skip
    assert code == 0, capsys.readouterr().out
    data = json.loads(report.read_text())
    assert data["component"] == "swa_manager" and data["failures"] == 0 and data["steps"] > 0
