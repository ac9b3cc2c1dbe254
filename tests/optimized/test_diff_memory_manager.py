"""Direct differential test: the optimized MemoryManager vs the reference on random request
lifecycles (page sizes 1, 2, 4, 16, 64; every eviction policy; the radix cache on and off).

Every call goes to both twins; they must return the same slots (as lists) or raise the same
error type (the state unchanged: exactly, or for OutOfMemoryError in everything the pools
account), and their whole-state snapshots (allocator free lists, table rows, tree nodes with
ids, requests, sessions, KV tags) must be equal after every step."""

from __future__ import annotations

import random
from collections.abc import Callable
from typing import Any

import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

from kvpool.config import PoolConfig
from kvpool.constants import EVICTION_POLICIES, SUPPORTED_PAGE_SIZES_TESTED
from kvpool.errors import (
    ContextOverflowError,
    InvalidArgumentError,
    KVPoolError,
    OutOfMemoryError,
    RowReuseError,
)
from kvpool.optimized.lifecycle.memory_manager import MemoryManager as OptMM
from kvpool.reference.lifecycle.memory_manager import MemoryManager as RefMM
from kvpool.snapshot import PoolSnapshot


def _plain(x: Any) -> Any:
    if isinstance(x, torch.Tensor):
        return [int(v) for v in x.tolist()]
    if isinstance(x, list):
        return [int(v) for v in x]
    return x


def _accounted(snap: PoolSnapshot) -> tuple[Any, ...]:
    """What an out-of-memory failure must leave exactly unchanged."""
    tree = snap.tree
    locks = sum(n.lock_ref * len(n.key) for n in tree.nodes)  # unchanged by a split
    return (
        snap.allocator,
        snap.req_to_token,
        snap.reqs,
        snap.sessions,
        tree.evictable_size,
        tree.protected_size,
        locks,
    )


class Lockstep:
    """Both managers, driven together."""

    def __init__(self, config: PoolConfig) -> None:
        self.ref = RefMM(config)
        self.opt = OptMM(config, checked=True)
        self.errors = 0

    def call(self, name: str, *args: Any, **kwargs: Any) -> Any:
        ref_fn: Callable[..., Any] = getattr(self.ref, name)
        opt_fn: Callable[..., Any] = getattr(self.opt, name)
        before = self.ref.snapshot()
        try:
            r = ref_fn(*args, **kwargs)
        except KVPoolError as exc:
            with pytest.raises(type(exc)) as info:
                opt_fn(*args, **kwargs)
            assert type(info.value) is type(exc), name
            self.errors += 1
            self.check()
            after = self.ref.snapshot()
            if isinstance(exc, OutOfMemoryError):
                # A match done by the failed extend may leave splits and access times behind;
                # everything the pools account must be as it was.
                assert _accounted(after) == _accounted(before), name
            else:
                assert after == before, f"{name} raised {exc!r} and changed the state"
            return None
        o = opt_fn(*args, **kwargs)
        assert _plain(r) == _plain(o), name
        self.check()
        return r

    def check(self) -> None:
        assert self.ref.snapshot() == self.opt.snapshot()


def _prompt(rng: random.Random, ps: int) -> list[int]:
    stem = rng.choice([[], [5] * ps, [5] * ps + [6] * ps, [7] * (2 * ps + 1)])
    return stem + [rng.randrange(4) for _ in range(rng.randrange(1, 2 * ps + 3))]


def run_lifecycle(seed: int, page_size: int, policy: str, disable: bool, steps: int) -> Lockstep:
    rng = random.Random(seed)
    ps = page_size
    config = PoolConfig(
        size=12 * ps,
        page_size=ps,
        req_pool_size=4,
        max_context_len=8 * ps,
        eviction_policy=policy,
        disable_radix_cache=disable,
    )
    ls = Lockstep(config)
    next_id = 0
    sessions: list[str] = []
    for _ in range(steps):
        waiting = [r for r, q in ls.ref.reqs.items() if q.state == "waiting"]
        running = [r for r, q in ls.ref.reqs.items() if q.state == "running"]
        full = [r for r in running if not ls.ref.reqs[r].is_chunked]
        chunked = [r for r in running if ls.ref.reqs[r].is_chunked]
        op = rng.choice(
            ["new", "new", "match", "extend", "extend", "decode", "decode", "spec", "draft",
             "finish", "finish", "abort", "retract", "session", "close", "evict"]
        )  # fmt: skip
        if op == "new" or (op in ("match", "extend") and not waiting and not chunked):
            sid = None
            if sessions and rng.random() < 0.4:
                sid = rng.choice(sessions)
            extra = rng.choice([None, None, "ns"]) if sid is None else None
            ls.call("new_req", f"r{next_id}", _prompt(rng, ps), extra, sid)
            next_id += 1
        elif op == "match" and waiting:
            ls.call("match_prefix", rng.choice(waiting))
        elif op == "extend":
            pool = waiting + chunked
            batch = rng.sample(pool, rng.randrange(1, min(3, len(pool)) + 1))
            sizes = [rng.choice([None, 1, ps, 2 * ps + 1]) for _ in batch]
            ls.call("extend", batch, sizes)
        elif op == "decode" and full:
            batch = rng.sample(full, rng.randrange(1, len(full) + 1))
            ls.call("decode", batch, [rng.randrange(4) for _ in batch])
        elif op == "spec" and full:
            batch = rng.sample(full, rng.randrange(1, len(full) + 1))
            reserve = rng.randrange(0, 3)
            acc = [
                [rng.randrange(4) for _ in range(rng.randrange(0, 2 * reserve + 1))] for _ in batch
            ]
            ls.call("spec_step", batch, acc, reserve)
        elif op == "draft" and full:
            ls.call("spec_draft_v1", rng.sample(full, 1), rng.randrange(0, 3))
        elif op == "finish" and full:
            batch = rng.sample(full, rng.randrange(1, len(full) + 1))
            ls.call("finish", batch, rng.random() < 0.8)
        elif op == "abort" and (waiting or running):
            ls.call("abort", rng.choice(waiting + running))
        elif op == "retract" and running:
            ls.call("retract", rng.choice(running))
        elif op == "session":
            sid = f"s{len(sessions)}"
            sessions.append(sid)
            ls.call("open_session", sid)
        elif op == "close" and sessions:
            sid = rng.choice(sessions)
            if ls.call("close_session", sid) is None and sid not in ls.ref.sessions:
                sessions.remove(sid)
        elif op == "evict":
            ls.call("evict", rng.randrange(0, 4 * ps))
    return ls


