"""``kvpool sessions``' own logic, without SGLang: the plans it draws, the findings it predicts,
how it shrinks and what it prints. The campaign on SGLang's code is opt-in
(:mod:`tests.sglang.test_sglang_session_campaign`)."""

from __future__ import annotations

import ast
import dataclasses
import json
import os
import random
import re
import signal
import time
from typing import Any

import pytest

from kvpool.cli import sessions as cli
from kvpool.errors import InvariantViolation
from kvpool.sglang import session_workers as workers_module
from kvpool.sglang.session_campaign import (
    EAGLE_MODELS,
    MAX_TURNS,
    MODELS,
    PAGE_SIZES,
    RUN_TIMEOUT,
    SessionFailure,
    Setup,
    Verdict,
    describe_mismatch,
    describe_turn,
    draw_plan,
    parse_plan,
    setups,
    shrink,
    simpler,
)
from kvpool.sglang.session_plans import RETRACTIONS, Turn, predicted, predicted_findings
from kvpool.sglang.session_workers import run_parallel
from kvpool.sglang.session_world import CORES

OVERLAP_RETRACTED: Turn = (1, 1, 0, None, False, "overlap", False)
STOP_INSIDE: Turn = (1, 3, 0, 1, False, None, True)
"""Three sampled, stopped at the first: the forward consumed all three (finding 10)."""
SPEC_NO_STEP: Turn = (1, 1, 1, None, False, None, False)
"""Speculating, finished with no verify launched (finding 12)."""
PLAIN: Turn = (1, 1, 0, None, False, None, True)


def _size(plan: list[Turn]) -> tuple[int, ...]:
    """A measure every simpler plan lowers (turns first, then each field's distance from its
    simplest value)."""
    fields = [
        (n - 1) + (o - 1) + r + (0 if s is None else s) + a + RETRACTIONS.index(x) + lau
        for n, o, r, s, a, x, lau in plan
    ]
    return (len(plan), sum(fields))


def test_plans_are_deterministic_and_stay_in_their_ranges() -> None:
    plans = [draw_plan(random.Random(f"0/{i}")) for i in range(400)]
    assert plans == [draw_plan(random.Random(f"0/{i}")) for i in range(400)]
    assert plans != [draw_plan(random.Random(f"1/{i}")) for i in range(400)]
    turns = [turn for plan in plans for turn in plan]
    assert {len(plan) for plan in plans} == set(range(1, MAX_TURNS + 1))
    assert {t[0] for t in turns} == {1, 2, 3} and {t[1] for t in turns} == {1, 2, 3, 4}
    assert {t[2] for t in turns} == {0, 1, 2, 3} and {t[3] for t in turns} == {None, 1, 2, 3, 4}
    assert {t[4] for t in turns} == {t[6] for t in turns} == {False, True}
    assert {t[5] for t in turns} == set(RETRACTIONS)


