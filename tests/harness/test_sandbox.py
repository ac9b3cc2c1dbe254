"""``kvpool.testing.sandbox``: calls answered in forked children of one zygote, a death or a
hang past the call's timeout an answer (``Died``), an exception the caller's error, the zygote
warmed once per key, its environment set before anything loads, a call that keeps writing its
watched file not hung."""

from __future__ import annotations

import os
import signal
import time
from dataclasses import dataclass
from pathlib import Path

import pytest

from kvpool.testing.sandbox import Died, Sandbox, SandboxError, describe_exit

WARMED: list[str] = []
"""What the zygote warmed (each child inherits the list as it was when it was forked)."""


@dataclass(frozen=True)
class Call:
    what: str
    warm_key: str = "a"
    path: str = ""


def _answer(call: Call) -> object:
    if call.what == "segv":
        os.kill(os.getpid(), signal.SIGSEGV)
    if call.what == "exit":
        os._exit(3)
    if call.what == "hang":
        time.sleep(3600)
    if call.what == "raise":
        raise KeyError("no such thing")
    if call.what in ("writes", "writes-then-stops"):  # 2 s of progress, a write each 0.1 s
        for i in range(20):
            with open(call.path, "a") as f:
                f.write(f"{i}\n")
            time.sleep(0.1)
        if call.what == "writes-then-stops":
            time.sleep(3600)
        return "done"
    if call.what == "env":
        import torch

        return (os.environ.get("KVPOOL_SANDBOX_TEST"), torch.get_num_threads())
    if call.what == "zygote":
        os.kill(os.getppid(), signal.SIGKILL)  # the zygote, whose child this is
        return None
    return (call.what, os.getpid(), list(WARMED))


def _warm(call: Call) -> None:
    WARMED.append(call.warm_key)


def test_a_sandbox_answers_survives_deaths_and_warms_once_per_key() -> None:
    with Sandbox(_answer, _warm) as sandbox:
        what, first_pid, warmed = sandbox.call(Call("hello"))
        assert (what, warmed) == ("hello", ["a"])
        assert sandbox.call(Call("segv")) == Died(-signal.SIGSEGV)
        assert str(sandbox.call(Call("segv"))) == "killed by signal SIGSEGV"
        assert sandbox.call(Call("exit")) == Died(3)
        hung = sandbox.call(Call("hang"), timeout=0.5)
        assert hung == Died(-signal.SIGKILL, 0.5) and str(hung) == "hung: no answer within 0.5 s"
        assert sandbox.call(Call("quick"), timeout=30.0)[0] == "quick"  # in time: an answer
        with pytest.raises(SandboxError, match="raised KeyError: 'no such thing'"):
            sandbox.call(Call("raise"))
        # every call in a child of its own, the zygote warmed once per key, still alive
        what, second_pid, warmed = sandbox.call(Call("again", "b"))
        assert second_pid != first_pid and warmed == ["a", "b"]
        with pytest.raises(SandboxError, match="zygote killed by signal SIGKILL"):
            sandbox.call(Call("zygote"))
    assert os.getpid() not in (first_pid, second_pid)


def test_exit_statuses_read_as_words() -> None:
    assert describe_exit(-9) == "killed by signal SIGKILL"
    assert describe_exit(-200) == "killed by signal 200"
    assert describe_exit(2) == "exited with code 2"


def test_a_call_that_keeps_writing_its_watched_file_is_not_hung(tmp_path: Path) -> None:
    path = str(tmp_path / "progress")
    with Sandbox(_answer) as sandbox:  # a write every 0.1 s: far inside a 1 s timeout
        assert sandbox.call(Call("writes", path=path), timeout=1.0, watch=path) == "done"
        started = time.monotonic()
        hung = sandbox.call(Call("writes-then-stops", path=path), timeout=1.0, watch=path)
        assert hung == Died(-signal.SIGKILL, 1.0)
        assert time.monotonic() - started >= 2.0  # killed only after the writes stopped
        # without the watch the same 2 s of writes is a hang
        assert sandbox.call(Call("writes", path=path), timeout=1.0) == Died(-signal.SIGKILL, 1.0)


def test_the_zygote_environment_is_set_before_torch_loads(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("OMP_NUM_THREADS", "4")  # the caller's own: not the sandbox's
    with Sandbox(_answer) as sandbox:
        assert sandbox.call(Call("env")) == (None, 1)
    with Sandbox(_answer, env=(("KVPOOL_SANDBOX_TEST", "yes"), ("OMP_NUM_THREADS", "2"))) as box:
        assert box.call(Call("env")) == ("yes", 2)
