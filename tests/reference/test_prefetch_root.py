"""A prefetch that completes directly below the root: the new host-only node takes the root's
priority, which in SGLang is its floor (``ROOT_PRIORITY``, ``-sys.maxsize``: inserts raise the
nodes they enter, never the root), and the root itself is not touched (its access time stays;
a walk touches the nodes it enters, root excluded). Below another node the new node takes that
node's priority. Both twins; SGLang 0.5.16's own tree agrees
(tests/sglang/test_sglang_hiradix_storage.py)."""

from __future__ import annotations

from typing import Any

import pytest

from kvpool.config import PoolConfig
from kvpool.constants import ROOT_PRIORITY
from kvpool.rules import Rules
from kvpool.testing.bundle import Implementation
from kvpool.testing.implementations import optimized_implementation, reference_implementation
from kvpool.testing.machines.hiradix import HiRadixTarget
from kvpool.testing.swarm import Op

CONFIG = PoolConfig(size=16, page_size=2, eviction_policy="priority", hicache_ratio=1.0,
                    hicache_prefetch_threshold=2, hicache_storage=True,
                    rules=Rules.for_sglang("0.5.16"))  # fmt: skip
NO_KEY = (("extra_key", None),)


def fetched(impl: Implementation, *before: Op) -> Any:
    """The tree after ``before`` and a prefetch of [2, 3, 3, 1, 1, 2] run to its end (the
    tokens the tree holds already are not asked for; storage holds four)."""
    target = HiRadixTarget()
    side = target.build(impl, CONFIG)
    calls = [*before, Op("prefetch", ("r0", [2, 3, 3, 1, 1, 2]), NO_KEY),
             Op("storage_hit", ("r0", 4)), Op("prefetch_io", ("r0", 2)),
             Op("check_prefetch_progress", ("r0",))]  # fmt: skip
    outs = [target.call(side, op) for op in calls]
    assert outs[-4:] == [True, True, 4, True]
    return side.tree.host_snapshot().tree


@pytest.mark.parametrize("make", [reference_implementation, optimized_implementation])
def test_below_the_root_the_floor(make: Any) -> None:
    tree = fetched(make())
    root, node = tree.nodes
    assert node.evicted and node.key == (2, 3, 3, 1)
    assert node.priority == ROOT_PRIORITY
    assert root.last_access_time == 0.0 and node.last_access_time > 0.0


@pytest.mark.parametrize("make", [reference_implementation, optimized_implementation])
def test_below_a_node_its_priority(make: Any) -> None:
    """[2, 3] inserted with priority 0 and written through to host (its write acknowledged):
    the prefetch extends its host copy, and the fetched [3, 1, 1, 2] hangs below it."""
    tree = fetched(make(), Op("insert", ([2, 3],), NO_KEY), Op("writing_check", (8,)))
    [node] = [n for n in tree.nodes if n.evicted]
    parent = next(n for n in tree.nodes if n.node_id == node.parent_id)
    assert (parent.key, node.key) == ((2, 3), (3, 1, 1, 2))
    assert node.priority == parent.priority == 0