def test_the_setups_cover_every_model_page_size_and_core_in_a_fixed_order() -> None:
    every = setups()
    alone = sum(len(PAGE_SIZES[m]) for m in MODELS) * len(CORES)
    assert len(every) == len(set(every)) == 8 * alone
    assert [s.model for s in every[:2]] == ["full", "full"] and every[0].core == CORES[0]
    # whole prefills, one session, alone first, in the order they had before plain requests,
    # the second session and chunked prefills joined (a run's setup is the run number modulo
    # their count)
    whole, chunked = every[: 4 * alone], every[4 * alone :]
    assert not any(s.chunked for s in whole) and all(s.chunked for s in chunked)
    one, two = whole[: 2 * alone], whole[2 * alone :]
    assert {s.sessions for s in one} == {1} and {s.sessions for s in two} == {2}
    assert not any(s.neighbours for s in one[:alone]) and all(s.neighbours for s in one[alone:])

    def shape(s: Setup) -> tuple[object, ...]:
        return (s.model, s.page_size, s.core, s.neighbours)

    assert [shape(s) for s in two] == [shape(s) for s in one]
    assert [(*shape(s), s.sessions) for s in chunked] == [(*shape(s), s.sessions) for s in whole]
    assert {s.chunk for s in chunked} == {2, 4} and {s.chunk for s in whole} == {0}
    assert all(s.chunk % s.page_size == 0 for s in chunked)
    assert every[4] == Setup("hybrid", 1, "rust")
    assert setups(("hybrid",), (4,)) == []
    assert setups(("swa",), (4,), ("python",), sessions=(1,), chunked=(False,)) == [
        Setup("swa", 4, "python"),
        Setup("swa", 4, "python", neighbours=True),
    ]
    assert str(every[-1]) == (
        "swa, page size 4, python core, two sessions sharing a prompt, with plain requests, "
        "4-token prefill chunks"
    )
    # EAGLE's bigram tree: drawn only when asked, for the models whose worlds build it
    bigram = setups(eagle=(True,))
    assert {s.model for s in bigram} == set(EAGLE_MODELS) == {"full", "swa"}
    assert all(s.eagle for s in bigram) and len(bigram) == 8 * (2 + 2) * len(CORES)
    assert setups(("hybrid",), eagle=(True,)) == [] and not any(s.eagle for s in every)
    assert str(bigram[0]) == "full (EAGLE's bigram tree), page size 1, rust core"
    # SGLang's Triton allocation kernels: every setup when asked, named where they run
    on_triton = setups(triton=True)
    assert [dataclasses.replace(s, triton=False) for s in on_triton] == every
    assert all(s.triton for s in on_triton) and not any(s.triton for s in every)
    assert str(on_triton[0]) == str(every[0]) == "full, page size 1, rust core"
    assert str(on_triton[2]) == "full, page size 4, rust core, Triton allocation kernels"
    # the command line's choices are the library's (it does not import it to start fast)
    assert cli.MODELS == MODELS and cli.CORES == CORES and cli.RUN_TIMEOUT == RUN_TIMEOUT


def test_each_predicted_mismatch_names_its_finding() -> None:
    assert predicted_findings([OVERLAP_RETRACTED], hybrid=True) == [((0, "state", 1), 11)]
    assert predicted_findings([OVERLAP_RETRACTED], hybrid=False) == []
    assert predicted_findings([STOP_INSIDE, PLAIN], hybrid=True) == [((1, "state", 2), 10)]
    assert predicted_findings([STOP_INSIDE, PLAIN], hybrid=False) == []
    # the bonus token's KV is claimed before a verify computes it: every later admission
    # resumes over it, and a hybrid state is a token behind
    found = predicted_findings([SPEC_NO_STEP, PLAIN, PLAIN], hybrid=True)
    assert found == [((1, "state", -1), 12), ((1, "kv", 1), 12), ((2, "kv", 1), 12)]
    assert predicted([SPEC_NO_STEP, PLAIN], hybrid=False) == [(1, "kv", 1)]
    # an abort makes the session forget: nothing is resumed over after it
    aborted = (1, 1, 1, None, True, None, False)
    assert predicted([aborted, PLAIN], hybrid=False) == []


def test_two_sessions_take_turns_and_each_keeps_its_own_findings() -> None:
    # turn i is session i % 2's: the second session's turns are numbered in the plan
    plan = [STOP_INSIDE, SPEC_NO_STEP, PLAIN, PLAIN]
    assert predicted_findings(plan, hybrid=True, sessions=2) == [
        ((2, "state", 2), 10),
        ((3, "state", -1), 12),
        ((3, "kv", 1), 12),
    ]
    # as each session's turns alone would have them
    assert predicted([STOP_INSIDE, PLAIN], hybrid=True) == [(1, "state", 2)]
    assert predicted([SPEC_NO_STEP, PLAIN], hybrid=True) == [(1, "state", -1), (1, "kv", 1)]
    # one turn: the second session never runs
    assert predicted([OVERLAP_RETRACTED], True, sessions=2) == predicted([OVERLAP_RETRACTED], True)


