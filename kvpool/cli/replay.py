"""``kvpool replay TRACE``: what does this workload get from this pool?

Replays the first ``--requests`` requests of a Mooncake trace (a file, or a name inside
``../shared/traces``) and prints the prefix-cache hit ratio, tokens evicted and peak pages in
use. Modes: ``lockstep`` (the default for one run) drives the reference and the optimized twin
together, compared at every step, every invariant checked; ``twin-only`` (``--twin-only``, and
the default of ``--compare-policies`` / ``--plot``, which run many replays) drives the twin
alone, its invariants still checked every ``--every`` steps; ``--lockstep`` forces lockstep.
``--compare-policies`` prints one row per eviction policy; ``--plot FILE.png`` draws the hit
ratio against pool size (``--plot-pools``, default four sizes derived from the trace's peak
demand, see :func:`kvpool.replay.replay_pool_sizes`) for each policy; a twin-only plot checks
invariants every :data:`PLOT_EVERY` steps unless ``--every`` says otherwise. A tqdm bar on stderr
(``--no-progress`` hides it) counts the requests of every run, the current run named.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

from kvpool.constants import EVICTION_POLICIES
from kvpool.replay import (
    ReplaySettings,
    ReplayStats,
    prepare_requests,
    replay_pool_sizes,
    replay_trace,
)
from kvpool.testing.factories import optimized_factory, reference_factory
from kvpool.traces import BLOCK_SIZE, load_trace

_EPILOG = """\
expected time (2 shared CPU cores, conversation_trace.jsonl, full 512-token blocks):
  lockstep (one run)            about 3 requests/s: --requests 30 ~11 s
  --twin-only                   ~2x faster than lockstep at equal --every
  --compare-policies (6 runs, twin only, every step checked)   --requests 200: ~4 min
  --plot (24 runs, twin only, invariants every 8 steps)        --requests 200: ~8 min
--lockstep about doubles the last two; a smaller --block-tokens scales a replay down.
"""

PLOT_EVERY = 8
"""Default ``--every`` of a twin-only ``--plot`` (6 policies x 4 pool sizes)."""

REJECTED_NOTE = (
    "rejected: requests that cannot fit the pool even when it is idle (prompt plus outputs, "
    "page-aligned, above the pool size); they are skipped and count as misses in the hit ratio"
)


def register(sub: Any) -> None:
    """Add the ``replay`` subcommand to ``sub`` (an argparse subparsers object)."""
    p = sub.add_parser(
        "replay",
        help="replay a real trace (lockstep or twin only) and report cache hits",
        epilog=_EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("trace", help="trace file, or a name in ../shared/traces")
    p.add_argument("--pool-tokens", type=int, default=65536, help="pool size in tokens")
    p.add_argument("--page-size", type=int, default=16)
    p.add_argument("--policy", choices=EVICTION_POLICIES, default="lru")
    p.add_argument("--requests", type=int, default=100, help="first K requests of the trace")
    p.add_argument("--concurrency", type=int, default=4, help="requests running at once")
    p.add_argument("--max-output", type=int, default=4, help="cap on output tokens (speed)")
    p.add_argument(
        "--block-tokens",
        type=int,
        default=BLOCK_SIZE,
        help="tokens kept of each 512-token block (smaller: a scaled-down replay)",
    )
    p.add_argument("--chunk-size", type=int, default=0, help="chunked prefill size (0: off)")
    p.add_argument(
        "--every",
        type=int,
        default=None,
        help="check invariants every N steps (default 1; 8 for a twin-only --plot)",
    )
    p.add_argument("--backend", choices=("torch", "interpret"), default="torch")
    mode = p.add_mutually_exclusive_group()
    mode.add_argument(
        "--twin-only",
        action="store_true",
        help="run the optimized twin alone (invariants still checked); fast, for real sizes",
    )
    mode.add_argument(
        "--lockstep",
        action="store_true",
        help="compare with the reference at every step even with --compare-policies/--plot",
    )
    p.add_argument("--compare-policies", action="store_true", help="one row per policy")
    p.add_argument("--plot", type=Path, default=None, help="PNG of hit ratio vs pool size")
    p.add_argument(
        "--plot-pools",
        type=int,
        nargs="*",
        default=None,
        help="pool sizes to plot (default: 4 sizes from the trace's peak demand)",
    )
    p.add_argument("--report", type=Path, default=None, help="write the rows as JSON")
    p.add_argument("--no-progress", action="store_true", help="no progress bar on stderr")
    p.set_defaults(func=run)


def _settings(args: argparse.Namespace, policy: str, pool_tokens: int) -> ReplaySettings:
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


def format_rows(rows: list[ReplayStats]) -> str:
    """One line per replay: policy, pool, hit ratio, evicted tokens, peak pages, requests."""
    head = (f"{'policy':<9} {'pool':>8} {'hit ratio':>9} {'evicted':>9} {'peak pages':>10} "
            f"{'finished':>8} {'rejected':>8} {'steps':>6} {'checks':>7} {'s':>6}")  # fmt: skip
    lines = [head, "-" * len(head)]
    for r in rows:
        lines.append(
            f"{r.policy:<9} {r.pool_tokens:>8} {r.hit_ratio:>9.4f} {r.evicted_tokens:>9} "
            f"{r.peak_pages:>10} {r.finished:>8} {r.rejected:>8} {r.steps:>6} "
            f"{r.invariant_checks:>7} {r.seconds:>6.1f}"
        )
    if any(r.rejected for r in rows):
        lines.append(REJECTED_NOTE)
    return "\n".join(lines)


def plot(rows: list[ReplayStats], path: Path) -> None:
    """Hit ratio against pool size, one line per policy (matplotlib, no display needed)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6, 4))
    for policy in sorted({r.policy for r in rows}):
        mine = sorted((r for r in rows if r.policy == policy), key=lambda r: r.pool_tokens)
        ax.plot([r.pool_tokens for r in mine], [r.hit_ratio for r in mine], marker="o",
                label=policy)  # fmt: skip
    ax.set_xlabel("pool size (tokens)")
    ax.set_ylabel("prefix-cache hit ratio")
    ax.set_title("hit ratio vs pool size")
    ax.legend()
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)


