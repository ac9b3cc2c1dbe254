"""``kvpool.testing.sandbox``: calls answered in forked children of one zygote, a death or a
hang past the call's timeout an answer (``Died``), an exception the caller's error, the zygote
warmed once per key."""

from __future__ import annotations

import os
import signal
import time
from dataclasses import dataclass

import pytest

from kvpool.testing.sandbox import Died, Sandbox, SandboxError, describe_exit

WARMED: list[str] = []
"""What the zygote warmed (each child inherits the list as it was when it was forked)."""


@dataclass(frozen=True)
class Call:
    what: str
    warm_key: str = "a"


def _answer(call: Call) -> object:
    if call.what == "segv":
        os.kill(os.getpid(), signal.SIGSEGV)
    if call.what == "exit":
        os._exit(3)
    if call.what == "hang":
        time.sleep(3600)
    if call.what == "raise":
        raise KeyError("no such thing")
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
