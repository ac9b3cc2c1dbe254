"""Campaigns over a Ray cluster (``kvpool verify --ray [ADDRESS]``).

The campaign is the local one (:mod:`kvpool.testing.workers`) cut into blocks of run numbers:
the driver hands block ``[first, end)`` of the same campaign seed to one of its long-lived
:class:`BlockRunner` actors (one per cluster CPU, spread over the nodes), in order; run ``i`` is
the same seeded run wherever it executes, so a block's results are those of the local
campaign's runs ``first .. end - 1``.

An actor runs its blocks through :func:`kvpool.testing.workers.run_block` with one worker
process that it keeps from block to block (started, with both implementations built, before the
campaign's clock starts, as the local workers are; rebuilt only after a crash). The candidate
runs in that child process, which streams every op over a pipe before executing it: a candidate
that segfaults, aborts, is OOM-killed or hangs kills only the child, and the block returns the
``crash`` (detector, run, the ops so far) as plain data, like any other failure. Should the actor
itself die (Ray's memory monitor, a lost node: Ray reports the actor died), the driver still
names the run and its ops: the actor sends a checkpoint (run started, ops so far; at most
:data:`CHECKPOINT_SECONDS` old) to a small actor (the totals of the runs that block had passed
are lost with it; they are not failures), and a new actor takes the dead one's place.

Budget: each block gets what remains of ``seconds`` when it is handed out and starts no run
after it; a new (cold) actor gets no block with less time left than the longest start-up seen.
Blocks are sized from the rates measured to about :data:`TASK_SECONDS` of work, or the time
left if less.

Determinism: after a failure in run ``i`` no block at or past ``i`` is handed out (actors
running one are killed), and every run below ``i`` that a block cut by the deadline skipped is
run (without a time limit), so the lowest failing run is the one reported, as locally. That one
failure is shrunk once, on the driver, by replaying candidate traces in fresh local processes
(:func:`kvpool.testing.workers.report_failure`); a crash that does not reproduce there keeps its
original trace.

What the nodes need of the driver's machine (candidate files, SGLang's wheel) travels in the
job's runtime environment (:mod:`kvpool.testing.ray_ship`).

``ray`` is imported only when asked for, by :mod:`kvpool.testing.ray_connect`: its
:func:`connect` turns a missing package or an unreachable address into :class:`RayUnavailable`
(one line).
"""

from __future__ import annotations

import contextlib
import dataclasses
import math
import os
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from kvpool.testing.campaign import CampaignResult
from kvpool.testing.ray_connect import Connection, import_ray
from kvpool.testing.ray_ship import SHIPPED_PATH_VARIABLES, Shipment
from kvpool.testing.swarm import Op
from kvpool.testing.workers import CampaignSpec, Found, report_failure, run_block

Progress = Callable[[float, int], None]

FIRST_BLOCK = 8
"""Runs in each of the first blocks (before any rate is measured)."""

TASK_SECONDS = 30.0
"""Work a block is sized for once rates are known (or what is left of the campaign)."""

CHECKPOINT_SECONDS = 0.1
"""Most seconds between two checkpoints of a task's current run (its run number and ops)."""


# ---------------------------------------------------------------------------- task side
class Checkpoints:
    """An actor (``num_cpus=0``): each block's last checkpoint ``(run, ops so far)``."""

    def __init__(self) -> None:
        self.last: dict[int, tuple[int, list[Op]]] = {}

    def note(self, block: int, run: int, ops: list[Op]) -> None:
        self.last[block] = (run, ops)

    def get(self, block: int) -> tuple[int, list[Op]] | None:
        return self.last.get(block)


class _Checkpointer:
    """Keeps the current run's ops as the worker process announces them; a thread sends them
    to the :class:`Checkpoints` actor when they changed, every :data:`CHECKPOINT_SECONDS` (so
    the cost does not grow with the step rate, and ops announced that long before the Ray
    worker died are in its checkpoint)."""

    def __init__(self, checkpoints: Any, block: int) -> None:
        self.actor, self.block = checkpoints, block
        self.lock = threading.Lock()
        self.run: int | None = None
        self.ops: list[Op] = []
        self.dirty = False
        self.done = threading.Event()
        self.thread = threading.Thread(target=self._send_loop, daemon=True)
        self.thread.start()

    def observe(self, run: int, op: Op | None) -> None:
        with self.lock:
            if op is None:
                self.run, self.ops = run, []
            else:
                self.ops.append(op)
            self.dirty = True

    def _send_loop(self) -> None:
        while not self.done.wait(CHECKPOINT_SECONDS):
            with self.lock:
                if not self.dirty or self.run is None:
                    continue
                run, ops, self.dirty = self.run, list(self.ops), False
            self.actor.note.remote(self.block, run, ops)

    def stop(self) -> None:
        self.done.set()
        self.thread.join()


