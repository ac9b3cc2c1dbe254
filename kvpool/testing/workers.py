"""Crash-proof campaigns: lockstep runs in worker processes (``kvpool verify --workers N``).

Each worker process rebuilds both implementations from their spec strings
(:func:`kvpool.testing.implementations.resolve_implementation`) and executes the runs the
parent hands it (:func:`kvpool.testing.runs.execute`), recording every operation in its op log
(:mod:`kvpool.testing.op_log`) BEFORE executing it. So when a candidate kills its process (a
segfault in a kernel, an abort, the OOM killer) or hangs (neither a message nor a new op within
``step_timeout`` seconds), the parent reads the trace so far from the log and reports a failure
with detector ``crash`` naming the signal or the timeout.

Determinism: runs are handed out in order; after a failure in run ``i`` no new run starts, the
runs before ``i`` still running are finished, and the failure of the lowest run number is the
one reported. Shrinking replays candidate op lists in a :class:`~kvpool.testing.sandbox.Sandbox`:
one process imports both implementations once and forks a child for every replay, so a replay
that kills its process (which counts as reproducing a crash) costs a fork, not a fresh
interpreter; a replay that writes no new op to its log within ``step_timeout`` is hung.
"""

from __future__ import annotations

import contextlib
import logging
import multiprocessing as mp
import os
import time
from collections import Counter
from collections.abc import Callable, Iterator, Sequence
from dataclasses import asdict, dataclass, field
from multiprocessing.connection import Connection, wait
from typing import Any

from kvpool.testing.bundle import Implementation
from kvpool.testing.campaign import CampaignFailure, CampaignResult, quiet_collector
from kvpool.testing.op_log import OpLogWriter, log_mark, new_log, read_ops, remove_log
from kvpool.testing.runs import shrink_ops
from kvpool.testing.sandbox import Died, Sandbox, SandboxError, describe_exit
from kvpool.testing.swarm import Op

Progress = Callable[[float, int], None]


@dataclass(frozen=True)
class CampaignSpec:
    """Everything a worker needs to rebuild the campaign's sides (plain, picklable data)."""

    component: str
    impl_a: str
    impl_b: str
    seed: int
    steps_per_run: int
    labels: tuple[str, str]
    env: tuple[tuple[str, str], ...] = ()
    """Environment set in the worker before anything is imported (``TRITON_INTERPRET``...)."""


# ---------------------------------------------------------------------------- worker side
def _worker_main(conn: Connection, spec: CampaignSpec, log: str) -> None:
    """Serve ``("run", i)`` requests until ``("stop",)``, each op recorded in the op log at
    path ``log`` before it executes.

    Torch (imported later, by the implementations) gets ONE intra-op thread unless
    ``spec.env`` says otherwise: the workers are the campaign's parallelism, one per core, and
    a second OpenMP pool in each only contends for the same cores (a candidate that does not
    set it itself, SGLang's classes among them, ran several times slower on two workers)."""
    os.environ["OMP_NUM_THREADS"] = "1"
    for key, value in spec.env:
        os.environ[key] = value
    with _kernels_as_asked():
        _serve(conn, spec, log)


def _kernels_as_asked() -> contextlib.AbstractContextManager[object]:
    """The checked interpreter when the environment asks for it (``--checked``:
    ``KVPOOL_CHECKED_INTERPRETER=1``), else nothing."""
    if os.environ.get("KVPOOL_CHECKED_INTERPRETER") != "1":
        return contextlib.nullcontext()
    from kvpool.testing.kernel_harness.interpreter import checked_interpreter

    return checked_interpreter()


LOG_TAG = "log:"
"""Prefix of the coverage tags that count the log records a worker's implementations emitted
(:class:`LogCounts`)."""


