"""``kvpool bench [--quick] [--only NAME]``: run the benchmark scripts and print one table.

The scripts live in the repository's ``benchmarks/`` directory (next to the ``kvpool`` package;
an editable install finds it); ``benchmarks/run_all.py`` does the work.
"""

from __future__ import annotations

import argparse
import importlib.util
from pathlib import Path
from typing import Any

from kvpool.cli.args import add_parser, fail

BENCH_DIR = Path(__file__).resolve().parents[2] / "benchmarks"


def _run_all_module() -> Any:
    path = BENCH_DIR / "run_all.py"
    if not path.is_file():
        return None
    spec = importlib.util.spec_from_file_location("kvpool_bench_run_all", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _run(args: argparse.Namespace) -> int:
    module = _run_all_module()
    if module is None:
        fail(f"bench: benchmarks not found in {BENCH_DIR} (needs a source checkout)")
    if args.only is not None and not module.discover(args.only):
        fail(f"bench: --only {args.only!r} matches no script; expected part of one of: "
             f"{', '.join(module.discover())}")  # fmt: skip
    argv = (["--quick"] if args.quick else []) + (["--only", args.only] if args.only else [])
    code: int = module.main(argv)
    return code


def register(subparsers: Any) -> None:
    """Add the ``bench`` subcommand."""
    parser = add_parser(
        subparsers,
        "bench",
        description=__doc__,
        help="run the benchmarks (twin vs reference) and print one table",
    )
    parser.add_argument("--quick", action="store_true", help="small sizes, few repeats")
    parser.add_argument(
        "--only",
        default=None,
        metavar="NAME",
        help="only the scripts whose name contains NAME (default: all)",
    )
    parser.set_defaults(func=_run)
