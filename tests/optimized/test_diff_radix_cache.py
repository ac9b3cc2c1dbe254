"""Direct differential test: optimized RadixCache / ChunkCache vs the reference on random
operation sequences (page sizes 1, 2, 4, 16, 64; every eviction policy).

Both twins free through a recording allocator, so the exact sequence of ``free`` calls (slot lists,
in order) is compared too, along with every result, node id, snapshot and the eviction order."""

from __future__ import annotations

import random
from typing import Any

import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

from kvpool.constants import EVICTION_POLICIES, SUPPORTED_PAGE_SIZES_TESTED
from kvpool.errors import InvalidArgumentError, KVPoolError, LockError
from kvpool.optimized.radix.radix_cache import RadixCache as OptRadixCache
from kvpool.optimized.radix_key import RadixKey as OptKey
from kvpool.reference.radix.radix_cache import RadixCache as RefRadixCache
from kvpool.reference.radix_key import RadixKey as RefKey


class RecordingAllocator:
    """Stands in for the token allocator: remembers every ``free`` call as a list of slots."""

    def __init__(self, page_size: int) -> None:
        self.page_size = page_size
        self.calls: list[list[int]] = []

    def free(self, idx: Any) -> None:
        self.calls.append([int(x) for x in (idx.tolist() if hasattr(idx, "tolist") else idx)])


def _plain(x: Any) -> list[int]:
    return [int(v) for v in (x.tolist() if isinstance(x, torch.Tensor) else x)]


def _node_id(node: Any) -> int | None:
    return None if node is None else int(node.node_id)


class Pair:
    """The two twins side by side, with the same allocator stand-in type."""

    def __init__(self, page_size: int, policy: str) -> None:
        self.ref_alloc = RecordingAllocator(page_size)
        self.opt_alloc = RecordingAllocator(page_size)
        self.ref = RefRadixCache(None, self.ref_alloc, page_size, eviction_policy=policy)  # type: ignore[arg-type]
        self.opt = OptRadixCache(None, self.opt_alloc, page_size, eviction_policy=policy)  # type: ignore[arg-type]
        self.ref_nodes: list[Any] = []
        self.opt_nodes: list[Any] = []
        self.next_slot = 1

    def check(self) -> None:
        assert self.ref.snapshot() == self.opt.snapshot()
        assert self.ref_alloc.calls == self.opt_alloc.calls
        assert self.ref.total_size() == self.opt.total_size()
        assert self.ref.evictable_size() == self.opt.evictable_size()
        assert self.ref.protected_size() == self.opt.protected_size()
        assert self.ref.pretty_print() == self.opt.pretty_print()

    def both(
        self, name: str, ref_args: tuple[Any, ...], opt_args: tuple[Any, ...], **kw: Any
    ) -> tuple[Any, Any]:
        """Call method ``name`` on both twins; they must agree on success or on the error."""
        try:
            r = getattr(self.ref, name)(*ref_args, **kw)
        except KVPoolError as exc:
            with pytest.raises(type(exc)):
                getattr(self.opt, name)(*opt_args, **kw)
            return None, None
        return r, getattr(self.opt, name)(*opt_args, **kw)


def _tokens(rng: random.Random, page_size: int) -> list[int]:
    # a tiny vocabulary and page-multiple lengths make shared prefixes and splits frequent
    n = rng.randrange(0, 6) * page_size + rng.choice([0, 0, rng.randrange(page_size)])
    stem = rng.choice([[], [1] * page_size, [2] * page_size * 2])
    return (stem + [rng.randrange(3) for _ in range(n)])[: max(n, len(stem))]


def run_sequence(seed: int, page_size: int, policy: str, steps: int) -> None:
    rng = random.Random(seed)
    p = Pair(page_size, policy)
    for _ in range(steps):
        op = rng.choice(["insert", "insert", "match", "match", "lock", "unlock", "evict"])
        extra = rng.choice([None, None, "ns"])
        if op == "insert":
            toks = _tokens(rng, page_size)
            slots = list(range(p.next_slot, p.next_slot + len(toks)))
            p.next_slot += len(toks)
            prio = rng.randrange(3)
            r, o = p.both(
                "insert",
                (RefKey(toks, extra), slots),
                (OptKey(toks, extra), torch.tensor(slots)),
                priority=prio,
            )
            assert r == o
        elif op == "match":
            toks = _tokens(rng, page_size)
            rm = p.ref.match_prefix(RefKey(toks, extra))
            om = p.opt.match_prefix(OptKey(toks, extra))
            assert _plain(rm.device_indices) == _plain(om.device_indices)
            assert _node_id(rm.last_device_node) == _node_id(om.last_device_node)
            assert _node_id(rm.last_host_node) == _node_id(om.last_host_node)
            p.ref_nodes.append(rm.last_device_node)
            p.opt_nodes.append(om.last_device_node)
        elif op in ("lock", "unlock") and p.ref_nodes:
            i = rng.randrange(len(p.ref_nodes))
            name = "inc_lock_ref" if op == "lock" else "dec_lock_ref"
            r, o = p.both(name, (p.ref_nodes[i],), (p.opt_nodes[i],))
            assert r == o
        elif op == "evict":
            n = rng.randrange(0, 8 * page_size)
            assert p.ref.evict(n) == p.opt.evict(n)
        p.check()
    # drain: the full eviction order must agree too
    for rn, on in reversed(list(zip(p.ref_nodes, p.opt_nodes, strict=True))):
        r, o = p.both("dec_lock_ref", (rn,), (on,))
        assert r == o
    assert p.ref.evict(10**9) == p.opt.evict(10**9)
    p.check()


