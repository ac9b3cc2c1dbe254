"""Opt-in (``--run-sglang-wheel``): SGLang 0.5.23's own scheduler checks ("Mem Leak Detected",
:mod:`kvpool.sglang.scheduler_checker`) run at every step of the glue campaigns and pass on
what SGLang's glue does; they fire, with SGLang's own message, on a slot taken or freed behind
the scheduler's back, on a lost request row and (the tree's own sanity check, when idle) on a
tree whose leaf set lost a leaf; kvpool's sessions are counted as the scheduler's session-held
rows; plans played on SGLang's own sessions pass them, busy and idle; 0.5.16's checker is not
run, and ``+no-scheduler-checks`` leaves them out."""

from __future__ import annotations

from typing import Any

import pytest
import torch

from kvpool.config import PoolConfig
from kvpool.errors import InvariantViolation
from kvpool.sglang import implementation, session_plans
from kvpool.sglang.implementation import from_spec
from kvpool.sglang.scheduler_checker import INVARIANT_ID
from kvpool.sglang.session_campaign import Setup
from kvpool.sglang.session_plans import Turn, scheduler_checks
from kvpool.testing.campaign import run_machine
from kvpool.testing.implementations import reference_implementation

pytestmark = pytest.mark.sglang_wheel

CHECKS = ("busy", "kv_pages", "idle", "tree")


@pytest.mark.parametrize(
    "component", ["manager", "swa_manager", "mamba_manager", "hicache_manager"]
)
def test_glue_campaigns_pass_sglangs_checks_at_every_step(component: str) -> None:
    result = run_machine(component, reference_implementation(), implementation("0.5.23"),
                         3600.0, seed=5, max_runs=12)  # fmt: skip
    assert result.failure is None, result.failure.report
    ran = {name: result.coverage.get(f"sglang:scheduler_checker.{name}", 0) for name in CHECKS}
    assert all(ran.values()), ran
    # every step of a configuration the glue drives is checked (busy and KV pages alike)
    assert ran["busy"] == ran["kv_pages"] > result.steps // 2, (ran, result.steps)


def _manager(config: PoolConfig, release: str = "0.5.23") -> Any:
    make = implementation(release).manager
    assert make is not None
    return make(config)


def _running() -> Any:
    """A glue manager with one request of 8 tokens prefilled and decoding."""
    mm = _manager(PoolConfig(size=64))
    mm.new_req("r1", list(range(1, 9)))
    mm.extend(["r1"])
    mm.decode(["r1"], [9])
    mm.run_own_checks()
    return mm


def _fails(mm: Any) -> str:
    with pytest.raises(InvariantViolation) as caught:
        mm.run_own_checks()
    assert caught.value.invariant_id == INVARIANT_ID
    return str(caught.value)


def test_a_slot_taken_behind_the_schedulers_back_is_a_leak() -> None:
    mm = _running()
    mm.tree_cache.impl.token_to_kv_pool_allocator.alloc(1)
    assert "Full Pool Mem Leak Detected!" in _fails(mm)


def test_an_owned_slot_in_the_free_list_is_a_use_after_free() -> None:
    mm = _running()
    alloc = mm.tree_cache.impl.token_to_kv_pool_allocator
    owned = int(mm.req_to_token_pool.impl.req_to_token[mm.reqs["r1"].req_pool_idx, 0])
    alloc.alloc(1)  # the counts stay balanced: only the page check can see it
    alloc.free(torch.tensor([owned], dtype=torch.int64))
    assert "KV page use-after-free: 1 owner page refs are in the free pool" in _fails(mm)


def test_a_lost_request_row_is_caught_when_idle() -> None:
    mm = _running()
    mm.finish(["r1"])
    mm.run_own_checks()
    pool = mm.req_to_token_pool.impl
    pool.free_slots = pool.free_slots[1:]
    assert "req_to_token_pool memory leak detected!" in _fails(mm)


@pytest.mark.parametrize("mamba_slots", [None, 4])
def test_kvpools_sessions_are_the_schedulers_session_held_rows(mamba_slots: int | None) -> None:
    # a hybrid model's sessions run with the radix cache off (kvpool's lifecycle)
    config = PoolConfig(size=64, mamba_slots=mamba_slots, disable_radix_cache=bool(mamba_slots))
    mm = _manager(config)
    mm.open_session("s1")
    mm.new_req("t1", [3, 3, 4], session_id="s1")
    mm.extend(["t1"])
    mm.finish(["t1"])
    assert mm.sessions["s1"].req_pool_idx is not None
    mm.run_own_checks()  # idle: every request gone, the session's row held
    checks = mm.scheduler_checks
    assert checks is not None and list(checks.checker.tree_cache.session_records()) == ["s1"]
    assert checks.counts["scheduler_checker.idle"] >= 1


def test_0_5_16_ships_no_scheduler_checker() -> None:
    mm = _manager(PoolConfig(size=64), "0.5.16")
    assert mm.scheduler_checks is None
    mm.run_own_checks()


def test_the_trees_own_sanity_check_runs_when_idle() -> None:
    make = implementation("0.5.23", tree_core="python").manager
    assert make is not None
    mm = make(PoolConfig(size=64))
    mm.new_req("r1", list(range(1, 9)))
    mm.extend(["r1"])
    mm.finish(["r1"])
    mm.run_own_checks()
    assert mm.scheduler_checks.counts["scheduler_checker.tree"] == 1
    # a leaf the eviction would never find: only the tree's own check sees it
    mm.tree_cache.impl.tree_core.evictable_device_leaves.clear()
    assert "D-leaf missing" in _fails(mm)


@pytest.mark.parametrize("model", ["full", "hybrid", "swa"])
def test_sglangs_own_sessions_pass_its_checks_busy_and_idle(
    model: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """SGLang's streaming sessions keep their records in its tree (``session_records()``): the
    checks run after every step of a played plan, chunked prefills busy, finishes idle."""
    built: list[Any] = []

    def keep(world: Any, running: list[Any]) -> Any:
        checks = scheduler_checks(world, running)
        built.append(checks)
        return checks

    monkeypatch.setattr(session_plans, "scheduler_checks", keep)
    plan: list[Turn] = [
        (5, 2, 0, None, False, None, True),
        (3, 3, 2, 1, False, None, False),
        (2, 2, 0, None, True, None, True),
        (4, 1, 0, None, False, None, True),
    ]
    setup = Setup(model, 4 if model == "full" else 1, "rust", neighbours=True, chunked=True)
    setup.play(plan)
    counts = built[0].counts
    assert all(counts[f"scheduler_checker.{name}"] for name in CHECKS), counts
    assert counts["scheduler_checker.busy"] > counts["scheduler_checker.idle"] > 4, counts


def test_the_checks_can_be_left_out() -> None:
    candidate = from_spec("0.5.23+no-scheduler-checks")
    for make, config in (
        (candidate.manager, PoolConfig(size=64)),
        (candidate.swa_manager, PoolConfig(size=64, sliding_window=4)),
    ):
        assert make is not None
        mm = make(config)
        assert mm.scheduler_checks is None
        mm.tree_cache.impl.token_to_kv_pool_allocator.alloc(1)  # a leak nobody checks here
        mm.run_own_checks()
    result = run_machine("manager", reference_implementation(), candidate, 3600.0, seed=5,
                         max_runs=3)  # fmt: skip
    assert result.failure is None, result.failure.report
    assert not [tag for tag in result.coverage if "scheduler_checker" in tag]
