"""Layer-wise KV loading, twin of :mod:`kvpool.reference.kv.layer_transfer`: the same names and
rotation, but a wait on a layer whose load has not completed **blocks** until a loader thread
calls ``complete`` (SGLang's stream wait), instead of raising.

A wait gives up after ``timeout`` seconds (default 30) with
:class:`~kvpool.errors.LayerNotLoadedError`, so a load that never completes fails a test rather
than hanging it.
"""

from __future__ import annotations

import threading

from kvpool.errors import ConfigError, IndexOutOfRangeError, LayerNotLoadedError, LockError
from kvpool.host_checks import as_int


class LayerLoadingEvent:
    """Per-layer completion flags of one load, guarded by a condition variable."""

    def __init__(self, num_layers: int, timeout: float = 30.0) -> None:
        self._num_layers = num_layers
        self._timeout = timeout
        self._cond = threading.Condition()
        self.done = [False] * num_layers
        self.started = False

    def _check(self, layer_index: object, name: str = "layer_index") -> int:
        """``layer_index`` as a local layer (the reference's checks and errors)."""
        index = as_int(name, layer_index)
        if not 0 <= index < self._num_layers:
            raise IndexOutOfRangeError(f"{name} {index} outside 0..{self._num_layers - 1}")
        return index

    def start(self) -> None:
        """A new load begins on this event: no layer is done."""
        with self._cond:
            self.done = [False] * self._num_layers
            self.started = True

    def complete(self, layer_index: int) -> None:
        """Layer ``layer_index`` has finished loading; wakes its waiters."""
        index = self._check(layer_index)
        with self._cond:
            self.done[index] = True
            self._cond.notify_all()

    def is_complete(self, layer_index: int) -> bool:
        """Whether layer ``layer_index`` has finished loading."""
        index = self._check(layer_index)
        with self._cond:
            return self.done[index]

    def wait(self, layer_index: int) -> None:
        """Block until layer ``layer_index`` has loaded (LayerNotLoadedError after the
        timeout)."""
        index = self._check(layer_index)
        with self._cond:
            if not self._cond.wait_for(lambda: self.done[index], self._timeout):
                raise LayerNotLoadedError(f"layer {index} still loading after {self._timeout} s")

    @property
    def finished(self) -> bool:
        """True when the event may be reused: never started, or its last layer done."""
        with self._cond:
            return not self.started or self.done[-1]


class LayerDoneCounter:
    """Three rotating :class:`LayerLoadingEvent` s, a producer and a consumer index."""

    num_counters = 3

    def __init__(self, num_layers: int, timeout: float = 30.0) -> None:
        if num_layers <= 0:
            raise ConfigError(f"num_layers must be positive, got {num_layers}")
        self.num_layers = num_layers
        self.events = [LayerLoadingEvent(num_layers, timeout) for _ in range(self.num_counters)]
        self.producer_index = -1
        self.consumer_index = -1

    def update_producer(self) -> int:
        """Start a load on the next event; LockError if it has not finished its last load."""
        nxt = (self.producer_index + 1) % self.num_counters
        if not self.events[nxt].finished:
            raise LockError(f"event {nxt} reused before its previous load finished")
        self.producer_index = nxt
        self.events[nxt].start()
        return nxt

    def set_consumer(self, index: int) -> None:
        """Reads wait for the load on event ``index`` (the reference's checks and errors)."""
        event = as_int("index", index)
        if not 0 <= event < self.num_counters:
            raise IndexOutOfRangeError(f"event {event} outside 0..{self.num_counters - 1}")
        self.consumer_index = event

    def wait_until(self, threshold: int) -> None:
        """Return at once without a consumer; else block until layer ``threshold`` loaded.
        ``threshold`` is checked first, consumer or not (the reference's checks and errors)."""
        layer = as_int("threshold", threshold)
        if not 0 <= layer < self.num_layers:
            raise IndexOutOfRangeError(f"threshold {layer} outside 0..{self.num_layers - 1}")
        if self.consumer_index < 0:
            return
        self.events[self.consumer_index].wait(layer)

    def reset(self) -> None:
        """Forget the producer and consumer."""
        self.producer_index = -1
        self.consumer_index = -1


__all__ = ["LayerDoneCounter", "LayerLoadingEvent"]