def run(args: argparse.Namespace) -> int:
    """Run the replays; 0 on success (a lockstep or invariant failure propagates with its
    report). Rows go to stdout as each run ends; the progress bar to stderr."""
    from tqdm import tqdm

    records = load_trace(args.trace, limit=args.requests)
    solo = twin_only(args)
    if args.every is None:  # a twin-only plot is 24 runs: space the checks out unless told
        args.every = PLOT_EVERY if (solo and args.plot is not None) else 1
    factory_b = optimized_factory(args.backend)
    policies = EVICTION_POLICIES if (args.compare_policies or args.plot) else (args.policy,)
    pools = [args.pool_tokens]
    if args.plot is not None:
        pools = args.plot_pools or replay_pool_sizes(records, _settings(args, "lru", 0))
    runs = [(policy, pool) for policy in policies for pool in pools]
    requests = prepare_requests(records, _settings(args, "lru", 0))  # same for every run
    mode = (f"twin only (optimized[{args.backend}], invariants every {args.every} step(s))"
            if solo else f"lockstep (reference vs optimized[{args.backend}])")  # fmt: skip
    print(f"trace {args.trace}: {len(records)} requests, page size {args.page_size}; "
          f"mode: {mode}; {len(runs)} run(s)", flush=True)  # fmt: skip
    bar = tqdm(total=len(runs) * len(records), unit="req", file=sys.stderr,
               disable=args.no_progress, dynamic_ncols=True, desc="replay")  # fmt: skip
    rows: list[ReplayStats] = []
    try:
        for k, (policy, pool) in enumerate(runs, 1):
            bar.set_description(f"run {k}/{len(runs)} {policy} pool={pool}")
            settings = _settings(args, policy, pool)
            if solo:
                row = replay_trace(records, settings, factory_b, None, ("optimized", ""),
                                   requests, lambda: bar.update())  # fmt: skip
            else:
                row = replay_trace(records, settings, reference_factory, factory_b,
                                   ("reference", "optimized"), requests,
                                   lambda: bar.update())  # fmt: skip
            rows.append(row)
    finally:
        bar.close()
    print(format_rows(rows))
    if args.plot is not None:
        plot(rows, args.plot)
        print(f"plot written to {args.plot}")
    if args.report is not None:
        args.report.write_text(json.dumps([r.to_json() for r in rows], indent=2) + "\n")
    return 0