class BlockRunner:
    """A long-lived Ray actor (one CPU) that runs blocks of the campaign's runs on request.

    Its worker process is started by the first block and kept for the next ones (rebuilt only
    after a crash), so a block costs no process start-up, imports or implementation builds after
    the first: on a busy machine those dominated a short task. ``start_dir`` is where the actor
    started: the unpacked working directory of the campaign's runtime environment when one is
    shipped (:mod:`kvpool.testing.ray_ship`), so relative paths of the shipped files hold."""

    def __init__(self, spec: CampaignSpec, checkpoints: Any) -> None:
        self.start_dir = os.getcwd()
        env = tuple((key, os.path.join(self.start_dir, value) if key in SHIPPED_PATH_VARIABLES
                     else value) for key, value in spec.env)  # fmt: skip
        self.spec, self.checkpoints = dataclasses.replace(spec, env=env), checkpoints
        self.kept: list[Any] = []

    def run(
        self, block: int, first: int, end: int, seconds: float, step_timeout: float
    ) -> dict[str, Any]:
        """Runs ``first .. end - 1`` (until ``seconds`` have passed) in the kept worker
        process; the totals and the failures as plain data, and where they ran."""
        entered = time.monotonic()
        checkpoint = _Checkpointer(self.checkpoints, block)
        try:
            result, failures, done = run_block(self.spec, seconds, 1, step_timeout, None, first,
                                               end, checkpoint.observe,
                                               budget_includes_start_up=True,
                                               kept=self.kept)  # fmt: skip
        finally:
            checkpoint.stop()
        return {
            "first": first,
            "end": done,
            "seconds": result.seconds,
            "start_up": time.monotonic() - entered - result.seconds,
            "totals": _totals(result),
            "failures": {run: _plain(run, found) for run, found in failures.items()},
            "node": _node_id(),
        }

    def warm_up(self) -> str:
        """Start the kept worker process and wait until it has built both implementations
        (a block of no runs); the node this actor runs on."""
        run_block(self.spec, 0.0, 1, first_run=0, end_run=0, kept=self.kept)
        return _node_id()

    def close(self) -> None:
        """Stop the kept worker process (the driver calls it before letting the actor go)."""
        for worker in self.kept:
            worker.process.kill()
        self.kept.clear()


def _node_id() -> str:
    """The Ray node this actor runs on."""
    node: str = import_ray().get_runtime_context().get_node_id()
    return node


def _totals(result: CampaignResult) -> dict[str, Any]:
    return {
        "configurations": result.configurations,
        "steps": result.steps,
        "invariant_checks": result.invariant_checks,
        "page_sizes": dict(result.page_sizes),
        "coverage": dict(result.coverage),
    }


def _plain(run: int, found: Found) -> dict[str, Any]:
    """A failure as plain data: the detector, run, step, report text, config and the ops both
    as :class:`~kvpool.testing.swarm.Op` values and rendered."""
    detector, step, text, ops, config = found
    return {"run": run, "detector": detector, "step": step, "text": text, "config": config,
            "ops": list(ops), "rendered": [op.render() for op in ops]}  # fmt: skip


def _found(plain: dict[str, Any]) -> Found:
    return (plain["detector"], plain["step"], plain["text"], list(plain["ops"]), plain["config"])


# ---------------------------------------------------------------------------- driver side
@dataclass
class _Plan:
    """Which runs the driver handed out, ran, and must still run."""

    next_run: int = 0
    holes: list[tuple[int, int]] = field(default_factory=list)
    failures: dict[int, Found] = field(default_factory=dict)

    @property
    def stop_at(self) -> int | None:
        return min(self.failures) if self.failures else None

    def take_hole(self) -> tuple[int, int] | None:
        """A skipped range below the lowest failure (clamped to it), if any."""
        stop = self.stop_at
        if stop is None:
            return None
        while self.holes:
            first, end = self.holes.pop()
            if first < stop:
                return first, min(end, stop)
        return None


