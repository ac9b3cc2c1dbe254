"""A seeded campaign of generated streaming sessions on SGLang's own session code
(``kvpool sessions``).

Run ``i`` of seed ``s`` draws one plan (:func:`draw_plan`, from ``random.Random(f"{s}/{i}")``)
and plays it (:func:`~kvpool.sglang.session_plans.run_session`) on a fresh world of the
``i``-th :class:`Setup` in turn: a model (``full``, ``hybrid``: FULL and MAMBA, ``swa``: FULL
and a window of :data:`~kvpool.sglang.session_world.WINDOW` tokens), a page size and a tree core.
A run fails when a named rule breaks on SGLang's state, SGLang leaves the driver's model of
its scheduler (``session-model``), SGLang raises (``crash``) or an admission resumes from KV or
state that does not match its tokens. A failure whose mismatches are exactly those findings 10,
11 and 12 predict (:func:`~kvpool.sglang.session_plans.predicted_findings`) is *known*; with
``skip_known`` the campaign counts it and goes on, so only a new behaviour stops it.

The first failing plan is shrunk (:func:`shrink`): turns dropped, numbers lowered, options
switched off, as long as it fails with the same detector and stays known or new. Same seed, same
plans, same report, in one process or several (:func:`~kvpool.sglang.session_workers.
run_parallel`).
"""

from __future__ import annotations

import ast
import json
import random
import time
import traceback
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, cast

from kvpool.errors import InvariantViolation
from kvpool.sglang.session_plans import (
    FINDINGS,
    INVARIANT_OF,
    RETRACTIONS,
    Mismatch,
    Turn,
    predicted_findings,
    run_session,
)
from kvpool.sglang.session_world import CORES, VERSION, World, build, build_swa
from kvpool.testing.sandbox import Died, Sandbox

MODELS = ("full", "hybrid", "swa")
"""The models a :class:`Setup` names."""

PAGE_SIZES = {"full": (1, 4), "hybrid": (1,), "swa": (1, 4)}
"""The page sizes (tokens) each model runs at (SGLang's hybrid Mamba pool here: page size 1)."""

EAGLE_MODELS = ("full", "swa")
"""The models whose worlds can build EAGLE's tree (bigram keys); kvpool's adapter of the
unified FULL+MAMBA tree builds it without."""

MAX_TURNS = 4
"""Turns of a plan, at most; with their tokens they fit the worlds' 32-column rows."""

RANGES = ((1, 3), (1, 4), (0, 3))
"""The inclusive ranges of a turn's new tokens, sampled tokens and reserve, as :func:`draw_plan`
draws them: the worlds' pools and rows fit them."""

STOPS = (1, 4)
"""The inclusive range of a turn's stop (an output position) when it has one."""

SHRINK_EVALUATIONS = 400
"""Plans :func:`shrink` plays at most (each on a fresh world)."""


