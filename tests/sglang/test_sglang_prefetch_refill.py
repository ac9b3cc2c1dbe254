"""Opt-in (``--run-sglang-wheel``): a storage prefetch's completion in SGLang 0.5.23's unified
tree, its tree core's own ``insert_host``, against kvpool's ``Rules.prefetch_refill ==
"refill"`` (``HiRadixCache._insert_helper_host`` of both twins under 0.5.23's preset).

Each case (``tests.reference.test_prefetch_refill.CASES``, where the twins agree on them)
builds the same tree on the reference and on SGLang's cache with its host tier
(``kvpool.sglang.unified_hicache``), reserves the fetched host slots as a prefetch's
storage hit does, completes the prefetch as ``UnifiedRadixCache._handle_prefetch_result`` does
(``insert_host`` below the anchor, then the first ``prefix_len`` fetched slots freed) and
evicts the device copies. On SGLang's Python tree core every node, slot and free list must
equal the reference's; the Rust core reports no host slots of nodes the adapter did not insert,
so there the freed count, the shape of the tree, the device eviction and the host pool's free
slots are compared. The 0.5.23 flow around this call (when it runs, locks, occupancy) is not
modelled yet: specs/unified_cache.md, "Not modelled yet"."""

from __future__ import annotations

from typing import Any

import pytest
import torch

from kvpool.sglang.implementation import implementation_with_host_tier
from kvpool.sglang.radix import to_sglang_key
from kvpool.snapshot import HostTierSnapshot
from kvpool.testing.implementations import reference_implementation
from tests.reference.test_prefetch_refill import CASES, _kvpool, _run

pytestmark = pytest.mark.sglang_wheel


def _sglang(tree: Any, anchor: Any, key: Any, fetched: Any) -> int:
    """``_handle_prefetch_result``'s tree part: ``insert_host`` below the anchor, its actions
    applied; returns ``prefix_len`` (the fetched slots to free)."""
    core = tree.impl.tree_core
    hashes = [f"page{i}" for i in range(len(key) // tree.page_size)]
    result = core.insert_host(int(anchor), to_sglang_key(tree.modules, key),
                              torch.as_tensor(fetched, dtype=torch.int64), hashes)  # fmt: skip
    tree.impl._apply_cache_actions(result.cache_actions)
    return len(fetched) if result.host_insert_dropped else int(result.prefix_len)


def _shape(snap: HostTierSnapshot) -> list[tuple[int, int | None, bool, int, bool]]:
    return [(n.node_id, n.parent_id, n.evicted, len(n.key), n.host_value is not None)
            for n in snap.tree.nodes]  # fmt: skip


@pytest.mark.parametrize("name", sorted(CASES))
def test_sglangs_python_tree_core_agrees(name: str) -> None:
    case = CASES[name]
    ref = _run(reference_implementation(), case, _kvpool)
    sgl = _run(implementation_with_host_tier("0.5.23", "python"), case, _sglang)
    assert (sgl.freed, sgl.evicted) == (ref.freed, ref.evicted)
    assert sgl.before == ref.before
    assert sgl.after == ref.after


@pytest.mark.parametrize("name", sorted(CASES))
def test_sglangs_rust_tree_core_agrees(name: str) -> None:
    case = CASES[name]
    ref = _run(reference_implementation(), case, _kvpool)
    sgl = _run(implementation_with_host_tier("0.5.23", "rust"), case, _sglang)
    assert (sgl.freed, sgl.evicted) == (ref.freed, ref.evicted)
    for mine, theirs in ((ref.before, sgl.before), (ref.after, sgl.after)):
        assert _shape(theirs) == _shape(mine)
        assert theirs.host.free_slots == mine.host.free_slots
        assert theirs.device.free_pages == mine.device.free_pages