@pytest.mark.parametrize("page_size", SUPPORTED_PAGE_SIZES_TESTED)
def test_lifecycle_every_page_size(page_size: int) -> None:
    total_errors = 0
    for seed in range(2):
        ls = run_lifecycle(seed * 7 + page_size, page_size, "lru", False, steps=60)
        total_errors += ls.errors
    assert ls.ref.tree_cache.total_size() == ls.opt.tree_cache.total_size()


@pytest.mark.parametrize("policy", EVICTION_POLICIES)
def test_lifecycle_every_policy(policy: str) -> None:
    run_lifecycle(11, 2, policy, False, steps=60)


def test_lifecycle_chunk_cache() -> None:
    for ps in (1, 4):
        run_lifecycle(3, ps, "lru", True, steps=60)


@pytest.mark.slow
@given(
    seed=st.integers(0, 2**32 - 1),
    page_size=st.sampled_from(SUPPORTED_PAGE_SIZES_TESTED),
    policy=st.sampled_from(EVICTION_POLICIES),
    disable=st.booleans(),
)
def test_lifecycle_hypothesis(seed: int, page_size: int, policy: str, disable: bool) -> None:
    run_lifecycle(seed, page_size, policy, disable, steps=30)


@given(
    tokens=st.lists(st.integers(-5, 40_000), max_size=300),
    extra=st.sampled_from([None, "", "ns"]),
    cut=st.integers(0, 300),
)
def test_running_tag_hash_matches_kv_tags(tokens: list[int], extra: str | None, cut: int) -> None:
    # The twin's incremental, vectorised tags equal kvpool.tags.kv_tags at every split point.
    from kvpool.optimized.req import Req
    from kvpool.tags import kv_tags

    if not tokens:
        return
    req = Req("r", tokens, extra)
    cut = min(cut, len(tokens))
    assert req.kv_tags_upto(cut).tolist() == kv_tags(tokens[:cut], extra)
    assert req.kv_tags_upto(len(tokens)).tolist() == kv_tags(tokens, extra)


@pytest.mark.parametrize("twin", ["reference", "optimized"])
@pytest.mark.parametrize("page_size", [1, 4])
def test_primitives_refuse_misuse_before_allocating_in_both_twins(
    twin: str, page_size: int
) -> None:
    """The SGLang-named primitives check rows, lengths and capacity before evicting or allocating
    (a RowReuseError found after the slot allocation used to leak the slots)."""
    config = PoolConfig(size=16 * page_size, page_size=page_size, req_pool_size=2)
    mm: Any = RefMM(config) if twin == "reference" else OptMM(config, checked=True)
    mm.new_req("a", [1, 2, 3])
    mm.new_req("b", [4, 5, 6])
    mm.extend(["a"])
    held = mm.reqs["a"]
    squatter = type(held)("x", [5, 6, 7])
    squatter.req_pool_idx = held.req_pool_idx  # held by "a"; x has no committed KV
    rowless = mm.reqs["b"]  # waiting: no row
    cases: list[tuple[type[KVPoolError], Callable[[], object]]] = [
        (RowReuseError, lambda: mm.alloc_for_extend([squatter], [3])),
        (ContextOverflowError, lambda: mm.alloc_for_extend([rowless], [10**6])),
        (InvalidArgumentError, lambda: mm.alloc_for_extend([rowless], [3, 3])),
        (InvalidArgumentError, lambda: mm.alloc_for_decode([held, rowless])),
        (InvalidArgumentError, lambda: mm.release_kv_cache(rowless)),
        (InvalidArgumentError, lambda: mm.tree_cache.cache_finished_req(rowless)),
        (InvalidArgumentError, lambda: mm.tree_cache.cache_unfinished_req(rowless)),
    ]
    for error, action in cases:
        before = mm.snapshot()
        with pytest.raises(error) as info:
            action()
        assert type(info.value) is error
        assert mm.snapshot() == before, error
        assert rowless.req_pool_idx is None and squatter.kv_allocated_len == 0