class LogCounts(logging.Handler):
    """Counts the log records of the libraries a worker runs (SGLang's own warnings, a plug-in's)
    by level, logger and message, instead of letting Python's last-resort handler print them
    between a campaign's lines: a run reports them as coverage tags ``log:LEVEL LOGGER: MESSAGE``
    (the logger's last dotted part, the message's unformatted first line, at most 100
    characters), which ``kvpool verify`` lists with their counts. Installed on the root logger
    (:func:`counted_logs`) beside any handler already there, which keeps working."""

    def __init__(self) -> None:
        super().__init__(logging.DEBUG)
        self.counts: Counter[str] = Counter()

    def emit(self, record: logging.LogRecord) -> None:
        text = str(record.msg).strip()
        first = text.splitlines()[0][:100] if text else ""
        where = record.name.rsplit(".", 1)[-1]
        self.counts[f"{LOG_TAG}{record.levelname} {where}: {first}"] += 1

    def taken(self) -> dict[str, int]:
        """The counts since the last call (then cleared)."""
        out = dict(self.counts)
        self.counts.clear()
        return out


@contextlib.contextmanager
def counted_logs() -> Iterator[LogCounts]:
    """A :class:`LogCounts` on the root logger while inside (an in-process campaign's: the
    caller's own handlers stay; with none, nothing is printed), removed on leaving."""
    logs = LogCounts()
    root = logging.getLogger()
    root.addHandler(logs)
    try:
        yield logs
    finally:
        root.removeHandler(logs)


def _serve(conn: Connection, spec: CampaignSpec, log: str) -> None:
    from kvpool.testing.implementations import resolve_implementation

    with counted_logs() as logs:  # before the implementations load and log anything
        impl_a = resolve_implementation(spec.impl_a, spec.component)
        impl_b = resolve_implementation(spec.impl_b, spec.component)
        writer = OpLogWriter(log)
        conn.send(("ready",))
        logs.taken()  # what loading logged belongs to no run
        with quiet_collector():
            _serve_runs(conn, spec, impl_a, impl_b, writer, logs)


def _serve_runs(
    conn: Connection,
    spec: CampaignSpec,
    impl_a: Implementation,
    impl_b: Implementation,
    writer: OpLogWriter,
    logs: LogCounts,
) -> None:
    from kvpool.testing.runs import execute, run_config

    while True:
        request = conn.recv()
        if request[0] == "stop":
            return
        run = request[1]
        chooser, config = run_config(spec.component, impl_b, spec.seed, run)
        writer.start(run)
        conn.send(("start", run, asdict(config)))
        done = execute(spec.component, impl_a, impl_b, config, chooser=chooser,
                       steps=spec.steps_per_run, labels=spec.labels,
                       on_op=writer.append)  # fmt: skip
        failure = None
        if done.failure is not None:
            f = done.failure
            failure = (f.detector, f.step, str(f))
        # (the config went with "start": the parent keeps it for the run)
        tags = dict(done.coverage)
        tags.update(logs.taken())
        conn.send(("done", run, done.steps, done.checks, tags, failure))


# ---------------------------------------------------------------------------- replays
@dataclass(frozen=True)
class _Replay:
    """One replay of run ``run`` of ``spec``'s campaign with ``ops``, as a sandbox call; each
    op is written to the op log at ``log`` before it executes (the sandbox's sign of
    progress)."""

    spec: CampaignSpec
    run: int
    ops: tuple[Op, ...]
    log: str

    @property
    def warm_key(self) -> CampaignSpec:
        return self.spec


_SIDES: dict[CampaignSpec, tuple[Implementation, Implementation]] = {}
"""Both implementations of each spec this process resolved (the sandbox's zygote resolves
them once; its children inherit them)."""


def _sides(spec: CampaignSpec) -> tuple[Implementation, Implementation]:
    if spec not in _SIDES:
        from kvpool.testing.implementations import resolve_implementation

        _SIDES[spec] = (resolve_implementation(spec.impl_a, spec.component),
                        resolve_implementation(spec.impl_b, spec.component))  # fmt: skip
    return _SIDES[spec]


def _warm_replays(replay: _Replay) -> None:
    """In the zygote: import and resolve both sides (a crash here is the child's to meet);
    the libraries' log records are counted and dropped, as in a campaign's worker."""
    logging.getLogger().addHandler(LogCounts())
    _sides(replay.spec)