@dataclass(frozen=True)
class Setup:
    """One world: ``model`` (:data:`MODELS`), ``page_size`` (tokens) and ``core`` (0.5.23's tree
    core, ``"rust"`` or ``"python"``), of SGLang ``source``; with ``neighbours``, a plain
    request after every turn presses on the pool (the tree evicts); ``sessions``: one streaming
    session, or two taking turns that share the first one's first prompt; with ``chunked``,
    every prefill runs in chunks of :attr:`chunk` tokens; with ``eagle``, EAGLE's tree (bigram
    keys; :data:`EAGLE_MODELS` only); with ``triton``, the paged allocators (page size 4) run
    SGLang's Triton allocation kernels through Triton's interpreter, else SGLang's torch path
    for them (``use_triton_kernels = False``, as on a platform without Triton: the same slots,
    checked in lockstep against kvpool's reference by the opt-in allocator campaigns)."""

    model: str
    page_size: int
    core: str
    source: str = VERSION
    neighbours: bool = False
    sessions: int = 1
    chunked: bool = False
    eagle: bool = False
    triton: bool = False

    @property
    def chunk(self) -> int:
        """The prefill's chunk (tokens): two, or a page above page size 2; 0 unchunked."""
        return max(2, self.page_size) if self.chunked else 0

    def build(self) -> World:
        """A fresh world of this setup."""
        if self.model == "swa":
            return build_swa(self.core, self.page_size, self.source, self.eagle, self.triton)
        # a session holds a state and locks its published prompt's, and SGLang's admission
        # budget (rem_mamba_slots) admits a turn only when one is left: two more per session
        states = 4 + 2 * (self.sessions - 1)
        return build(self.core, self.model == "hybrid", self.page_size, self.source, states,
                     self.eagle, self.triton)  # fmt: skip

    def play(self, plan: list[Turn]) -> list[Mismatch]:
        """Play ``plan`` on a fresh world of this setup: the resume mismatches
        (:func:`~kvpool.sglang.session_plans.run_session`'s answer; a broken rule raises)."""
        return run_session(self.build(), plan, self.neighbours, self.sessions, self.chunk)

    @property
    def warm_key(self) -> tuple[str, str, str]:
        """What :meth:`warm` loads: the release, the model's cache and the tree core."""
        return (self.source, self.model, self.core)

    def warm(self) -> None:
        """Load this setup's release and tree core into this process (a world built and
        dropped), so that processes forked from it start with them loaded."""
        self.build()

    def __str__(self) -> str:
        two = ", two sessions sharing a prompt" if self.sessions == 2 else ""
        beside = ", with plain requests" if self.neighbours else ""
        chunks = f", {self.chunk}-token prefill chunks" if self.chunked else ""
        tree = " (EAGLE's bigram tree)" if self.eagle else ""
        kernels = ", Triton allocation kernels" if self.triton and self.page_size > 1 else ""
        return (
            f"{self.model}{tree}, page size {self.page_size}, {self.core} core{two}{beside}"
            f"{chunks}{kernels}"
        )


def setups(
    models: Sequence[str] = MODELS,
    page_sizes: Sequence[int] | None = None,
    cores: Sequence[str] = CORES,
    source: str = VERSION,
    neighbours: Sequence[bool] = (False, True),
    sessions: Sequence[int] = (1, 2),
    chunked: Sequence[bool] = (False, True),
    eagle: Sequence[bool] = (False,),
    triton: bool = False,
) -> list[Setup]:
    """Every setup of ``eagle`` x ``chunked`` x ``sessions`` x ``neighbours`` x ``models`` x
    their page sizes (only those in ``page_sizes``; None: all) x ``cores``, in that order:
    whole prefills first, one session first, alone first. EAGLE's tree (``eagle``: True; by
    default not drawn) only for :data:`EAGLE_MODELS`; ``triton``: every setup's allocation
    kernels (:attr:`Setup.triton`)."""
    return [
        Setup(model, ps, core, source, beside, count, chunks, bigrams, triton)
        for bigrams in eagle
        for chunks in chunked
        for count in sessions
        for beside in neighbours
        for model in models
        if not bigrams or model in EAGLE_MODELS
        for ps in PAGE_SIZES[model]
        if page_sizes is None or ps in page_sizes
        for core in cores
    ]


def draw_plan(rng: random.Random) -> list[Turn]:
    """One to :data:`MAX_TURNS` turns, each field drawn uniformly from its range (the ranges of
    :data:`~kvpool.sglang.session_plans.Turn`'s opt-in hypothesis strategy)."""
    plan: list[Turn] = []
    for _ in range(rng.randint(1, MAX_TURNS)):
        new, outputs, reserve = (rng.randint(low, high) for low, high in RANGES)
        stop = None if rng.random() < 0.5 else rng.randint(*STOPS)
        aborted, retracted = rng.random() < 0.5, rng.choice(RETRACTIONS)
        plan.append((new, outputs, reserve, stop, aborted, retracted, rng.random() < 0.5))
    return plan


