"""Backend selection: defaults, the environment variable, errors, registered backends, and
importing kvpool.kernels without triton."""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Callable
from typing import Any

import pytest
import torch

from kvpool.errors import KernelError, KVPoolError, PageSizeError
from kvpool.kernels import (
    BACKENDS,
    KERNEL_FUNCTIONS,
    alloc_decode,
    alloc_extend,
    available_backends,
    create_flashmla_kv_indices,
    get_last_loc,
    register_kernel_backend,
    resolve_backend,
    unregister_kernel_backend,
)
from kvpool.kernels.dispatch import ENV_VAR, get_kernel, triton_installed

needs_triton = pytest.mark.skipif(not triton_installed(), reason="triton is not installed")


def _t(values: list[int]) -> torch.Tensor:
    return torch.tensor(values, dtype=torch.int64)


def test_default_backend_on_cpu_is_torch_or_the_environment(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    cpu = torch.zeros(1)
    monkeypatch.delenv(ENV_VAR, raising=False)
    assert resolve_backend(None, cpu) == "torch"
    monkeypatch.setenv(ENV_VAR, "python")
    assert resolve_backend(None, cpu) == "python"
    assert resolve_backend("torch", cpu) == "torch"  # an explicit backend wins


def test_unknown_backend_and_triton_on_cpu_raise_kernel_error(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    with pytest.raises(KernelError, match="unknown kernel backend"):
        resolve_backend("cuda-magic", torch.zeros(1))
    monkeypatch.setenv(ENV_VAR, "nope")
    with pytest.raises(KernelError, match="unknown kernel backend"):
        resolve_backend(None, torch.zeros(1))
    if triton_installed():
        with pytest.raises(KernelError, match="CUDA tensors"):
            resolve_backend("triton", torch.zeros(1))
    out = torch.zeros(1, dtype=torch.int64)
    with pytest.raises(KVPoolError):
        alloc_decode(_t([2]), _t([5]), _t([]), out, 4, backend="bogus")
    assert out.tolist() == [0]  # nothing written


def test_available_backends() -> None:
    found = available_backends()
    assert {"torch", "python"} <= set(found)
    assert ("interpret" in found) == triton_installed()
    assert ("triton" in found) == (triton_installed() and torch.cuda.is_available())
    assert set(BACKENDS) == {"triton", "interpret", "torch", "python"}


@pytest.mark.parametrize("page_size", [0, 3, 6, -4])
def test_page_size_must_be_a_power_of_two(page_size: int) -> None:
    out = torch.zeros(1, dtype=torch.int64)
    with pytest.raises(PageSizeError):
        alloc_extend(_t([0]), _t([1]), _t([-1]), _t([3]), out, page_size, backend="torch")
    with pytest.raises(PageSizeError):
        create_flashmla_kv_indices(
            torch.zeros(2, 4, dtype=torch.int32),
            _t([1]),
            _t([1]),
            None,
            torch.zeros(1, 1, dtype=torch.int32),
            page_size,
        )


def test_builtin_backends_cannot_be_replaced() -> None:
    with pytest.raises(KernelError, match="built in"):
        register_kernel_backend("torch", lambda fn: fn)
    with pytest.raises(KernelError, match="does not run Triton kernels"):
        get_kernel(KERNEL_FUNCTIONS["alloc_decode"], "torch")


@needs_triton
def test_registered_backend_receives_the_plain_kernel() -> None:
    from triton.runtime.interpreter import InterpretedFunction

    seen: list[Callable[..., None]] = []

    def factory(fn: Callable[..., None]) -> Any:
        seen.append(fn)
        return InterpretedFunction(fn)

    register_kernel_backend("recording", factory)
    try:
        assert "recording" in available_backends()
        table = torch.zeros(3, 4, dtype=torch.int32)
        table[2, :3] = torch.tensor([8, 9, 10], dtype=torch.int32)
        got = get_last_loc(table, _t([2, 2]), _t([3, 0]), backend="recording")
        assert got.tolist() == [10, -1]
        assert seen == [KERNEL_FUNCTIONS["get_last_loc"]]
    finally:
        unregister_kernel_backend("recording")
    assert "recording" not in available_backends()


_WITHOUT_TRITON = """
import sys
sys.modules["triton"] = None  # any import of triton now fails
import torch
import kvpool.kernels as k
from kvpool.errors import KernelError
out = torch.zeros(1, dtype=torch.int64)
k.alloc_decode(torch.tensor([2]), torch.tensor([5]), torch.tensor([], dtype=torch.int64), out, 4)
assert out.tolist() == [6], out
assert "interpret" not in k.available_backends()
try:
    k.alloc_decode(torch.tensor([2]), torch.tensor([5]), torch.tensor([3]), out, 4, "interpret")
except KernelError as e:
    assert "triton" in str(e)
else:
    raise AssertionError("no KernelError")
print("ok")
"""


@pytest.mark.slow
def test_kernels_import_and_fall_back_without_triton() -> None:
    done = subprocess.run(
        [sys.executable, "-c", _WITHOUT_TRITON], capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "ok"