def _replay_in_child(replay: _Replay) -> tuple[str, int, str] | None:
    """In a forked child: the replay's failure, ``(detector, step, report)``, or None."""
    from kvpool.testing.runs import execute, run_config

    impl_a, impl_b = _sides(replay.spec)
    spec = replay.spec
    chooser, config = run_config(spec.component, impl_b, spec.seed, replay.run)
    writer = OpLogWriter(replay.log)
    writer.start(replay.run)
    with _kernels_as_asked():
        done = execute(spec.component, impl_a, impl_b, config, chooser=chooser,
                       steps=spec.steps_per_run, ops=list(replay.ops), labels=spec.labels,
                       on_op=writer.append)  # fmt: skip
    if done.failure is None:
        return None
    return (done.failure.detector, done.failure.step, str(done.failure))


# ---------------------------------------------------------------------------- parent side
@dataclass
class _Worker:
    process: Any
    conn: Connection
    log: str
    """The worker's op log (:mod:`kvpool.testing.op_log`)."""
    run: int | None = None
    last_seen: float = 0.0
    mark: tuple[int, int] = (0, 0)
    """The log's :func:`~kvpool.testing.op_log.log_mark` when last looked at."""
    observed: int = 0
    """Ops of the current run an observer has seen."""
    config: dict[str, Any] = field(default_factory=dict)

    def ops(self) -> list[Op]:
        """The ops of the current run the worker has announced (read from its log)."""
        return read_ops(self.log, self.run) if self.run is not None else []

    def progressed(self, now: float) -> bool:
        """Whether the worker announced an op since the last look (then ``last_seen = now``)."""
        mark = log_mark(self.log)
        if mark == self.mark:
            return False
        self.mark, self.last_seen = mark, now
        return True


def _start(spec: CampaignSpec) -> _Worker:
    ctx = mp.get_context("spawn")
    parent, child = ctx.Pipe()
    log = new_log()
    proc = ctx.Process(target=_worker_main, args=(child, spec, log), daemon=True)
    proc.start()
    child.close()
    return _Worker(proc, parent, log, last_seen=time.monotonic())


def _death(worker: _Worker) -> str:
    """How a worker ended: the signal that killed it, or its exit code."""
    worker.process.join(5)
    return describe_exit(worker.process.exitcode)


def _stop(worker: _Worker) -> None:
    if worker.process.is_alive():
        worker.process.kill()
    worker.process.join(5)
    worker.conn.close()
    remove_log(worker.log)


def _crash_text(spec: CampaignSpec, run: int, ops: Sequence[Op], why: str) -> str:
    lines = [f"=== kvpool lockstep failure: crash ({spec.component}) ==="]
    lines.append(f"minimal trace ({len(ops)} steps):")
    lines += [f"  step {i}: {op.render()}" for i, op in enumerate(ops, 1)]
    where = f"during step {len(ops)}" if ops else "before the first step"
    lines.append(f"failed {where}: the worker process {why} (run {run}, seed {spec.seed})")
    return "\n".join(lines)


class Replayer:
    """Replays op lists of run ``run`` of ``spec``'s campaign, each in a forked child of one
    :class:`~kvpool.testing.sandbox.Sandbox` (started at the first replay, with ``spec.env``
    set before anything is imported): a replay is ``(detector, failing step)`` or None, and
    one whose child dies, or writes no new op to its log for ``step_timeout`` seconds, is a
    ``crash`` (its report in :attr:`last_text`)."""

    def __init__(self, spec: CampaignSpec, run: int, step_timeout: float) -> None:
        self.spec, self.run, self.timeout = spec, run, step_timeout
        self.sandbox: Sandbox | None = None
        self.log = ""
        self.last_text = ""

    def __call__(self, ops: Sequence[Op]) -> tuple[str, int] | None:
        if self.sandbox is None:
            self.sandbox = Sandbox(_replay_in_child, _warm_replays, self.spec.env)
            self.log = new_log()
        try:
            answer = self.sandbox.call(_Replay(self.spec, self.run, tuple(ops), self.log),
                                       self.timeout, watch=self.log)  # fmt: skip
        except SandboxError as exc:  # the zygote died (an import that kills) or the call raised
            self.close()
            self.last_text = _crash_text(self.spec, self.run, ops, str(exc))
            return ("crash", len(ops))
        if isinstance(answer, Died):
            why = "hung (step timeout)" if answer.hung_after is not None else str(answer)
            self.last_text = _crash_text(self.spec, self.run, ops, why)
            return ("crash", len(ops))
        if answer is None:
            return None
        detector, step, self.last_text = answer
        return (detector, step)

    def close(self) -> None:
        if self.sandbox is not None:
            self.sandbox.close()
            self.sandbox = None
            remove_log(self.log)


