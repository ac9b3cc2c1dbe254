"""``kvpool sessions`` speed: plans a second on SGLang's torch allocation path and on its Triton
kernels, in the same run.

At page size 4 the session worlds' paged allocators take SGLang's torch path
(``use_triton_kernels = False``) unless ``--allocation-kernels triton`` asks for the Triton
kernels, which a CPU runs through Triton's interpreter. Each row plays the same plans (seed
21, runs ``0 .. N-1`` over the default 80 setups, ``--skip-known``) in this process with one
path: ``plans``, ``turns`` and the known findings' counts are deterministic and must agree
between the rows (the two paths give the same slots); ``cpu_s`` is this thread's CPU time
(``time.thread_time``) and ``plans_per_s`` plans over it. The last row is the ratio. SGLang
comes from the published wheel at run time (``$KVPOOL_SGLANG_CACHE``); when it cannot be
loaded one row says why.

    python benchmarks/bench_sessions.py [--quick] [--runs N]
    kvpool bench --only sessions
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))  # run_all, whoever loads us
from bench_allocators import load_sglang_or_reason
from run_all import format_table

SEED = 21
"""The campaign seed of every row."""


def kernels_row(triton: bool, runs: int) -> dict[str, Any]:
    """Runs ``0 .. runs - 1`` of seed :data:`SEED` with one allocation path (see the module
    docstring), after one warm-up plan on every setup (SGLang loaded, each core and world
    built once)."""
    from kvpool.sglang.session_campaign import run_campaign, setups

    chosen = setups(triton=triton)
    run_campaign(chosen, 1e9, seed=SEED + 1, max_runs=len(chosen), skip_known=True)
    start = time.thread_time()
    result = run_campaign(chosen, 1e9, seed=SEED, max_runs=runs, skip_known=True)
    cpu = time.thread_time() - start
    known = ", ".join(f"{k}: {v}" for k, v in sorted(result.known.items()))
    return {
        "kernels": "triton (interpreter)" if triton else "torch",
        "plans": result.plans,
        "turns": result.turns,
        "known": known,
        "failures": 0 if result.failure is None else 1,
        "cpu_s": round(cpu, 2),
        "plans_per_s": round(result.plans / cpu, 1) if cpu > 0 else None,
    }


def run(quick: bool, runs: int | None = None) -> list[dict[str, Any]]:
    """The torch row, the Triton row and their ratio (``quick``: 80 plans, else 400)."""
    _, why = load_sglang_or_reason("0.5.23")
    if why:
        return [{"kernels": "SGLang", "note": why}]
    n = runs if runs is not None else (80 if quick else 400)
    torch_row, triton_row = kernels_row(False, n), kernels_row(True, n)
    ratio = None
    if torch_row["plans_per_s"] and triton_row["plans_per_s"]:
        ratio = round(torch_row["plans_per_s"] / triton_row["plans_per_s"], 2)
    return [torch_row, triton_row, {"kernels": "torch / triton", "plans_per_s": ratio}]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="80 plans a row")
    parser.add_argument("--runs", type=int, default=None, help="plans a row (default 400)")
    args = parser.parse_args(argv)
    print(format_table(run(args.quick, args.runs)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
