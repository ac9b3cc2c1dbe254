"""The trace replay driver on hand-made records: sharing survives scaling, shared prefixes hit."""

from __future__ import annotations

from kvpool.replay import ReplaySettings, replay_trace, scaled_prompt
from kvpool.testing.factories import optimized_factory, reference_factory
from kvpool.traces import TraceRecord


def _record(hash_ids: tuple[int, ...], length: int, outputs: int = 3) -> TraceRecord:
    return TraceRecord(0, length, outputs, hash_ids)


def test_scaled_prompts_keep_the_block_sharing() -> None:
    a = scaled_prompt(_record((5, 6, 7), 1500), 16)
    b = scaled_prompt(_record((5, 6, 9), 1536), 16)
    assert len(a) == 47 and len(b) == 48  # ceil(1500 * 16 / 512), 3 * 16
    assert a[:32] == b[:32] and a[32:47] != b[32:47]
    assert scaled_prompt(_record((5,), 300), 512) == scaled_prompt(_record((5, 1), 300), 512)


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


def test_small_pool_evicts_and_rejects_what_never_fits() -> None:
    records = [_record((10 + i, 20 + i), 1024) for i in range(6)] + [_record((99,) * 9, 4600)]
    settings = ReplaySettings(pool_tokens=160, page_size=2, block_tokens=32, concurrency=3)
    stats = replay_trace(records, settings, reference_factory, reference_factory)
    assert stats.rejected == 1  # 288 tokens > 160-token pool
    assert stats.finished == 6
    assert stats.evicted_tokens > 0
    assert stats.peak_pages <= 80
