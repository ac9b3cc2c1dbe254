"""``kvpool sessions``' worker processes: a campaign's runs shared out, and a worker that dies
playing a run reported as that run's failure.

Worker ``k`` of ``N`` plays runs ``k, k + N, ...`` of :func:`~kvpool.sglang.session_campaign.
run_campaign` in a spawned process of its own, so the plans, and the first failure when every run
below it ran, are the same whatever ``N``. Each worker posts the run in hand and its counts in
shared memory (:data:`~kvpool.sglang.session_campaign.BOARD`), where they outlive it: a fault in
SGLang's compiled tree core kills the process with no exception to report, and the parent still
knows which run did it, draws that run's plan again and shrinks it in a sandbox
(:func:`~kvpool.sglang.session_campaign.judge_isolated`), every candidate in a forked child.
"""

from __future__ import annotations

import multiprocessing as mp
import random
import time
from collections.abc import Callable, Sequence
from queue import Empty
from typing import Any

from kvpool.sglang.session_campaign import (
    BOARD,
    HUNG,
    KILLED,
    NO_FAILURE,
    RUN_TIMEOUT,
    SessionCampaign,
    SessionFailure,
    Setup,
    Verdict,
    draw_plan,
    fails_alike,
    isolated_sandbox,
    judge_isolated,
    run_campaign,
    shrink,
    shrinking,
)
from kvpool.sglang.session_plans import FINDINGS, Turn
from kvpool.testing.sandbox import SandboxError, describe_exit


def killed_failure(
    setup: Setup,
    run: int,
    plan: list[Turn],
    how: str,
    detector: str = KILLED,
    timeout: float = RUN_TIMEOUT,
) -> SessionFailure:
    """The report of run ``run`` (``plan`` on ``setup``), whose worker died playing it or was
    killed for a hang (``how``: :func:`~kvpool.testing.sandbox.describe_exit`'s words or the
    hang's; ``detector``: :data:`KILLED` or :data:`HUNG`): the plan played again in a sandbox
    (``timeout`` seconds at most) and, when it dies or hangs the same way there, shrunk there
    (every candidate in a child of its own); when it does not, the death reported as it
    happened, unshrunk."""
    with isolated_sandbox() as sandbox:
        alone: str | None = None  # what the plan did played again, when not the same
        try:
            verdict = judge_isolated(sandbox, setup, plan, timeout)
        except SandboxError as exc:  # the zygote itself died (loading the setup, say)
            verdict, alone = None, f"the sandbox could not play it: {exc}"
        else:
            if verdict is None:
                alone = "every check holds"
            elif verdict.detector != detector:
                alone = f"[{verdict.detector}] {verdict.message}"
        if verdict is None or alone is not None:
            death = Verdict(detector, f"the worker playing the plan {how}; played again "
                                      f"alone: {alone}")  # fmt: skip
            return SessionFailure(run, setup, plan, plan, death)

        def judge_with(s: Setup, p: list[Turn]) -> Verdict | None:
            return judge_isolated(sandbox, s, p, timeout)

        shrunk = shrink(plan, fails_alike(setup, verdict, judge_with))
        final = judge_with(setup, shrunk)
    assert final is not None  # shrink keeps only failing plans
    return SessionFailure(run, setup, plan, shrunk, final)


def _worker(
    queue: Any, lowest: Any, board: Any, chosen: Sequence[Setup], settings: tuple[Any, ...]
) -> None:
    """One worker process of :func:`run_parallel`: its share of the runs (``settings``: seconds,
    seed, max_runs, skip_known, first, stride), one torch thread (the workers are the
    parallelism). Sends ``(first, its campaign)``."""
    import torch

    torch.set_num_threads(1)
    seconds, seed, max_runs, skip_known, first, stride = settings
    try:
        part: Any = run_campaign(chosen, seconds, seed, max_runs, skip_known, first, stride,
                                 lowest, board)  # fmt: skip
    except BaseException as exc:  # the parent reports it; a worker has no terminal of its own
        # as text: an exception holding what does not pickle would never reach the parent
        part = RuntimeError(f"session worker {first}: {type(exc).__name__}: {exc}")
    queue.put((first, part))


