"""Layer-wise loading inside the request lifecycle: the lockstep's loader and forward steps.

With ``PoolConfig.layerwise_loading`` each memory manager registers a ``LayerDoneCounter`` on its
KV pool (``manager.layer_done_counter``). The lockstep then interleaves three harness steps with
the request lifecycle, as SGLang's scheduler does when a load-back or a prefix fetch streams a
batch's KV from the host one layer at a time while the forward pass starts:

- ``layer_load()``: the loader starts the next batch's load (``update_producer``) and the forward
  will wait on it (``set_consumer``); returns the event index. ``LockError`` (nothing changes)
  when the event it rotates onto still has a load in flight.
- ``layer_done(layer)``: the loader finishes local layer ``layer`` of the load in progress
  (``events[producer].complete``); layers finish in the order the swarm draws. ``LockError``
  without a load.
- ``layer_read(layer)``: the forward reads local layer ``layer`` (``get_key_buffer``), which
  waits for that layer. The reference raises ``LayerNotLoadedError`` when it has not loaded; the
  twin waits ``PoolConfig.layer_wait_s`` (:data:`LAYER_WAIT_S` in the swarm: nothing else can
  complete it) and raises the same error, so both are one outcome for the lockstep.

The harness asks each side's counter, before every read, whether the layer had loaded; a read
that returns when it had not is counted, and :meth:`LayerLoads.check` reports
``INV-LAYER-LOADED`` for any (before the outcomes are compared, so a pool that skips the wait is
named by the invariant, not by the bare difference). The two sides' counters (producer, consumer,
per-layer completion) must also stay equal (``lockstep-diff``).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from kvpool.config import PoolConfig
from kvpool.errors import LockError
from kvpool.testing.swarm import LAYER_KINDS, Chooser, Op, View, draw_op

LAYER_OPS = frozenset(LAYER_KINDS)
LAYER_SHARE = 3
"""One lifecycle step in ``LAYER_SHARE`` is a layer step when layer-wise loading is on."""
LAYER_WAIT_S = 0.0002
"""The campaign twin's wait for a layer that is not loaded (``PoolConfig.layer_wait_s``). In a
single-threaded run nothing else can complete the layer, so the wait always times out: its
length is wall time lost to every such read (a few hundred reads in a 20 s campaign)."""


@dataclass
class LayerSide:
    """One side's manager and the reads it let through before their layer had loaded."""

    manager: Any
    early_reads: int = 0


def counter_state(manager: Any) -> tuple[int, int, tuple[tuple[bool, ...], ...]]:
    """``(producer, consumer, done flags per event)`` of ``manager.layer_done_counter``."""
    counter = manager.layer_done_counter
    done = tuple([tuple(map(bool, e.done)) for e in counter.events])
    return counter.producer_index, counter.consumer_index, done


class LayerLoads:
    """The layer steps of one lockstep run on sides A and B (see the module docstring)."""

    def __init__(self, manager_a: Any, manager_b: Any) -> None:
        self.sides = (LayerSide(manager_a), LayerSide(manager_b))

    def _side(self, manager: Any) -> LayerSide:
        first, second = self.sides
        if manager is first.manager:
            return first
        if manager is second.manager:
            return second
        raise ValueError("the manager is neither side of this run")

    def call(self, op: Op, manager: Any) -> Any:
        """Run layer step ``op`` on ``manager`` (one of the two sides)."""
        side = self._side(manager)
        counter, kv = manager.layer_done_counter, manager.kv_cache
        if op.name == "layer_load":
            event = counter.update_producer()
            counter.set_consumer(event)
            return event
        layer = op.args[0]
        if op.name == "layer_done":
            if counter.producer_index < 0:
                raise LockError("no layer-wise load in progress")
            counter.events[counter.producer_index].complete(layer)
            return None
        consumer = counter.consumer_index
        ready = consumer < 0 or counter.events[consumer].is_complete(layer)
        kv.get_key_buffer(kv.start_layer + layer)
        if not ready:
            side.early_reads += 1
        return None

    def check(self, labels: tuple[str, str]) -> tuple[str, str] | None:
        """``(detector, detail)`` of the first problem: a read that returned before its layer
        loaded (``INV-LAYER-LOADED``, candidate first), or counters that differ."""
        for label, side in ((labels[1], self.sides[1]), (labels[0], self.sides[0])):
            if side.early_reads:
                return "INV-LAYER-LOADED", (
                    f"{label}: {side.early_reads} layer read(s) returned before the layer loaded"
                )
        state_a, state_b = (counter_state(s.manager) for s in self.sides)
        if state_a != state_b:
            return "lockstep-diff", (
                f"layer-transfer counters differ: {labels[0]}={state_a} {labels[1]}={state_b}"
            )
        return None

    def draw(self, c: Chooser, kind: str) -> Op:
        """A layer step of ``kind`` for side A's counter: a completion takes a layer of the
        load in progress that has not finished yet (out of order), else any layer; without a
        load in progress a completion starts one."""
        producer, _, done = counter_state(self.sides[0].manager)
        layers = len(done[0])
        if kind == "layer_load" or (kind == "layer_done" and producer < 0):
            return Op("layer_load")
        if kind == "layer_done":
            pending = [i for i, d in enumerate(done[producer]) if not d]
            return Op("layer_done", (c.choice(pending) if pending else c.integer(0, layers - 1),))
        return Op("layer_read", (c.integer(0, layers - 1),))


def layer_fields(config: PoolConfig) -> dict[str, Any]:
    """The lifecycle campaign's layer-wise loading (``layerwise_loading``, the layer steps of
    :mod:`kvpool.testing.layer_ops`): about one configuration in four, over 2 to 4 layers, the
    twin waiting :data:`LAYER_WAIT_S` for a layer (nothing else can complete it in a
    single-threaded run).
    Derived from fields already drawn (no extra draw), and applied by the lifecycle target only
    (:class:`~kvpool.testing.machines.lifecycle.LifecycleTarget`), so ``swarm.draw_config`` and
    every run built on it elsewhere (the hypothesis machine, the quality hunts) stay as they
    were. Empty when the configuration already sets ``layerwise_loading``."""
    pages = config.size // config.page_size
    if config.layerwise_loading or (pages + 2 * config.req_pool_size) % 4 != 1:
        return {}
    return {"layerwise_loading": True, "layer_wait_s": LAYER_WAIT_S, "num_layers": 2 + pages % 3}


def draw_lifecycle_op(c: Chooser, view: View, layers: LayerLoads | None, kind: str) -> Op:
    """A lifecycle operation of ``kind`` (:func:`~kvpool.testing.swarm.draw_op`), or, when
    ``layers`` is set (layer-wise loading), one time in :data:`LAYER_SHARE` a layer step
    instead. Without layer-wise loading nothing extra is drawn, so those runs are unchanged."""
    if layers is not None and c.integer(1, LAYER_SHARE) == 1:
        return layers.draw(c, c.choice(LAYER_KINDS))
    return draw_op(c, view, kind)


__all__ = [
    "LAYER_OPS",
    "LayerLoads",
    "LayerSide",
    "counter_state",
    "draw_lifecycle_op",
    "layer_fields",
]
