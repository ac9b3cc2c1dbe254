"""Twin layer-wise loading: reads wait (block) for their layer; out-of-order loads in a thread."""

from __future__ import annotations

import threading
import time

import pytest
import torch

from kvpool.errors import LayerNotLoadedError, LockError
from kvpool.optimized.kv.layer_transfer import LayerDoneCounter
from kvpool.optimized.kv.mha import MHATokenToKVPool
from kvpool.optimized.kv.page_major import PageMajorMHATokenToKVPool
from kvpool.testing.layer_loading import run_twin


def tensor(x: list[object]) -> torch.Tensor:
    return torch.tensor(x, dtype=torch.float32)


def test_read_blocks_until_the_layer_completes() -> None:
    kv = MHATokenToKVPool(8, 1, torch.float32, 1, 2, 2)
    counter = LayerDoneCounter(2)
    kv.register_layer_transfer_counter(counter)
    event = counter.update_producer()
    counter.set_consumer(event)
    returned: list[float] = []

    def read() -> None:
        kv.get_key_buffer(1)
        returned.append(time.monotonic())

    reader = threading.Thread(target=read)
    reader.start()
    time.sleep(0.05)
    assert not returned  # still waiting
    completed = time.monotonic()
    counter.events[event].complete(1)
    reader.join(timeout=10)
    assert returned and returned[0] >= completed


def test_wait_times_out_with_a_typed_error() -> None:
    counter = LayerDoneCounter(2, timeout=0.01)
    counter.set_consumer(counter.update_producer())
    with pytest.raises(LayerNotLoadedError):
        counter.wait_until(0)
    for _ in range(2):
        counter.update_producer()
    with pytest.raises(LockError):
        counter.update_producer()


@pytest.mark.parametrize("seed", range(6))
def test_out_of_order_loads_never_read_early(seed: int) -> None:
    kv = MHATokenToKVPool(8, 1, torch.float32, 1, 2, 4, start_layer=2)
    assert run_twin(kv, seed, LayerDoneCounter(4, timeout=10), tensor) == []


class PageMajorFirstValue(PageMajorMHATokenToKVPool):
    """The page-major views seen by slot (page_size 1: one slot a page)."""

    def get_key_buffer(self, layer_id: int) -> torch.Tensor:
        return super().get_key_buffer(layer_id)[:, 0]


def test_page_major_pool_loads_layer_wise() -> None:
    kv = PageMajorFirstValue(8, 1, "float32", 1, 2, 3)
    assert run_twin(kv, 1, LayerDoneCounter(3, timeout=10), tensor) == []


class EagerPool(MHATokenToKVPool):
    """A pool whose key reads skip the transfer wait."""

    def get_key_buffer(self, layer_id: int) -> torch.Tensor:
        return self.k_buffer[self._layer(layer_id)]


def test_harness_catches_a_read_that_skips_the_wait() -> None:
    kv = EagerPool(8, 1, torch.float32, 1, 2, 3)
    assert run_twin(kv, 0, LayerDoneCounter(3, timeout=10), tensor) != []
