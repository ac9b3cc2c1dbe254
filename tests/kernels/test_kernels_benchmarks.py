"""The kernel benchmark scripts run: the CPU one in quick mode, the CUDA one's cases on the host
(their inputs are valid and the backends agree), and its clean skip without a GPU."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from types import ModuleType

import pytest
import torch

from kvpool.kernels.dispatch import triton_installed

BENCHMARKS = Path(__file__).resolve().parents[2] / "benchmarks"


def _load(name: str) -> ModuleType:
    spec = importlib.util.spec_from_file_location(f"bench_{name}", BENCHMARKS / f"{name}.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up while being built
    spec.loader.exec_module(module)
    return module


def test_cpu_benchmark_quick_prints_a_table(capsys: pytest.CaptureFixture[str]) -> None:
    bench = _load("bench_kernels")
    assert bench.main(["--quick", "--repeats", "1", "--no-interpret"]) == 0
    out = capsys.readouterr().out
    for name in ("alloc_extend", "alloc_decode", "write_req_to_token", "get_last_loc"):
        assert name in out
    assert "torch x" in out


@pytest.mark.parametrize(
    "backend",
    [
        "python",
        pytest.param(
            "interpret",
            marks=pytest.mark.skipif(not triton_installed(), reason="triton is not installed"),
        ),
    ],
)
def test_cuda_benchmark_cases_agree_on_the_host(backend: str) -> None:
    cuda = _load("cuda_kernels")
    for case in cuda.build_cases(bs=4, prefix=40, extend=30, ps=4, device="cpu"):
        got, want = case.run(backend), case.run("torch")
        assert isinstance(got, torch.Tensor) and torch.equal(got, want), case.name
        assert case.bytes_moved > 0


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the skip path of a GPU-less host")
def test_cuda_benchmark_skips_cleanly_without_a_gpu(capsys: pytest.CaptureFixture[str]) -> None:
    assert _load("cuda_kernels").main(["--quick"]) == 0
    assert capsys.readouterr().out.startswith("SKIP")