def test_every_simpler_plan_is_smaller_and_the_simplest_has_none() -> None:
    rng = random.Random(7)
    for _ in range(200):
        plan = draw_plan(rng)
        for candidate in simpler(plan):
            assert 1 <= len(candidate) <= len(plan) and _size(candidate) < _size(plan)
    assert simpler([(1, 1, 0, None, False, None, False)]) == []


def test_shrink_keeps_a_failing_plan_and_reaches_the_simplest_one() -> None:
    def fails(plan: list[Turn]) -> bool:  # a planted condition: two outputs, under overlap
        return any(t[5] == "overlap" and t[1] >= 2 for t in plan)

    start: list[Turn] = [PLAIN, (3, 4, 3, 2, True, "overlap", True), SPEC_NO_STEP]
    shrunk = shrink(start, fails)
    assert shrunk == [(1, 2, 0, None, False, "overlap", False)]
    assert shrink(start, fails) == shrunk  # deterministic
    calls: list[int] = []

    def counted(plan: list[Turn]) -> bool:
        calls.append(1)
        return fails(plan)

    assert fails(shrink(start, counted, budget=3)) and len(calls) <= 3


def test_the_report_names_the_detector_the_findings_and_a_plan_to_paste() -> None:
    plan = [PLAIN, OVERLAP_RETRACTED]
    known = SessionFailure(4, Setup("hybrid", 1, "rust"), plan, [OVERLAP_RETRACTED],
                           Verdict("INV-MAMBA-STATE-INTEGRITY", "turn 0 ...", (11,)))  # fmt: skip
    lines = known.lines()
    assert lines[0].startswith("failure in run 4 (hybrid, page size 1, rust core): "
                               "[INV-MAMBA-STATE-INTEGRITY]")  # fmt: skip
    assert "finding(s) 11 of specs/sglang_findings.md" in lines[1]
    assert lines[-1].startswith("  plan = ")
    assert ast.literal_eval(lines[-1].split("=", 1)[1].strip()) == [OVERLAP_RETRACTED]
    new = SessionFailure(0, Setup("full", 4, "python"), plan, plan, Verdict("crash", "boom"))
    assert "not a known finding" in new.lines()[1] and len(new.lines()) == 6


def test_turns_and_mismatches_read_as_sentences() -> None:
    assert describe_turn(OVERLAP_RETRACTED) == (
        "1 new token(s), 1 sampled, retracted under overlap"
    )
    assert describe_turn(STOP_INSIDE) == (
        "1 new token(s), 3 sampled, stops at output 1, next step launched"
    )
    assert "speculative (reserve 1)" in describe_turn(SPEC_NO_STEP)
    assert describe_mismatch((1, "state", 2)) == (
        "turn 1 resumes from a Mamba state 2 token(s) ahead of its prefix"
    )
    assert "behind" in describe_mismatch((1, "state", -1))
    assert "another token's KV" in describe_mismatch((2, "kv", 1))
    assert "window freed" in describe_mismatch((0, "swa", 3))
    assert describe_mismatch((2, "plain-kv", 1)) == (
        "the plain request after turn 2 resumes over 1 position(s) holding another token's KV"
    )


