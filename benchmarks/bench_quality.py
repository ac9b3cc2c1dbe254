"""Time-to-find of the quality suite's seeded bugs: how fast verification finds a planted bug.

For each seeded bug of ``tests/quality/mutants.py`` (:data:`tests.quality.mutants.MUTANTS`),
:func:`kvpool.testing.quality.hunt` runs the reference against the mutated twin under the
``mutants`` hypothesis profile (the quality suite's budget: deterministic, the same examples and
steps on every run) and stops at the first failure; the trace is not shrunk here
(``shrink_replays=0``), so ``find_s`` is the wall time until the bug was found. ``detector``,
``examples`` and ``steps`` are deterministic: a change that made verification slower per step
shows in ``find_s`` alone, one that made it weaker in the other columns. Each bug is hunted
``--rounds`` times, the rounds taking turns over the bugs; ``find_s`` is the median of its
rounds, and the last row the median over the bugs of those medians.

    python benchmarks/bench_quality.py [--quick] [--rounds 3] [--only NAME]
    kvpool bench --only quality
"""

from __future__ import annotations

import argparse
import statistics
import sys
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))  # run_all, whoever loads us
from run_all import format_table

ROOT = Path(__file__).resolve().parents[1]
"""The repository root: ``tests.quality.mutants`` is imported from the checkout."""


def run(quick: bool, rounds: int | None = None, only: str | None = None) -> list[dict[str, Any]]:
    """One row per seeded bug whose name contains ``only`` (all by default), then the median."""
    if str(ROOT) not in sys.path:
        sys.path.insert(0, str(ROOT))
    from hypothesis import settings

    from kvpool.testing.profiles import register_profiles
    from kvpool.testing.quality import hunt
    from tests.quality.mutants import MUTANTS

    register_profiles()
    budget = settings.get_profile("mutants")
    mutants = [m for m in MUTANTS if only is None or only in m.name]
    n = rounds if rounds is not None else (1 if quick else 3)
    times: dict[str, list[float]] = {m.name: [] for m in mutants}
    rows: dict[str, dict[str, Any]] = {}
    for _ in range(n):
        for m in mutants:
            found = hunt(m, budget, shrink_replays=0)
            times[m.name].append(found.seconds)
            rows[m.name] = {"mutant": m.name, "caught": found.as_expected,
                            "detector": found.detector, "examples": found.examples,
                            "steps": found.steps}  # fmt: skip
    out = [{**rows[name], "find_s": round(statistics.median(t), 3)} for name, t in times.items()]
    if out:
        medians = [r["find_s"] for r in out]
        out.append({"mutant": "median", "caught": sum(r["caught"] for r in out),
                    "find_s": round(statistics.median(medians), 3)})  # fmt: skip
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="one round")
    parser.add_argument("--rounds", type=int, default=None, help="rounds per bug (default 3)")
    parser.add_argument("--only", default=None, help="bugs whose name contains this")
    args = parser.parse_args(argv)
    rows = run(args.quick, args.rounds, args.only)
    if not rows:
        print(f"no seeded bug matches {args.only!r}", file=sys.stderr)
        return 1
    print(format_table(rows))
    return 0


if __name__ == "__main__":
    sys.exit(main())
