"""Opt-in (``--run-sglang-wheel``): SGLang's own host KV pool allocator (``HostKVCache``'s
``alloc`` / ``free`` / ``available_size``, through :class:`kvpool.sglang.SGLangHostPool`) in step
with kvpool's reference ``HostKVCache`` on seeded alloc/free sequences, for each release with a
rules preset: the same slots in the same order, the same free lists after every step, and a
double free or a size off the page grid refused by both, nothing changed. The wheels come from
``$KVPOOL_SGLANG_CACHE`` (or ``~/.cache/kvpool/sglang``)."""

from __future__ import annotations

import random

import pytest

from kvpool.errors import AlignmentError, DoubleFreeError
from kvpool.reference.hicache.memory_pool_host import MHATokenToKVPoolHost
from kvpool.reference.kv.mha import MHATokenToKVPool
from kvpool.sglang import SGLangHostPool, SGLangModules, load_sglang

pytestmark = pytest.mark.sglang_wheel


@pytest.fixture(scope="module", params=("0.5.16", "0.5.23"))
def sgl(request: pytest.FixtureRequest) -> SGLangModules:
    return load_sglang(str(request.param))


def _plain(snap: object) -> tuple[object, ...]:
    return (snap.free_slots, snap.release_slots)  # type: ignore[attr-defined]


@pytest.mark.parametrize("page_size", [1, 4])
@pytest.mark.parametrize("seed", range(4))
def test_host_allocator_matches_sglang(sgl: SGLangModules, page_size: int, seed: int) -> None:
    ours = MHATokenToKVPoolHost(MHATokenToKVPool(32, page_size, "float32", 1, 2, 1), 1.0, 0,
                                page_size)  # fmt: skip
    theirs = SGLangHostPool(sgl, ours.size, page_size)
    assert theirs.available_size() == ours.available_size() == ours.size
    rng = random.Random(seed)
    held: list[list[int]] = []
    for _ in range(60):
        if held and rng.random() < 0.45:
            got = held.pop(rng.randrange(len(held)))
            assert theirs.free(got) == ours.free(got) == len(got)
        else:
            n = rng.randint(0, 4) * page_size
            a, b = ours.alloc(n), theirs.alloc(n)
            assert a == (None if b is None else b.tolist())
            if a:
                held.append(a)
        assert _plain(theirs.snapshot()) == _plain(ours.snapshot())
        assert theirs.available_size() == ours.available_size()


def test_misuse_is_refused_by_both_without_change(sgl: SGLangModules) -> None:
    ours = MHATokenToKVPoolHost(MHATokenToKVPool(16, 4, "float32", 1, 2, 1), 1.0, 0, 4)
    theirs = SGLangHostPool(sgl, ours.size, 4)
    slots = ours.alloc(4)
    assert slots is not None and theirs.alloc(4) is not None
    ours.free(slots)
    theirs.free(slots)
    for pool in (ours, theirs):
        before = _plain(pool.snapshot())
        with pytest.raises(DoubleFreeError):
            pool.free(slots)
        with pytest.raises(AlignmentError):
            pool.alloc(3)
        assert _plain(pool.snapshot()) == before