def _merge(result: CampaignResult, totals: dict[str, Any]) -> None:
    result.configurations += totals["configurations"]
    result.steps += totals["steps"]
    result.invariant_checks += totals["invariant_checks"]
    for name in ("page_sizes", "coverage"):
        mine = getattr(result, name)
        for key, n in totals[name].items():
            mine[key] = mine.get(key, 0) + n


@dataclass
class _Slot:
    """One :class:`BlockRunner` actor; ``warm`` once it finished a block (its worker process
    is running, so a block handed to it pays no start-up)."""

    actor: Any
    warm: bool = False


WARM_UP_TIMEOUT = 300.0
"""Most seconds to wait for the actors to build their workers before the clock starts."""

WARM_MINIMUM_SECONDS = 0.5
"""Least time left for which a block is still handed to a warm actor."""


def run_ray(
    spec: CampaignSpec,
    seconds: float,
    connection: Connection,
    step_timeout: float = 60.0,
    progress: Progress | None = None,
    max_runs: int | None = None,
    shrink_budget: float = 60.0,
    shipment: Shipment | None = None,
) -> tuple[CampaignResult, dict[str, Any]]:
    """The campaign of ``spec`` over the cluster of ``connection`` (see the module docstring):
    the merged result (its failure shrunk) and the report's ``ray`` section. ``shipment``: what
    the connection's job-level runtime environment carries to every node (the candidates'
    files and SGLang's sources: :func:`kvpool.testing.ray_ship.stage`); its spec, whose paths
    are relative to the shipped folder, is the one the actors run."""
    ray = import_ray()
    options: dict[str, Any] = {"scheduling_strategy": "SPREAD"}
    runner = ray.remote(num_cpus=1, max_restarts=0, max_task_retries=0)(BlockRunner)
    remote_spec = shipment.spec if shipment is not None else spec
    checkpoints = ray.remote(num_cpus=0)(Checkpoints).remote()
    ray.get(checkpoints.get.remote(-1))  # alive: calls to an actor not yet started are queued
    # in the caller, and a Ray worker that dies would lose its checkpoints with them
    result = CampaignResult(seed=spec.seed, seconds=0.0, component=spec.component,
                            workers=connection.cpus)  # fmt: skip
    plan = _Plan()
    idle: list[_Slot] = []
    pending: dict[Any, tuple[_Slot, int, int, int]] = {}  # ref -> (slot, block, first, end)
    cancelled: set[Any] = set()
    nodes: set[str] = set()
    rates, blocks, actors = _Rates(), 0, connection.cpus
    # every actor builds its worker before the clock starts, as the local campaign's workers
    # do (kvpool.testing.workers.run_block): start-up does not eat the campaign's budget
    idle = [_Slot(runner.options(**options).remote(remote_spec, checkpoints))
            for _ in range(connection.cpus)]  # fmt: skip
    warming = {slot.actor.warm_up.remote(): slot for slot in idle}
    ready, _ = ray.wait(list(warming), num_returns=len(warming), timeout=WARM_UP_TIMEOUT)
    for ref in ready:
        with contextlib.suppress(ray.exceptions.RayError):  # a broken actor: its first block
            nodes.add(ray.get(ref))  # reports it
            warming[ref].warm = True
    start = time.monotonic()
    deadline = start + seconds
    try:
        while True:
            while len(pending) < connection.cpus:
                if not idle:
                    idle.append(_Slot(runner.options(**options).remote(remote_spec, checkpoints)))
                    actors += 1
                slot = idle[-1]
                hole = plan.take_hole()
                left = deadline - time.monotonic()
                needed = WARM_MINIMUM_SECONDS if slot.warm else rates.start_up
                if hole is not None:  # runs below a failure: always, without a time limit
                    first, end, budget = hole[0], hole[1], math.inf
                elif left > needed and (max_runs is None or plan.next_run < max_runs):
                    first, end, budget = plan.next_run, plan.next_run + rates.block(left), left
                    if max_runs is not None:
                        end = min(end, max_runs)
                    if plan.stop_at is not None:
                        end = min(end, plan.stop_at)
                    if end <= first:
                        break
                    plan.next_run = end
                else:
                    break
                idle.pop()
                ref = slot.actor.run.remote(blocks, first, end, budget, step_timeout)
                pending[ref] = (slot, blocks, first, end)
                blocks += 1
            if not pending:
                break
            ready, _ = ray.wait(list(pending), num_returns=1, timeout=1.0)
            for ref in ready:
                slot, block, first, end = pending.pop(ref)
                if ref in cancelled:  # a block above a failure: its runs do not count
                    continue
                done = _collect(ray, ref, block, first, checkpoints, result, plan, rates, nodes)
                if done is None:  # its actor died: the slot is gone
                    continue
                if done < end:
                    plan.holes.append((done, end))
                slot.warm = True
                idle.append(slot)
            stop = plan.stop_at
            for ref, (slot, _, first, _) in pending.items():
                if stop is not None and first >= stop and ref not in cancelled:
                    ray.kill(slot.actor)  # its worker process sees the pipe close and stops
                    cancelled.add(ref)
            if progress is not None:
                progress(time.monotonic() - start, result.steps)
    finally:  # an internal error too: nothing of this campaign keeps running
        slots = idle + [slot for ref, (slot, *_) in pending.items() if ref not in cancelled]
        with contextlib.suppress(Exception):
            ray.get([slot.actor.close.remote() for slot in idle], timeout=10)
        for slot in slots:
            ray.kill(slot.actor)
        ray.kill(checkpoints)
    result.seconds = time.monotonic() - start
    if plan.failures:
        run = min(plan.failures)
        report_failure(result, spec, run, plan.failures[run], step_timeout, shrink_budget)
    shipped = list(shipment.shipped) if shipment is not None else []
    return result, {"address": connection.address, "tasks": blocks, "cpus": connection.cpus,
                    "actors": actors, "nodes": len(nodes), "shipped": shipped}  # fmt: skip


