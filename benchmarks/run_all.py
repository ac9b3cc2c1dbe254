"""Run every benchmark script's ``run(quick)`` and print one table.

A benchmark script is a ``bench_*.py`` file in this directory exposing
``run(quick: bool) -> list[dict]`` (one dict per measured row; the table's columns are the union
of the rows' keys). Scripts without ``run`` are listed as skipped. ``--only NAME`` keeps the
scripts whose name contains NAME (``radix``, ``bench_replay``...).

    python benchmarks/run_all.py --quick
    kvpool bench --quick --only radix
"""

from __future__ import annotations

import argparse
import importlib
import sys
import time
from pathlib import Path
from typing import Any

BENCH_DIR = Path(__file__).resolve().parent


def discover(only: str | None = None) -> list[str]:
    """Names of the benchmark modules (``bench_*``), sorted, filtered by ``only``."""
    names = sorted(p.stem for p in BENCH_DIR.glob("bench_*.py"))
    return [n for n in names if only is None or only in n]


def run_all(quick: bool = False, only: str | None = None) -> list[dict[str, Any]]:
    """Rows of every selected benchmark, each tagged with its script and wall time."""
    if str(BENCH_DIR) not in sys.path:
        sys.path.insert(0, str(BENCH_DIR))
    rows: list[dict[str, Any]] = []
    for name in discover(only):
        module = importlib.import_module(name)
        run = getattr(module, "run", None)
        if run is None:
            rows.append({"bench": name, "op": "(skipped: no run(quick))"})
            continue
        t0 = time.perf_counter()
        result: list[dict[str, Any]] = run(quick)
        elapsed = time.perf_counter() - t0
        for row in result:
            rows.append({"script": name, **row})
        print(f"[{name}: {len(result)} rows in {elapsed:.1f} s]", file=sys.stderr)
    return rows


def format_table(rows: list[dict[str, Any]]) -> str:
    """Rows as an aligned text table (columns: the union of the rows' keys, first-seen order)."""
    cols: list[str] = []
    for r in rows:
        cols.extend(k for k in r if k not in cols)
    cells = [["" if r.get(c) is None else str(r.get(c)) for c in cols] for r in rows]
    widths = [max([len(c)] + [len(line[i]) for line in cells]) for i, c in enumerate(cols)]
    lines = ["  ".join(c.ljust(w) for c, w in zip(cols, widths, strict=True))]
    lines += ["  ".join(v.ljust(w) for v, w in zip(line, widths, strict=True)) for line in cells]
    return "\n".join(line.rstrip() for line in lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="small sizes, few repeats")
    parser.add_argument("--only", default=None, help="run only scripts whose name contains this")
    args = parser.parse_args(argv)
    rows = run_all(args.quick, args.only)
    if not rows:
        print(f"no benchmark matches {args.only!r}", file=sys.stderr)
        return 1
    print(format_table(rows))
    return 0


if __name__ == "__main__":
    sys.exit(main())
