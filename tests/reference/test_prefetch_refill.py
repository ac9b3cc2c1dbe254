"""A storage prefetch that completes through a device node with no host copy (another request
inserted it after the prefetch started) would hang the fetched suffix below it as a host-only
child: a gap in the backed-up prefix that write-through keeps from the root. kvpool's rules drop
that refill (``Rules.prefetch_refill == "drop"``: its host slots freed with the duplicates', as
SGLang's fix sgl-project/sglang#31902 does when nothing is refilled); SGLang 0.5.16 attaches it
(``"attach"``), and evicting the node's other children then promotes the node, whose deletion
asserts a leaf: the scheduler dies (specs/sglang_findings.md). The hiradix machine does not
drive that preset into an eviction there. (Found by ``kvpool verify --rules 0.5.16 --component
hiradix_cache --seed 20261207``, run 1043.) SGLang 0.5.23's tree cores refill (``"refill"``):
the device node takes the fetched slots of its tokens as its host copy and the rest hangs below
it; :data:`CASES` are the completions tests/sglang/test_sglang_prefetch_refill.py also runs
through SGLang's own ``insert_host``.
"""

from __future__ import annotations

import random
from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import Any

import pytest

from kvpool.config import PoolConfig
from kvpool.rules import Rules
from kvpool.snapshot import HostTierSnapshot
from kvpool.testing.bundle import Implementation
from kvpool.testing.implementations import (
    following_release,
    optimized_implementation,
    reference_implementation,
    resolve_implementation,
)
from kvpool.testing.machines.hiradix import HiRadixTarget, coarse_host_tier
from kvpool.testing.runs import execute
from kvpool.testing.swarm import Op, RandomChooser

OLD = Rules.for_sglang("0.5.16")

TRACE = [
    Op("prefetch", (0, [1, 2, 2, 2, 3, 3, 3, 1, 1, 1, 1, 1]), (("extra_key", "a"),)),
    Op("storage_hit", (1, 12)),
    Op("insert", ([1, 2, 2, 2, 1, 2, 3, 1],), (("extra_key", None),)),
    Op("prefetch_io", (1, 3)),
    Op("check_prefetch_progress", (1,)),
    Op("evict", (7,)),
]
"""The shrunk trace, as the machine draws it (a request is named by its index among the
prefetching ones): the prefetch holds the whole host pool (two pages), so the insert's nodes
get no host copy; the two fetched pages complete through node [1, 2, 2, 2] (its host copy freed
as a duplicate) and attach [3, 3, 3, 1] below it, host-only; the eviction frees node
[1, 2, 3, 1] and promotes its parent."""

CALLS = [
    Op("prefetch", ("r0", [1, 2, 2, 2, 3, 3, 3, 1, 1, 1, 1, 1]), (("extra_key", "a"),)),
    Op("storage_hit", ("r0", 12)),
    Op("insert", ([1, 2, 2, 2, 1, 2, 3, 1],), (("extra_key", None),)),
    Op("prefetch_io", ("r0", 3)),
    Op("check_prefetch_progress", ("r0",)),
    Op("evict", (7,)),
]
"""The same calls made on one side directly."""


def _config(rules: Rules) -> PoolConfig:
    return PoolConfig(size=12, page_size=4, req_pool_size=16, max_context_len=512,
                      eviction_policy="slru", rules=rules, hicache_ratio=0.5,
                      hicache_write_policy="write_through", hicache_load_back_threshold=4,
                      hicache_prefetch_threshold=4, hicache_storage=True)  # fmt: skip


def test_kvpools_rules_drop_the_refill_below_a_device_node() -> None:
    """Twin and reference in lockstep; on one side: the completion leaves no host-only node and
    every host slot free or queued for release; the eviction then frees both device nodes."""
    ref, twin = reference_implementation(), optimized_implementation()
    done = execute("hiradix_cache", ref, twin, _config(Rules()), ops=TRACE)
    assert done.failure is None, done.failure
    target = HiRadixTarget()
    side = target.build(ref, _config(Rules()))
    outs = [target.call(side, op) for op in CALLS[:-1]]
    assert outs[-1] is True  # the prefetch ended
    snap = side.tree.host_snapshot()
    assert not any(n.evicted for n in snap.tree.nodes)  # nothing host-only
    assert all(n.host_value is None for n in snap.tree.nodes[1:])
    assert len(snap.host.free_slots) + len(snap.host.release_slots) == snap.host.size
    assert target.call(side, CALLS[-1]) == 8
    snap = side.tree.host_snapshot()
    assert [n.node_id for n in snap.tree.nodes] == [0]
    assert sorted(snap.device.free_pages) == [1, 2, 3]