def run_parallel(
    spec: CampaignSpec,
    seconds: float,
    workers: int,
    step_timeout: float = 60.0,
    progress: Progress | None = None,
    max_runs: int | None = None,
    shrink_budget: float = 60.0,
) -> CampaignResult:
    """The campaign of ``spec`` over ``workers`` processes (see the module docstring)."""
    result, failures, _ = run_block(spec, seconds, workers, step_timeout, progress, 0, max_runs)
    if failures:
        run = min(failures)
        report_failure(result, spec, run, failures[run], step_timeout, shrink_budget)
    return result


Found = tuple[str, int, str, list[Op], dict[str, Any]]
"""A failure before shrinking: (detector, failing step, report text, ops so far, config)."""

Observer = Callable[[int, "Op | None"], None]
"""Sees ``(run, None)`` when a run starts and ``(run, op)`` for each op a worker announces."""


def run_block(
    spec: CampaignSpec,
    seconds: float,
    workers: int,
    step_timeout: float = 60.0,
    progress: Progress | None = None,
    first_run: int = 0,
    end_run: int | None = None,
    observe: Observer | None = None,
    budget_includes_start_up: bool = False,
    kept: list[_Worker] | None = None,
) -> tuple[CampaignResult, dict[int, Found], int]:
    """Runs ``first_run``, ``first_run + 1``, ... (before ``end_run``; None: no bound) of
    ``spec``'s campaign over ``workers`` processes until ``seconds`` have passed (counted once
    every worker is ready) or a run fails: the totals, every failure found (by run number, NOT
    shrunk) and the first run not started. Runs are handed out in order and every started run
    ends (passes, fails or crashes), so exactly the runs ``first_run`` ... ``end - 1`` ran.
    ``budget_includes_start_up``: ``seconds`` counts from this call, not from ready workers
    (a slice of a larger campaign's budget, as in :mod:`kvpool.testing.ray_campaign`).
    ``kept``: worker processes that outlive the call (a long-lived Ray actor's): started into
    the list when it has fewer than ``workers``, left running at the end (a worker that died
    or hung is removed from it), stopped only when the call raises."""
    max_runs = end_run
    result = CampaignResult(seed=spec.seed, seconds=0.0, component=spec.component,
                            workers=workers)  # fmt: skip
    called = time.monotonic()
    pool = kept if kept is not None else []
    fresh = [_start(spec) for _ in range(max(workers, 1) - len(pool))]
    pool += fresh
    _await_ready(fresh, spec)
    start = time.monotonic()
    if budget_includes_start_up:
        seconds -= start - called
    next_run = first_run
    failures: dict[int, Found] = {}
    stop_at: int | None = None  # no run at or past this number starts
    try:
        while pool:
            for w in pool:
                if w.run is None and w.process.is_alive():
                    in_time = time.monotonic() - start < seconds
                    allowed = (max_runs is None or next_run < max_runs) and (
                        stop_at is None or next_run < stop_at
                    )
                    if in_time and allowed:
                        w.run, w.observed, w.last_seen = next_run, 0, time.monotonic()
                        w.conn.send(("run", next_run))
                        if observe is not None:
                            observe(next_run, None)
                        next_run += 1
            busy = [w for w in pool if w.run is not None]
            if not busy:
                break
            # Messages come at the start and end of a run only (ops go to the log): the
            # timeout is how often a silent worker's log is looked at.
            ready = wait([w.conn for w in busy], timeout=1.0 if observe is None else OBSERVE_S)
            now = time.monotonic()
            for w in busy:
                run = w.run
                assert run is not None
                if w.conn not in ready:
                    if w.progressed(now):
                        if observe is not None:
                            _observe_new(w, run, observe)
                    elif now - w.last_seen > step_timeout:
                        why = f"hung: no progress for {step_timeout:g} s (step timeout)"
                        ops = w.ops()
                        failures[run] = ("crash", len(ops), why, ops, w.config)
                        result.steps += len(ops)
                        _stop(w)
                        pool.remove(w)
                        stop_at = min(stop_at or run + 1, run + 1)
                    continue
                try:
                    msg = w.conn.recv()
                except (EOFError, OSError):
                    ops = w.ops()
                    failures[run] = ("crash", len(ops), _death(w), ops, w.config)
                    result.steps += len(ops)
                    _stop(w)
                    pool.remove(w)
                    stop_at = min(stop_at or run + 1, run + 1)
                    continue
                w.last_seen = now
                if msg[0] == "start":
                    w.config = msg[2]
                elif msg[0] == "done":
                    _, _, steps, checks, tags, failure = msg
                    config = w.config
                    result.add_run(config["page_size"], steps, checks, tags)
                    if observe is not None:
                        _observe_new(w, run, observe)
                    if failure is not None:
                        failures[run] = (failure[0], failure[1], failure[2], w.ops(), config)
                        stop_at = min(stop_at or run + 1, run + 1)
                    w.run = None
                    if progress is not None:
                        progress(time.monotonic() - start, result.steps)
            if not pool and stop_at is None and time.monotonic() - start < seconds:
                pool.append(_start(spec))  # every worker died without a failure: go on
    except BaseException:  # (KeyboardInterrupt: a cancelled Ray task) nothing keeps running
        for w in pool:
            _stop(w)
        pool.clear()
        raise
    if kept is None:
        for w in pool:
            _stop(w)
    result.seconds = time.monotonic() - start
    return result, failures, next_run


