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


def test_allocator_benchmark_leaves_sglang_columns_empty_without_sglang() -> None:
    """No SGLang to load: a one-line reason, and every row still measures both twins."""
    bench = _load("bench_allocators")
    modules, why = bench.load_sglang_or_reason("/nonexistent/sglang")
    assert modules is None and why.startswith("SGLang /nonexistent/sglang not loaded")
    ref_us, twin_us, sg_us = bench._decode_case(bench.Pair(1 << 12, "cpu"), [5, 16, 33], 2, 2)
    assert ref_us > 0 and twin_us > 0 and sg_us is None
    rows = bench._free_rows("cpu", [20, 40, 3], 2, 2, None, "3 reqs", 1 << 12)
    assert [r["op"] for r in rows] == [
        "free 3 reqs (one call)",
        "free 3 reqs (free group, 3 frees)",
    ]
    assert all(r["twin/sglang"] is None and r["twin_us"] > 0 for r in rows)


@pytest.mark.sglang_wheel
def test_allocator_benchmark_times_sglang_on_the_same_inputs() -> None:
    """With SGLang 0.5.23 loaded, its allocators run the same cases (their results are checked
    against the twins' before timing) and fill the SGLang columns."""
    bench = _load("bench_allocators")
    modules, why = bench.load_sglang_or_reason("0.5.23")
    assert modules is not None, why
    pair = bench.Pair(1 << 12, "cpu", modules)
    _, _, sg_us = bench._extend_case(pair, [0, 5, 17], [30, 12, 40], 2, 2)
    assert sg_us is not None and sg_us > 0
    for ps in (1, 16):
        rows = bench._free_rows("cpu", [20, 40, 3], 2, 2, modules, "3 reqs", 1 << 12, True, ps)
        assert all(r["twin/sglang"] is not None for r in rows)


@pytest.mark.sglang_wheel
def test_allocator_vs_sglang_rows_check_results_and_carry_targets() -> None:
    """The "vs SGLang" cases first check that both allocators return the same slots and leave
    the same free lists (an assertion fails otherwise), then give each row its target."""
    bench = _load("bench_allocators")
    modules, why = bench.load_sglang_or_reason("0.5.23")
    assert modules is not None, why
    cases = _load("allocator_vs_sglang")
    b = cases.Bench(modules, quick=True)
    b.budget_s = 0.0  # the minimum number of timed pairs
    b.segment_rows()
    b.need_sort_rows()
    assert len(b.rows) == 13
    for row in b.rows:
        assert row["mode"] == "twin unchecked" and row["target"] == "<= 1.0"
        # the times, not the rounded ratio: a stalled SGLang call on a busy machine can round
        # a ratio to 0.0
        assert row["twin_us"] > 0 and row["sglang_0.5.23_us"] > 0
        assert isinstance(row["twin/sglang"], float)


@pytest.mark.sglang_wheel
def test_page_size_one_alloc_decode_is_informational() -> None:
    """SGLang has no page-size-1 ``alloc_decode``: that row has no target and no verdict; its
    decode step (``alloc(batch size)`` on both) and the paged ``alloc_decode`` rows have 0.67."""
    bench = _load("bench_allocators")
    modules, why = bench.load_sglang_or_reason("0.5.23")
    assert modules is not None, why
    b = _load("allocator_vs_sglang").Bench(modules, quick=True)
    b.budget_s = 0.0
    b.decode_rows()
    info = [r for r in b.rows if r["op"].startswith("alloc_decode") and r["op"].endswith(" 1")]
    assert info and all(r["target"] == "-" and r["ok"] == "-" for r in info)
    rest = [r for r in b.rows if r not in info]
    assert rest and all(r["target"] == "<= 0.67" and r["ok"] in ("yes", "NO") for r in rest)
