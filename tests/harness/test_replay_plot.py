"""The ``kvpool replay --plot`` figure: what it names, and how coinciding policies stay visible."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from kvpool.cli.replay_plot import curves, merged_labels, plot, title
from kvpool.replay import ReplayStats


def _row(policy: str, pool: int, matched: int) -> ReplayStats:
    return ReplayStats(policy, pool, 16, 10, prompt_tokens=100, matched_tokens=matched)


ROWS = [_row(p, n, m) for p, m0 in (("lru", 1), ("lfu", 1), ("mru", 3)) for n, m in
        ((4096, m0), (1024, m0 - 1))]  # fmt: skip


def test_curves_sort_by_pool_and_labels_mark_identical_policies() -> None:
    lines = curves(ROWS)
    assert lines["lru"] == [(1024, 0.0), (4096, 0.01)]
    assert merged_labels(lines) == {"lru": "lru", "lfu": "lfu (= lru)", "mru": "mru"}


def test_title_names_trace_requests_page_size_and_scale() -> None:
    assert title("/x/conversation_sample.jsonl", 400, 16, 16) == (
        "conversation_sample.jsonl: 400 requests, page size 16, 16 tokens per 512-token block"
    )
    assert title("t.jsonl", 5, 1, 512).endswith("page size 1, full prompts")


def test_plot_axes(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import matplotlib.pyplot as plt

    seen: list[Any] = []
    monkeypatch.setattr(plt, "close", seen.append)  # keep the figure to inspect it
    plot(ROWS, tmp_path / "hit.png", "t.jsonl", 10, 16, 16)
    assert (tmp_path / "hit.png").read_bytes()[:4] == b"\x89PNG"
    (ax,) = seen[0].axes
    assert ax.get_ylim()[0] == 0 and ax.get_xscale() == "log"
    assert "10 requests, page size 16" in ax.get_title()
    xs = [tuple(line.get_xdata()) for line in ax.get_lines()]
    assert len(set(xs)) == 3  # lru and lfu coincide in y, not in x: offset
    assert len({line.get_marker() for line in ax.get_lines()}) == 3
    plt.close(seen[0])
