"""Opt-in (``--run-sglang-wheel``): ``kvpool sessions`` on SGLang 0.5.23's own streaming session.

The campaign finds finding 11 at its default seed and shrinks it to one turn, and replaying that
plan (``--plan``) fails on the hybrid model's setups only; two worker processes run the same
plans and report the same failure as one, and a planted fault that kills a worker's process is
reported as its run's failure, shrunk; with
``--skip-known`` it runs past the known findings 10, 11 and 12 (each hit, the counts the same
from run to run) and finds nothing else. Six planted bugs in SGLang's session code and its Mamba
pool (kept here, each a wrapper around the release's own method) are each found as a new failure
within a few runs, with the named rule they break, and shrunk to one turn; a seventh (a published
prompt's node left unlocked) only with plain requests pressing on the pool beside the session.
At page size 4, SGLang's torch allocation path (the worlds' default) and its Triton kernels
leave every plan the same world.
"""

from __future__ import annotations

import dataclasses
import json
import os
import random
import signal
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from kvpool.cli import main
from kvpool.sglang import session_plans
from kvpool.sglang.loader import load_sglang
from kvpool.sglang.session_campaign import Setup, Verdict, run_campaign, setups
from kvpool.sglang.session_plans import Turn
from kvpool.sglang.session_workers import run_parallel

pytestmark = pytest.mark.sglang_wheel

SESSION = "sglang.srt.session.streaming_session"


