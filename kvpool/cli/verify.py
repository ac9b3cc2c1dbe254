"""``kvpool verify``: the lockstep campaign, kvpool's main job.

Phase 1 (half a second): the reference pools' seeded self-check
(:mod:`kvpool.testing.selfcheck`: table and allocators against a simple model, every page size).
Phase 2 (``--seconds``): the lockstep campaign, the reference against the optimized twin (or,
with ``--impl MODULE:FACTORY``, against any factory ``(PoolConfig) -> MemoryManagerProtocol``)
across the configuration swarm, every invariant checked after every step, with a progress bar.
Prints a summary (configurations, steps, invariant checks, failures, steps per second) and
writes it as JSON with ``--report``. On a failure it prints the shrunk trace report and exits 1.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import sys
from typing import TYPE_CHECKING, Any

from kvpool.cli.args import add_parser, callable_spec, output_path, positive_float, positive_int

if TYPE_CHECKING:
    from kvpool.testing.campaign import CampaignResult


def register(sub: Any) -> None:
    """Add the ``verify`` subcommand to ``sub`` (an argparse subparsers object)."""
    p = add_parser(sub, "verify", help="lockstep campaign: reference vs optimized (or --impl)",
                   description=__doc__)  # fmt: skip
    p.add_argument(
        "--seconds",
        type=positive_float,
        default=60.0,
        help="time budget of the campaign, in seconds",
    )
    p.add_argument("--seed", type=int, default=0, help="campaign seed (any integer)")
    p.add_argument(
        "--report",
        type=output_path,
        default=None,
        metavar="FILE.json",
        help="also write the JSON report here (default: none)",
    )
    p.add_argument(
        "--impl",
        type=callable_spec,
        default=None,
        metavar="MODULE:FACTORY",
        help="verify this factory (PoolConfig -> manager; MODULE:NAME or "
        "path/to/file.py:NAME) against the reference (default: the optimized twin)",
    )
    p.add_argument(
        "--backend",
        choices=("torch", "interpret"),
        default="torch",
        help="kernel backend of the optimized twin",
    )
    p.add_argument(
        "--steps-per-run", type=positive_int, default=60, help="lockstep steps per configuration"
    )
    p.add_argument("--no-progress", action="store_true", help="hide the progress bar")
    p.set_defaults(func=run)


def summary_lines(result: CampaignResult, candidate: str) -> list[str]:
    """The human summary printed at the end."""
    return [
        f"kvpool verify: reference vs {candidate}, seed {result.seed}",
        f"  configurations   {result.configurations}",
        f"  steps            {result.steps}",
        f"  invariant checks {result.invariant_checks}",
        f"  failures         {result.failures}",
        f"  seconds          {result.seconds:.1f}",
        f"  steps per second {result.steps_per_second:.0f}",
    ]


SELF_CHECK_SECONDS = 0.5
"""Budget of phase 1 (it always runs every page size once, with and without ``need_sort``
as time allows)."""


def run(args: argparse.Namespace) -> int:
    """Run both phases; exit code 0 when nothing failed, 1 on a failure, 2 for a bad ``--impl``."""
    from kvpool.testing import selfcheck
    from kvpool.testing.campaign import run_campaign
    from kvpool.testing.factories import load_factory, optimized_factory, reference_factory

    if args.impl:
        try:
            candidate, factory_b = args.impl, load_factory(args.impl)
        except Exception as exc:  # any failure of the user's import is bad input
            print(f"kvpool: error: verify: cannot load --impl {args.impl}: {exc}", file=sys.stderr)
            return 2
    else:
        candidate, factory_b = f"optimized[{args.backend}]", optimized_factory(args.backend)
    try:
        pools = selfcheck.run_campaign(SELF_CHECK_SECONDS, args.seed)
    except selfcheck.SelfCheckFailure as exc:
        print(f"kvpool verify: reference self-check failed: {exc}")
        return 1
    print(f"reference self-check: {pools.configurations} configurations, {pools.steps} steps, "
          f"{pools.invariant_checks} invariant checks, 0 failures")  # fmt: skip
    bar: Any = None
    if not args.no_progress:
        from tqdm import tqdm

        bar = tqdm(
            total=round(args.seconds, 1),
            unit="s",
            desc="verify",
            file=sys.stderr,
            bar_format="{l_bar}{bar}| {n:.1f}/{total:.1f}s {postfix}",
            mininterval=0.5,
        )

    def progress(elapsed: float, steps: int) -> None:
        if bar is not None:
            bar.n = min(round(elapsed, 1), bar.total)
            bar.set_postfix_str(f"{steps} steps", refresh=False)
            bar.update(0)  # redraws at most every mininterval, not once per configuration

    try:
        result = run_campaign(
            reference_factory,
            factory_b,
            args.seconds,
            args.seed,
            args.steps_per_run,
            ("reference", candidate),
            progress,
        )
    finally:
        if bar is not None:
            bar.close()
    if result.failure is not None:
        print(result.failure.report)
    print("\n".join(summary_lines(result, candidate)))
    if args.report is not None:
        payload = result.to_json()
        payload["candidate"] = candidate
        payload["self_check"] = dataclasses.asdict(pools)
        args.report.write_text(json.dumps(payload, indent=2) + "\n")
        print(f"report written to {args.report}")
    return 1 if result.failures else 0
