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
from collections.abc import Sequence
from queue import Empty
from typing import Any

from kvpool.sglang.session_campaign import (
    BOARD,
    KILLED,
    NO_FAILURE,
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
)
from kvpool.sglang.session_plans import FINDINGS, Turn
from kvpool.testing.sandbox import SandboxError, describe_exit


def killed_failure(setup: Setup, run: int, plan: list[Turn], how: str) -> SessionFailure:
    """The report of run ``run`` (``plan`` on ``setup``), whose worker died playing it
    (``how``: :func:`~kvpool.testing.sandbox.describe_exit`'s words): the plan played again in
    a sandbox and, when it kills that process too, shrunk there (every candidate in a child of
    its own); when it does not, the death reported as it happened, unshrunk."""
    with isolated_sandbox() as sandbox:
        alone: str | None = None  # what the plan did played again, when it did not kill
        try:
            verdict = judge_isolated(sandbox, setup, plan)
        except SandboxError as exc:  # the zygote itself died (loading the setup, say)
            verdict, alone = None, f"the sandbox could not play it: {exc}"
        else:
            if verdict is None:
                alone = "every check holds"
            elif verdict.detector != KILLED:
                alone = f"[{verdict.detector}] {verdict.message}"
        if verdict is None or alone is not None:
            death = Verdict(KILLED, f"the worker playing the plan was {how}; played again "
                                    f"alone: {alone}")  # fmt: skip
            return SessionFailure(run, setup, plan, plan, death)

        def judge_with(s: Setup, p: list[Turn]) -> Verdict | None:
            return judge_isolated(sandbox, s, p)

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
) -> SessionCampaign:
    """:func:`run_campaign` over ``workers`` processes (0: in this process), worker ``k``
    taking runs ``k, k + workers, ...``: the same plans on the same setups as one process, and
    the same first failure when every run below it ran (always with ``max_runs``). A worker
    killed while playing a run (a signal, an exit without its part) is that run's failure,
    :data:`KILLED` (:func:`killed_failure`); the others stop above it. Plans, turns and known
    findings are summed (a killed worker's as it posted them, its last run included);
    ``seconds`` is the longest worker's."""
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
    dead: dict[int, int] = {}  # worker -> exit code, for a worker that died without its part
    try:
        while len(parts.keys() | dead.keys()) < len(procs):
            try:
                k, part = queue.get(timeout=1.0)
            except Empty:  # a worker killed (a signal) never sends its part
                for k, proc in enumerate(procs):
                    if k not in parts and k not in dead and proc.exitcode not in (None, 0):
                        dead[k] = proc.exitcode
                        if board[k * BOARD] < 0:
                            raise RuntimeError(f"session worker {k} {describe_exit(dead[k])} "
                                               "outside a run") from None  # fmt: skip
                        with lowest.get_lock():  # the others stop above its run
                            lowest.value = min(lowest.value, board[k * BOARD])
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
    killed: list[tuple[int, Setup, list[Turn], int]] = []
    for k in dead:
        run, plans, turns, *known = board[k * BOARD : (k + 1) * BOARD]
        plan = draw_plan(random.Random(f"{seed}/{run}"))
        merged.plans += plans + 1
        merged.turns += turns + len(plan)
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
        run, setup, plan, code = lowest_killed
        failures = [killed_failure(setup, run, plan, describe_exit(code))]
    merged.failure = min(failures, key=lambda f: f.run, default=None)
    return merged


__all__ = ["killed_failure", "run_parallel"]
