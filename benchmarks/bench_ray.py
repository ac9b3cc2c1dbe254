"""Ray against local worker processes: lockstep steps per CPU of the same campaign, back to back.

For each load (``idle``: nothing else started by this script; ``busy``: as many spinning
processes as the machine has CPUs, started before and stopped after each pair of runs), the
default campaign (``manager``, reference vs the optimized twin) runs for :data:`SECONDS` on
``--workers N`` (N = this machine's CPUs) and then on a private Ray cluster of N CPUs on the same
machine (``--ray local``), :data:`ROUNDS` times alternately. A row gives each side's steps per
second per CPU (the campaign's steps over its seconds and CPUs; Ray's seconds include its actors'
start-up, the local campaign's exclude its workers' start-up) and the ratio Ray / local, which the
issue's target puts at >= 0.9.

    python benchmarks/bench_ray.py [--quick]
"""

from __future__ import annotations

import argparse
import multiprocessing as mp
import os
import statistics
import sys
from typing import Any

from kvpool.testing.ray_connect import RayUnavailable, connect
from kvpool.testing.workers import CampaignSpec, run_parallel

SECONDS = 60.0
ROUNDS = 2
TARGET = 0.9


def _spin() -> None:
    while True:
        pass


def _spec(seed: int) -> CampaignSpec:
    return CampaignSpec("manager", "reference", "optimized[torch]", seed, 60,
                        ("reference", "optimized[torch]"))  # fmt: skip


def _local(seconds: float, cpus: int, seed: int) -> float:
    result = run_parallel(_spec(seed), seconds, cpus)
    return result.steps / result.seconds / cpus


def _ray(seconds: float, cpus: int, seed: int) -> float:
    from kvpool.testing.ray_campaign import run_ray

    cluster = connect("local", cpus)
    try:
        result, _ = run_ray(_spec(seed), seconds, cluster)
    finally:
        cluster.close()
    return result.steps / result.seconds / cpus


def run(quick: bool = False) -> list[dict[str, Any]]:
    """One row per load (see the module docstring)."""
    seconds, rounds = (15.0, 1) if quick else (SECONDS, ROUNDS)
    cpus = os.cpu_count() or 1
    rows: list[dict[str, Any]] = []
    for load in ("idle", "busy"):
        local: list[float] = []
        ray: list[float] = []
        for i in range(rounds):
            spinners = []
            if load == "busy":
                spinners = [mp.Process(target=_spin, daemon=True) for _ in range(cpus)]
                for p in spinners:
                    p.start()
            try:
                local.append(_local(seconds, cpus, seed=i))
                ray.append(_ray(seconds, cpus, seed=i))
            except RayUnavailable as exc:
                return [{"op": "ray vs local", "skipped": str(exc)}]
            finally:
                for p in spinners:
                    p.kill()
                    p.join()
        lo, ra = statistics.median(local), statistics.median(ray)
        rows.append({"op": f"manager campaign, {load}", "cpus": cpus, "seconds": seconds,
                     "local steps/s/CPU": round(lo), "ray steps/s/CPU": round(ra),
                     "ray/local": round(ra / lo, 2), "target": f">= {TARGET}"})  # fmt: skip
    return rows


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="15 s campaigns, one round")
    args = parser.parse_args(argv)
    for row in run(args.quick):
        print(row)
    return 0


if __name__ == "__main__":
    sys.exit(main())
