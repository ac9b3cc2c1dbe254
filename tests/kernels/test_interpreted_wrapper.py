"""``interpreted()`` launches a kernel that calls triton library functions, however it was made.

A module decorated while ``TRITON_INTERPRET=1`` was set holds ``InterpretedFunction`` objects,
while triton's own library functions (imported earlier, without the variable) stay compiled-mode
``JITFunction`` objects that refuse a direct call. Which one a test sees depends on what ran
before it in the process, so both must launch."""

from __future__ import annotations

import torch
import triton
import triton.language as tl
from triton.runtime.interpreter import InterpretedFunction

from kvpool.testing.kernel_harness.interpreted import interpreted


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