def test_a_printed_plan_parses_back_and_a_malformed_one_is_refused() -> None:
    rng = random.Random(3)
    for _ in range(100):
        plan = draw_plan(rng)
        assert parse_plan(repr(plan)) == plan
        assert parse_plan(json.dumps(plan)) == plan  # as a JSON report holds it
    assert parse_plan("([1, 1, 0, None, False, 'overlap', False],)") == [OVERLAP_RETRACTED]
    for text, message in [
        ("nonsense", "is not a Python or JSON list of turns"),
        ("[]", "a plan is a list of 1 to 4 turns"),
        (repr([PLAIN] * 5), "a plan is a list of 1 to 4 turns"),
        ("[(1, 1, 0)]", "turn 0 is not a 7-tuple"),
        ("[(0, 1, 0, None, False, None, False)]", "turn 0: new 0 is not an integer in 1..3"),
        ("[(1, 1, 4, None, False, None, False)]", "reserve 4 is not an integer in 0..3"),
        ("[(1, 1.0, 0, None, False, None, False)]", "sampled 1.0 is not an integer"),
        ("[(1, 1, 0, 5, False, None, False)]", "stop 5 is not None or an integer in 1..4"),
        ("[(1, 1, 0, None, 1, None, False)]", "aborted and launched are True or False"),
        ("[(1, 1, 0, None, False, 'soon', False)]", "retracted 'soon' is not one of"),
    ]:
        with pytest.raises(ValueError, match=re.escape(message)):
            parse_plan(text)


class _DyingSetup(Setup):
    """A setup that loads no SGLang: a plan with an aborted turn kills the process playing it
    (a candidate's compiled code that segfaults), every other plan keeps every rule."""

    def warm(self) -> None:
        pass

    def play(self, plan: list[Turn]) -> list[Any]:
        if any(turn[4] for turn in plan):
            os.kill(os.getpid(), signal.SIGSEGV)
        return []


class _SlowSetup(_DyingSetup):
    """Every plan takes a quarter of a second and keeps every rule."""

    def play(self, plan: list[Turn]) -> list[Any]:
        time.sleep(0.25)
        return []


def test_the_workers_report_their_progress_about_once_a_second() -> None:
    heard: list[tuple[float, int]] = []
    slow = _SlowSetup("full", 1, "rust")

    def progress(elapsed: float, plans: int) -> None:
        heard.append((elapsed, plans))

    result = run_parallel([slow], 60.0, seed=1, max_runs=12, workers=2, progress=progress)
    assert result.failure is None and result.plans == 12
    assert heard, "no progress heard in a campaign of 1.5 s or more"
    assert [s for s, _ in heard] == sorted(s for s, _ in heard)
    assert [p for _, p in heard] == sorted(p for _, p in heard)
    assert all(0 <= p <= 12 for _, p in heard)


def test_a_run_that_kills_its_worker_is_reported_shrunk_not_waited_for() -> None:
    with pytest.raises(ValueError, match="no setup to run"):
        run_parallel([], 1.0, workers=2)
    dying = _DyingSetup("full", 1, "rust")
    first = next(r for r in range(100) if any(t[4] for t in draw_plan(random.Random(f"7/{r}"))))
    result = run_parallel([dying], 60.0, seed=7, max_runs=first + 6, workers=2)
    failure = result.failure
    assert failure is not None
    # the lowest killing run, whichever worker played it; every run below it played
    assert failure.run == first and failure.setup == dying
    assert failure.plan == draw_plan(random.Random(f"7/{first}"))
    assert failure.verdict == Verdict(
        "killed", "the process playing the plan was killed by signal SIGSEGV"
    )
    assert failure.shrunk == [(1, 1, 0, None, True, None, False)]
    assert result.plans >= first + 1  # the killed run and every one below it
    assert "[killed] the process playing the plan was killed by signal SIGSEGV" in "\n".join(
        failure.lines()
    )


class _DyingOnceSetup(_DyingSetup):
    """Kills its worker outright, whatever the plan, but not a sandbox's child: a death the
    plan does not explain (another process's signal, the kernel's OOM killer)."""

    def play(self, plan: list[Turn]) -> list[Any]:
        if os.environ.get("KVPOOL_TEST_DIE") == "1":
            os.kill(os.getpid(), signal.SIGKILL)
        return []