@pytest.mark.parametrize("page_size", SUPPORTED_PAGE_SIZES_TESTED)
@pytest.mark.parametrize("policy", EVICTION_POLICIES)
def test_random_sequences_fixed_seeds(page_size: int, policy: str) -> None:
    for seed in range(3):
        run_sequence(seed * 1000 + page_size, page_size, policy, steps=60)


@pytest.mark.slow
@given(
    seed=st.integers(0, 2**32 - 1),
    page_size=st.sampled_from(SUPPORTED_PAGE_SIZES_TESTED),
    policy=st.sampled_from(EVICTION_POLICIES),
)
def test_random_sequences_hypothesis(seed: int, page_size: int, policy: str) -> None:
    run_sequence(seed, page_size, policy, steps=40)


def test_misuse_raises_same_errors() -> None:
    p = Pair(1, "lru")
    with pytest.raises(InvalidArgumentError):
        p.opt.insert(OptKey([1, 2, 3]), torch.tensor([5]))
    with pytest.raises(InvalidArgumentError):
        p.opt.evict(-1)
    p.ref.insert(RefKey([1, 2]), [3, 4])
    p.opt.insert(OptKey([1, 2]), torch.tensor([3, 4]))
    ref_node = p.ref.match_prefix(RefKey([1, 2])).last_device_node
    opt_node = p.opt.match_prefix(OptKey([1, 2])).last_device_node
    with pytest.raises(LockError):
        p.opt.dec_lock_ref(opt_node)
    p.ref.evict(2)
    p.opt.evict(2)
    with pytest.raises(LockError):  # detached node
        p.opt.inc_lock_ref(opt_node)
    with pytest.raises(LockError):
        p.ref.inc_lock_ref(ref_node)
    p.check()


def test_array_and_list_keys_agree() -> None:
    a = OptRadixCache(None, RecordingAllocator(4), 4)  # type: ignore[arg-type]
    b = OptRadixCache(None, RecordingAllocator(4), 4)  # type: ignore[arg-type]
    toks = [7, 7, 7, 7, 1, 2, 3, 4, 9]
    assert a.insert(OptKey(toks), torch.arange(1, 10)) == 0
    import numpy as np

    assert b.insert(OptKey(np.array(toks)), torch.arange(1, 10)) == 0
    assert a.snapshot() == b.snapshot()
    assert a.match_prefix(OptKey(toks[:6])).device_indices.tolist() == [1, 2, 3, 4]


def test_twins_satisfy_the_protocols() -> None:
    # mypy checks these assignments statically; the runtime asserts keep the test honest.
    from kvpool.config import PoolConfig
    from kvpool.optimized.lifecycle.memory_manager import MemoryManager
    from kvpool.optimized.radix.chunk_cache import ChunkCache
    from kvpool.protocols.lifecycle import MemoryManagerProtocol
    from kvpool.protocols.radix import RadixCacheProtocol

    tree: RadixCacheProtocol[torch.Tensor] = OptRadixCache(None, RecordingAllocator(2), 2)  # type: ignore[arg-type]
    chunk: RadixCacheProtocol[torch.Tensor] = ChunkCache(None, RecordingAllocator(2), 2)  # type: ignore[arg-type]
    mm: MemoryManagerProtocol[torch.Tensor] = MemoryManager(PoolConfig(size=16, page_size=2))
    assert tree.page_size == chunk.page_size == 2
    assert not tree.disable and chunk.disable
    assert mm.snapshot().max_total_num_tokens == 16


def test_wide_token_ids_and_mixed_widths() -> None:
    # ids past 32 bits fall back to int64 arrays; int32 and int64 keys match each other
    import numpy as np

    big = [2**40, 2**40 + 1, 5, 6]
    ref = RefRadixCache(None, RecordingAllocator(2), 2)  # type: ignore[arg-type]
    opt = OptRadixCache(None, RecordingAllocator(2), 2)  # type: ignore[arg-type]
    assert OptKey(big).array.dtype == np.int64
    assert OptKey([1, 2]).array.dtype == np.int32
    ref.insert(RefKey(big), [1, 2, 3, 4])
    opt.insert(OptKey(big), torch.tensor([1, 2, 3, 4]))
    ref.insert(RefKey([1, 2, 3, 4]), [5, 6, 7, 8])
    opt.insert(OptKey(np.array([1, 2, 3, 4], dtype=np.int64)), torch.tensor([5, 6, 7, 8]))
    got = opt.match_prefix(OptKey(np.array([1, 2, 3, 9], dtype=np.int32)))
    assert got.device_indices.tolist() == ref.match_prefix(RefKey([1, 2, 3, 9])).device_indices
    assert got.device_indices.tolist() == [5, 6]
    assert opt.snapshot() == ref.snapshot()