def parse_plan(text: str) -> list[Turn]:
    """A plan written as a report prints it (a Python list of 7-tuples) or as a JSON report
    holds it (a list of 7-item lists); ValueError naming what is wrong when it is not one of
    :func:`draw_plan`'s plans."""
    try:
        value = json.loads(text)
    except ValueError:  # not JSON: a Python literal
        try:
            value = ast.literal_eval(text)
        except (ValueError, SyntaxError):
            raise ValueError(f"{text!r} is not a Python or JSON list of turns") from None
    if not isinstance(value, list | tuple) or not 1 <= len(value) <= MAX_TURNS:
        raise ValueError(f"a plan is a list of 1 to {MAX_TURNS} turns")
    plan: list[Turn] = []
    for i, turn in enumerate(value):
        if not isinstance(turn, list | tuple) or len(turn) != 7:
            raise ValueError(f"turn {i} is not a 7-tuple (new, sampled, reserve, stop, "
                             "aborted, retracted, launched)")  # fmt: skip
        new, outputs, reserve, stop, aborted, retracted, launched = turn
        numbers = zip(("new", "sampled", "reserve"), (new, outputs, reserve), RANGES, strict=True)
        for name, number, (low, high) in numbers:
            if type(number) is not int or not low <= number <= high:
                raise ValueError(f"turn {i}: {name} {number!r} is not an integer in {low}..{high}")
        if stop is not None and (type(stop) is not int or not STOPS[0] <= stop <= STOPS[1]):
            raise ValueError(
                f"turn {i}: stop {stop!r} is not None or an integer in {STOPS[0]}..{STOPS[1]}"
            )
        if type(aborted) is not bool or type(launched) is not bool:
            raise ValueError(f"turn {i}: aborted and launched are True or False")
        if retracted not in RETRACTIONS:
            raise ValueError(f"turn {i}: retracted {retracted!r} is not one of {RETRACTIONS}")
        plan.append((new, outputs, reserve, stop, aborted, retracted, launched))
    return plan


@dataclass(frozen=True)
class Verdict:
    """How a plan failed: ``detector`` (an invariant id, ``session-model`` or ``crash``), a
    one-line ``message`` and ``known``, the findings that explain it (empty: a new behaviour;
    only resume mismatches can be known)."""

    detector: str
    message: str
    known: tuple[int, ...] = ()

    def record(self) -> dict[str, Any]:
        """The verdict as JSON-ready data."""
        return {"detector": self.detector, "message": self.message, "known": list(self.known)}


def describe_mismatch(mismatch: Mismatch) -> str:
    """One line for a resume mismatch."""
    turn, kind, amount = mismatch
    if kind == "state":
        side = "ahead of" if amount > 0 else "behind"
        return f"turn {turn} resumes from a Mamba state {abs(amount)} token(s) {side} its prefix"
    if kind == "kv":
        return f"turn {turn} resumes over {amount} position(s) holding another token's KV"
    if kind == "plain-kv":
        return (
            f"the plain request after turn {turn} resumes over {amount} position(s) holding "
            "another token's KV"
        )
    return f"turn {turn} resumes with {amount} position(s) of its window freed"


def judge(setup: Setup, plan: list[Turn]) -> Verdict | None:
    """Play ``plan`` on a fresh world of ``setup``; None when every check holds."""
    try:
        found = setup.play(plan)
    except InvariantViolation as exc:
        return Verdict(exc.invariant_id, str(exc).removeprefix(f"[{exc.invariant_id}] "))
    except Exception as exc:  # SGLang's own code raised: the report shows what and where
        last = traceback.extract_tb(exc.__traceback__)[-1]  # this function's frame at least
        where = f"{Path(last.filename).name}:{last.lineno}, {last.name}"
        return Verdict("crash", f"{type(exc).__name__}: {exc} (at {where})")
    if not found:
        return None
    first = sorted(found)[0]
    expected = predicted_findings(plan, setup.model == "hybrid", setup.sessions)
    known: tuple[int, ...] = ()
    if sorted(found) == sorted(m for m, _ in expected):
        known = tuple(sorted({finding for _, finding in expected}))
    more = f" (+{len(found) - 1} more)" if len(found) > 1 else ""
    return Verdict(INVARIANT_OF[first[1]], describe_mismatch(first) + more, known)


