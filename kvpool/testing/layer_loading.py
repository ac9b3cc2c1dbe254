"""Layer-wise loading harness: layers load out of order; no read may see a layer before its load
completed.

Each round starts a load on the pool's :class:`LayerDoneCounter` (``update_producer`` +
``set_consumer``). The **loader** takes the layers in a seeded random order; for each it writes
that round's value (``1000 * round + layer + 1``) into the layer at the probe slots, then marks the
layer done (``events[producer].complete``). The **reader** is the forward pass: it reads layers
``0, 1, ...`` in order through ``get_key_buffer`` and notes what it saw.

- :func:`run_reference` interleaves the two as one seeded sequence of steps. A read of a layer
  not yet done must raise :class:`~kvpool.errors.LayerNotLoadedError` (the reader retries it
  later); a read that returns must come after the layer's completion and show this round's value.
- :func:`run_twin` runs the loader and the reader in two threads against the twin's blocking
  counter. The loader completes a layer only while the reader is inside ``wait_until`` (or done
  reading), so a pool that reads without waiting, or waits on the wrong layer, is caught
  deterministically: its read returns before the layer's value is there.

Both return the list of violations (empty when every read was sound).
"""

from __future__ import annotations

import random
import threading
from collections.abc import Callable
from typing import Any

from kvpool.errors import LayerNotLoadedError
from kvpool.reference.kv.layer_transfer import LayerDoneCounter as RefCounter

PROBE_SLOTS = (1, 2)


def layer_value(round_index: int, layer: int) -> float:
    """The value a round's load writes into a layer (distinct per round and layer)."""
    return float(1000 * round_index + layer + 1)


def first_value(buffer: Any, slot: int) -> float:
    """Head 0, channel 0 of ``slot`` in a layer buffer (reference lists or a torch tensor)."""
    if isinstance(buffer, list):
        return float(buffer[slot][0][0])
    return float(buffer[slot, 0, 0])


def _load(pool: Any, layer: int, round_index: int, make: Callable[[list[Any]], Any]) -> None:
    """Write the round's value for ``layer`` (local index) at the probe slots, K and V."""
    value = layer_value(round_index, layer)
    k = [[[value] * pool.head_dim for _ in range(pool.head_num)] for _ in PROBE_SLOTS]
    v = [[[value] * pool.v_head_dim for _ in range(pool.head_num)] for _ in PROBE_SLOTS]
    pool.set_kv_buffer(pool.start_layer + layer, list(PROBE_SLOTS), make(k), make(v))


def run_reference(pool: Any, seed: int, rounds: int = 4) -> list[str]:
    """Seeded interleaving of loads and reads on a reference pool (module docstring)."""
    rng = random.Random(seed)
    counter = RefCounter(pool.layer_num)
    pool.register_layer_transfer_counter(counter)
    violations: list[str] = []
    for r in range(rounds):
        event = counter.update_producer()
        counter.set_consumer(event)
        order = rng.sample(range(pool.layer_num), pool.layer_num)
        done: set[int] = set()
        next_read = 0
        while next_read < pool.layer_num:
            if order and rng.random() < 0.5:
                layer = order.pop(0)
                _load(pool, layer, r, lambda x: x)
                counter.events[event].complete(layer)
                done.add(layer)
                continue
            try:
                buffer = pool.get_key_buffer(pool.start_layer + next_read)
            except LayerNotLoadedError:
                if next_read in done:
                    violations.append(f"round {r}: layer {next_read} refused after its load")
                continue
            seen = first_value(buffer, PROBE_SLOTS[0])
            if next_read not in done or seen != layer_value(r, next_read):
                violations.append(
                    f"round {r}: layer {next_read} read {seen} (loaded: {next_read in done})"
                )
            next_read += 1
        for layer in order:  # the rest of the load lands after the forward pass
            _load(pool, layer, r, lambda x: x)
            counter.events[event].complete(layer)
    return violations


class _SignallingCounter:
    """Wraps a counter: records when the reader is inside ``wait_until``."""

    def __init__(self, inner: Any, state: threading.Condition, flags: dict[str, bool]) -> None:
        self.inner, self.state, self.flags = inner, state, flags

    def wait_until(self, threshold: int) -> None:
        with self.state:
            self.flags["waiting"] = True
            self.state.notify_all()
        try:
            self.inner.wait_until(threshold)
        finally:
            with self.state:
                self.flags["waiting"] = False


def run_twin(
    pool: Any, seed: int, counter: Any, make: Callable[[list[Any]], Any], rounds: int = 3
) -> list[str]:
    """Loader and reader threads on a twin pool with the twin's blocking ``counter`` (module
    docstring). ``make`` turns nested lists into the pool's input tensors."""
    rng = random.Random(seed)
    state = threading.Condition()
    flags = {"waiting": False, "finished": False}
    pool.register_layer_transfer_counter(_SignallingCounter(counter, state, flags))
    violations: list[str] = []
    for r in range(rounds):
        event = counter.update_producer()
        counter.set_consumer(event)
        order = rng.sample(range(pool.layer_num), pool.layer_num)
        flags["finished"] = False

        def loader(order: list[int] = order, r: int = r, event: int = event) -> None:
            for layer in order:
                with state:
                    state.wait_for(lambda: flags["waiting"] or flags["finished"], timeout=10)
                _load(pool, layer, r, make)
                counter.events[event].complete(layer)

        thread = threading.Thread(target=loader)
        thread.start()
        for layer in range(pool.layer_num):
            seen = first_value(pool.get_key_buffer(pool.start_layer + layer), PROBE_SLOTS[0])
            if seen != layer_value(r, layer):
                violations.append(f"round {r}: layer {layer} read {seen} before its load")
        with state:
            flags["finished"] = True
            state.notify_all()
        thread.join(timeout=30)
        if thread.is_alive():
            violations.append(f"round {r}: the loader did not finish")
            break
    return violations


__all__ = ["first_value", "layer_value", "run_reference", "run_twin"]
