"""A refused step leaves no reference cycle: the driver keeps the refusal (its class and message
are compared and reported) without the traceback, whose frames would hold the driver, and so
both implementations, until the cyclic collector ran. With the collector off, a run's driver
must be freed as soon as the last reference to it goes."""

from __future__ import annotations

import gc
import weakref

import pytest

from kvpool.config import PoolConfig
from kvpool.errors import KVPoolError, OutOfMemoryError
from kvpool.testing.factories import optimized_factory, reference_factory
from kvpool.testing.lockstep_driver import Lockstep
from kvpool.testing.swarm import Op

REFUSED = [
    Op("new_req", ("r1", [1, 2, 3])),
    Op("extend", (["nobody"],), expect_error=True),  # an unknown request
    Op("new_req", ("r2", list(range(40)))),
    Op("extend", (["r2"],)),  # more tokens than the pool holds: OutOfMemoryError
    Op("finish", ("r1",), expect_error=True),  # never extended
]


@pytest.fixture
def no_collector() -> object:
    gc.collect()
    gc.disable()
    try:
        yield None
    finally:
        gc.enable()


def test_refusals_keep_no_traceback(no_collector: object) -> None:
    pair = Lockstep(reference_factory, optimized_factory("torch"), PoolConfig(size=16))
    errors = [pair.run(op) for op in REFUSED]
    refused = [e for e in errors if isinstance(e, KVPoolError)]
    assert len(refused) == 3 and any(isinstance(e, OutOfMemoryError) for e in refused)
    for err in refused:
        assert err.__traceback__ is None


def test_a_driver_with_refused_steps_is_freed_without_the_collector(no_collector: object) -> None:
    pair = Lockstep(reference_factory, optimized_factory("torch"), PoolConfig(size=16))
    for op in REFUSED:
        pair.run(op)
    gone = weakref.ref(pair)
    manager = weakref.ref(pair.b)
    del pair
    assert gone() is None
    assert manager() is None
