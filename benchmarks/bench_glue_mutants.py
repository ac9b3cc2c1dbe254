"""Mutants of SGLang 0.5.23's scheduler glue: how many do lockstep campaigns kill?

Every mutant of :mod:`kvpool.sglang.glue_mutants` (a comparison, an operator, a constant, a
condition or a statement of ``allocation.py`` / ``common.py`` changed, one at a time) is judged
by the same campaigns: ``--runs`` runs of each ``--component`` machine seeded ``--seed``, the
reference against SGLang's glue lifecycle loaded from the wheel in this run. For each machine
the campaign first runs as released, under a line tracer: it must pass, and a mutant on a line
it never executes cannot change what it sees. Every mutant it reaches that no earlier machine
killed is then played in a forked child of a warm process
(:class:`kvpool.testing.sandbox.Sandbox`, one per ``--workers``); a child that dies or gives no
answer within ``--timeout`` seconds counts as killed (``killed by ...`` / ``hung``), as a
campaign's crash report would. A mutant no machine reaches is ``unreached``.

Rows: one per reached mutant that survived (what to read), then one per function and the total:
``mutants``, ``reached``, ``killed``, ``survived`` and the kill ratio over reached mutants, and
the wall time. ``--json FILE`` writes every mutant's verdict.

    python benchmarks/bench_glue_mutants.py [--runs 40] [--seed 1] [--workers 2] [--only release]
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from collections import Counter
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))  # run_all, whoever loads us
from run_all import format_table


def verdicts(
    source: str, components: list[str], seed: int, runs: int, workers: int, timeout: float,
    only: str | None = None,
) -> tuple[list[dict[str, Any]], float]:  # fmt: skip
    """Every mutant's verdict (dicts: ``mutant``, ``function``, ``operator``, ``line``,
    ``verdict``: ``unreached``, ``survived`` or the detector that killed it, ``component``
    and ``step`` where it was killed), and the seconds taken. The components' campaigns judge
    in turn: a mutant one of them kills is not played by the next."""
    import torch

    from kvpool.sglang import glue_mutants as gm
    from kvpool.sglang.loader import load_sglang

    torch.set_num_threads(1)
    start = time.monotonic()
    modules = load_sglang(source)
    everything = [m for m in gm.mutants(modules) if only is None or only in m.name]
    rows = {m: _row(m, "unreached") for m in everything}
    for component in components:
        baseline = gm.Trial(source, component, seed, runs)
        reached, passed = gm.lines_reached(modules, baseline)
        if passed.detector is not None:
            raise SystemExit(f"{component}'s campaign fails as released ({passed.detector})")
        todo = [m for m in everything if (m.module, m.line) in reached
                and rows[m]["verdict"] in ("unreached", "survived")]  # fmt: skip
        _judge(todo, baseline, rows, workers, timeout)
    return [rows[m] for m in everything], time.monotonic() - start


def _judge(
    todo: list[Any], baseline: Any, rows: dict[Any, dict[str, Any]], workers: int,
    timeout: float,
) -> None:  # fmt: skip
    """Play every mutant of ``todo`` with ``baseline``'s campaign, ``workers`` sandboxes
    taking shares; record each verdict in ``rows``."""
    import dataclasses

    from kvpool.sglang import glue_mutants as gm
    from kvpool.testing.sandbox import Died, Sandbox

    boxes = [Sandbox(gm.play_quietly, gm.warm) for _ in range(max(workers, 1))]
    where = baseline.component

    def judge(box: Any, share: list[gm.Mutant]) -> None:
        for m in share:
            answer = box.call(dataclasses.replace(baseline, mutant=m), timeout)
            if isinstance(answer, Died):
                verdict = "hung" if answer.hung_after is not None else str(answer)
                rows[m] = _row(m, verdict, where)
            else:
                rows[m] = _row(m, answer.detector or "survived", where, answer.step)

    try:
        with ThreadPoolExecutor(len(boxes)) as pool:
            shares = [todo[i :: len(boxes)] for i in range(len(boxes))]
            list(pool.map(judge, boxes, shares))
    finally:
        for box in boxes:
            box.close()


def _row(m: Any, verdict: str, component: str = "", step: int = 0) -> dict[str, Any]:
    return {"mutant": m.name, "function": f"{m.module}.{m.function}", "operator": m.operator,
            "line": m.line, "verdict": verdict, "component": component,
            "step": step}  # fmt: skip


def summary(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """One row per function with a reached mutant, then ``total``."""
    out: list[dict[str, Any]] = []
    functions = sorted({r["function"] for r in rows})
    for name in [*functions, "total"]:
        mine = [r for r in rows if name in ("total", r["function"])]
        reached = [r for r in mine if r["verdict"] != "unreached"]
        if not reached and name != "total":
            continue
        killed = sum(r["verdict"] != "survived" for r in reached)
        ratio = round(killed / len(reached), 3) if reached else None
        out.append({"function": name, "mutants": len(mine), "reached": len(reached),
                    "killed": killed, "survived": len(reached) - killed,
                    "kill_ratio": ratio})  # fmt: skip
    return out


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--sglang", default="0.5.23", help="SGLang source (default: 0.5.23)")
    p.add_argument(
        "--component",
        default="manager,mamba_manager,swa_manager,hicache_manager",
        help="the campaigns' machines, comma-separated, judging in turn (default: "
        "the lifecycle, then its hybrid, sliding-window and host-tier machines)",
    )
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--runs", type=int, default=40, help="runs of 60 steps per mutant")
    p.add_argument("--workers", type=int, default=2)
    p.add_argument("--timeout", type=float, default=300.0, help="seconds before a mutant hangs")
    p.add_argument("--only", help="only mutants whose name contains this")
    p.add_argument("--json", help="write every verdict to this file")
    args = p.parse_args(argv)
    rows, seconds = verdicts(args.sglang, args.component.split(","), args.seed, args.runs,
                             args.workers, args.timeout, args.only)  # fmt: skip
    survivors = [r for r in rows if r["verdict"] == "survived"]
    if survivors:
        print(format_table([{k: r[k] for k in ("mutant", "verdict")} for r in survivors]))
    print(format_table(summary(rows)))
    kinds = Counter(r["verdict"].split(":")[0] for r in rows)
    print(f"verdicts: {dict(sorted(kinds.items()))}; {seconds:.0f} s")
    if args.json:
        Path(args.json).write_text(json.dumps(rows, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
