"""Calls made in a forked child process, so that a call that kills its process is an answer.

Compiled code under test (SGLang 0.5.23's Rust tree core, a candidate's CUDA extension) can end
its process with a signal, leaving no Python exception to report and no process to go on in. A
campaign that meets such a death must still shrink the input that caused it, which means
playing that input, and smaller ones, many times over. A :class:`Sandbox` makes each of those
plays cheap and survivable: it spawns one fresh interpreter (the *zygote*: nothing run in it
yet, one torch thread), which imports and warms what the calls need once and then forks a
child for every call. The child makes the call, pipes the pickled result back and exits; a
child killed by a signal, or exiting without a result, gives :class:`Died` instead, and so does
one that gives no answer within the call's timeout (the zygote kills it: a hang in compiled
code is a finding too). A call may name a file the child writes as it goes (an op log): its
timeout then counts from the file's last change, so a long call that keeps making progress is
not a hang. A fork of the warm zygote costs tens of milliseconds, against seconds for a fresh
interpreter.

Only POSIX systems fork; the zygote is spawned, never forked from the caller (whose threads,
such as a ``multiprocessing`` queue's feeder, a forked child would inherit half-held).
"""

from __future__ import annotations

import contextlib
import multiprocessing as mp
import os
import pickle
import select
import signal
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from kvpool.testing.op_log import log_mark


@dataclass(frozen=True)
class Died:
    """A child that ended without a result: ``code`` is its exit status as ``multiprocessing``
    reports it (minus the signal number when a signal killed it); ``hung_after`` (seconds),
    when the sandbox killed it for giving no answer within the call's timeout."""

    code: int
    hung_after: float | None = None

    def __str__(self) -> str:
        if self.hung_after is not None:
            return f"hung: no answer within {self.hung_after:g} s"
        return describe_exit(self.code)


def describe_exit(code: int | None) -> str:
    """How a process ended, from its exit status (``Process.exitcode``'s convention)."""
    if code is not None and code < 0:
        try:
            return f"killed by signal {signal.Signals(-code).name}"
        except ValueError:
            return f"killed by signal {-code}"
    return f"exited with code {code}"


WATCH_POLL_S = 0.25
"""With a watched file: how often the zygote looks at it while the child is silent (seconds)."""


def _in_child(
    fn: Callable[[Any], Any], arg: Any, timeout: float | None, watch: str | None = None
) -> Any:
    """``fn(arg)`` in a forked child: its result, or :class:`Died` (killed when it gives no
    answer within ``timeout`` seconds, counted from the last change of the file at ``watch``
    when one is named; None: no limit). An exception ``fn`` raises is a result (re-raised by
    :meth:`Sandbox.call` as text)."""
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: answer, then leave without running the zygote's exit handlers
        os.close(read)
        try:
            try:
                payload = pickle.dumps(("ok", fn(arg)))
            except BaseException as exc:
                payload = pickle.dumps(("raised", f"{type(exc).__name__}: {exc}"))
            with os.fdopen(write, "wb") as out:
                out.write(payload)
        finally:
            os._exit(0)
    os.close(write)
    deadline = None if timeout is None else time.monotonic() + timeout
    seen = None if watch is None else log_mark(watch)
    chunks: list[bytes] = []
    with os.fdopen(read, "rb", buffering=0) as source:
        while True:
            left = None if deadline is None else max(deadline - time.monotonic(), 0.0)
            if watch is not None and left is not None:
                left = min(left, WATCH_POLL_S)
            if not select.select([source], [], [], left)[0]:
                mark = None if watch is None else log_mark(watch)
                if timeout is not None and mark != seen:  # the child went on: not hung
                    seen, deadline = mark, time.monotonic() + timeout
                    continue
                if deadline is not None and time.monotonic() < deadline:
                    continue
                os.kill(pid, signal.SIGKILL)  # no answer in time: hung
                os.waitpid(pid, 0)
                return Died(-signal.SIGKILL, timeout)
            chunk = source.read(1 << 16)
            if not chunk:
                break
            chunks.append(chunk)
    _, status = os.waitpid(pid, 0)
    code = os.waitstatus_to_exitcode(status)
    if not chunks or code != 0:  # a death after a full answer still counts as a death
        return Died(code if code != 0 else 1)
    return pickle.loads(b"".join(chunks))


