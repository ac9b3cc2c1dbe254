"""``interpreted()`` launches a kernel that calls triton library functions, however it was made.

A module decorated while ``TRITON_INTERPRET=1`` was set holds ``InterpretedFunction`` objects,
while triton's own library functions (imported earlier, without the variable) stay compiled-mode
``JITFunction`` objects that refuse a direct call. Which one a test sees depends on what ran
before it in the process, so both must launch."""

from __future__ import annotations

import pytest
import torch
import triton
import triton.language as tl
from triton.runtime.interpreter import InterpretedFunction

from kvpool.testing.kernel_harness.interpreted import interpreted, triton_interpreter


def _pages_kernel(lens_ptr, out_ptr, PAGE: tl.constexpr):  # type: ignore[no-untyped-def]
    pid = tl.program_id(0)
    n = tl.load(lens_ptr + pid)
    tl.store(out_ptr + pid, tl.cdiv(n, PAGE))  # tl.cdiv is a triton.jit library function


def _launch(kernel: object) -> list[int]:
    lens = torch.tensor([0, 1, 16, 17], dtype=torch.int64)
    out = torch.zeros(4, dtype=torch.int64)
    interpreted(kernel)[(4,)](lens, out, PAGE=16)
    return [int(v) for v in out.tolist()]


def test_a_jit_kernel_launches_through_the_interpreter() -> None:
    assert _launch(triton.jit(_pages_kernel)) == [0, 1, 1, 2]


def test_an_interpreted_function_made_elsewhere_launches_too() -> None:
    assert _launch(InterpretedFunction(_pages_kernel)) == [0, 1, 1, 2]


def _failing_device(x):  # type: ignore[no-untyped-def]
    return x + undefined_name  # type: ignore[name-defined]  # noqa: F821


def _calls_failing_kernel(out_ptr):  # type: ignore[no-untyped-def]
    tl.store(out_ptr, _FAILING(tl.program_id(0)))


_FAILING = triton.jit(_failing_device)


def test_a_device_function_is_patched_once_per_launch(monkeypatch: pytest.MonkeyPatch) -> None:
    """``tl.cdiv`` runs once per program (4 here); ``triton.language`` is patched for it at its
    first call of the launch only, and again in the next launch (triton's device call patches
    at every call)."""
    interp = triton_interpreter()
    patched: list[str] = []
    real = interp._patch_lang

    def counting(fn: object) -> object:
        patched.append(getattr(fn, "__name__", "?"))
        return real(fn)

    monkeypatch.setattr(interp, "_patch_lang", counting)
    kernel = triton.jit(_pages_kernel)
    assert _launch(kernel) == [0, 1, 1, 2]
    assert _launch(kernel) == [0, 1, 1, 2]
    # per launch: the kernel's own patch (the grid executor's) and cdiv's, once
    assert patched == ["_pages_kernel", "cdiv", "_pages_kernel", "cdiv"]


def test_an_error_in_a_device_function_is_an_interpreter_error() -> None:
    interp = triton_interpreter()
    out = torch.zeros(1, dtype=torch.int64)
    with pytest.raises(interp.InterpreterError, match="undefined_name"):
        interpreted(triton.jit(_calls_failing_kernel))[(1,)](out)
