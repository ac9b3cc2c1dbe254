"""The op-list shrinker: greedy deletion that keeps the detector, bounded by replays."""

from __future__ import annotations

from kvpool.config import PoolConfig
from kvpool.testing.campaign import replay, shrink
from kvpool.testing.factories import reference_factory
from kvpool.testing.swarm import Op
from tests.harness.buggy_impl import leaky_factory

CONFIG = PoolConfig(size=32, page_size=1, req_pool_size=4)
NOISE = [Op("new_req", (f"n{i}", [3, 2, 1, i + 1])) for i in range(6)]
BUG = [
    Op("new_req", ("r1", [1, 2, 3])),
    Op("extend", (["r1"],)),
    Op("finish", (["r1"],), (("is_insert", False),)),
]
"""The leaky candidate forgets one slot when a request's 3 slots are freed: a leak."""


def test_shrink_drops_everything_but_the_failing_steps() -> None:
    ops = NOISE[:3] + BUG[:2] + NOISE[3:] + BUG[2:]
    found = replay(reference_factory, leaky_factory, CONFIG, ops)
    assert found is not None
    best, final = shrink(reference_factory, leaky_factory, CONFIG, ops, found.detector)
    assert [op.name for op in best] == ["new_req", "extend", "finish"]
    assert final is not None and final.detector == found.detector and final.step == 3


def test_replay_bound_stops_the_shrinker_deterministically() -> None:
    ops = NOISE + BUG
    found = replay(reference_factory, leaky_factory, CONFIG, ops)
    assert found is not None
    untouched, _ = shrink(
        reference_factory, leaky_factory, CONFIG, ops, found.detector, max_replays=0
    )
    assert untouched == ops
    # One replay: the first chunk (half the list, rounded down: 4 noise steps) goes, then stop.
    runs = [
        shrink(reference_factory, leaky_factory, CONFIG, ops, found.detector, max_replays=1)[0]
        for _ in range(2)
    ]
    assert runs[0] == runs[1] == NOISE[4:] + BUG
