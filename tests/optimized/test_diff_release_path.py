"""SGLang 0.5.23's release path in both twins (``Rules.hit_count``, ``Rules.release_path``):
hits counted past ``cache_inserted_len``, ``checkpoint`` matching again at release, the leaf
split at the prompt boundary, ``free_kv_row``'s segment frees, and paged ``free_page_ids``
inside a free group. Each effect is asserted on both twins under both values of its knob, and
short lockstep campaigns check that the twins agree under every combination."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

import pytest
import torch

from kvpool.config import PoolConfig
from kvpool.errors import DoubleFreeError
from kvpool.rules import Rules
from kvpool.testing.campaign import run_machine
from kvpool.testing.implementations import optimized_implementation, reference_implementation
from kvpool.testing.machines.lifecycle import manager_factory

TWINS = [reference_implementation, optimized_implementation]
OLD, NEW = Rules.for_sglang("0.5.16"), Rules.for_sglang("0.5.23")


def _manager(make: Any, rules: Rules, **config: Any) -> Any:
    return manager_factory(make())(PoolConfig(rules=rules, **config))


def _nodes(mm: Any) -> dict[tuple[int, ...], Any]:
    return {n.key: n for n in mm.snapshot().tree.nodes}


@pytest.mark.parametrize("make", TWINS)
@pytest.mark.parametrize("path", ["finished_req", "checkpoint"])
def test_checkpoint_reads_the_clock_again_at_release(make: Any, path: str) -> None:
    mm = _manager(make, replace(OLD, release_path=path), size=20, page_size=1, req_pool_size=3)
    mm.new_req("r1", [1], extra_key="a")
    mm.extend(["r1"], [1])
    mm.finish(["r1"])
    # the insert reads tick 1; checkpoint's second match reads tick 2
    assert _nodes(mm)[(1,)].last_access_time == (2.0 if path == "checkpoint" else 1.0)


@pytest.mark.parametrize("make", TWINS)
@pytest.mark.parametrize("path", ["finished_req", "checkpoint"])
def test_checkpoint_splits_the_finished_leaf_at_the_prompt(make: Any, path: str) -> None:
    mm = _manager(make, replace(OLD, release_path=path), size=20, page_size=1, req_pool_size=3)
    mm.new_req("r1", [1], extra_key="a", priority=3)
    mm.extend(["r1"], [1])
    mm.decode(["r1"], [2])
    mm.finish(["r1"])
    nodes = _nodes(mm)
    if path == "finished_req":
        assert set(nodes) == {(), (1, 2)}
        return
    assert set(nodes) == {(), (1,), (2,)}
    assert (nodes[(1,)].priority, nodes[(2,)].priority) == (4, 3)
    assert (nodes[(1,)].hit_count, nodes[(2,)].hit_count) == (1, 1)  # the re-insert counts none


@pytest.mark.parametrize("make", TWINS)
def test_no_split_when_the_prompt_is_not_shorter_or_empty(make: Any) -> None:
    """Page size 4: a prompt of 3 tokens aligns to nothing, one of 4 + 3 outputs to the whole
    key: neither re-inserts."""
    for prompt, outputs, keys in (
        ([1, 2, 3], [4, 5], {(), (1, 2, 3, 4)}),
        ([1, 2, 3, 4], [5, 6, 7], {(), (1, 2, 3, 4)}),
    ):
        mm = _manager(make, NEW, size=64, page_size=4, req_pool_size=3)
        mm.new_req("r", prompt)
        mm.extend(["r"], [None])
        for tok in outputs:
            mm.decode(["r"], [tok])
        mm.finish(["r"])
        assert set(_nodes(mm)) == keys


@pytest.mark.parametrize("make", TWINS)
@pytest.mark.parametrize(("count", "hits"), [("chunked", 0), ("inserted_len", 1)])
def test_hits_counted_past_inserted_len(make: Any, count: str, hits: int) -> None:
    """A chunk boundary inserts 8 tokens: under ``chunked`` no hit; past ``inserted_len`` (0)
    one. The release then counts none on them again (``inserted_len`` 8), one on the new leaf."""
    mm = _manager(make, replace(OLD, hit_count=count), size=64, page_size=4, req_pool_size=4)
    mm.new_req("r1", [3, 1, 1, 1, 2, 2, 2, 3, 3, 3, 3, 3])
    mm.extend(["r1"], [9])
    assert _nodes(mm)[(3, 1, 1, 1, 2, 2, 2, 3)].hit_count == hits
    mm.extend(["r1"], [None])
    mm.finish(["r1"])
    nodes = _nodes(mm)
    assert nodes[(3, 1, 1, 1, 2, 2, 2, 3)].hit_count == (hits if count == "inserted_len" else 1)
    assert nodes[(3, 3, 3, 3)].hit_count == 1


@pytest.mark.parametrize("make", TWINS)
@pytest.mark.parametrize("path", ["finished_req", "checkpoint"])
def test_release_frees_row_segments_in_row_order(make: Any, path: str) -> None:
    mm = _manager(make, replace(OLD, release_path=path), size=64, page_size=4, req_pool_size=4)
    for rid in "abc":
        mm.new_req(rid, [7, 7, 7, 7])
    mm.extend(["a", "b", "c"], [None, None, None])  # pages 1, 2, 3
    mm.finish(["a"], is_insert=False)
    mm.finish(["c"], is_insert=False)  # free list 3, 1, 4, ...
    mm.new_req("d", [1, 2, 3, 4, 5, 6, 7, 8])
    mm.extend(["d"], [None])  # row: page 3 then page 1
    mm.finish(["d"], is_insert=False)
    head = tuple(mm.snapshot().allocator.free_pages[:3])
    assert head == ((3, 1, 4) if path == "checkpoint" else (1, 3, 4))


@pytest.mark.parametrize("make", TWINS)
@pytest.mark.parametrize("path", ["finished_req", "checkpoint"])
def test_session_close_frees_row_segments_in_row_order(make: Any, path: str) -> None:
    mm = _manager(make, replace(OLD, release_path=path), size=64, page_size=4, req_pool_size=4)
    for rid in "abc":
        mm.new_req(rid, [7, 7, 7, 7])
    mm.extend(["a", "b", "c"], [None, None, None])  # pages 1, 2, 3
    mm.finish(["a"], is_insert=False)
    mm.finish(["c"], is_insert=False)  # free list 3, 1, 4, ...
    mm.open_session("s")
    mm.new_req("d", [1, 2, 3, 4, 5, 6, 7, 8], session_id="s")
    mm.extend(["d"], [None])  # row: page 3 then page 1
    mm.finish(["d"])  # the session keeps the row
    mm.close_session("s")
    head = tuple(mm.snapshot().allocator.free_pages[:3])
    assert head == ((3, 1, 4) if path == "checkpoint" else (1, 3, 4))


@pytest.mark.parametrize("make", TWINS)
def test_free_page_ids_in_a_group_follow_the_slot_frees(make: Any) -> None:
    """Paged: pages freed by ``free_page_ids`` inside a group go back after the group's slot
    frees, in their given order; a page buffered both ways is a double free at the end."""
    impl = make()
    alloc = impl.allocator(PoolConfig(size=32, page_size=4))
    alloc.alloc(24)  # pages 1..6
    alloc.free_group_begin()
    alloc.free_page_ids(impl.index([5, 2]))
    alloc.free(impl.index([12, 4]))  # pages 3, 1
    with pytest.raises(DoubleFreeError):
        alloc.free_page_ids(impl.index([2]))  # already buffered
    alloc.free_group_end()
    assert list(alloc.snapshot().free_pages[:5]) == [5, 2, 1, 3, 7]
    alloc.free_group_begin()
    alloc.free_page_ids(impl.index([4]))
    alloc.free(impl.index([16]))
    with pytest.raises(DoubleFreeError):
        alloc.free_group_end()


def _combinations() -> list[Rules]:
    return [
        replace(base, hit_count=count, release_path=path, tree_free=tree)
        for base in (Rules(), OLD)
        for count in ("chunked", "inserted_len")
        for path in ("finished_req", "checkpoint")
        for tree in ("free", "segment")
    ]


@pytest.mark.slow
@pytest.mark.parametrize("rules", _combinations(), ids=repr)
def test_twins_agree_under_every_release_rule(rules: Rules) -> None:
    ref = replace(reference_implementation(), rules=rules)
    twin = replace(optimized_implementation(), rules=rules)
    result = run_machine(
        "manager", ref, twin, seconds=300.0, seed=3, max_runs=4, labels=("reference", "twin")
    )
    assert result.failure is None, result.failure.report if result.failure else ""
    assert result.steps > 100
    assert result.coverage.get("finish:ok", 0) > 0


def _row(mm: Any, req: Any, stop: int) -> Any:
    """``row[:stop]`` as a caller reads it ahead: a list (reference), int64 slots (twin)."""
    read = mm.req_to_token_pool.read(req.req_pool_idx, 0, stop)
    return read.to(torch.int64) if isinstance(read, torch.Tensor) else read


def _duplicated_chunks(make: Any, rules: Rules, disable: bool) -> Any:
    """Two chunked requests in one batch; ``b``'s chunk duplicates ``a``'s prefix."""
    mm = _manager(make, rules, size=64, page_size=2, req_pool_size=4, disable_radix_cache=disable)
    mm.new_req("a", [1, 2, 3, 4, 5, 6, 7])
    mm.new_req("b", [1, 2, 3, 4, 9, 9, 9])
    mm.extend(["a", "b"], [5, 5])
    return mm


@pytest.mark.parametrize("make", TWINS)
@pytest.mark.parametrize("path", ["finished_req", "checkpoint"])
@pytest.mark.parametrize("disable", [False, True], ids=["radix", "chunk_cache"])
@pytest.mark.parametrize("is_insert", [True, False])
def test_a_row_read_ahead_releases_as_a_read_of_the_row(
    make: Any, path: str, disable: bool, is_insert: bool
) -> None:
    """``row_read`` (the caller's read of the row) leaves every pool, the tree and the request
    exactly as the tree's own read does: between chunks and at the end."""
    rules = replace(NEW if path == "checkpoint" else OLD, release_path=path)
    given, own = (_duplicated_chunks(make, rules, disable) for _ in range(2))
    for rid in ("a", "b"):
        req = given.reqs[rid]
        given.tree_cache.cache_unfinished_req(req, True, row_read=_row(given, req, 5))
        own.tree_cache.cache_unfinished_req(own.reqs[rid], True)
        assert list(map(int, req.prefix_indices)) == list(map(int, own.reqs[rid].prefix_indices))
    assert given.snapshot() == own.snapshot()
    for mm in (given, own):
        mm.extend(["a", "b"])
        mm.decode(["a", "b"], [8, 8])
    for rid in ("a", "b"):
        req = given.reqs[rid]
        stop = req.kv_committed_len
        given.tree_cache.cache_finished_req(req, is_insert, row_read=_row(given, req, stop))
        own.tree_cache.cache_finished_req(own.reqs[rid], is_insert)
    assert given.snapshot() == own.snapshot()


@pytest.mark.parametrize("make", TWINS)
@pytest.mark.parametrize("unified", [False, True])
def test_a_checkpoint_frees_duplicates_once_or_per_node(make: Any, unified: bool) -> None:
    """A chunk whose duplicates span two nodes (another request's two chunks): the legacy tree's
    checkpoint frees them in one call, SGLang 0.5.23's unified tree one ``free_segment`` per
    node, in walk order; a paged free puts its pages at the head of the free list, so the
    second node's page comes first. (Found by a campaign against SGLang 0.5.23, seed 20261203.)"""
    config = PoolConfig(size=20, page_size=2, req_pool_size=3, max_context_len=48, rules=NEW)
    mm = manager_factory(make(), unified)(config)
    mm.new_req("r1", [2, 3, 3, 2, 2, 2, 2])
    mm.new_req("r2", [3, 1, 1, 1, 2, 2, 1, 2, 3])
    mm.new_req("r3", [3, 1, 1, 1, 2, 2, 1, 2, 3, 2])
    mm.extend(["r3", "r1", "r2"], [1, 2, 5])  # r2's chunk caches [3, 1, 1, 1]
    # r2's chunk caches [2, 2] below it; r3's six tokens duplicate both nodes: pages 1 and 7
    # (slots 2, 3, 14, 15) in the first, page 8 (slots 16, 17) in the second
    got = mm.extend(["r2", "r3"], [2, 5])
    assert [int(s) for s in got] == [11, 12, 3, 14, 15, 16, 17]
    free = tuple(mm.snapshot().allocator.free_pages)
    assert free == ((8, 1, 7, 9, 10) if unified else (1, 7, 8, 9, 10))


@pytest.mark.slow
def test_twins_agree_over_the_unified_tree() -> None:
    """The lifecycle over SGLang 0.5.23's unified tree (its server default) in lockstep, twin
    against reference: checkpoints that free their duplicates node by node, splits that keep
    the creation time."""
    ref = replace(reference_implementation(), rules=NEW, unified_lifecycle=True)
    twin = replace(optimized_implementation(), rules=NEW, unified_lifecycle=True)
    result = run_machine(
        "manager", ref, twin, seconds=300.0, seed=5, max_runs=30, labels=("reference", "twin")
    )
    assert result.failure is None, result.failure.report if result.failure else ""
    assert result.steps == 30 * 60
    assert result.coverage.get("finish:ok", 0) > 0
