"""Opt-in (``--run-sglang-wheel``): a stop inside the last speculative run against SGLang's own
release (full attention and a sliding window). SGLang 0.5.23's ``release_kv_cache`` asks the
request for ``owned_kv_len()`` (SGLang's own method, compiled from the release:
:mod:`kvpool.sglang.req_methods`) and keeps only the tokens through the stop; 0.5.16's keeps
every committed token. Both releases' glue run in
lockstep with kvpool's reference under their rules (``Rules.release_upto``), on a directed case
and on the lifecycle machine's stops; a glue whose request ignores the stop is caught."""

from __future__ import annotations

from typing import Any

import pytest

from kvpool.config import PoolConfig
from kvpool.constants import floor_align
from kvpool.rules import Rules
from kvpool.sglang import implementation
from kvpool.sglang.glue import GlueReq
from kvpool.sglang.req_methods import StopMethods
from kvpool.testing.campaign import run_machine
from kvpool.testing.implementations import reference_implementation
from kvpool.testing.lockstep_driver import LockstepFailure
from kvpool.testing.machines.lifecycle import LifecyclePair
from kvpool.testing.swarm import Op

pytestmark = pytest.mark.sglang_wheel

SOURCES = [("0.5.23", {}), ("0.5.23", {"tree_core": "python"}), ("0.5.16", {})]
IDS = ["0.5.23-rust", "0.5.23-python", "0.5.16"]
PROMPT, RUN = [1, 2, 3, 4, 5, 6], [7, 8, 9, 10, 11]


def _directed(
    source: str, options: dict[str, Any], page_size: int, mamba_slots: int | None = None
) -> LifecyclePair:
    """Prompt of 6, one speculative step accepting 5, a stop after the first output token;
    then a request sending every token (overshoot included) matches what the release kept."""
    rules = Rules.for_sglang(source)
    config = PoolConfig(size=48, page_size=page_size, req_pool_size=4, max_context_len=64,
                        disable_radix_cache=False, rules=rules,
                        mamba_slots=mamba_slots)  # fmt: skip
    pair = LifecyclePair(reference_implementation(), implementation(source, **options), config,
                         ("reference", f"sglang-{source}"))  # fmt: skip
    for op in (Op("new_req", ("a", PROMPT)), Op("extend", (["a"],)),
               Op("spec_step", (["a"], [RUN], 3)),
               Op("finish", (["a"],), (("is_insert", True), ("finished_lens", [1]))),
               Op("new_req", ("b", [*PROMPT, *RUN, 99]))):  # fmt: skip
        pair.run(op)
    return pair


@pytest.mark.slow
@pytest.mark.parametrize("page_size", [1, 4])
@pytest.mark.parametrize(("source", "options"), SOURCES, ids=IDS)
def test_sglangs_release_keeps_what_its_rules_say(
    source: str, options: dict[str, Any], page_size: int
) -> None:
    pair = _directed(source, options, page_size)
    matched = pair.run(Op("match_prefix", ("b",)))
    kept = len(PROMPT) + (1 if source == "0.5.23" else len(RUN))
    assert matched == floor_align(kept, page_size)
    if source == "0.5.23":
        assert pair.coverage["sglang:schedule_batch.Req.owned_kv_len"] > 0, pair.coverage


@pytest.mark.slow
@pytest.mark.parametrize(("source", "options"), SOURCES, ids=IDS)
def test_sglangs_hybrid_release_caches_no_state_past_a_stop(
    source: str, options: dict[str, Any]
) -> None:
    """A hybrid (Mamba) model: 0.5.23's scheduler skips the insert of a request whose state
    ran past its stop (its own ``_mamba_can_cache_finished_req``); 0.5.16 caches everything."""
    pair = _directed(source, options, 1, mamba_slots=5)
    matched = pair.run(Op("match_prefix", ("b",)))
    assert matched == (0 if source == "0.5.23" else len(PROMPT) + len(RUN))


@pytest.mark.slow
@pytest.mark.parametrize("machine", ["manager", "swa_manager", "mamba_manager"])
@pytest.mark.parametrize(("source", "options"), SOURCES, ids=IDS)
def test_stop_campaign_passes(source: str, options: dict[str, Any], machine: str) -> None:
    """The lifecycle machines' stops (plain finishes and session turns) on SGLang's glue: its
    full-attention, sliding-window and hybrid (Mamba) glue (0.5.23's, 0.5.16's)."""
    candidate = implementation(source, **options)
    assert candidate.manager_models_stops
    result = run_machine(machine, reference_implementation(), candidate, seconds=600.0,
                         seed=3, max_runs=30)  # fmt: skip
    assert result.failure is None, result.failure
    tags = ["finish:stop-inside"] + (["session:stop-inside"] if machine != "mamba_manager" else [])
    for tag in tags:
        assert result.coverage[tag] > 0, (tag, result.coverage)
    if source == "0.5.23" and machine == "mamba_manager":  # the scheduler's own check ran
        assert result.coverage["sglang:batch_result_processor._mamba_can_cache_finished_req"]


@pytest.mark.slow
def test_a_glue_request_that_ignores_the_stop_is_caught(monkeypatch: pytest.MonkeyPatch) -> None:
    """Planted: the glue's request reports every committed token as its own (what 0.5.23's
    ``owned_kv_len`` replaced): SGLang's release caches the overshoot, and the lockstep
    against kvpool's reference under 0.5.23's rules reports the difference."""
    monkeypatch.setattr(GlueReq, "owned_kv_len", lambda self: int(self.req.kv_committed_len))
    with pytest.raises(LockstepFailure) as caught:
        _directed("0.5.23", {}, 1)
    assert caught.value.detector == "lockstep-diff"


@pytest.mark.slow
def test_a_scheduler_that_caches_a_state_past_the_stop_is_caught(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Planted: the scheduler's check never says no, so SGLang 0.5.23 caches a hybrid
    request's key through the stop with a state that ran past it: the invariant that a cached
    state is the state after its node's tokens reports it."""
    monkeypatch.setattr(StopMethods, "mamba_can_cache_finished_req", lambda self, req, tree: True)
    with pytest.raises(LockstepFailure) as caught:
        _directed("0.5.23", {}, 1, mamba_slots=5).run(Op("match_prefix", ("b",)))
    assert caught.value.detector == "INV-MAMBA-CHECKPOINT"