OBSERVE_S = 0.1
"""With an observer: the longest an op waits in the log before the observer sees it."""


def _observe_new(w: _Worker, run: int, observe: Observer) -> None:
    """Show ``observe`` the ops of ``w``'s run it has not seen."""
    ops = w.ops()
    for op in ops[w.observed :]:
        observe(run, op)
    w.observed = max(w.observed, len(ops))


def _await_ready(pool: list[_Worker], spec: CampaignSpec, timeout: float = 300.0) -> None:
    """Wait until every worker has built its implementations (imports can take seconds), so
    that start-up does not eat the campaign's budget. A worker that dies meanwhile stays in the
    pool: the campaign loop reports it when it hands that worker its first run."""
    waiting = list(pool)
    deadline = time.monotonic() + timeout
    while waiting and time.monotonic() < deadline:
        for ready in wait([w.conn for w in waiting], timeout=1.0):
            w = next(w for w in waiting if w.conn is ready)
            waiting.remove(w)
            with contextlib.suppress(EOFError, OSError):
                w.conn.recv()


def report_failure(
    result: CampaignResult,
    spec: CampaignSpec,
    run: int,
    found: Found,
    step_timeout: float,
    shrink_budget: float,
) -> None:
    """Shrink the failure of ``run`` in fresh processes and record it on ``result``."""
    detector, step, text, ops, config = found
    ops = ops[:step] if step else ops
    replayer = Replayer(spec, run, step_timeout)
    try:
        best = shrink_ops(replayer, ops, detector, budget_s=shrink_budget)
        again = replayer(best)
        if again is not None and again[0] == detector:
            text = replayer.last_text
        else:
            best = ops
        if detector == "crash" and not text.startswith("==="):
            text = _crash_text(spec, run, best, text)
    finally:
        replayer.close()
    result.failures = 1
    result.failure = CampaignFailure(run, config, detector, len(ops),
                                     [op.render() for op in best], text)  # fmt: skip


__all__ = ["LOG_TAG", "CampaignSpec", "Found", "LogCounts", "Observer", "Replayer",
           "counted_logs", "report_failure", "run_block", "run_parallel"]  # fmt: skip
