"""Every CUDA check in one run: the lifecycle's sync-free tests, then the kernel benchmark.

1. ``tests/optimized/test_sync_free_manager.py`` (every lifecycle step under
   ``torch.cuda.set_sync_debug_mode("error")``, plus the CPU counters) and the CUDA kernel tests
   of ``tests/kernels`` (compiled Triton against the torch fallbacks);
2. ``benchmarks/cuda_kernels.py`` (bandwidth of the compiled kernels; ``--quick``: one size).

Without CUDA it prints a skip line and exits 0. Exit status: non-zero when a check fails.

    python benchmarks/cuda_checks.py [--quick]
"""

from __future__ import annotations

import argparse
import importlib.util
import sys
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
TESTS = ("tests/optimized/test_sync_free_manager.py", "tests/kernels")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="CUDA checks: sync-free lifecycle, kernels")
    parser.add_argument("--quick", action="store_true", help="one kernel benchmark size")
    args = parser.parse_args(argv)
    if not torch.cuda.is_available():
        print("SKIP: no CUDA device; the CUDA checks need a GPU")
        return 0
    import pytest

    status = int(pytest.main(["-q", "-p", "no:cacheprovider", *(str(ROOT / t) for t in TESTS)]))
    spec = importlib.util.spec_from_file_location(
        "cuda_kernels", ROOT / "benchmarks/cuda_kernels.py"
    )
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    bench_status = int(module.main(["--quick"] if args.quick else []))
    return 1 if status or bench_status else 0


if __name__ == "__main__":
    raise SystemExit(main())