def _with(turn: Turn, index: int, value: object) -> Turn:
    """``turn`` with field ``index`` set to ``value``."""
    fields: list[object] = list(turn)
    fields[index] = value
    return cast(Turn, tuple(fields))


def simpler(plan: list[Turn]) -> list[list[Turn]]:
    """The plans one step simpler than ``plan``, simplest first: a turn dropped, then each
    field of each turn moved towards its simplest value (the least number, no stop, False, not
    retracted)."""
    out = [plan[:i] + plan[i + 1 :] for i in range(len(plan))] if len(plan) > 1 else []
    for i, turn in enumerate(plan):
        _, _, _, stop, aborted, retracted, launched = turn
        options: list[Turn] = []
        for index, (low, _) in enumerate(RANGES):  # new, sampled, reserve: the least, one less
            number: int = turn[index]  # type: ignore[assignment]
            lower = sorted({low, number - 1})
            options += [_with(turn, index, v) for v in lower if low <= v < number]
        if stop is not None:
            options.append(_with(turn, 3, None))
            if stop > STOPS[0]:
                options.append(_with(turn, 3, stop - 1))
        if aborted:
            options.append(_with(turn, 4, False))
        if retracted is not None:
            options += [_with(turn, 5, m) for m in RETRACTIONS[: RETRACTIONS.index(retracted)]]
        if launched:
            options.append(_with(turn, 6, False))
        out.extend([*plan[:i], option, *plan[i + 1 :]] for option in options)
    return out


def shrink(
    plan: list[Turn],
    fails: Callable[[list[Turn]], bool],
    budget: int = SHRINK_EVALUATIONS,
) -> list[Turn]:
    """A plan no simpler step of which still ``fails`` (or the simplest found within
    ``budget`` calls of ``fails``): greedy, the first simpler plan that fails is taken and the
    search starts again from it. Deterministic."""
    current, calls = plan, 0
    progress = True
    while progress and calls < budget:
        progress = False
        for candidate in simpler(current):
            calls += 1
            if fails(candidate):
                current, progress = candidate, True
                break
            if calls >= budget:
                break
    return current


def describe_turn(turn: Turn) -> str:
    """One line for a turn of a plan."""
    new, outputs, reserve, stop, aborted, retracted, launched = turn
    parts = [f"{new} new token(s), {outputs} sampled"]
    if reserve:
        parts.append(f"speculative (reserve {reserve})")
    if retracted:
        parts.append("retracted " + ("under overlap" if retracted == "overlap" else "(plain)"))
    elif stop is not None and stop < outputs:
        parts.append(f"stops at output {stop}")
    if aborted:
        parts.append("aborted")
    if not retracted:  # a retracted turn finishes after its re-admission's own step
        parts.append("next step launched" if launched else "no step launched")
    return ", ".join(parts)


@dataclass(frozen=True)
class SessionFailure:
    """The first failing run: its number, setup, plan and the shrunk plan with its verdict."""

    run: int
    setup: Setup
    plan: list[Turn]
    shrunk: list[Turn]
    verdict: Verdict

    def lines(self) -> list[str]:
        """The report: the verdict, the shrunk plan turn by turn and as Python."""
        status = (
            "known: finding(s) " + ", ".join(map(str, self.verdict.known))
            + " of specs/sglang_findings.md"
            if self.verdict.known
            else "not a known finding"
        )  # fmt: skip
        out = [
            f"failure in run {self.run} ({self.setup}): [{self.verdict.detector}] "
            f"{self.verdict.message}",
            f"  {status}",
            f"  shrunk from {len(self.plan)} to {len(self.shrunk)} turn(s):",
        ]
        out += [f"    turn {i}: {describe_turn(turn)}" for i, turn in enumerate(self.shrunk)]
        out.append(f"  plan = {self.shrunk!r}")
        return out

    def record(self) -> dict[str, Any]:
        """The failure as JSON-ready data (a plan as a list of 7-item lists)."""
        return {
            "run": self.run,
            "setup": str(self.setup),
            **self.verdict.record(),
            "plan": [list(turn) for turn in self.plan],
            "shrunk": [list(turn) for turn in self.shrunk],
        }


