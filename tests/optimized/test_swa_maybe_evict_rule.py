"""SGLang 0.5.16's window timing (``Rules.swa_window_release == "maybe_evict"``, set by
``Rules.for_sglang("0.5.16")``) in the torch twin's SWA lifecycle: the reference's worked
examples (tests/reference/test_swa_window_0516.py) on both twins, and the reference and the
twin in lockstep under 0.5.16's rules (specs/swa.md, "SGLang 0.5.16's window timing")."""

from __future__ import annotations

import dataclasses

import pytest

from kvpool.config import PoolConfig
from kvpool.invariants import check_all
from kvpool.optimized.lifecycle.swa_memory_manager import SWAMemoryManager as TwinSWAMemoryManager
from kvpool.reference.lifecycle.swa_memory_manager import SWAMemoryManager
from kvpool.rules import Rules
from kvpool.testing.campaign import run_machine
from kvpool.testing.implementations import optimized_implementation, reference_implementation

RULES = Rules.for_sglang("0.5.16")
MANAGERS = [SWAMemoryManager, TwinSWAMemoryManager]


@pytest.mark.parametrize("cls", MANAGERS)
def test_chunks_decodes_and_eagle_steps_slide_at_0_5_16s_times(cls: type) -> None:
    """Chunk cache, page 1, window 2, a 10-token prompt in chunks of 4, 4, 2: the later chunks
    slide at their prefix (cursors 2, 6); the first decode does not slide, the second does at
    its committed length (11: cursor 9); an EAGLE v2 step slides first too (12 committed:
    cursor 10)."""
    mm = cls(PoolConfig(size=64, page_size=1, disable_radix_cache=True, sliding_window=2,
                        rules=RULES))  # fmt: skip
    mm.new_req("a", list(range(1, 11)))
    got = []
    for chunk in (4, 4, None):
        mm.extend(["a"], [chunk])
        got.append(mm.snapshot().reqs[0].swa_evicted_seqlen)
    for token in (11, 12):
        mm.decode(["a"], [token])
        got.append(mm.snapshot().reqs[0].swa_evicted_seqlen)
    mm.spec_step(["a"], [[13]], 1)
    snap = mm.snapshot()
    check_all(snap)
    got.append(snap.reqs[0].swa_evicted_seqlen)
    assert got == [0, 2, 6, 6, 9, 10]
    mm.finish(["a"])
    snap = mm.snapshot()
    check_all(snap)
    assert snap.swa is not None and snap.swa.swa.available_size() == snap.swa.swa.size


def test_reference_and_twin_agree_under_the_0_5_16_rules() -> None:
    twin = dataclasses.replace(optimized_implementation("torch", checked=True), rules=RULES)
    result = run_machine("swa_manager", reference_implementation(), twin, 1e9, seed=16,
                         steps_per_run=60, max_runs=30)  # fmt: skip
    assert result.failure is None, result.failure and result.failure.report
    assert result.steps >= 30 * 40
    for tag in (
        "decode:window-slid",
        "spec_step:window-slid",
        "radix:tombstoned",
        "session:restore",
        "extend:chunked",
        "spec_step:ok",
    ):
        assert result.coverage.get(tag), (tag, dict(result.coverage))