def _zygote(
    conn: Any,
    fn: Callable[[Any], Any],
    warm: Callable[[Any], None] | None,
    env: tuple[tuple[str, str], ...],
) -> None:
    """The zygote's loop: for each argument received, warm it once in this process (an
    exception there is left for the child to meet), then answer it from a forked child; None
    ends the loop. ``env`` is set first, before anything imports torch (which takes its
    number of threads from ``OMP_NUM_THREADS`` when it loads)."""
    os.environ["OMP_NUM_THREADS"] = "1"  # no thread pool for a child to inherit half-held
    for name, value in env:
        os.environ[name] = value
    threads = os.environ["OMP_NUM_THREADS"]
    wanted = int(threads) if threads.isdigit() and int(threads) > 0 else 1
    warmed: set[Any] = set()
    while True:
        message = conn.recv()
        if message is None:
            return
        arg, timeout, watch = message
        key = getattr(arg, "warm_key", None)
        if warm is not None and key not in warmed:
            warmed.add(key)
            # an exception here is left for the child's call, which meets it again
            with contextlib.suppress(Exception):
                warm(arg)
        loaded = sys.modules.get("torch")  # loaded before the environment was set: unpickling
        if loaded is not None and loaded.get_num_threads() != wanted:  # ``fn`` imported it
            loaded.set_num_threads(wanted)
        conn.send(_in_child(fn, arg, timeout, watch))


class SandboxError(RuntimeError):
    """The zygote itself died or the called function raised (its message says which)."""


class Sandbox:
    """``fn(arg)`` answered in a forked child of one spawned zygote process.

    ``fn`` and ``warm`` must be picklable (module-level functions), and so must every argument
    and result. ``warm(arg)``, when given, runs in the zygote once per distinct
    ``arg.warm_key`` (an argument without one: once for all), before the first child for it is
    forked: loading a release there means every child starts with it loaded. ``env``: variables
    set in the zygote before anything is imported (``OMP_NUM_THREADS`` is 1 unless it says
    otherwise, so torch, once loaded, has one thread). Use as a context manager; :meth:`close`
    ends the zygote."""

    def __init__(
        self,
        fn: Callable[[Any], Any],
        warm: Callable[[Any], None] | None = None,
        env: tuple[tuple[str, str], ...] = (),
    ) -> None:
        ctx = mp.get_context("spawn")
        self._conn, theirs = ctx.Pipe()
        self._process = ctx.Process(target=_zygote, args=(theirs, fn, warm, env), daemon=True)
        self._process.start()
        theirs.close()

    def call(self, arg: Any, timeout: float | None = None, watch: str | None = None) -> Any:
        """``fn(arg)``'s result, or :class:`Died` when the child that made the call died or
        gave no answer within ``timeout`` seconds (None: no limit), counted from the last
        change of the file at ``watch`` when one is named (a child that writes its progress
        there is hung only when it stops writing). Raises :class:`SandboxError` when ``fn``
        raised or the zygote died."""
        try:
            self._conn.send((arg, timeout, watch))
            answer = self._conn.recv()
        except (EOFError, OSError):
            self._process.join(5)
            raise SandboxError(
                f"the sandbox's zygote {describe_exit(self._process.exitcode)}"
            ) from None
        if isinstance(answer, Died):
            return answer
        kind, value = answer
        if kind == "raised":
            raise SandboxError(f"the sandboxed call raised {value}")
        return value

    def close(self) -> None:
        """End the zygote (it finishes the call in hand first)."""
        if self._process.is_alive():
            with contextlib.suppress(OSError):  # the zygote is already gone
                self._conn.send(None)
            self._process.join(10)
            if self._process.is_alive():
                self._process.kill()
        self._conn.close()

    def __enter__(self) -> Sandbox:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


__all__ = ["Died", "Sandbox", "SandboxError", "describe_exit"]