@dataclass
class SessionCampaign:
    """What a campaign ran and found (:func:`run_campaign`)."""

    seed: int
    plans: int = 0
    turns: int = 0
    seconds: float = 0.0
    known: Counter[int] = field(default_factory=Counter)
    """Plans whose only failures are known findings, per finding (``skip_known``)."""
    failure: SessionFailure | None = None

    def record(self) -> dict[str, Any]:
        """The campaign as JSON-ready data (``known``: plans per finding)."""
        return {
            "seed": self.seed,
            "plans": self.plans,
            "turns": self.turns,
            "seconds": round(self.seconds, 3),
            "known": {str(n): count for n, count in sorted(self.known.items())},
            "failure": None if self.failure is None else self.failure.record(),
        }


KILLED = "killed"
"""The detector of a plan whose playing killed its process (a signal, or an exit without a
verdict): what a fault in SGLang's compiled tree core looks like from outside."""

HUNG = "hung"
"""The detector of a plan whose playing gave no answer within the run's timeout (a deadlock or
an endless loop; the process is killed)."""

RUN_TIMEOUT = 60.0
"""Seconds a run may take before it counts as hung (a plan takes milliseconds)."""


@dataclass(frozen=True)
class _Play:
    """One plan on one setup, as a :class:`~kvpool.testing.sandbox.Sandbox` call."""

    setup: Setup
    plan: list[Turn]

    @property
    def warm_key(self) -> tuple[str, str, str]:
        return self.setup.warm_key


def _judge_play(play: _Play) -> Verdict | None:
    return judge(play.setup, play.plan)


def _warm_play(play: _Play) -> None:
    play.setup.warm()


def isolated_sandbox() -> Sandbox:
    """A sandbox in which :func:`judge_isolated` plays plans (close it when done)."""
    return Sandbox(_judge_play, _warm_play)


def judge_isolated(
    sandbox: Sandbox, setup: Setup, plan: list[Turn], timeout: float | None = RUN_TIMEOUT
) -> Verdict | None:
    """:func:`judge` in a forked child of ``sandbox`` (:func:`isolated_sandbox`): a plan that
    kills its process gets the verdict :data:`KILLED`, naming the signal or the exit code, and
    one that gives no verdict within ``timeout`` seconds (None: no limit) :data:`HUNG`."""
    answer = sandbox.call(_Play(setup, plan), timeout)
    if isinstance(answer, Died):
        if answer.hung_after is not None:
            return Verdict(HUNG, f"the process playing the plan {answer}")
        return Verdict(KILLED, f"the process playing the plan was {answer}")
    verdict: Verdict | None = answer
    return verdict


Judge = Callable[[Setup, list[Turn]], "Verdict | None"]
"""How a plan is judged: :func:`judge`, or :func:`judge_isolated` bound to a sandbox."""


def fails_alike(
    setup: Setup, verdict: Verdict, judge_with: Judge = judge
) -> Callable[[list[Turn]], bool]:
    """Whether a plan fails on ``setup`` with ``verdict``'s detector, known or new alike (a
    killed or hung process: the same way)."""

    def fails(candidate: list[Turn]) -> bool:
        again = judge_with(setup, candidate)
        return (
            again is not None
            and again.detector == verdict.detector
            and bool(again.known) == bool(verdict.known)
            and (verdict.detector not in (KILLED, HUNG) or again.message == verdict.message)
        )

    return fails


NO_FAILURE = 2**62
"""The lowest failing run a campaign shares between its workers, before any fails."""