def attached(impl: Implementation) -> Callable[[], object]:
    """``CALLS`` but the eviction on ``impl`` under 0.5.16's preset, checking that the refill
    hangs host-only below the device node without a host copy; returns the eviction's call."""
    target = HiRadixTarget()
    side = target.build(impl, _config(OLD))
    for op in CALLS[:-1]:
        target.call(side, op)
    nodes = side.tree.host_snapshot().tree.nodes
    [host_only] = [n for n in nodes if n.evicted]
    parent = next(n for n in nodes if n.node_id == host_only.parent_id)
    assert (host_only.key, parent.key, parent.host_value) == ((3, 3, 3, 1), (1, 2, 2, 2), None)
    return lambda: target.call(side, CALLS[-1])


def test_sglang_0_5_16_attaches_it_and_asserts_a_leaf_at_eviction() -> None:
    """Under 0.5.16's preset the refill hangs below the device node, and the eviction fails
    SGLang's assertion, as its scheduler would."""
    evict = attached(following_release(reference_implementation(), "0.5.16"))
    with pytest.raises(AssertionError, match="without a backup has children"):
        evict()


def test_the_machine_does_not_drive_0_5_16_into_that_eviction() -> None:
    """The campaign's run that found it passes under 0.5.16's preset: the eviction is not
    drawn while a device node without a host copy has a host-only child."""
    ref = resolve_implementation("reference@0.5.16", "hiradix_cache")
    twin = resolve_implementation("optimized@0.5.16", "hiradix_cache")
    chooser = RandomChooser(random.Random("20261207/1043"))
    config = HiRadixTarget().draw_config(chooser, twin)
    assert (config.page_size, config.hicache_storage) == (4, True)
    done = execute("hiradix_cache", ref, twin, config, chooser=chooser, steps=60)
    assert done.failure is None, done.failure
    assert done.steps == 60


@pytest.mark.parametrize("impl", [reference_implementation, optimized_implementation])
def test_sglang_0_5_23_refills_the_device_node(impl: Callable[[], Implementation]) -> None:
    """Under ``"refill"`` the device node [1, 2, 2, 2] takes the first fetched page as its host
    copy (nothing is freed) and [3, 3, 3, 1] hangs below it host-only; the eviction then
    deletes [1, 2, 3, 1] and demotes [1, 2, 2, 2], whose host copy stays. Twin and reference
    also agree on the machine's trace."""
    rules = replace(Rules(), prefetch_refill="refill")
    done = execute("hiradix_cache", reference_implementation(), optimized_implementation(),
                   _config(rules), ops=TRACE)  # fmt: skip
    assert done.failure is None, done.failure
    target = HiRadixTarget()
    side = target.build(impl(), _config(rules))
    for op in CALLS[:-1]:
        target.call(side, op)
    snap = side.tree.host_snapshot()
    shape = {n.key: (n.evicted, n.host_value is not None) for n in snap.tree.nodes[1:]}
    assert shape == {(1, 2, 2, 2): (False, True), (1, 2, 3, 1): (False, False),
                     (3, 3, 3, 1): (True, True)}  # fmt: skip
    assert not snap.host.free_slots and not snap.host.release_slots  # every fetched slot kept
    assert target.call(side, CALLS[-1]) == 8
    after = side.tree.host_snapshot().tree.nodes
    assert [(n.key, n.evicted) for n in after[1:]] == [((1, 2, 2, 2), True), ((3, 3, 3, 1), True)]


def test_the_presets() -> None:
    assert Rules().prefetch_refill == "drop"
    assert OLD.prefetch_refill == "attach"
    assert Rules.for_sglang("0.5.23").prefetch_refill == "refill"


PREFIX = [1, 2, 2, 2]
OTHER = [1, 2, 2, 2, 1, 2, 3, 1]


