"""``kvpool.sglang.unified_base.capture_fd1``: what a call writes to file descriptor 1 (where
SGLang's Rust tree core prints its tree), captured through one sink per process that every
capture reuses. Needs no SGLang: the writer here is ``os.write``."""

from __future__ import annotations

import os

import pytest

from kvpool.sglang.unified_base import capture_fd1


def _writes(text: str) -> None:
    os.write(1, text.encode())


def test_a_capture_returns_what_the_call_wrote_to_descriptor_one() -> None:
    def twice() -> None:
        _writes("[0] 0 full_lock=1\n")
        _writes("  [1] 1 full_lock=0\n")

    assert capture_fd1(twice) == "[0] 0 full_lock=1\n  [1] 1 full_lock=0\n"


def test_each_capture_returns_only_its_own_output() -> None:
    assert (
        capture_fd1(lambda: _writes("a much longer first line\n")) == "a much longer first line\n"
    )
    assert capture_fd1(lambda: _writes("short\n")) == "short\n"
    assert capture_fd1(lambda: None) == ""


def test_a_large_output_comes_back_whole() -> None:
    text = "".join(f"[{i}] {i} full_lock=0\n" for i in range(20_000))  # far above a pipe's 64 KiB
    assert len(text) > 300_000
    assert capture_fd1(lambda: _writes(text)) == text


def test_descriptor_one_is_restored_when_the_call_raises(capfd: pytest.CaptureFixture[str]) -> None:
    def fails() -> None:
        _writes("before the error\n")
        raise RuntimeError("boom")

    with pytest.raises(RuntimeError, match="boom"):
        capture_fd1(fails)
    _writes("after\n")
    assert capfd.readouterr().out == "after\n"


@pytest.mark.skipif(not hasattr(os, "fork"), reason="os.fork is POSIX-only")
def test_a_forked_child_captures_into_its_own_sink() -> None:
    assert capture_fd1(lambda: _writes("parent before\n")) == "parent before\n"
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: a capture of its own, reported through the pipe
        try:
            got = capture_fd1(lambda: _writes("child output\n"))
            os.write(write, got.encode())
        finally:
            os._exit(0)
    os.close(write)
    with os.fdopen(read, "rb") as pipe:
        child = pipe.read().decode()
    os.waitpid(pid, 0)
    assert child == "child output\n"
    assert capture_fd1(lambda: _writes("parent after\n")) == "parent after\n"


def test_without_memfd_the_sink_is_an_unnamed_temporary_file(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Where ``os.memfd_create`` is missing (not Linux) the sink is a temporary file, kept open
    through a duplicate of its descriptor, and captures behave the same."""
    from kvpool.sglang import unified_base

    monkeypatch.delattr(os, "memfd_create", raising=False)
    monkeypatch.setattr(unified_base, "_SINK", None)
    assert capture_fd1(lambda: _writes("a longer first capture\n")) == "a longer first capture\n"
    assert capture_fd1(lambda: _writes("second\n")) == "second\n"
    sink = unified_base._SINK
    assert sink is not None and sink[0] == os.getpid()
    os.close(sink[1])  # the test's own sink: the module's is restored after it