BOARD = 3 + len(FINDINGS)
"""Numbers each worker of :func:`~kvpool.sglang.session_workers.run_parallel` posts in shared
memory: the run it is playing (-1: none; ``shrinking(run)`` while it shrinks that run's
failure), its plans and turns so far, and its known plans per finding
(:data:`~kvpool.sglang.session_plans.FINDINGS`). They outlive a worker that is killed."""


def shrinking(run: int) -> int:
    """The number a worker posts while it shrinks ``run``'s failure (below -1; its own
    inverse: ``shrinking(shrinking(run)) == run``). No run timeout applies then: a shrink plays
    hundreds of plans."""
    return -2 - run


def _post(board: Any, slot: int, run: int, result: SessionCampaign) -> None:
    """Post ``result``'s counts and the run in hand to worker ``slot``'s part of ``board``."""
    numbers = [run, result.plans, result.turns, *(result.known[n] for n in FINDINGS)]
    board[slot * BOARD : (slot + 1) * BOARD] = numbers


def run_campaign(
    chosen: Sequence[Setup],
    seconds: float,
    seed: int = 0,
    max_runs: int | None = None,
    skip_known: bool = False,
    first: int = 0,
    stride: int = 1,
    lowest: Any = None,
    board: Any = None,
) -> SessionCampaign:
    """Runs ``first, first + stride, ...`` below ``max_runs`` (setups in turn: run ``i`` on
    ``chosen[i % len(chosen)]``) until ``seconds`` have passed or a run failed (with
    ``skip_known``: failed with anything but known findings); the failure shrunk. ``lowest``
    (a shared ``multiprocessing.Value``, :func:`run_parallel`'s) holds the lowest failing run
    of every worker: a worker stops before a run above it and lowers it when it fails.
    ``board`` (a shared array, :func:`run_parallel`'s): where this worker (number ``first``)
    posts the run in hand and its counts (:data:`BOARD`)."""
    if not chosen:
        raise ValueError("no setup to run")
    result = SessionCampaign(seed)
    start = time.monotonic()
    run = first
    while (max_runs is None or run < max_runs) and time.monotonic() - start < seconds:
        if lowest is not None and run > lowest.value:
            break  # a lower run failed in another worker: this one's report would not count
        setup = chosen[run % len(chosen)]
        plan = draw_plan(random.Random(f"{seed}/{run}"))
        if board is not None:
            _post(board, first, run, result)
        verdict = judge(setup, plan)
        result.plans += 1
        result.turns += len(plan)
        if verdict is not None and skip_known and verdict.known:
            result.known.update(verdict.known)
            verdict = None
        if verdict is not None:
            if lowest is not None:
                with lowest.get_lock():
                    lowest.value = min(lowest.value, run)
            if board is not None:
                _post(board, first, shrinking(run), result)
            shrunk = shrink(plan, fails_alike(setup, verdict))
            final = judge(setup, shrunk)
            assert final is not None  # shrink keeps only failing plans
            result.failure = SessionFailure(run, setup, plan, shrunk, final)
            break  # the run stays posted: a death while shrinking is that run's
        if board is not None:
            _post(board, first, -1, result)
        run += stride
    result.seconds = time.monotonic() - start
    return result


__all__ = [
    "BOARD",
    "EAGLE_MODELS",
    "HUNG",
    "KILLED",
    "MAX_TURNS",
    "MODELS",
    "NO_FAILURE",
    "PAGE_SIZES",
    "RANGES",
    "RUN_TIMEOUT",
    "SHRINK_EVALUATIONS",
    "STOPS",
    "Judge",
    "SessionCampaign",
    "SessionFailure",
    "Setup",
    "Verdict",
    "describe_mismatch",
    "describe_turn",
    "draw_plan",
    "fails_alike",
    "isolated_sandbox",
    "judge",
    "judge_isolated",
    "parse_plan",
    "run_campaign",
    "setups",
    "shrink",
    "shrinking",
    "simpler",
]
