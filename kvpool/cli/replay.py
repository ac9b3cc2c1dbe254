"""``kvpool replay [TRACE]``: what does this workload get from this pool?

Replays the first ``--requests`` requests of a Mooncake trace and prints, per run, the
prefix-cache hit ratio, tokens evicted and peak pages in use, one row as each run ends. Without
TRACE it replays ``conversation_sample.jsonl``, the 400-request sample shipped in ``kvpool/data``;
a name is looked up there, then in the folder ``$KVPOOL_TRACES`` names (the full traces).

Modes: ``lockstep`` (the default for one run) drives the reference and the optimized twin
together, compared at every step, every invariant checked; ``twin-only`` (``--twin-only``, and
the default of ``--compare-policies`` / ``--plot``, which run many replays) drives the twin
alone, its invariants still checked every ``--every`` steps; ``--lockstep`` forces lockstep.
``--compare-policies`` prints one row per eviction policy; ``--plot FILE.png`` runs every policy
at several pool sizes (``--plot-pools``, default four sizes from the trace's peak demand to its
cache footprint, see :func:`kvpool.replay.replay_pool_sizes`) and draws hit ratio against pool
size (:mod:`kvpool.cli.replay_plot`). A tqdm bar on stderr (``--no-progress`` hides it) counts
the requests of every run, the current run named.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any

from kvpool.cli.args import (
    add_parser,
    check_checked_env,
    fail,
    non_negative_int,
    output_path,
    plot_path,
    positive_int,
    power_of_two,
)
from kvpool.constants import EVICTION_POLICIES

if TYPE_CHECKING:
    from kvpool.replay import ReplaySettings, ReplayStats
    from kvpool.traces import TraceRecord

DEFAULT_TRACE = "conversation_sample.jsonl"
"""The trace shipped in ``kvpool/data`` (:data:`kvpool.traces.SAMPLE_TRACE`)."""

DEFAULT_BLOCK_TOKENS = 16
"""``--block-tokens`` default: a 32x scaled-down replay (same sharing), seconds not minutes."""

FULL_BLOCK_TOKENS = 512
"""Tokens per Mooncake block (:data:`kvpool.traces.BLOCK_SIZE`): ``--block-tokens`` at most."""

_EPILOG = """\
expected time (2 shared CPU cores, the default sample, 400 requests, --block-tokens 16):
  one run (lockstep)                          ~3 min
  --compare-policies (6 runs, twin only)      ~2.5 min
  --plot (24 runs, twin only)                 ~10 min
