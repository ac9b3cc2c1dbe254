"""The ``kvpool replay --plot`` figure: prefix-cache hit ratio against pool size, per policy.

Made to be read honestly: the title names the trace, the request count, the page size and the
block scaling; the y axis starts at 0 (a flat line looks flat); the pool axis is logarithmic
(sizes double); and policies whose curves coincide stay visible: each has its own marker and
line style, drawn with a small horizontal offset (a few percent of a doubling, stated under the
axis), and the legend marks a policy whose points equal an earlier one's (``lfu (= lru)``).
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from kvpool.replay import ReplayStats

MARKERS = ("o", "s", "^", "v", "D", "x")
STYLES = ("-", "--", "-.", ":", (0, (5, 1)), (0, (1, 1)))
OFFSET = 0.025
"""Horizontal shift between consecutive policies, as a fraction of the pool size (log axis)."""


def curves(rows: list[ReplayStats]) -> dict[str, list[tuple[int, float]]]:
    """Per policy (first-seen order), its ``(pool tokens, hit ratio)`` points by pool size."""
    out: dict[str, list[tuple[int, float]]] = {}
    for r in rows:
        out.setdefault(r.policy, []).append((r.pool_tokens, r.hit_ratio))
    return {p: sorted(points) for p, points in out.items()}


def merged_labels(lines: dict[str, list[tuple[int, float]]]) -> dict[str, str]:
    """Legend label per policy: its name, followed by ``(= lru)`` when its points are identical
    to those of an earlier policy (its line then lies under that one, offset)."""
    groups: dict[tuple[tuple[int, float], ...], list[str]] = {}
    for policy, points in lines.items():
        groups.setdefault(tuple((n, round(h, 6)) for n, h in points), []).append(policy)
    labels: dict[str, str] = {}
    for members in groups.values():
        labels[members[0]] = members[0]
        labels.update({m: f"{m} (= {members[0]})" for m in members[1:]})
    return labels


def title(trace: str, requests: int, page_size: int, block_tokens: int) -> str:
    """What was replayed, in one line."""
    scale = "full prompts" if block_tokens >= 512 else f"{block_tokens} tokens per 512-token block"
    return f"{Path(trace).name}: {requests} requests, page size {page_size}, {scale}"


def plot(rows: list[ReplayStats], path: Path, trace: str, requests: int, page_size: int,
         block_tokens: int) -> None:  # fmt: skip
    """Write the figure to ``path`` (format from its suffix; matplotlib, no display needed)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    lines = curves(rows)
    labels = merged_labels(lines)
    fig, ax = plt.subplots(figsize=(7, 4.5))
    middle = (len(lines) - 1) / 2
    for k, (policy, points) in enumerate(lines.items()):
        shift = (1 + OFFSET) ** (k - middle)
        ax.plot([n * shift for n, _ in points], [h for _, h in points],
                marker=MARKERS[k % len(MARKERS)], linestyle=STYLES[k % len(STYLES)],
                markersize=7, markerfacecolor="none", linewidth=1.5,
                label=labels[policy])  # fmt: skip
    ax.set_xscale("log", base=2)
    pools = sorted({n for points in lines.values() for n, _ in points})
    ax.set_xticks(pools, [f"{n:,}" for n in pools], rotation=20)
    ax.minorticks_off()
    top = max((h for points in lines.values() for _, h in points), default=0.0)
    ax.set_ylim(0, max(top * 1.15, 0.05))
    ax.set_xlabel(f"pool size (tokens, log scale; policies offset by {OFFSET:.1%} to stay visible)")
    ax.set_ylabel("prefix-cache hit ratio")
    ax.set_title(title(trace, requests, page_size, block_tokens), fontsize=10)
    ax.grid(True, alpha=0.3)
    ax.legend(title="eviction policy", fontsize=8)
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)
