"""Reference layer-wise loading: LayerDoneCounter, a pool that reads through it, the harness."""

from __future__ import annotations

import pytest

from kvpool.errors import IndexOutOfRangeError, LayerNotLoadedError, LockError
from kvpool.reference.kv.fp4 import MHATokenToKVPoolFP4
from kvpool.reference.kv.layer_transfer import LayerDoneCounter
from kvpool.reference.kv.mha import MHATokenToKVPool
from kvpool.testing.layer_loading import run_reference


def test_read_before_load_is_a_typed_error_then_succeeds() -> None:
    kv = MHATokenToKVPool(8, 1, "float32", 1, 2, 3, start_layer=2)
    counter = LayerDoneCounter(3)
    kv.register_layer_transfer_counter(counter)
    kv.get_key_buffer(2)  # no consumer yet: nothing is loading
    event = counter.update_producer()
    counter.set_consumer(event)
    counter.events[event].complete(2)  # local layer 2 = global layer 4, out of order
    assert kv.get_value_buffer(4) is kv.v_buffer[2]
    with pytest.raises(LayerNotLoadedError):
        kv.get_key_buffer(2)
    with pytest.raises(LayerNotLoadedError):
        kv.get_kv_buffer(3)
    counter.events[event].complete(0)
    assert kv.get_key_buffer(2) is kv.k_buffer[0]


def test_counter_rotation_refuses_an_unfinished_event() -> None:
    counter = LayerDoneCounter(2)
    assert [counter.update_producer() for _ in range(3)] == [0, 1, 2]
    with pytest.raises(LockError):
        counter.update_producer()  # event 0's load never finished
    assert counter.producer_index == 2
    counter.events[0].complete(1)  # its last layer: finished
    assert counter.update_producer() == 0 and not counter.events[0].is_complete(1)
    with pytest.raises(IndexOutOfRangeError):
        counter.set_consumer(3)
    counter.set_consumer(0)
    counter.reset()
    counter.wait_until(1)  # reset: no consumer, no wait
    assert (counter.producer_index, counter.consumer_index) == (-1, -1)


@pytest.mark.parametrize("seed", range(20))
def test_out_of_order_loads_never_read_early(seed: int) -> None:
    kv = MHATokenToKVPool(8, 1, "float32", 1, 2, 4, start_layer=1)
    assert run_reference(kv, seed) == []


def test_quantised_pool_waits_too() -> None:
    kv = MHATokenToKVPoolFP4(8, 1, "float32", 1, 16, 2)
    counter = LayerDoneCounter(2)
    kv.register_layer_transfer_counter(counter)
    counter.set_consumer(counter.update_producer())
    with pytest.raises(LayerNotLoadedError):
        kv.get_raw_kv_buffer(1)


class EagerPool(MHATokenToKVPool):
    """A pool whose key reads skip the transfer wait."""

    def get_key_buffer(self, layer_id: int) -> list[list[list[float]]]:
        return self.k_buffer[self._layer(layer_id)]


def test_harness_catches_a_read_that_skips_the_wait() -> None:
    kv = EagerPool(8, 1, "float32", 1, 2, 4)
    assert any(run_reference(kv, seed) for seed in range(5))
