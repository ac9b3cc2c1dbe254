"""The contract matrix: every bad call of every family on every side, counted.

``python -m tests.contract.matrix [--family NAME] [--seed N] [--show]`` sweeps each public class
of each family (of one, with ``--family``) from the state its builder reaches with ``seed`` and
prints, per family and side, how many bad calls were typed (a KVPoolError, nothing changed),
answered (the documented answer, nothing changed), accepted, untyped (a foreign exception) or
changed state before raising, and the share that kept the contract. ``--show`` lists every
call that broke it. On the unchecked twin, a value only a device read would refuse is the
caller's to avoid (README, "Checked mode"): whatever the call does with it counts as kept, and
the ``dev-read`` column counts those calls.
"""

from __future__ import annotations

import argparse
import os
from collections import Counter

from tests.contract.machinery import SIDES, Outcome, klass, sweep
from tests.contract.registry import FAMILIES

VERDICTS = ("typed", "answer", "accepted", "untyped", "changed-then-raised")


def run(family_name: str | None, seed: int) -> list[Outcome]:
    """Every outcome of the sweep (one family, or all)."""
    os.environ.pop("KVPOOL_CHECKED", None)  # the library's own default mode
    outcomes: list[Outcome] = []
    for family in FAMILIES:
        if family_name not in (None, family.name):
            continue
        for cls in family.classes:
            if cls in family.abstract:
                continue
            for side in SIDES:
                try:
                    klass(side, cls)
                except AttributeError:
                    continue
                outcomes += sweep(family, cls, side, seed)
    return outcomes


def table(outcomes: list[Outcome]) -> str:
    """One row per (family, side): counts per verdict and the share kept."""
    rows = []
    header = f"{'family':<10} {'side':<26} {'calls':>6} " + " ".join(
        f"{v[:9]:>9}" for v in VERDICTS
    )
    rows.append(header + f" {'dev-read':>8} {'kept':>7}")
    keys = sorted({(o.family, o.side) for o in outcomes})
    keys += [("all", s) for s in sorted({o.side for o in outcomes})]
    for fam, side in keys:
        group = [o for o in outcomes if o.side == side and fam in ("all", o.family)]
        counts = Counter(o.verdict for o in group)
        kept = sum(o.ok for o in group)
        excused = sum(o.ok and o.verdict not in ("typed", "answer") for o in group)
        share = 100.0 * kept / len(group) if group else 100.0
        cells = " ".join(f"{counts[v]:>9}" for v in VERDICTS)
        rows.append(f"{fam:<10} {side:<26} {len(group):>6} {cells} {excused:>8} {share:>6.1f}%")
    return "\n".join(rows)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--family")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--show", action="store_true", help="list every call that broke it")
    args = parser.parse_args()
    outcomes = run(args.family, args.seed)
    print(table(outcomes))
    if args.show:
        for o in outcomes:
            if not o.ok:
                print(o.line())


if __name__ == "__main__":
    main()
