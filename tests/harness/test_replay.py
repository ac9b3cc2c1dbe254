"""The trace replay driver on hand-made records: sharing survives scaling, shared prefixes hit,
twin-only runs agree with lockstep and still check invariants."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from kvpool.config import PoolConfig
from kvpool.replay import (
    ReplaySettings,
    cache_footprint_tokens,
    replay_pool_sizes,
    replay_trace,
    scaled_prompt,
)
from kvpool.testing.factories import optimized_factory, reference_factory
from kvpool.testing.lockstep_driver import LockstepFailure
from kvpool.traces import (
    DATA_DIR,
    OUTPUT_TOKEN_LIMIT,
    SAMPLE_TRACE,
    VOCAB_SIZE,
    TraceError,
    TraceRecord,
    blocks_token_array,
    load_trace,
    trace_path,
)


def _record(hash_ids: tuple[int, ...], length: int, outputs: int = 3) -> TraceRecord:
    return TraceRecord(0, length, outputs, hash_ids)


def test_scaled_prompts_keep_the_block_sharing() -> None:
    a = scaled_prompt(_record((5, 6, 7), 1500), 16)
    b = scaled_prompt(_record((5, 6, 9), 1536), 16)
    assert len(a) == 47 and len(b) == 48  # ceil(1500 * 16 / 512), 3 * 16
    assert a[:32] == b[:32] and a[32:47] != b[32:47]
    assert scaled_prompt(_record((5,), 300), 512) == scaled_prompt(_record((5, 1), 300), 512)


@pytest.mark.slow
def test_repeated_prefixes_hit_the_cache() -> None:
    records = [_record((1, 2, 3 + i), 3 * 512) for i in range(8)]
    settings = ReplaySettings(pool_tokens=1024, page_size=4, block_tokens=16, concurrency=2)
    stats = replay_trace(records, settings, reference_factory, optimized_factory("torch"))
    assert stats.finished == 8 and stats.rejected == 0
    # The first two run together (nothing cached yet); each later one finds the first two
    # blocks (32 of its 48 tokens) inserted by a finished predecessor.
    assert stats.matched_tokens == 6 * 32
    assert stats.hit_ratio == 6 * 32 / (8 * 48)
    assert stats.invariant_checks > stats.steps > 0
    assert 0 < stats.peak_pages <= 1024 // 4


@pytest.mark.slow
def test_small_pool_evicts_and_rejects_what_never_fits() -> None:
    records = [_record((10 + i, 20 + i), 1024) for i in range(6)] + [_record((99,) * 9, 4600)]
    settings = ReplaySettings(pool_tokens=160, page_size=2, block_tokens=32, concurrency=3)
    stats = replay_trace(records, settings, reference_factory, reference_factory)
    assert stats.rejected == 1  # 288 tokens > 160-token pool
    assert stats.finished == 6
    assert stats.evicted_tokens > 0
    assert stats.peak_pages <= 80


@pytest.mark.slow
def test_twin_only_matches_lockstep_and_counts_requests() -> None:
    records = [_record((1, 2, 3 + i), 3 * 512) for i in range(6)] + [_record((99,) * 9, 4600)]
    settings = ReplaySettings(pool_tokens=128, page_size=4, block_tokens=16, concurrency=2)
    both = replay_trace(records, settings, reference_factory, optimized_factory("torch"))
    done: list[int] = []
    solo = replay_trace(records, settings, optimized_factory("torch"), None,
                        on_request=lambda: done.append(1))  # fmt: skip
    assert len(done) == len(records)  # one progress tick per request, rejected ones included
    assert solo.rejected == both.rejected == 1  # 144 prompt tokens + outputs > 128
    assert (solo.finished, solo.matched_tokens, solo.evicted_tokens, solo.peak_pages) == (
        both.finished, both.matched_tokens, both.evicted_tokens, both.peak_pages)  # fmt: skip
    assert solo.steps == both.steps and 0 < solo.invariant_checks < both.invariant_checks


@pytest.mark.slow
def test_twin_only_still_checks_invariants() -> None:
    def leaky(config: PoolConfig) -> Any:
        mm = reference_factory(config)
        alloc = mm.token_to_kv_pool_allocator
        free = alloc.free
        alloc.free = lambda slots: free(slots[1:])  # every free leaks its first slot
        return mm

    records = [_record((10 + i, 20 + i), 1024) for i in range(6)]
    settings = ReplaySettings(pool_tokens=96, page_size=1, block_tokens=32, concurrency=2)
    with pytest.raises(LockstepFailure) as failure:
        replay_trace(records, settings, leaky, None, ("leaky", ""))
    assert failure.value.detector.startswith("INV-") and "leaky" in str(failure.value)
    # Checks spaced out past the end of the run: the final state is still checked.
    rare = ReplaySettings(pool_tokens=96, page_size=1, block_tokens=32, check_every=10**6)
    with pytest.raises(LockstepFailure, match=r"\(end\)"):
        replay_trace(records, rare, leaky, None, ("leaky", ""))


def test_plot_pool_sizes_follow_the_trace() -> None:
    records = [_record((1, 2, 3 + i), 3 * 512) for i in range(8)]  # 10 distinct blocks
    settings = ReplaySettings(page_size=4, block_tokens=16, concurrency=2)
    # Peak demand: 48 prompt tokens + 3 outputs -> 52, plus a page per runner -> 60; the
    # footprint, 10 blocks of 16 tokens: 160. Four sizes evenly spaced on a log scale, in pages.
    assert cache_footprint_tokens(records, 16) == 160
    assert replay_pool_sizes(records, settings) == [60, 84, 116, 160]
    assert replay_pool_sizes(records, settings, points=2) == [60, 160]
    assert replay_pool_sizes(records[:1], settings) == [60]  # footprint 48 < demand


@pytest.mark.slow
@pytest.mark.parametrize("block_tokens", [16, 512])
def test_page_sizes_report_only_the_reuse_the_block_ids_contain(block_tokens: int) -> None:
    # Blocks 5 and 32005 (and 7 and 64007) spelled the same first token before: page size 1
    # then matched one token more than the ids share. B shares block 1 with A; C shares A's
    # blocks 1 and 2, whose end A cut 100 tokens into block 2 (A's outputs follow, and must not
    # match C's next tokens).
    bt = block_tokens
    a = _record((1, 5, 7), 1024 + 100)
    b = _record((1, 32005, 64007), 3 * 512)
    c = _record((1, 5, 7, 9), 4 * 512)
    cut = max(-(-(1024 + 100) * bt // 512), 1)  # A's scaled length
    shared = {1: bt, 2: cut}  # by the ids: B shares block 1, C all of A's prompt
    matched = {}
    for ps in (1, 16):
        settings = ReplaySettings(pool_tokens=4096, page_size=ps, block_tokens=bt, concurrency=1)
        stats = replay_trace([a, b, c], settings, reference_factory, optimized_factory("torch"))
        matched[ps] = stats.matched_tokens
        assert stats.finished == 3
    assert matched[1] == shared[1] + shared[2]
    assert matched[16] == shared[1] // 16 * 16 + shared[2] // 16 * 16
    assert matched[16] <= matched[1]


def test_block_tokens_differ_from_the_first_token_and_outputs_never_match() -> None:
    ids = (5, 32005, 64005, 7)
    tokens = blocks_token_array(ids).reshape(len(ids), 512)
    assert tokens[:, 0].tolist() == [VOCAB_SIZE + b for b in ids]  # markers: distinct ids
    assert int(tokens[:, 1:].min()) >= OUTPUT_TOKEN_LIMIT and int(tokens.max()) < 2**31


def test_trace_errors_name_the_path_as_typed(tmp_path: Path) -> None:
    with pytest.raises(TraceError, match=r"trace 'nodir/x\.jsonl': no such file$"):
        trace_path("nodir/x.jsonl")
    with pytest.raises(TraceError, match="names are looked up in"):
        trace_path("x.jsonl")
    bad = tmp_path / "t.jsonl"
    bad.write_text('{"timestamp": 0, "input_length": 3, "output_length": 1, "hash_ids": [-1]}')
    with pytest.raises(TraceError, match="line 1: negative output_length or a block id"):
        load_trace(str(bad))


def test_the_sample_ships_with_its_licence_notice() -> None:
    path = trace_path(SAMPLE_TRACE)
    assert path.parent == DATA_DIR and "Apache" in (DATA_DIR / "NOTICE").read_text()
    records = load_trace(SAMPLE_TRACE)
    assert len(records) == 400 and records[0].hash_ids[:2] == (0, 1)