--block-tokens 512 replays the full prompts (~12,000 tokens each, 30x slower); the full traces
are not shipped: pass a path, or put them in a folder named by $KVPOOL_TRACES.
"""

MANY_RUNS_EVERY = 8
"""Default ``--every`` of a twin-only ``--compare-policies`` or ``--plot`` (6 or 24 runs)."""

REJECTED_NOTE = (
    "rejected: requests that cannot fit the pool even when it is idle (prompt plus outputs, "
    "page-aligned, above the pool size); they are skipped and count as misses in the hit ratio"
)

ROW_HEAD = (f"{'policy':<9} {'pool':>8} {'hit ratio':>9} {'evicted':>9} {'peak pages':>10} "
            f"{'finished':>8} {'rejected':>8} {'steps':>6} {'checks':>7} {'s':>6}")  # fmt: skip


def register(sub: Any) -> None:
    """Add the ``replay`` subcommand to ``sub`` (an argparse subparsers object)."""
    p = add_parser(sub, "replay", help="replay a real trace through the pool; report cache hits",
                   description=__doc__, epilog=_EPILOG)  # fmt: skip
    p.add_argument("trace", nargs="?", default=DEFAULT_TRACE,
                   help="trace file path, or a name in kvpool/data or $KVPOOL_TRACES")  # fmt: skip
    p.add_argument(
        "--requests",
        type=positive_int,
        default=400,
        help="replay the first N requests of the trace",
    )
    p.add_argument(
        "--pool-tokens",
        type=positive_int,
        default=65536,
        help="pool size in tokens (rounded down to whole pages)",
    )
    p.add_argument("--page-size", type=power_of_two, default=16, help="tokens per page")
    p.add_argument(
        "--policy", choices=EVICTION_POLICIES, default="lru", help="eviction policy of a single run"
    )
    p.add_argument("--concurrency", type=positive_int, default=4, help="requests running at once")
    p.add_argument(
        "--max-output",
        type=positive_int,
        default=4,
        help="cap on each request's output tokens (decode steps; speed)",
    )
    p.add_argument("--block-tokens", type=positive_int, default=DEFAULT_BLOCK_TOKENS,
                   help=f"tokens kept of each {FULL_BLOCK_TOKENS}-token block, 1 to "
                   f"{FULL_BLOCK_TOKENS} ({FULL_BLOCK_TOKENS}: full prompts; less: a "
                   "scaled-down replay with the same sharing)")  # fmt: skip
    p.add_argument("--chunk-size", type=non_negative_int, default=0,
                   help="chunked prefill: at most N prompt tokens per extend (0: off, whole "
                   "prompts)")  # fmt: skip
    p.add_argument("--every", type=positive_int, default=None,
                   help="check invariants every N steps (default: 1 for one run, "
                   f"{MANY_RUNS_EVERY} for a twin-only --compare-policies or --plot)")  # fmt: skip
    p.add_argument(
        "--backend",
        choices=("torch", "interpret"),
        default="torch",
        help="kernel backend of the optimized twin",
    )
    mode = p.add_mutually_exclusive_group()
    mode.add_argument(
        "--twin-only",
        action="store_true",
        help="run the optimized twin alone (invariants still checked; fast)",
    )
    mode.add_argument("--lockstep", action="store_true",
                      help="compare with the reference at every step, even with "
                      "--compare-policies or --plot")  # fmt: skip
    p.add_argument(
        "--compare-policies", action="store_true", help="one run per eviction policy, one row each"
    )
    p.add_argument("--plot", type=plot_path, default=None, metavar="FILE.png",
                   help="every policy at several pool sizes, drawn as hit ratio vs pool size "
                   "(default: no plot)")  # fmt: skip
    p.add_argument("--plot-pools", type=positive_int, nargs="+", default=None, metavar="TOKENS",
                   help="pool sizes of --plot (default: 4 sizes from the trace's peak demand to "
                   "its cache footprint)")  # fmt: skip
    p.add_argument(
        "--report",
        type=output_path,
        default=None,
        metavar="FILE.json",
        help="also write the rows as JSON (default: none)",
    )
    p.add_argument("--no-progress", action="store_true", help="no progress bar on stderr")
    p.set_defaults(func=run)


def _settings(args: argparse.Namespace, policy: str, pool_tokens: int) -> ReplaySettings:
    from kvpool.replay import ReplaySettings

    return ReplaySettings(
        pool_tokens=pool_tokens,
        page_size=args.page_size,
        policy=policy,
        concurrency=args.concurrency,
        max_output=args.max_output,
        block_tokens=args.block_tokens,
        chunk_size=args.chunk_size,
        check_every=args.every or 1,
    )


def twin_only(args: argparse.Namespace) -> bool:
    """The mode: twin alone when asked, or by default for the many-run ``--compare-policies``
    and ``--plot`` (``--lockstep`` overrides); lockstep otherwise."""
    many = bool(args.compare_policies or args.plot is not None)
    return bool(args.twin_only or (many and not args.lockstep))


def format_row(r: ReplayStats) -> str:
    """One line of the table (columns of :data:`ROW_HEAD`)."""
    return (f"{r.policy:<9} {r.pool_tokens:>8} {r.hit_ratio:>9.4f} {r.evicted_tokens:>9} "
            f"{r.peak_pages:>10} {r.finished:>8} {r.rejected:>8} {r.steps:>6} "
            f"{r.invariant_checks:>7} {r.seconds:>6.1f}")  # fmt: skip


def format_rows(rows: list[ReplayStats]) -> str:
    """The whole table: head, rule, one line per replay, the rejection note if any."""
    lines = [ROW_HEAD, "-" * len(ROW_HEAD), *map(format_row, rows)]
    if any(r.rejected for r in rows):
        lines.append(REJECTED_NOTE)
    return "\n".join(lines)


def validate(args: argparse.Namespace) -> None:
    """Checks that need several arguments or the environment; :class:`CLIError` before work."""
    if args.block_tokens > FULL_BLOCK_TOKENS:
        fail(f"replay: --block-tokens {args.block_tokens}: expected 1 to {FULL_BLOCK_TOKENS}")
    if args.pool_tokens < args.page_size:
        fail(f"replay: --pool-tokens {args.pool_tokens}: expected at least one page "
             f"(--page-size {args.page_size})")  # fmt: skip
    if args.plot_pools is not None and args.plot is None:
        fail("replay: --plot-pools needs --plot FILE.png")
    for pool in args.plot_pools or ():
        if pool < args.page_size:
            fail(f"replay: --plot-pools {pool}: expected at least one page ({args.page_size})")
    if args.plot is not None:
        import importlib.util

        if importlib.util.find_spec("matplotlib") is None:
            fail("replay: --plot needs matplotlib (pip install 'kvpool[plot]')")


def load_records(args: argparse.Namespace) -> list[TraceRecord]:
    """The first ``--requests`` records; a missing or malformed trace is a :class:`CLIError`."""
    from kvpool.traces import TraceError, load_trace

    try:
        records = load_trace(args.trace, limit=args.requests)
    except TraceError as exc:
        fail(f"replay: {exc}")
    if not records:
        fail(f"replay: trace {args.trace!r} holds no request")
    return records


def run(args: argparse.Namespace) -> int:
    """Run the replays; 0 on success, 1 when a lockstep comparison or an invariant fails (the
    report is printed). Rows go to stdout as each run ends; the progress bar to stderr."""
    check_checked_env("replay")
    validate(args)
    records = load_records(args)
    from tqdm import tqdm

    from kvpool.replay import prepare_requests, replay_pool_sizes, replay_trace
    from kvpool.testing.factories import optimized_factory, reference_factory
    from kvpool.testing.lockstep_driver import LockstepFailure

    solo = twin_only(args)
    many = bool(args.compare_policies or args.plot is not None)
    if args.every is None:
        args.every = MANY_RUNS_EVERY if (solo and many) else 1
    factory_b = optimized_factory(args.backend)
    policies = EVICTION_POLICIES if many else (args.policy,)
    pools = [args.pool_tokens]
    if args.plot is not None:
        pools = args.plot_pools or replay_pool_sizes(records, _settings(args, "lru", 0))
    runs = [(policy, pool) for policy in policies for pool in pools]
    requests = prepare_requests(records, _settings(args, "lru", 0))  # same for every run
    mode = (f"twin only (optimized[{args.backend}], invariants every {args.every} step(s))"
            if solo else f"lockstep (reference vs optimized[{args.backend}])")  # fmt: skip
    print(f"trace {args.trace}: {len(records)} requests, page size {args.page_size}, "
          f"{args.block_tokens} tokens per block; mode: {mode}; {len(runs)} run(s)")  # fmt: skip
    print(f"{ROW_HEAD}\n{'-' * len(ROW_HEAD)}", flush=True)
    bar = tqdm(total=len(runs) * len(records), unit="req", file=sys.stderr,
               disable=args.no_progress, dynamic_ncols=True, desc="replay")  # fmt: skip
    rows: list[ReplayStats] = []
    try:
        for k, (policy, pool) in enumerate(runs, 1):
            bar.set_description(f"run {k}/{len(runs)} {policy} pool={pool}")
            settings = _settings(args, policy, pool)
            tick = lambda: bar.update()  # noqa: E731
            if solo:
                row = replay_trace(records, settings, factory_b, None, ("optimized", ""),
                                   requests, tick)  # fmt: skip
            else:
                row = replay_trace(records, settings, reference_factory, factory_b,
                                   ("reference", "optimized"), requests, tick)  # fmt: skip
            rows.append(row)
            bar.write(format_row(row), file=sys.stdout)
            sys.stdout.flush()
    except LockstepFailure as failure:
        bar.close()
        print(f"replay failed: {failure}")
        return 1
    finally:
        bar.close()
    if any(r.rejected for r in rows):
        print(REJECTED_NOTE)
    if args.plot is not None:
        from kvpool.cli.replay_plot import plot

        plot(rows, args.plot, args.trace, len(records), args.page_size, args.block_tokens)
        print(f"plot written to {args.plot}")
    if args.report is not None:
        Path(args.report).write_text(json.dumps([r.to_json() for r in rows], indent=2) + "\n")
        print(f"report written to {args.report}")
    return 0
