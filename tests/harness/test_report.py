"""The failure report's pieces: step lines, page map (owners, leaks, shared pages), tree, diff."""

from __future__ import annotations

from kvpool.snapshot import (
    AllocatorSnapshot,
    NodeSnapshot,
    PoolSnapshot,
    ReqSnapshot,
    ReqToTokenSnapshot,
    SessionSnapshot,
    TreeSnapshot,
)
from kvpool.testing import report
from kvpool.testing.swarm import Op


def _snapshot(free_pages: tuple[int, ...]) -> PoolSnapshot:
    """Page size 2, pages 1..5: page 1 in node 1, page 2 held by r1, page 3 by session s1."""
    root = NodeSnapshot(0, None, (), None, (), 1, (1,), ((7, 8),), 0.0)
    node = NodeSnapshot(1, 0, (7, 8), None, (2, 3), 0, (), (), 3.0)
    req = ReqSnapshot("r1", "running", 1, 3, 0, 2, 3, 3, 2, 0, 1, None, None, row=(2, 3, 4))
    session = SessionSnapshot("s1", 2, 1, 2, 0, None, row=(6, 7))
    return PoolSnapshot(
        allocator=AllocatorSnapshot(2, 5, 10, free_pages, (), False),
        req_to_token=ReqToTokenSnapshot(2, 8, (), (0, 1, 1)),
        tree=TreeSnapshot(2, False, "lru", 2, 0, (root, node)),
        reqs=(req,),
        sessions=(session,),
        max_total_num_tokens=10,
    )


def test_step_line_is_readable_and_cut() -> None:
    op = Op("extend", (["r1", "r2"],), (("chunk_sizes", [None, 8]),))
    line = report.format_step(3, op.render(), report.short(list(range(5, 30))))
    assert line.startswith("step 3: extend(['r1', 'r2'], chunk_sizes=[None, 8]) -> [5, 6, 7,")
    assert line.endswith(", ...]")


def test_invalid_op_is_marked() -> None:
    assert "invalid on purpose" in Op("abort", ("ghost1",), expect_error=True).render()


def test_page_map_names_every_owner() -> None:
    owners = report.page_owners(_snapshot(free_pages=(4, 5)))
    assert owners == {1: ["node 1"], 2: ["req r1"], 3: ["session s1"], 4: ["free"], 5: ["free"]}


def test_page_map_flags_leaks_and_shared_pages() -> None:
    text = report.render_page_map(_snapshot(free_pages=(2, 4)))
    assert "page 2 (slots 4-5): SHARED: req r1, free" in text
    assert "page 5 (slots 10-11): LEAKED" in text


def test_tree_rendering_shows_ids_locks_and_keys() -> None:
    text = report.render_tree(_snapshot(free_pages=(4, 5)).tree)
    assert "node 1 key=[7, 8] value=[2, 3] lock=0" in text


def test_first_difference_gives_the_path() -> None:
    found = report.first_difference(_snapshot((4, 5)), _snapshot((5, 4)))
    assert found == ("snapshot.allocator.free_pages", (4, 5), (5, 4))
    assert report.first_difference(_snapshot((4, 5)), _snapshot((4, 5))) is None


def test_normalize_turns_tensors_and_tuples_into_lists() -> None:
    import torch

    assert report.normalize((torch.tensor([1, 2]), 3, None)) == [[1, 2], 3, None]


def test_whole_report_names_the_failing_step_and_shows_each_side() -> None:
    snap = _snapshot(free_pages=(2, 4))
    steps = [
        report.format_step(1, "new_req('r1', [7, 8])", "None"),
        "step 2: extend(['r1']) -> [2]",
    ]
    text = report.build_report(
        "INV-X", steps, "cand: broken", [("ref", snap, None), ("cand", snap, "#0 pretty")], "CFG"
    )
    lines = text.splitlines()
    assert lines[:3] == [
        "=== kvpool lockstep failure: INV-X ===",
        "config: CFG",
        "minimal trace (2 steps):",
    ]
    assert "failed after step 2: cand: broken" in lines
    assert "--- ref: radix tree ---" in lines and "--- cand: page map ---" in lines
    assert lines[lines.index("--- cand: radix tree ---") + 1] == "#0 pretty"  # its own printer
    assert "page 5 (slots 10-11): LEAKED" in text
    assert "failed before the first step: x" in report.build_report("T", [], "x", [])