@dataclass(frozen=True)
class Case:
    """A tree built by ``inserts`` (each backed up while the host pool has room, when
    ``backed``), then a prefetch of ``fetch`` reserving ``len(fetch)`` host slots below the
    node matched by ``anchor`` (the root when empty)."""

    write_policy: str
    host_ratio: float
    backed: tuple[tuple[int, ...], ...]
    inserts: tuple[tuple[int, ...], ...]
    fetch: tuple[int, ...]
    anchor: tuple[int, ...] = ()


CASES = {
    # the fetched prompt runs through a device node with no host copy: it takes the
    # fetched slots (a refill), the rest hangs below it; nothing is freed
    "refill-below-the-root": Case("write_through", 0.5, (), (tuple(OTHER),),
                                  (1, 2, 2, 2, 3, 3, 3, 1)),
    # a backed-up node first (its fetched slots freed), then a refill, then the rest
    "backed-then-refill": Case("write_through", 2.0, (tuple(PREFIX),), (tuple(OTHER),),
                               (1, 2, 2, 2, 1, 2, 3, 1, 5, 5, 5, 5)),
    # write-back: no refill, every matched token's fetched slot freed
    "write-back": Case("write_back", 0.5, (), (tuple(OTHER),), (1, 2, 2, 2, 3, 3, 3, 1)),
    # nothing matches below a device anchor with no host copy: the whole fetch is dropped
    "dropped-below-a-device-anchor": Case("write_through", 0.5, (), (tuple(OTHER),),
                                          (1, 2, 3, 1, 7, 7, 7, 7), anchor=tuple(OTHER)),
}  # fmt: skip


@dataclass
class Outcome:
    freed: int
    evicted: int
    before: HostTierSnapshot
    after: HostTierSnapshot


def _case_config(case: Case) -> PoolConfig:
    return PoolConfig(size=16, page_size=4, rules=Rules.for_sglang("0.5.23"),
                      hicache_ratio=case.host_ratio, hicache_write_policy=case.write_policy,
                      hicache_load_back_threshold=4)  # fmt: skip


Complete = Callable[[Any, Any, Any, Any], int]
"""A prefetch's completion: (tree, anchor, key, fetched host slots) -> the slots to free."""


def _run(impl: Implementation, case: Case, complete: Complete) -> Outcome:
    config = _case_config(case)
    assert impl.req_to_token_pool and impl.allocator and impl.hiradix_cache and impl.radix_key
    make_key = impl.radix_key

    def key_of(tokens: list[int]) -> Any:
        return make_key(tokens, None)

    pool, alloc = impl.req_to_token_pool(config), impl.allocator(config)
    tree = impl.hiradix_cache(config, pool, alloc)
    for tokens in case.backed:
        tree.insert(key_of(list(tokens)), alloc.alloc(len(tokens)))
        tree.writing_check()
    host = tree.token_to_kv_pool_host
    # the whole host pool reserved (the rest by other prefetches): the inserts below get no
    # host copy
    fetched = host.alloc(host.available_size())
    assert fetched is not None and len(fetched) >= len(case.fetch)
    fetched = fetched[: len(case.fetch)]
    for tokens in case.inserts:
        tree.insert(key_of(list(tokens)), alloc.alloc(len(tokens)))
        tree.writing_check()
    anchor = tree.match_prefix(key_of(list(case.anchor))).last_device_node
    freed = complete(tree, anchor, key_of(list(case.fetch)), fetched)
    host.free(fetched[:freed])
    before = coarse_host_tier(tree.host_snapshot())
    evicted = tree.evict(16)
    return Outcome(freed, evicted, before, coarse_host_tier(tree.host_snapshot()))


def _kvpool(tree: Any, anchor: Any, key: Any, fetched: Any) -> int:
    return int(tree._insert_helper_host(anchor, key, fetched))


@pytest.mark.parametrize("name", sorted(CASES))
def test_the_twins_agree_on_every_completion_case(name: str) -> None:
    """Both twins under 0.5.23's preset (``"refill"``): the same slots freed, the same tree,
    host pool and device pool before and after the eviction (SGLang's own ``insert_host``
    against the reference: tests/sglang/test_sglang_prefetch_refill.py)."""
    case = CASES[name]
    ref = _run(reference_implementation(), case, _kvpool)
    twin = _run(optimized_implementation(), case, _kvpool)
    assert (twin.freed, twin.evicted, twin.before, twin.after) == (
        ref.freed, ref.evicted, ref.before, ref.after)  # fmt: skip
    assert ref.freed < len(case.fetch) or name.startswith("dropped")