def test_a_death_the_plan_does_not_explain_is_reported_unshrunk(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("KVPOOL_TEST_DIE", "1")  # inherited by the workers, which it kills
    dying = _DyingOnceSetup("full", 1, "rust")

    def killed_failure(setup: Setup, run: int, plan: list[Turn], *how: Any) -> SessionFailure:
        monkeypatch.delenv("KVPOOL_TEST_DIE")  # the sandbox spawned now lives
        return real(setup, run, plan, *how)

    real = workers_module.killed_failure
    monkeypatch.setattr(workers_module, "killed_failure", killed_failure)
    result = run_parallel([dying], 60.0, seed=3, max_runs=4, workers=2)
    failure = result.failure
    assert failure is not None and failure.run == 0 and failure.shrunk == failure.plan
    assert failure.verdict.detector == "killed"
    assert failure.verdict.message == (
        "the worker playing the plan was killed by signal SIGKILL; played again alone: "
        "every check holds"
    )


class _UnloadableSetup(_DyingSetup):
    """Kills whatever process plays it or loads it: the sandbox's zygote dies warming it."""

    def warm(self) -> None:
        os.kill(os.getpid(), signal.SIGKILL)

    def play(self, plan: list[Turn]) -> list[Any]:
        os.kill(os.getpid(), signal.SIGKILL)
        return []


def test_a_setup_the_sandbox_cannot_load_is_reported_as_the_death_it_was() -> None:
    result = run_parallel(
        [_UnloadableSetup("full", 1, "rust")], 60.0, seed=3, max_runs=2, workers=1
    )
    failure = result.failure
    assert failure is not None and failure.run == 0 and failure.shrunk == failure.plan
    assert failure.verdict.message == (
        "the worker playing the plan was killed by signal SIGKILL; played again alone: the "
        "sandbox could not play it: the sandbox's zygote killed by signal SIGKILL"
    )


class _HangingSetup(_DyingSetup):
    """A plan with an aborted turn never finishes (a deadlock in compiled code)."""

    def play(self, plan: list[Turn]) -> list[Any]:
        if any(turn[4] for turn in plan):
            time.sleep(3600)
        return []


def test_a_run_that_hangs_is_killed_reported_and_shrunk() -> None:
    hanging = _HangingSetup("full", 1, "rust")
    first = next(r for r in range(100) if any(t[4] for t in draw_plan(random.Random(f"7/{r}"))))
    result = run_parallel([hanging], 60.0, seed=7, max_runs=first + 4, workers=2, run_timeout=1.0)
    failure = result.failure
    assert failure is not None and failure.run == first
    assert failure.verdict == Verdict(
        "hung", "the process playing the plan hung: no answer within 1 s"
    )
    assert failure.shrunk == [(1, 1, 0, None, True, None, False)]


class _DyingWhileShrinkingSetup(_DyingSetup):
    """A plan with an aborted turn breaks a rule, and kills its process once it is down to one
    turn: the worker dies shrinking the failure it found."""

    def play(self, plan: list[Turn]) -> list[Any]:
        if any(turn[4] for turn in plan):
            if len(plan) == 1:
                os.kill(os.getpid(), signal.SIGSEGV)
            raise InvariantViolation("INV-TOKEN-ACCOUNTING", "planted")
        return []


def test_a_worker_that_dies_shrinking_reports_the_run_it_was_shrinking() -> None:
    dying = _DyingWhileShrinkingSetup("full", 1, "rust")
    assert len(draw_plan(random.Random("0/0"))) == 3 and any(
        t[4] for t in draw_plan(random.Random("0/0"))
    )
    result = run_parallel([dying], 60.0, seed=0, max_runs=4, workers=2, run_timeout=1.0)
    failure = result.failure
    assert failure is not None and failure.run == 0 and failure.shrunk == failure.plan
    assert failure.verdict.message == (
        "the worker playing the plan was killed by signal SIGSEGV; played again alone: "
        "[INV-TOKEN-ACCOUNTING] planted"
    )