def run_parallel(
    chosen: Sequence[Setup],
    seconds: float,
    seed: int = 0,
    max_runs: int | None = None,
    skip_known: bool = False,
    workers: int = 2,
    run_timeout: float = RUN_TIMEOUT,
    progress: Callable[[float, int], None] | None = None,
) -> SessionCampaign:
    """:func:`run_campaign` over ``workers`` processes (0: in this process), worker ``k``
    taking runs ``k, k + workers, ...``: the same plans on the same setups as one process, and
    the same first failure when every run below it ran (always with ``max_runs``). A worker
    killed while playing a run (a signal, an exit without its part) is that run's failure,
    :data:`KILLED`, and a worker still on one run after ``run_timeout`` seconds is killed and
    that run's failure is :data:`HUNG` (:func:`killed_failure`); the others stop above it.
    Plans, turns and known findings are summed (a killed worker's as it posted them, its last
    run included); ``seconds`` is the longest worker's. ``progress(seconds, plans)``, when
    given, hears about once a second how long the workers have played (0 while they load)
    and how many plans they finished (as posted; not called with ``workers`` 0)."""
    if not chosen:
        raise ValueError("no setup to run")
    if workers <= 0:
        return run_campaign(chosen, seconds, seed, max_runs, skip_known)
    ctx = mp.get_context("spawn")  # a fresh interpreter: torch and SGLang do not fork well
    queue = ctx.Queue()
    lowest = ctx.Value("q", NO_FAILURE)
    board = ctx.Array("q", [-1, *[0] * (BOARD - 1)] * workers)
    procs = [
        ctx.Process(target=_worker, daemon=True,
                    args=(queue, lowest, board, chosen,
                          (seconds, seed, max_runs, skip_known, k, workers)))
        for k in range(workers)
    ]  # fmt: skip
    for proc in procs:
        proc.start()
    parts: dict[int, SessionCampaign] = {}
    # worker -> (detector, how it ended), for a worker that died without its part
    dead: dict[int, tuple[str, str]] = {}
    watched = {k: (-1, time.monotonic()) for k in range(workers)}  # the run in hand, since
    playing: float | None = None  # when the first worker began its first run
    try:
        while len(parts.keys() | dead.keys()) < len(procs):
            try:
                k, part = queue.get(timeout=min(1.0, run_timeout / 4))
            except Empty:  # a worker killed (a signal) never sends its part
                now = time.monotonic()
                if progress is not None:
                    started = (board[k * BOARD] != -1 or board[k * BOARD + 1] > 0
                               for k in range(workers))  # fmt: skip
                    if playing is None and any(started):
                        playing = now  # the budget counts from a worker's first run
                    finished = sum(parts[k].plans if k in parts else board[k * BOARD + 1]
                                   for k in range(workers))  # fmt: skip
                    progress(0.0 if playing is None else now - playing, finished)
                for k, proc in enumerate(procs):
                    if k in parts or k in dead:
                        continue
                    posted = board[k * BOARD]
                    run = posted if posted >= -1 else shrinking(posted)
                    if posted != watched[k][0]:
                        watched[k] = (posted, now)
                    elif posted >= 0 and now - watched[k][1] > run_timeout and proc.is_alive():
                        proc.kill()  # hung: the run is its failure
                        proc.join(10)
                        dead[k] = (HUNG, f"hung: no answer within {run_timeout:g} s")
                    if k not in dead and proc.exitcode not in (None, 0):
                        dead[k] = (KILLED, f"was {describe_exit(proc.exitcode)}")
                        if run < 0:
                            raise RuntimeError(f"session worker {k} {describe_exit(proc.exitcode)}"
                                               " outside a run") from None  # fmt: skip
                    if k in dead:
                        with lowest.get_lock():  # the others stop above its run
                            lowest.value = min(lowest.value, run)
                gone = [p for k, p in enumerate(procs) if k not in parts and k not in dead]
                if gone and all(p.exitcode == 0 for p in gone) and queue.empty():
                    raise RuntimeError(
                        "the session workers exited without sending every part"
                    ) from None
                continue
            if isinstance(part, BaseException):
                raise part
            parts[k] = part
            dead.pop(k, None)  # a part that came after all: the worker finished
    finally:
        for proc in procs:
            if proc.is_alive() and len(parts.keys() | dead.keys()) < len(procs):
                proc.kill()
            proc.join(10)
    merged = SessionCampaign(seed)
    killed: list[tuple[int, Setup, list[Turn], tuple[str, str]]] = []
    for k in dead:
        posted, plans, turns, *known = board[k * BOARD : (k + 1) * BOARD]
        run = posted if posted >= -1 else shrinking(posted)
        plan = draw_plan(random.Random(f"{seed}/{run}"))
        playing = posted >= 0  # its last run not counted yet (a shrunk one was)
        merged.plans += plans + playing
        merged.turns += turns + len(plan) * playing
        merged.known.update({n: c for n, c in zip(FINDINGS, known, strict=True) if c})
        killed.append((run, chosen[run % len(chosen)], plan, dead[k]))
    for part in parts.values():
        merged.plans += part.plans
        merged.turns += part.turns
        merged.known.update(part.known)
        merged.seconds = max(merged.seconds, part.seconds)
    failures = [part.failure for part in parts.values() if part.failure is not None]
    lowest_killed = min(killed, key=lambda k: k[0], default=None)
    if lowest_killed is not None and all(f.run > lowest_killed[0] for f in failures):
        run, setup, plan, (detector, how) = lowest_killed
        failures = [killed_failure(setup, run, plan, how, detector, run_timeout)]
    merged.failure = min(failures, key=lambda f: f.run, default=None)
    return merged


__all__ = ["killed_failure", "run_parallel"]