def _collect(
    ray: Any,
    ref: Any,
    block: int,
    first: int,
    checkpoints: Any,
    result: CampaignResult,
    plan: _Plan,
    rates: _Rates,
    nodes: set[str],
) -> int | None:
    """Fold one finished block into ``result`` and ``plan``: the first run it did not run, or
    None when its actor died (the failure then is the run of its last checkpoint)."""
    try:
        out = ray.get(ref)
    except ray.exceptions.RayTaskError:
        raise  # an exception in kvpool's actor code (kvpool missing on a node...): internal
    except ray.exceptions.RayError as exc:  # the actor's process died: its last checkpoint
        last: tuple[int, list[Op]] | None = ray.get(checkpoints.get.remote(block))
        run, ops = last if last is not None else (first, [])
        first_line = (str(exc).strip().splitlines() or [""])[0]
        why = f"the Ray worker running it died ({type(exc).__name__}: {first_line})"
        plan.failures[run] = ("crash", len(ops), why, ops, {})
        result.steps += len(ops)
        return None
    _merge(result, out["totals"])
    rates.add(out["totals"]["configurations"], out["seconds"], out["start_up"])
    nodes.add(out["node"])
    for run, plain in out["failures"].items():
        plan.failures[int(run)] = _found(plain)
    end: int = out["end"]
    return end


@dataclass
class _Rates:
    """What finished tasks measured: runs per second of one task, and its start-up."""

    runs: int = 0
    seconds: float = 0.0
    start_up: float = 0.0
    """The longest start-up seen (a new block needs more time left than that)."""

    def add(self, runs: int, seconds: float, start_up: float) -> None:
        self.runs += runs
        self.seconds += seconds
        self.start_up = max(self.start_up, start_up)

    def block(self, left: float) -> int:
        """Runs for about :data:`TASK_SECONDS` of one task's work, or the ``left`` seconds
        of the campaign if fewer (:data:`FIRST_BLOCK` until a rate is known)."""
        if self.runs == 0 or self.seconds <= 0:
            return FIRST_BLOCK
        per_second = self.runs / self.seconds
        return max(FIRST_BLOCK, min(math.ceil(per_second * min(TASK_SECONDS, left)), 100_000))


__all__ = ["BlockRunner", "Checkpoints", "run_ray"]
