"""Storage prefetches under SGLang 0.5.23's rules (``Rules.hicache_host_tier == "unified"``):
kvpool's model of its ``UnifiedRadixCache`` flow (kvpool.reference.hicache.prefetch, "Under the
unified rules"), on both twins, call by call on the ``hiradix_cache`` machine's operations.

- the start: refused below a device node without a host copy (the scheduler's gate) and while
  the prefetches in flight ask for half the host pool; the root is pinned under write-back only;
- the worker reads a transfer whole, and its tokens count only when a drain applies the
  acknowledgements, which completes the prefetch at once (the fetched tokens inserted, the
  device nodes walked through refilled);
- an admission check before that drain ends the prefetch with no tokens, and the drain then
  releases every slot it had reserved.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest

from kvpool.config import PoolConfig
from kvpool.rules import Rules
from kvpool.testing.bundle import Implementation
from kvpool.testing.implementations import optimized_implementation, reference_implementation
from kvpool.testing.machines.hiradix import HiRadixTarget, HiSide
from kvpool.testing.runs import execute
from kvpool.testing.swarm import Op

TWINS = [reference_implementation, optimized_implementation]
PROMPT = [1, 2, 2, 2, 3, 3, 3, 1, 4, 4, 4, 4]


def _config(policy: str = "write_through", ratio: float = 2.0) -> PoolConfig:
    return PoolConfig(size=16, page_size=4, rules=Rules.for_sglang("0.5.23"),
                      hicache_ratio=ratio, hicache_write_policy=policy,
                      hicache_load_back_threshold=4, hicache_prefetch_threshold=4,
                      hicache_storage=True)  # fmt: skip


def _side(impl: Callable[[], Implementation], config: PoolConfig) -> tuple[HiRadixTarget, HiSide]:
    target = HiRadixTarget()
    return target, target.build(impl(), config)


def _calls(target: HiRadixTarget, side: HiSide, ops: list[Op]) -> list[Any]:
    out = []
    for op in ops:
        got = target.call(side, op)
        out.append(got.tolist() if hasattr(got, "tolist") else got)
    return out


def _prefetch(rid: str | int, tokens: list[int], extra: str | None = None) -> Op:
    """A prefetch by request id (a call on one side) or index (the machine's draw)."""
    return Op("prefetch", (rid, tokens), (("extra_key", extra),))


def _insert(tokens: list[int]) -> Op:
    return Op("insert", (tokens,), (("extra_key", None),))


def _free(side: HiSide) -> int:
    """Free host slots (free or released)."""
    host = side.tree.host_snapshot().host
    return len(host.free_slots) + len(host.release_slots)


def _nodes(side: HiSide) -> dict[tuple[int, ...], tuple[bool, bool]]:
    """Key -> (host-only, has a host copy) of every node but the root."""
    snap = side.tree.host_snapshot()
    return {n.key: (n.evicted, n.host_value is not None) for n in snap.tree.nodes[1:]}


@pytest.mark.parametrize("impl", TWINS)
def test_a_drain_completes_the_prefetch_with_the_acknowledged_tokens(
    impl: Callable[[], Implementation],
) -> None:
    target, side = _side(impl, _config())
    started, hit, read, drained = _calls(target, side, [
        _prefetch("r0", PROMPT), Op("storage_hit", ("r0", 12)), Op("prefetch_io", ("r0", 1)),
        Op("drain_storage_control_queues"),
    ])  # fmt: skip
    assert (started, hit, read, drained) == (True, True, 12, 0)
    snap = side.tree.host_snapshot()
    assert snap.prefetches == () and snap.worker_held == ()
    assert _nodes(side) == {tuple(PROMPT): (True, True)}  # host-only, below the root
    assert target.call(side, Op("check_prefetch_progress", ("r0",))) is True  # nothing left


@pytest.mark.parametrize("impl", TWINS)
def test_the_read_counts_only_at_the_drain_and_refills_device_nodes(
    impl: Callable[[], Implementation],
) -> None:
    """Between the read and the drain the tokens are the worker's; an insert in between (the
    host pool then full) leaves a device node without a host copy, which the completion
    refills; nothing is freed."""
    target, side = _side(impl, _config(ratio=0.75))
    _calls(target, side, [
        _prefetch("r0", PROMPT), Op("storage_hit", ("r0", 12)), Op("prefetch_io", ("r0", 1)),
    ])  # fmt: skip
    snap = side.tree.host_snapshot()
    assert [p.completed_tokens for p in snap.prefetches] == [0]
    assert len(snap.worker_held) == 12  # the worker's until its end is acknowledged
    _calls(target, side, [_insert([1, 2, 2, 2, 3, 3, 3, 1]), Op("writing_check", (8,))])
    assert _nodes(side) == {(1, 2, 2, 2, 3, 3, 3, 1): (False, False)}
    free_before = _free(side)
    assert target.call(side, Op("drain_storage_control_queues")) == 0
    assert _nodes(side) == {(1, 2, 2, 2, 3, 3, 3, 1): (False, True), (4, 4, 4, 4): (True, True)}
    assert _free(side) == free_before


@pytest.mark.parametrize("impl", TWINS)
def test_an_admission_check_before_the_drain_ends_it_with_nothing(
    impl: Callable[[], Implementation],
) -> None:
    target, side = _side(impl, _config())
    out = _calls(target, side, [
        _prefetch("r0", PROMPT), Op("storage_hit", ("r0", 12)), Op("prefetch_io", ("r0", 1)),
        Op("check_prefetch_progress", ("r0",)),
    ])  # fmt: skip
    assert out == [True, True, 12, True]
    snap = side.tree.host_snapshot()
    assert snap.prefetches == () and len(snap.worker_held) == 12 and _nodes(side) == {}
    assert target.call(side, Op("drain_storage_control_queues")) == 12  # the end releases all
    snap = side.tree.host_snapshot()
    assert snap.worker_held == () and _free(side) == snap.host.size


@pytest.mark.parametrize("impl", TWINS)
def test_a_terminated_transfer_reads_nothing(impl: Callable[[], Implementation]) -> None:
    target, side = _side(impl, _config())
    out = _calls(target, side, [
        _prefetch("r0", PROMPT), Op("storage_hit", ("r0", 8)),
        Op("release_aborted_request", ("r0",)), Op("prefetch_io", ("r0", 2)),
        Op("drain_storage_control_queues"),
    ])  # fmt: skip
    assert out == [True, True, None, 0, 8]
    assert _free(side) == side.tree.host_snapshot().host.size and _nodes(side) == {}


@pytest.mark.parametrize("impl", TWINS)
def test_the_start_gate_and_the_rate_limit(impl: Callable[[], Implementation]) -> None:
    """A device node without a host copy (``write_through_selective``: a first insert has
    none) anchors nothing; once the prefetches in flight ask for half the host pool another
    is refused."""
    target, side = _side(impl, _config("write_through_selective"))
    target.call(side, _insert([5, 5, 5, 5]))
    assert _nodes(side) == {(5, 5, 5, 5): (False, False)}
    assert target.call(side, _prefetch("r0", [5, 5, 5, 5, 6, 6, 6, 6])) is False
    half = side.tree.host_snapshot().host.size // 2
    asked = -(-half // 4) * 4  # whole pages, at least half
    assert target.call(side, _prefetch("r1", [7] * asked)) is True
    assert target.call(side, _prefetch("r2", [8] * 8)) is False
    assert [p.num_tokens for p in side.tree.host_snapshot().prefetches] == [asked]


@pytest.mark.parametrize("policy", ["write_through", "write_back"])
def test_the_root_is_pinned_under_write_back_only(policy: str) -> None:
    for impl in TWINS:
        target, side = _side(impl, _config(policy))
        assert target.call(side, _prefetch("r0", PROMPT)) is True
        root = side.tree.host_snapshot().tree.nodes[0]
        assert root.host_ref_counter == (policy == "write_back")
        target.call(side, Op("check_prefetch_progress", ("r0",)))
        assert side.tree.host_snapshot().tree.nodes[0].host_ref_counter == 0


def test_the_twins_agree_on_these_traces_in_lockstep() -> None:
    trace = [
        _prefetch(0, PROMPT), Op("storage_hit", (0, 12)), Op("prefetch_io", (0, 1)),
        _insert([1, 2, 2, 2, 3, 3, 3, 1]), Op("drain_storage_control_queues"),
        _prefetch(0, [9] * 8, "a"), Op("storage_hit", (0, 8)), Op("check_prefetch_progress", (0,)),
        Op("prefetch_io", (0, 1)), Op("drain_storage_control_queues"), Op("evict", (16,)),
    ]  # fmt: skip
    for policy in ("write_through", "write_back"):
        done = execute("hiradix_cache", reference_implementation(), optimized_implementation(),
                       _config(policy, 0.75), ops=trace)  # fmt: skip
        assert done.failure is None, done.failure
        assert done.steps == len(trace)


ROOT_TRACE = [
    _prefetch(0, [3, 1, 1, 1, 1], "a"), _insert([1]), Op("storage_hit", (2, 2)),
    Op("prefetch_io", (0, 2)), Op("writing_check", (1,)), Op("drain_storage_control_queues"),
    Op("evict", (1,)), Op("insert", ([2, 2, 3],), (("extra_key", "a"),)),
]  # fmt: skip
"""``kvpool verify --sglang 0.5.23 --tree-core python --component hiradix_cache --seed
20261302``, run 1536, shrunk: the prefetched [3, 1] hangs below the root next to the demoted
[1]; the last insert's write-through needs one host slot, and ``priority`` eviction takes the
host-only leaf of lower priority, then the older."""


def _root_config() -> PoolConfig:
    return PoolConfig(size=8, page_size=1, eviction_policy="priority",
                      rules=Rules.for_sglang("0.5.23"), hicache_ratio=0.5,
                      hicache_load_back_threshold=0, hicache_prefetch_threshold=1,
                      hicache_storage=True)  # fmt: skip


@pytest.mark.parametrize("impl", TWINS)
def test_a_prefetch_below_the_root_takes_the_priority_inserts_raised_it_to(
    impl: Callable[[], Implementation],
) -> None:
    """0.5.23's insert raises the root's priority to its own (0 here), so the prefetched node
    below the root is not SGLang 0.5.16's floor: the host eviction takes the older [1]."""
    target, side = _side(impl, _root_config())
    ops = [
        Op("prefetch", ("r0", [3, 1, 1, 1, 1]), (("extra_key", "a"),)), _insert([1]),
        Op("storage_hit", ("r0", 2)), Op("prefetch_io", ("r0", 2)), Op("writing_check", (1,)),
        Op("drain_storage_control_queues"), Op("evict", (1,)),
    ]  # fmt: skip
    _calls(target, side, ops)
    nodes = side.tree.host_snapshot().tree.nodes
    assert [(n.key, n.priority) for n in nodes[1:]] == [((1,), 0), ((3, 1), 0)]
    target.call(side, Op("insert", ([2, 2, 3],), (("extra_key", "a"),)))
    assert [n.key for n in side.tree.host_snapshot().tree.nodes[1:]] == [(3, 1), (2, 2, 3)]
    done = execute("hiradix_cache", reference_implementation(), optimized_implementation(),
                   _root_config(), ops=ROOT_TRACE)  # fmt: skip
    assert done.failure is None, done.failure


SPLIT_TRACE = [
    _insert([2, 3, 3, 1, 3]), _prefetch(0, [2, 3, 2, 2]),
    _insert([3, 1, 1, 1, 3, 2, 2, 3, 1, 1]),
    Op("match_prefix", ([2, 3, 2, 3, 2, 2],), (("extra_key", None),)), Op("evict", (3,)),
    _prefetch(0, [3, 1, 1, 1, 2, 2, 2, 3, 3, 3]), _insert([3, 1, 1]), Op("storage_hit", (0, 6)),
]  # fmt: skip
"""``kvpool verify --sglang 0.5.23 --component hiradix_cache --seed 20261304`` (Rust core), run
5333, shrunk: an insert splits the prefetch's host-only anchor [3, 1, 1, 1] and gives the upper
half [3, 1] device slots; 0.5.23's split hands the anchor's host lock to both halves, so the
storage hit's host eviction (write-back: duplicates first) cannot reclaim [3, 1]'s host copy and
evicts host-only leaves instead."""


def _split_config() -> PoolConfig:
    return PoolConfig(size=30, page_size=2, rules=Rules.for_sglang("0.5.23"), hicache_ratio=0.5,
                      hicache_write_policy="write_back", hicache_load_back_threshold=2,
                      hicache_prefetch_threshold=4, hicache_storage=True)  # fmt: skip


@pytest.mark.parametrize("impl", TWINS)
def test_a_split_of_the_prefetch_anchor_pins_both_halves(
    impl: Callable[[], Implementation],
) -> None:
    target, side = _side(impl, _split_config())
    ops = [Op(o.name, ("r0", *o.args[1:]), o.kwargs) if o.name in ("prefetch", "storage_hit")
           else o for o in SPLIT_TRACE]  # fmt: skip
    _calls(target, side, ops[:-1])
    pins = {(n.node_id, n.key): n.host_ref_counter for n in side.tree.host_snapshot().tree.nodes}
    assert pins[(5, (3, 1))] == 1 and pins[(4, (1, 1))] == 1  # the upper half and the anchor
    assert target.call(side, ops[-1]) is True
    kept = {(n.node_id, n.key): n.host_value for n in side.tree.host_snapshot().tree.nodes[1:]}
    assert kept == {(2, (2, 3)): None, (5, (3, 1)): (2, 3), (4, (1, 1)): (4, 5)}
    target.call(side, Op("check_prefetch_progress", ("r0",)))
    assert all(n.host_ref_counter == 0 for n in side.tree.host_snapshot().tree.nodes)
    done = execute("hiradix_cache", reference_implementation(), optimized_implementation(),
                   _split_config(), ops=SPLIT_TRACE)  # fmt: skip
    assert done.failure is None, done.failure
