"""Layer-wise KV loading: SGLang's ``LayerLoadingEvent`` and ``LayerDoneCounter``.

A load (host to device) copies a batch's KV one layer at a time so the forward pass can start on
layer 0 while later layers are still in flight. The loader marks layer ``i`` done with
``events[producer].complete(i)``; a pool with the counter registered
(``register_layer_transfer_counter``) calls ``wait_until(i)`` before every read of layer ``i``
(``i`` is the local layer index, ``layer_id - start_layer``, as SGLang passes it).

The counter rotates over ``num_counters = 3`` events so loads for the next batches can be queued
while the current one is consumed: ``update_producer()`` moves to the next event (the event
reused must have finished: its last layer done, or never used) and starts it afresh;
``set_consumer(i)`` selects which load reads wait for; ``reset()`` forgets both. With no consumer
set, ``wait_until`` returns at once (nothing is loading).

In SGLang a wait is a device-stream dependency. Here, in the reference, a wait on a layer whose
load has not completed raises :class:`~kvpool.errors.LayerNotLoadedError` (the read would have
seen stale KV); in the twin it blocks until the layer completes.
"""

from __future__ import annotations

from kvpool.errors import ConfigError, IndexOutOfRangeError, LayerNotLoadedError, LockError
from kvpool.host_checks import as_int


class LayerLoadingEvent:
    """Completion flags of one load, one per layer (``start`` marks the event as used)."""

    def __init__(self, num_layers: int) -> None:
        self._num_layers = num_layers
        self.done = [False] * num_layers
        self.started = False

    def _check(self, layer_index: object, name: str = "layer_index") -> int:
        """``layer_index`` as a local layer: InvalidArgumentError unless an integer (not a
        bool), IndexOutOfRangeError outside ``0..num_layers - 1``."""
        index = as_int(name, layer_index)
        if not 0 <= index < self._num_layers:
            raise IndexOutOfRangeError(f"{name} {index} outside 0..{self._num_layers - 1}")
        return index

    def start(self) -> None:
        """A new load begins on this event: no layer is done."""
        self.done = [False] * self._num_layers
        self.started = True

    def complete(self, layer_index: int) -> None:
        """Layer ``layer_index`` (local) has finished loading."""
        self.done[self._check(layer_index)] = True

    def is_complete(self, layer_index: int) -> bool:
        """Whether layer ``layer_index`` has finished loading."""
        return self.done[self._check(layer_index)]

    def wait(self, layer_index: int) -> None:
        """LayerNotLoadedError unless layer ``layer_index`` has finished loading."""
        if not self.is_complete(layer_index):
            raise LayerNotLoadedError(f"layer {layer_index} read before its load completed")

    @property
    def finished(self) -> bool:
        """True when the event may be reused: never started, or its last layer done."""
        return not self.started or self.done[-1]


class LayerDoneCounter:
    """Three rotating :class:`LayerLoadingEvent` s, a producer and a consumer index."""

    num_counters = 3

    def __init__(self, num_layers: int) -> None:
        if num_layers <= 0:
            raise ConfigError(f"num_layers must be positive, got {num_layers}")
        self.num_layers = num_layers
        self.events = [LayerLoadingEvent(num_layers) for _ in range(self.num_counters)]
        self.producer_index = -1
        self.consumer_index = -1

    def update_producer(self) -> int:
        """Start a load on the next event and return its index. LockError (nothing changes) if
        that event's previous load has not finished (SGLang asserts the same)."""
        nxt = (self.producer_index + 1) % self.num_counters
        if not self.events[nxt].finished:
            raise LockError(f"event {nxt} reused before its previous load finished")
        self.producer_index = nxt
        self.events[nxt].start()
        return nxt

    def set_consumer(self, index: int) -> None:
        """Reads wait for the load on event ``index`` (an integer in ``0..num_counters - 1``,
        else InvalidArgumentError / IndexOutOfRangeError)."""
        event = as_int("index", index)
        if not 0 <= event < self.num_counters:
            raise IndexOutOfRangeError(f"event {event} outside 0..{self.num_counters - 1}")
        self.consumer_index = event

    def wait_until(self, threshold: int) -> None:
        """Return if no consumer is set or layer ``threshold`` of its load is done; else
        LayerNotLoadedError. ``threshold`` is checked (an integer in ``0..num_layers - 1``)
        even with no consumer: a bad layer is a bad call whatever is loading."""
        layer = as_int("threshold", threshold)
        if not 0 <= layer < self.num_layers:
            raise IndexOutOfRangeError(f"threshold {layer} outside 0..{self.num_layers - 1}")
        if self.consumer_index < 0:
            return
        self.events[self.consumer_index].wait(layer)

    def reset(self) -> None:
        """Forget the producer and consumer (no load is in progress)."""
        self.producer_index = -1
        self.consumer_index = -1


__all__ = ["LayerDoneCounter", "LayerLoadingEvent"]
