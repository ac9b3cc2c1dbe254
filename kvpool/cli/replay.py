"""``kvpool replay TRACE``: what does this workload get from this pool?

Replays the first ``--requests`` requests of a Mooncake trace (a file, or a name inside
``../shared/traces``) through the reference and the optimized twin in lockstep, every invariant
checked, and prints the prefix-cache hit ratio, tokens evicted and peak pages in use.
``--compare-policies`` prints one row per eviction policy; ``--plot FILE.png`` draws the hit
ratio against pool size (``--plot-pools``, default 1/4, 1/2, 1 and 2 times ``--pool-tokens``)
for each policy.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

from kvpool.constants import EVICTION_POLICIES
from kvpool.replay import ReplaySettings, ReplayStats, replay_trace
from kvpool.testing.factories import optimized_factory, reference_factory
from kvpool.traces import BLOCK_SIZE, load_trace


def register(sub: Any) -> None:
    """Add the ``replay`` subcommand to ``sub`` (an argparse subparsers object)."""
    p = sub.add_parser("replay", help="replay a real trace through both twins in lockstep")
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
    p.add_argument("--every", type=int, default=1, help="check invariants every N steps")
    p.add_argument("--backend", choices=("torch", "interpret"), default="torch")
    p.add_argument("--compare-policies", action="store_true", help="one row per policy")
    p.add_argument("--plot", type=Path, default=None, help="PNG of hit ratio vs pool size")
    p.add_argument("--plot-pools", type=int, nargs="*", default=None, help="pool sizes to plot")
    p.add_argument("--report", type=Path, default=None, help="write the rows as JSON")
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
        check_every=args.every,
    )


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
    """Run the replays; 0 on success (a lockstep failure propagates with its report)."""
    records = load_trace(args.trace, limit=args.requests)
    factory_b = optimized_factory(args.backend)
    policies = EVICTION_POLICIES if (args.compare_policies or args.plot) else (args.policy,)
    pools = [args.pool_tokens]
    if args.plot is not None:
        base = args.pool_tokens
        pools = args.plot_pools or sorted({max(base // 4, 1), max(base // 2, 1), base, 2 * base})
    rows = [
        replay_trace(records, _settings(args, policy, pool), reference_factory, factory_b)
        for policy in policies
        for pool in pools
    ]
    print(f"trace {args.trace}: {len(records)} requests, page size {args.page_size}")
    print(format_rows(rows))
    if args.plot is not None:
        plot(rows, args.plot)
        print(f"plot written to {args.plot}")
    if args.report is not None:
        args.report.write_text(json.dumps([r.to_json() for r in rows], indent=2) + "\n")
    return 0
