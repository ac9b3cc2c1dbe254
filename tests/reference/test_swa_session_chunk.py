"""A prefill chunk after a session turn whose window slid, on the SWA radix tree of either twin.

Page 1, window 2: turn t1 (6 tokens) decodes twice, so its window cursor reaches 5 (slots of
tokens 1 to 5 hold no SWA KV any more); the session keeps the row; turn t2's first chunk is
cached between chunks. SGLang 0.5.16's ``SWARadixCache.cache_unfinished_req`` inserts a chunk
with cursor 0, which would put tokens 1 to 5 in the tree as live SWA although their SWA slots are
free (``INV-SWA-ACCOUNTING``); kvpool's lifecycle inserts the chunk with the request's cursor, as
a finish does, so they go in as a tombstone."""

from __future__ import annotations

from typing import Any

import pytest

import kvpool.optimized.lifecycle.swa_memory_manager as twin
import kvpool.reference.lifecycle.swa_memory_manager as ref
from kvpool.config import PoolConfig
from kvpool.invariants import check_all
from kvpool.rules import Rules


def _manager(side: str, rules: Rules) -> Any:
    config = PoolConfig(size=64, page_size=1, disable_radix_cache=False, sliding_window=2,
                        swa_full_tokens_ratio=0.8, rules=rules)  # fmt: skip
    return ref.SWAMemoryManager(config) if side == "reference" else twin.SWAMemoryManager(config)


@pytest.mark.parametrize("side", ["reference", "optimized"])
@pytest.mark.parametrize("rules", [Rules(), Rules.for_sglang("0.5.23")], ids=["default", "0.5.23"])
def test_a_chunk_after_a_slid_window_keeps_the_swa_accounting(side: str, rules: Rules) -> None:
    mm = _manager(side, rules)
    mm.open_session("s")
    mm.new_req("t1", [1, 2, 3, 4, 5, 6], session_id="s")
    mm.extend(["t1"])
    mm.decode(["t1"], [7])
    mm.decode(["t1"], [8])
    mm.finish(["t1"])
    mm.new_req("t2", [9, 10, 11, 12], session_id="s")
    mm.extend(["t2"], [2])
    snap = mm.snapshot()
    check_all(snap)
    assert snap.tree is not None
    tombstoned = [n.key for n in snap.tree.nodes[1:] if n.swa_tombstone]
    assert tombstoned and tombstoned[0][:5] == (1, 2, 3, 4, 5)
    mm.extend(["t2"])
    mm.finish(["t2"])
    mm.close_session("s")
    check_all(mm.snapshot())