def test_the_default_campaign_finds_finding_11_and_shrinks_it_to_one_turn(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    report = tmp_path / "sessions.json"
    assert main(["sessions", "--seconds", "60", "--report", str(report)]) == 1
    out = capsys.readouterr().out
    assert (
        "(hybrid, page size 1, rust core): [INV-MAMBA-STATE-INTEGRITY] turn 0 resumes from "
        "a Mamba state 1 token(s) ahead of its prefix" in out
    )
    assert "known: finding(s) 11 of specs/sglang_findings.md" in out
    assert "plan = [(1, 1, 0, None, False, 'overlap', False)]" in out
    failure = json.loads(report.read_text())["failure"]
    assert (failure["run"], failure["detector"], failure["known"]) == (
        4,
        "INV-MAMBA-STATE-INTEGRITY",
        [11],
    )
    # the report's plan replays as it is
    shrunk = json.dumps(failure["shrunk"])
    assert main(["sessions", "--plan", shrunk, "--model", "hybrid", "--report", str(report)]) == 1
    verdicts = json.loads(report.read_text())["verdicts"]
    # both cores, beside or not, one session or two, whole or chunked
    assert [v["known"] for v in verdicts] == [[11]] * 16


def test_a_replayed_plan_fails_on_the_setups_its_finding_lives_on(
    capsys: pytest.CaptureFixture[str],
) -> None:
    assert main(["sessions", "--plan", "[(1, 1, 0, None, False, 'overlap', False)]"]) == 1
    out = capsys.readouterr().out
    failing = [line for line in out.splitlines() if "[INV-" in line]
    assert len(failing) == 16 and all(line.startswith("  hybrid, page size 1,") for line in failing)
    assert all("(known: finding(s) 11)" in line for line in failing)
    assert out.count("every check holds") == 64 and "failures: 16 of 80 setups" in out
    plain = "[(1, 1, 0, None, False, 'plain', True), (2, 2, 0, None, False, None, True)]"
    assert main(["sessions", "--plan", plain, "--model", "hybrid"]) == 0


def test_past_the_known_findings_the_session_code_keeps_every_rule() -> None:
    every = setups()
    first = run_campaign(every, 600.0, seed=1, max_runs=300, skip_known=True)
    assert first.failure is None and first.plans == 300
    assert set(first.known) == {10, 11, 12} and min(first.known.values()) > 0
    again = run_campaign(every, 600.0, seed=1, max_runs=300, skip_known=True)
    assert again.known == first.known and again.turns == first.turns


def test_on_eagles_bigram_tree_the_session_code_keeps_every_rule_past_finding_12() -> None:
    """EAGLE's tree keys bigrams. The publishing checkpoint's window slide is measured on the
    key, a token shorter than the prompt: a plan that broke kvpool's slide model before it
    knew holds now, and 300 plans over the full and swa models hit only finding 12."""
    was_off: list[Turn] = [
        (3, 1, 0, None, False, None, False),
        (1, 1, 0, None, True, None, False),
        (1, 1, 0, None, False, None, False),
        (3, 1, 0, None, False, "overlap", False),
    ]
    for core in ("rust", "python"):
        assert Setup("swa", 1, core, sessions=2, eagle=True).play(was_off) == []
    result = run_campaign(setups(eagle=(True,)), 600.0, seed=1, max_runs=300, skip_known=True)
    assert result.failure is None and result.plans == 300
    assert set(result.known) == {12}


def test_the_torch_and_triton_allocation_paths_leave_every_plan_the_same_world() -> None:
    """At page size 4 the worlds allocate on SGLang's torch path unless told otherwise (it is
    several times faster than its Triton kernels through the interpreter). Every drawn plan, on
    every page-size-4 setup, ends the same on both: the same answer (the resume mismatches, or
    the broken rule), the same allocator state and the same request rows."""
    from kvpool.errors import InvariantViolation
    from kvpool.sglang.session_campaign import draw_plan
    from kvpool.sglang.session_plans import run_session

    def outcome(setup: Setup, plan: list[Turn]) -> tuple[Any, ...]:
        world = setup.build()
        try:
            answer: Any = run_session(world, plan, setup.neighbours, setup.sessions, setup.chunk)
        except InvariantViolation as exc:
            answer = str(exc)
        return answer, world.allocator.snapshot(), world.pool.impl.req_to_token.tolist()

    def kernels(setup: Setup) -> set[bool]:
        """Whether each paged allocator of a fresh world of ``setup`` launches Triton."""
        impl = setup.build().allocator.impl
        sides = ("full_attn_allocator", "swa_attn_allocator")
        subs: list[Any] = [getattr(impl, side) for side in sides if hasattr(impl, side)]
        return {sub.use_triton_kernels for sub in subs or [impl]}

    rng = random.Random(5)
    plans = [draw_plan(rng) for _ in range(24)][16:]  # the last meets finding 12 at page size 4
    answered = 0
    for setup in setups(page_sizes=(4,), cores=("rust",)):
        assert not setup.triton and "Triton" not in str(setup)
        on_triton = dataclasses.replace(setup, triton=True)
        assert str(on_triton) == f"{setup}, Triton allocation kernels"
        assert (kernels(setup), kernels(on_triton)) == ({False}, {True})
        for plan in plans:
            torch_path = outcome(setup, plan)
            assert torch_path == outcome(on_triton, plan), (str(setup), plan)
            answered += torch_path[0] != []
    assert answered > 0  # some plans meet a finding or a broken rule: those paths compared too


def test_workers_share_the_runs_and_report_the_same_plans_and_failure() -> None:
    every = setups()
    alone = run_campaign(every, 600.0, seed=5, max_runs=60, skip_known=True)
    shared = run_parallel(every, 600.0, seed=5, max_runs=60, skip_known=True, workers=2)
    assert (shared.plans, shared.turns, shared.known) == (alone.plans, alone.turns, alone.known)
    assert shared.failure is None and alone.plans == 60
    first = run_parallel(every, 600.0, seed=0, max_runs=40, workers=2).failure
    assert first is not None and (first.run, first.shrunk) == (
        4,
        [(1, 1, 0, None, False, "overlap", False)],
    )


def test_a_crash_in_sglangs_code_is_reported_with_where_it_raised(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    session = load_sglang("0.5.23").attr(SESSION, "StreamingSession")

    def broken(self: Any, session_id: str) -> None:
        raise KeyError(session_id)

    monkeypatch.setattr(session, "release_session", broken)
    result = run_campaign(setups(("full",), (1,), ("rust",)), 60.0, seed=0, max_runs=5)
    assert result.failure is not None and result.failure.verdict.detector == "crash"
    assert result.failure.verdict.message == (
        "KeyError: 's' (at test_sglang_session_campaign.py:"
        f"{broken.__code__.co_firstlineno + 1}, broken)"
    )
    assert len(result.failure.shrunk) == 1


class _SegfaultingSetup(Setup):
    """SGLang's own session code with a planted fault that kills the process, as a fault in
    its compiled tree core would: freeing a span of three or more tokens of a session's row."""

    def play(self, plan: list[Turn]) -> list[Any]:
        session = load_sglang(self.source).attr(SESSION, "StreamingSession")
        free = session._free_kv_aligned
        if not getattr(free, "planted", False):

            def faulting(self: Any, kv: Any, target: int, end: int) -> None:
                if end - target >= 3:
                    os.kill(os.getpid(), signal.SIGSEGV)
                free(self, kv, target, end)

            faulting.planted = True  # type: ignore[attr-defined]
            session._free_kv_aligned = faulting
        return super().play(plan)


def test_a_fault_that_kills_the_process_is_a_shrunk_failure_of_its_run() -> None:
    """Planted in the workers' processes: the campaign reports the run its worker died in, and
    shrinks its plan in a sandbox to a single turn that frees three tokens."""
    chosen = [_SegfaultingSetup("full", 1, "rust")]
    result = run_parallel(chosen, 300.0, seed=0, max_runs=40, workers=2)
    failure = result.failure
    assert failure is not None
    assert failure.verdict == Verdict(
        "killed", "the process playing the plan was killed by signal SIGSEGV"
    )
    assert len(failure.shrunk) == 1 and len(failure.plan) >= 1
    alone = [Setup("full", 1, "rust")]  # the release as it ships: the same run passes
    assert run_campaign(alone, 300.0, seed=0, max_runs=failure.run + 1).failure is None


def _unlocks_only(self: Any, session_id: str) -> None:
    """A ``release_session`` that unlocks the slot's node and keeps everything else."""
    slot = self.slots.get(session_id)
    if slot is not None and slot.lock is not None:
        self.cache.unlock(slot.lock)
        slot.lock = None


def _planted() -> dict[str, tuple[Any, str, Callable[..., Any], str]]:
    """Bugs planted in SGLang's ``StreamingSession`` and ``MambaPool`` (class, method,
    wrapper, the rule it breaks)."""
    modules = load_sglang("0.5.23")
    session = modules.attr(SESSION, "StreamingSession")
    states = modules.attr("sglang.srt.mem_cache.memory_pool", "MambaPool")
    free, trim = session._free_kv_aligned, session._trim_overshoot
    return {
        # the session frees nothing past a turn's stop or a retried tail
        "frees-nothing": (session, "_free_kv_aligned", lambda self, kv, target, end: None,
                          "INV-TOKEN-ACCOUNTING"),
        # off by one: the first slot of every freed span leaks
        "frees-one-short": (session, "_free_kv_aligned",
                            lambda self, kv, target, end: free(self, kv, target + 1, end),
                            "INV-TOKEN-ACCOUNTING"),
        # release_session keeps the session's Mamba state
        "keeps-the-state": (session, "_free_slot_mamba", lambda self, slot: None,
                            "INV-MAMBA-ACCOUNTING"),
        # release_session lets go of the lock but keeps the slot, its row and its KV
        "keeps-the-slot": (session, "release_session", _unlocks_only,
                           "INV-TOKEN-ACCOUNTING"),
        # the hand-over keeps one token past the stop
        "trims-past-the-stop": (session, "_trim_overshoot",
                                lambda self, req, finished: trim(self, req, finished + 1),
                                "INV-SESSION-TRIMMED"),
        # the first turn's prompt goes into the tree with a state slot never copied into
        "forks-nothing": (states, "copy_from", lambda self, src, dst: None,
                          "INV-MAMBA-STATE-INTEGRITY"),
    }  # fmt: skip


@pytest.mark.parametrize(
    "bug",
    ["frees-nothing", "frees-one-short", "keeps-the-state", "keeps-the-slot",
     "trims-past-the-stop", "forks-nothing"],
)  # fmt: skip
def test_each_planted_bug_is_found_as_new_and_shrunk(
    bug: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    owner, method, wrapper, rule = _planted()[bug]
    monkeypatch.setattr(owner, method, wrapper)
    result = run_campaign(setups(), 120.0, seed=0, max_runs=50, skip_known=True)
    assert result.failure is not None, bug
    assert result.failure.verdict.detector == rule and not result.failure.verdict.known
    assert len(result.failure.shrunk) == 1 and result.plans <= 20


def test_a_prompt_node_left_unlocked_is_found_only_with_plain_requests(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Planted: the session publishes its first prompt but keeps no lock on the prompt's node.
    The session alone never needs the slots back; plain requests beside it press on the pool
    and the tree evicts the node, whose pages the session's row still names (``INV-ROW-SLOTS``
    at once). Without that rule, SGLang's own KV page check sees them free then; without
    either, a plain request's KV lands in those slots and the session's next turn resumes over
    it (``INV-KV-INTEGRITY``)."""
    session = load_sglang("0.5.23").attr(SESSION, "StreamingSession")
    publish = session.try_checkpoint

    def unlocked(self: Any, req: Any, *, up_to: int, **kwargs: Any) -> bool:
        done: bool = publish(self, req, up_to=up_to, **kwargs)
        slot = self.borrowed_slot(req)
        if slot is not None and slot.lock is not None:
            self.cache.unlock(slot.lock)
            slot.lock = None
        return done

    monkeypatch.setattr(session, "try_checkpoint", unlocked)
    alone = run_campaign(setups(neighbours=(False,)), 600.0, seed=0, max_runs=100,
                         skip_known=True)  # fmt: skip
    assert alone.failure is None and alone.plans == 100
    beside = run_campaign(setups(neighbours=(True,)), 600.0, seed=0, max_runs=40,
                          skip_known=True)  # fmt: skip
    assert beside.failure is not None and beside.plans <= 20
    assert beside.failure.verdict.detector == "INV-ROW-SLOTS"
    assert len(beside.failure.shrunk) == 4  # three plain requests fill the pool first
    assert not beside.failure.verdict.known and "plain requests" in str(beside.failure.setup)
    # kvpool's rules without the row-slot one (no page reads as free to it)
    monkeypatch.setattr(session_plans, "_free_pages", lambda world: set())
    for checks, detector in ((True, "SGL-SCHEDULER-CHECK"), (False, "INV-KV-INTEGRITY")):
        if not checks:
            monkeypatch.setattr(session_plans, "scheduler_checks", lambda world, running: None)
        found = run_campaign(setups(neighbours=(True,)), 600.0, seed=0, max_runs=40,
                             skip_known=True)  # fmt: skip
        assert found.failure is not None and found.plans <= 20
        assert found.failure.verdict.detector == detector, found.failure.verdict
        assert len(found.failure.shrunk) == 4
