"""``kvpool verify``: the lockstep campaign, kvpool's main job.

Phase 1 (half a second): the reference pools' seeded self-check (:mod:`kvpool.testing.selfcheck`).
Phase 2 (``--seconds``): a lockstep campaign of one machine (``--component``: the lifecycle
``manager`` or the ``allocator`` / ``req_to_token_pool`` / ``radix_cache`` / ``swa_allocator``
/ ``swa_radix_cache`` alone), the reference against a candidate (``--impl``: the optimized twin
by default, ``sglang[:SOURCE]`` for SGLang's own classes, or ``MODULE:NAME`` / ``path.py:NAME``),
every invariant checked after every step, in ``--workers`` processes so that a candidate that
crashes or hangs is a reported failure. Prints a summary with the coverage reached, and writes
it as JSON with ``--report`` (always, also after a failure or an internal error). Exit codes: 0
clean, 1 a failure, 2 bad usage.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import sys
from pathlib import Path
from typing import Any

COMPONENTS = (
    "manager",
    "allocator",
    "req_to_token_pool",
    "radix_cache",
    "swa_allocator",
    "swa_radix_cache",
)


def _positive_float(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a positive number, got {text!r}") from None
    if not math.isfinite(value) or value <= 0:
        raise argparse.ArgumentTypeError(f"expected a positive number, got {text!r}")
    return value


def _count(low: int) -> Any:
    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected an integer, got {text!r}") from None
        if value < low:
            raise argparse.ArgumentTypeError(f"expected an integer >= {low}, got {value}")
        return value

    return parse


def register(sub: Any) -> None:
    """Add the ``verify`` subcommand to ``sub`` (an argparse subparsers object)."""
    p = sub.add_parser(
        "verify",
        help="lockstep campaign: the reference against a candidate",
        description=__doc__.split("\n\n")[1] if __doc__ else None,
        formatter_class=argparse.ArgumentDefaultsHelpFormatter,
    )
    p.add_argument("--seconds", type=_positive_float, default=60.0, help="time budget")
    p.add_argument("--seed", type=_count(0), default=0, help="campaign seed")
    p.add_argument("--component", choices=COMPONENTS, default="manager",
                   help="the machine to run: the whole lifecycle or one component")  # fmt: skip
    p.add_argument("--impl", default=None,
                   help="candidate: optimized[BACKEND], sglang[:SOURCE], MODULE:NAME or "
                   "path.py:NAME (default: the optimized twin with --backend)")  # fmt: skip
    p.add_argument("--sglang", metavar="SOURCE", default=None,
                   help="shorthand for --impl sglang:SOURCE (a release such as 0.5.16, a source "
                   "path, or 'installed')")  # fmt: skip
    p.add_argument("--naive", action="store_true",
                   help="with SGLang: route alloc_extend through its naive (NPU) path")  # fmt: skip
    p.add_argument("--backend", choices=("torch", "interpret"), default="torch",
                   help="kernel backend of the optimized twin")  # fmt: skip
    p.add_argument(
        "--workers",
        type=_count(0),
        default=os.cpu_count() or 1,
        help="worker processes (0: run in this process, no crash protection)",
    )
    p.add_argument(
        "--step-timeout",
        type=_positive_float,
        default=60.0,
        help="seconds one step may take before the candidate counts as hung",
    )
    p.add_argument(
        "--interpret",
        action="store_true",
        help="run the candidate's Triton kernels through Triton's interpreter",
    )
    p.add_argument(
        "--checked",
        action="store_true",
        help="run them under kvpool's checked interpreter (implies --interpret)",
    )
    p.add_argument("--report", type=Path, default=None, help="write the JSON report here")
    p.add_argument("--steps-per-run", type=_count(1), default=60, help="steps per configuration")
    p.add_argument("--no-progress", action="store_true", help="hide the progress bar")
    p.set_defaults(func=run)


def _candidate(args: argparse.Namespace) -> str:
    if args.sglang is not None:
        spec = f"sglang:{args.sglang}"
    else:
        spec = args.impl or f"optimized[{args.backend}]"
    if args.naive and spec.startswith("sglang"):
        spec = (spec if ":" in spec else "sglang:0.5.16") + "+naive"
    return str(spec)


def _env(args: argparse.Namespace) -> tuple[tuple[str, str], ...]:
    env: list[tuple[str, str]] = []
    if args.interpret or args.checked:
        env.append(("TRITON_INTERPRET", "1"))
    if args.checked:
        env.append(("KVPOOL_CHECKED_INTERPRETER", "1"))
    return tuple(env)


def _fail_usage(message: str) -> int:
    print(f"kvpool verify: error: {message}", file=sys.stderr)
    return 2


def _check_report_path(path: Path | None) -> str | None:
    if path is None:
        return None
    parent = path.resolve().parent
    if not parent.is_dir():
        return f"--report {path}: directory {parent} does not exist"
    if not os.access(parent, os.W_OK) or path.is_dir():
        return f"--report {path}: cannot write there"
    return None


def run(args: argparse.Namespace) -> int:
    """Run both phases (see the module docstring)."""
    problem = _check_report_path(args.report)
    if problem:
        return _fail_usage(problem)
    candidate = _candidate(args)
    env = _env(args)
    for key, value in env:  # before anything imports triton (the in-process case)
        os.environ[key] = value
    from kvpool.testing.verify_run import VerifyOptions, verify

    options = VerifyOptions(
        component=args.component,
        candidate=candidate,
        seconds=args.seconds,
        seed=args.seed,
        steps_per_run=args.steps_per_run,
        workers=args.workers,
        step_timeout=args.step_timeout,
        env=env,
        progress=not args.no_progress,
    )
    outcome = verify(options)
    if outcome.usage_error:
        return _fail_usage(outcome.usage_error)
    print("\n".join(outcome.lines))
    if args.report is not None:
        args.report.write_text(json.dumps(outcome.payload, indent=2) + "\n")
        print(f"report written to {args.report}")
    return outcome.exit_code
