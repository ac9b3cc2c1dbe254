"""Reachability of a failing lifecycle trace through SGLang's scheduler glue
(:func:`kvpool.sglang.glue_manager.reachability`): a trace of glue steps is reachable, any
other step (kvpool's emulation: speculative steps, sessions, a direct eviction, layer loads)
or a deliberately invalid call makes it direct only, and so does a configuration the glue
does not drive; a reachable trace's sub-lists stay reachable (what shrinking keeps)."""

from __future__ import annotations

import itertools

from kvpool.config import PoolConfig
from kvpool.sglang.glue_manager import GLUE_STEPS, reachability
from kvpool.testing.swarm import Op

CONFIG = PoolConfig(size=64, page_size=4)


def test_glue_steps_are_reachable_and_sub_lists_stay_so() -> None:
    ops = [Op("new_req", ("r1", [1, 2, 3])), Op("extend", (["r1"],)), Op("decode", (["r1"], [4])),
           Op("retract", ("r1",)), Op("finish", (["r1"],))]  # fmt: skip
    assert reachability(CONFIG, ops).startswith("reachable")
    for n in range(len(ops)):
        for sub in itertools.combinations(ops, n):
            assert reachability(CONFIG, list(sub)).startswith("reachable")


def test_other_steps_and_invalid_calls_are_direct_only() -> None:
    base = [Op("new_req", ("r1", [1, 2, 3])), Op("extend", (["r1"],))]
    for name in ("spec_draft_v1", "open_session", "evict", "layer_read"):
        assert name not in GLUE_STEPS
        line = reachability(CONFIG, [*base, Op(name, ())])
        assert line == f"direct only: step 3 ({name}) is kvpool's emulation, not SGLang's glue"
    bad = reachability(CONFIG, [*base, Op("abort", ("gone",), expect_error=True)])
    assert bad == "direct only: step 3 (abort) is a deliberately invalid call"
    assert reachability(CONFIG, base, covered=False).startswith("direct only: this configuration")


def test_the_summary_lists_the_glue_that_ran_apart() -> None:
    from kvpool.testing.verify_run import coverage_lines

    lines = coverage_lines("manager", {"extend:ok": 2, "sglang:allocation.alloc_for_extend": 3})
    at = lines.index("  SGLang glue that ran (calls):")
    assert lines[at + 1].split() == ["allocation.alloc_for_extend", "3"]
    assert not any("sglang:" in line for line in lines)
    assert "  SGLang glue that ran (calls):" not in coverage_lines("manager", {"extend:ok": 2})
