"""Contracts of the ``kv`` family: the KV buffers, storage variants, layer loading.

Reachable states:

- a pool (every storage variant) of ``size 8``, ``page_size 2`` (10 rows), layers 1..2, after a
  seeded mix of legal ``write_tags`` (distinct slots, tags in ``[1, 2**24)``),
  ``set_kv_buffer`` (values exact in float32) and ``move_kv_cache`` calls; in half the seeds a
  :class:`LayerDoneCounter` is registered whose current load has finished layer 0 and, by the
  seed, maybe layer 1 (``handles["unloaded"]``: the global layer still loading, if any);
- the reference's storage layers (``FP4Layer``, ``MXFP8Layer``: 10 rows) after seeded stores and
  moves, and a page-major pool's K view (``PageMajorView``) after seeded writes;
- a ``LayerLoadingEvent`` of 3 layers started with a seeded set of layers done (layer 0 always);
- a ``LayerDoneCounter`` of 3 layers after seeded loads (each finished before the next), the
  last one partly done and, by the seed, made the consumer.

The twin's counters and events wait ``0.01 s`` (not 30) before giving up on a layer, so a read of
a layer still loading answers ``LayerNotLoadedError`` at once on both sides.
"""

from __future__ import annotations

import random
from types import SimpleNamespace
from typing import Any

import torch

from tests.bad_inputs.harness import Twin
from tests.contract.machinery import Bad, Family, Method, Subject, klass, make, rng

SIZE, PAGE, LAYERS, START = 8, 2, 2, 1
ROWS = SIZE + PAGE
"""Rows per layer (slots ``0..ROWS - 1``); global layers ``START..START + LAYERS - 1``."""
TAG_LIMIT = 2**24
WAIT_S = 0.01
"""The twin's wait before a layer still loading is refused (LayerNotLoadedError)."""

MHA_LIKE = {
    "MHATokenToKVPool": (2, 2, 3),
    "MHATokenToKVPoolFP4": (2, 8, 8),
    "MHATokenToKVPoolMXFP8": (1, 32, 32),
    "NoOpMHATokenToKVPool": (1, 2, 2),
    "PageMajorMHATokenToKVPool": (2, 2, 3),
}
"""``(head_num, head_dim, v_head_dim)`` of each MHA-shaped pool."""
MLA_LIKE = {"MLATokenToKVPool": (2, 1), "MLATokenToKVPoolFP4": (12, 4)}
"""``(kv_lora_rank, qk_rope_head_dim)`` of each MLA pool."""
QUANTIZED = ("MHATokenToKVPoolFP4", "MLATokenToKVPoolFP4", "MHATokenToKVPoolMXFP8")
POOLS = (*MHA_LIKE, *MLA_LIKE)


# --------------------------------------------------------------------------- state
_SKIP = frozenset({"_cond"})  # the twin's condition variable: a lock, not state


def freeze(x: Any) -> Any:
    """Everything ``x`` holds as comparable plain values: tensors as (dtype, shape, bytes),
    containers and objects (their attributes, collaborators included) recursively."""
    if isinstance(x, torch.Tensor):
        t = x.detach().cpu().contiguous().reshape(-1)
        return ("tensor", str(x.dtype), tuple(x.shape), t.view(torch.uint8).numpy().tobytes())
    if isinstance(x, list | tuple):
        return tuple(freeze(i) for i in x)
    if isinstance(x, dict):
        return tuple(sorted((repr(k), freeze(v)) for k, v in x.items()))
    if x is None or isinstance(x, bool | int | float | str | bytes | torch.dtype | torch.device):
        return x
    if hasattr(x, "__dict__"):
        items = sorted((k, v) for k, v in vars(x).items() if k not in _SKIP)
        return (type(x).__name__, tuple((k, freeze(v)) for k, v in items))
    return ("id", id(x))


# --------------------------------------------------------------------------- helpers
def _values(r: random.Random, n: int, heads: int, dim: int) -> list[list[list[float]]]:
    """``[n][heads][dim]`` values exact in float32 (quarters in ``[-2, 2]``)."""
    return [[[r.randint(-8, 8) / 4 for _ in range(dim)] for _ in range(heads)] for _ in range(n)]


def _as(side: Twin, rows: Any) -> Any:
    return rows if side.is_ref else torch.tensor(rows, dtype=torch.float32)


def _counter(side: Twin, name: str, layers: int) -> Any:
    """A ``LayerDoneCounter`` / ``LayerLoadingEvent`` of ``layers``; the twin's waits short."""
    return klass(side, name)(layers) if side.is_ref else klass(side, name)(layers, WAIT_S)


def _distinct(r: random.Random, n: int) -> list[int]:
    return r.sample(range(PAGE, ROWS), n)


# --------------------------------------------------------------------------- pools
def _pool(side: Twin, cls: str, seed: int) -> Subject:
    if cls in MLA_LIKE:
        rank, rope = MLA_LIKE[cls]
        pool = make(side, cls, SIZE, PAGE, rank, rope, LAYERS, START)
        k_shape, v_shape = (1, rank + rope), None
    else:
        heads, k_dim, v_dim = MHA_LIKE[cls]
        pool = make(side, cls, SIZE, PAGE, "float32", heads, k_dim, LAYERS, START, v_dim)
        k_shape, v_shape = (heads, k_dim), (heads, v_dim)
    r = rng(seed)
    for _ in range(r.randint(1, 4)):
        op, n = r.choice(("tags", "tags", "set", "move")), r.randint(1, 3)
        slots = _distinct(r, n)
        if op == "tags":
            pool.write_tags(side.idx(slots), side.idx([r.randrange(1, TAG_LIMIT) for _ in slots]))
        elif op == "set" and cls != "NoOpMHATokenToKVPool":
            k = _as(side, _values(r, n, *k_shape))
            v = None if v_shape is None else _as(side, _values(r, n, *v_shape))
            layer = START + r.randrange(LAYERS)
            pool.set_kv_buffer(layer, side.idx(slots), k, v, r.choice((None, 2.0)))
        elif op == "move":
            pool.move_kv_cache(side.idx(slots), side.idx(_distinct(r, n)))
    unloaded = None
    if r.random() < 0.5:
        counter = _counter(side, "LayerDoneCounter", LAYERS)
        counter.set_consumer(counter.update_producer())
        counter.events[counter.producer_index].complete(0)
        if r.random() < 0.5:
            counter.events[counter.producer_index].complete(1)
        else:
            unloaded = START + 1
        pool.register_layer_transfer_counter(counter)
    handles = {"k": k_shape, "v": v_shape, "unloaded": unloaded, "quantized": cls in QUANTIZED}
    return Subject(pool, lambda: freeze(pool), handles)


def _data(side: Twin, n: int, shape: tuple[int, int], fill: float = 0.5) -> Any:
    return side.data((n, *shape), fill)


def _set_args(side: Twin, s: Subject) -> dict[str, Any]:
    """Two rows into slots 1 and 2 of the first layer, no scales."""
    v = s.handles["v"]
    return {
        "layer_id": START,
        "loc": side.idx([1, 2]),
        "cache_k": _data(side, 2, s.handles["k"]),
        "cache_v": None if v is None else _data(side, 2, v),
        "k_scale": None,
        "v_scale": None,
    }


def _layer_bads(reads: bool) -> Any:
    """Layers outside the pool; for a buffer read (``reads``), the layer still loading."""

    def bads(side: Twin, s: Subject) -> list[Bad]:
        out = [Bad("below-start", START - 1), Bad("past-end", START + LAYERS)]
        if reads and s.handles["unloaded"] is not None:
            out.append(Bad("still-loading", s.handles["unloaded"]))
        return out

    return bads


def _slot_bads(first: int = 1) -> Any:
    """Two slots, one outside the pool (a tensor's: a device read on the twin)."""

    def bads(side: Twin, s: Subject) -> list[Bad]:
        tensor = not side.is_ref
        return [
            Bad("past-pool", side.idx([first, ROWS]), device_read=tensor),
            Bad("negative-slot", side.idx([first, -1]), device_read=tensor),
            Bad("past-pool-list", [first, ROWS]),
        ]

    return bads


def _kv_data_bads(which: str) -> Any:
    """Bad K or V data: not data, wrong shape, not numbers, NaN for a quantised pool."""

    def bads(side: Twin, s: Subject) -> list[Bad]:
        shape = s.handles[which]
        if shape is None:  # MLA's cache_v: ignored
            return []
        heads, dim = shape
        out = [
            Bad("None", None),
            Bad("int", 3),
            Bad("str", "x"),
            Bad("one-row-for-two-slots", _data(side, 1, shape)),
            Bad("extra-head", _data(side, 2, (heads + 1, dim))),
            Bad("ragged", [[[0.5] * dim] * heads, [[0.5] * (dim + 1)] * heads]),
            Bad("str-items", [[["a"] * dim] * heads] * 2),
            Bad("None-items", [[[None] * dim] * heads] * 2),
            Bad("bool-items", [[[True] * dim] * heads] * 2),
        ]
        if not side.is_ref:
            out.append(Bad("bool-tensor", torch.ones((2, heads, dim), dtype=torch.bool)))
            out.append(Bad("complex-tensor", torch.ones((2, heads, dim), dtype=torch.complex64)))
        if s.handles["quantized"]:
            out.append(Bad("nan", _data(side, 2, shape, float("nan"))))
            out.append(Bad("inf", _data(side, 2, shape, float("inf"))))
        return out

    return bads


def _scale_bads(side: Twin, s: Subject) -> list[Bad]:
    return [Bad("bool", True), Bad("zero", 0.0), Bad("negative", -2.0), Bad("None-str", "None")]


def _move_args(side: Twin, s: Subject) -> dict[str, Any]:
    return {"tgt_loc": side.idx([3, 4]), "src_loc": side.idx([1, 2])}


def _tgt_bads(side: Twin, s: Subject) -> list[Bad]:
    return [
        *_slot_bads(3)(side, s),
        Bad("fewer-than-sources", side.idx([3])),
        Bad("same-target-twice", side.idx([3, 3]), device_read=not side.is_ref),
        Bad("same-target-twice-list", [3, 3]),
    ]


def _tag_bads(side: Twin, s: Subject) -> list[Bad]:
    tensor = not side.is_ref
    return [
        Bad("one-tag-for-two-slots", side.idx([5])),
        Bad("past-tag-limit", side.idx([5, TAG_LIMIT]), device_read=tensor),
        Bad("negative-tag", side.idx([5, -1]), device_read=tensor),
        Bad("past-tag-limit-list", [5, TAG_LIMIT]),
    ]


def _counter_args(side: Twin, s: Subject) -> dict[str, Any]:
    return {"counter": _counter(side, "LayerDoneCounter", LAYERS)}


def _counter_bads(side: Twin, s: Subject) -> list[Bad]:
    return [Bad("wait_until-not-callable", SimpleNamespace(wait_until=3))]


def _read_layer(reads: bool = True) -> Method:
    return Method(lambda side, s: {"layer_id": START}, bad={"layer_id": _layer_bads(reads)})


POOL_METHODS = {
    "set_kv_buffer": Method(
        _set_args,
        bad={
            "layer_id": _layer_bads(False),
            "loc": _slot_bads(),
            "cache_k": _kv_data_bads("k"),
            "cache_v": _kv_data_bads("v"),
            "k_scale": _scale_bads,
            "v_scale": _scale_bads,
        },
    ),
    "get_key_buffer": _read_layer(),
    "get_value_buffer": _read_layer(),
    "get_kv_buffer": _read_layer(),
    "get_raw_kv_buffer": _read_layer(),
    "get_kv_scale_buffer": _read_layer(False),  # no wait: the scales are not loaded layer-wise
    "move_kv_cache": Method(
        _move_args, bad={"tgt_loc": _tgt_bads, "src_loc": lambda side, s: _slot_bads()(side, s)}
    ),
    "write_tags": Method(
        lambda side, s: {"loc": side.idx([1, 2]), "tags": side.idx([5, 6])},
        bad={"loc": _slot_bads(), "tags": _tag_bads},
    ),
    "read_tags": Method(lambda side, s: {"loc": side.idx([1, 2])}, bad={"loc": _slot_bads()}),
    "register_layer_transfer_counter": Method(_counter_args, bad={"counter": _counter_bads}),
    "raw_bytes": Method(reads=True),
    "get_kv_size_bytes": Method(reads=True),
    # Takes anything and always refuses (KVStorageError): the no-op pool stores no KV.
    "NoOpMHATokenToKVPool.set_kv_buffer": Method(reads=True),
}


# --------------------------------------------------------------------------- storage layers
def _storage_layer(side: Twin, cls: str, seed: int) -> Subject:
    """An FP4 layer (2 heads of 8) or an MXFP8 layer (1 head of 32), 10 rows, after seeded
    stores and a move."""
    heads, dim = (2, 8) if cls == "FP4Layer" else (1, 32)
    layer = klass(side, cls)(ROWS, heads, dim)
    r = rng(seed)
    for slot in _distinct(r, r.randint(1, 4)):
        row = _values(r, 1, heads, dim)[0]
        layer.store(slot, [x for h in row for x in h] if cls == "FP4Layer" else row)
    if r.random() < 0.5:
        layer.move(_distinct(r, 2), _distinct(r, 2))
    return Subject(layer, lambda: freeze(layer), {"heads": heads, "dim": dim})


def _row_slot(side: Twin, s: Subject) -> list[Bad]:
    return [Bad("past-rows", ROWS)]


def _flat_bads(side: Twin, s: Subject) -> list[Bad]:
    width = s.handles["heads"] * s.handles["dim"]
    return [
        Bad("short", [0.5] * (width - 1)),
        Bad("nan", [float("nan")] * width),
        Bad("bool-items", [True] * width),
        Bad("str-items", ["a"] * width),
        Bad("nested", [[0.5] * width]),
    ]


def _head_row_bads(side: Twin, s: Subject) -> list[Bad]:
    heads, dim = s.handles["heads"], s.handles["dim"]
    return [
        Bad("None", None),
        Bad("int", 3),
        Bad("extra-head", [[0.5] * dim] * (heads + 1)),
        Bad("short-head", [[0.5] * (dim - 1)] * heads),
        Bad("inf", [[float("inf")] * dim] * heads),
        Bad("bool-items", [[True] * dim] * heads),
    ]


def _layer_move_bads(side: Twin, s: Subject) -> list[Bad]:
    return [Bad("past-rows", [3, ROWS]), Bad("fewer-than-sources", [3]), Bad("twice", [3, 3])]


def _storage_methods(cls: str) -> dict[str, Method]:
    slot = {"slot": _row_slot}
    read = Method(lambda side, s: {"slot": 3}, bad=slot)
    store_arg = "flat" if cls == "FP4Layer" else "row"

    def store_args(side: Twin, s: Subject) -> dict[str, Any]:
        heads, dim = s.handles["heads"], s.handles["dim"]
        value = [0.5] * (heads * dim) if cls == "FP4Layer" else [[0.5] * dim] * heads
        return {"slot": 3, store_arg: value}

    methods = {
        "store": Method(
            store_args,
            bad={**slot, store_arg: _flat_bads if cls == "FP4Layer" else _head_row_bads},
        ),
        "move": Method(
            lambda side, s: {"tgt": [3, 4], "src": [1, 2]},
            bad={"tgt": _layer_move_bads, "src": lambda side, s: [Bad("past-rows", [1, ROWS])]},
        ),
        "dequantized": Method(reads=True),
    }
    methods.update({"flat": read, "tag": read} if cls == "FP4Layer" else {"row": read})
    return {f"{cls}.{name}": m for name, m in methods.items()}


# --------------------------------------------------------------------------- page-major view
def _view(side: Twin, cls: str, seed: int) -> Subject:
    """One K view of a seeded page-major pool (the whole pool is the state: views share it)."""
    sub = _pool(side, "PageMajorMHATokenToKVPool", seed)
    pool = sub.obj
    view = pool.k_buffer[rng(seed).randrange(LAYERS)]
    return Subject(view, sub.state, {"items": view.row_items})


VIEW_METHODS = {
    "PageMajorView.offset": Method(
        lambda side, s: {"token": 3}, bad={"token": lambda side, s: [Bad("past-end", ROWS)]}
    ),
    "PageMajorView.write": Method(
        lambda side, s: {"token": 3, "values": [0.5] * s.handles["items"]},
        bad={
            "token": lambda side, s: [Bad("past-end", ROWS)],
            "values": lambda side, s: [
                Bad("short", [0.5] * (s.handles["items"] - 1)),
                Bad("bool-items", [True] * s.handles["items"]),
                Bad("str-items", ["a"] * s.handles["items"]),
                Bad("nested", [[0.5] * s.handles["items"]]),
            ],
        },
    ),
}


# --------------------------------------------------------------------------- layer loading
def _event(side: Twin, cls: str, seed: int) -> Subject:
    """A started 3-layer load with layer 0 and a seeded set of others done."""
    event = _counter(side, "LayerLoadingEvent", 3)
    r = rng(seed)
    event.start()
    for layer in [0, *r.sample([1, 2], r.randint(0, 2))]:
        event.complete(layer)
    pending = [i for i in range(3) if not event.done[i]]
    return Subject(event, lambda: freeze(event), {"loaded": 0, "pending": pending})


def _done_counter(side: Twin, cls: str, seed: int) -> Subject:
    """Seeded loads, each finished before the next; the last partly done, maybe consumed."""
    counter = _counter(side, "LayerDoneCounter", 3)
    r = rng(seed)
    pending: list[int] = []
    for i in range(r.randint(0, 4)):
        event = counter.events[counter.update_producer()]
        last = i == 3 or r.random() < 0.3
        done = r.randint(1, 3) if last else 3
        for layer in range(done):
            event.complete(layer)
        if last:
            pending = [layer for layer in range(3) if not event.done[layer]]
            break
    if counter.producer_index >= 0 and r.random() < 0.7:
        counter.set_consumer(counter.producer_index)
    if counter.consumer_index < 0:
        pending = []
    return Subject(counter, lambda: freeze(counter), {"loaded": 0, "pending": pending})


def _pending(side: Twin, s: Subject) -> list[Bad]:
    return [Bad("still-loading", p) for p in s.handles["pending"][:1]]


def _layer_index(name: str, wait: bool) -> Method:
    def bads(side: Twin, s: Subject) -> list[Bad]:
        return [Bad("past-layers", 3), *(_pending(side, s) if wait else [])]

    return Method(lambda side, s: {name: s.handles["loaded"]}, bad={name: bads})


LOADING_METHODS = {
    "LayerLoadingEvent.complete": _layer_index("layer_index", False),
    "LayerLoadingEvent.is_complete": _layer_index("layer_index", False),
    "LayerLoadingEvent.wait": _layer_index("layer_index", True),
    "LayerDoneCounter.set_consumer": Method(
        lambda side, s: {"index": 0}, bad={"index": lambda side, s: [Bad("past-events", 3)]}
    ),
    "LayerDoneCounter.wait_until": _layer_index("threshold", True),
    "LayerDoneCounter.update_producer": Method(refused_in=lambda side, s: _all_loading(side)),
}


def _all_loading(side: Twin) -> list[tuple[str, Subject]]:
    """A counter whose every event has a load in flight: the next one cannot be reused."""
    counter = _counter(side, "LayerDoneCounter", 3)
    for _ in range(counter.num_counters):
        counter.update_producer()
    return [("next-event-loading", Subject(counter, lambda: freeze(counter)))]


LOADING_EXEMPT = {
    "LayerLoadingEvent.start": "begins a load afresh (no layer done): legal in every state, "
    "as SGLang reuses its events",
    "LayerDoneCounter.reset": "forgets the producer and the consumer: legal in every state",
}


# --------------------------------------------------------------------------- the family
def _build(side: Twin, cls: str, seed: int) -> Subject:
    if cls in POOLS:
        return _pool(side, cls, seed)
    if cls in ("FP4Layer", "MXFP8Layer"):
        return _storage_layer(side, cls, seed)
    if cls == "PageMajorView":
        return _view(side, cls, seed)
    if cls == "LayerLoadingEvent":
        return _event(side, cls, seed)
    if cls == "LayerDoneCounter":
        return _done_counter(side, cls, seed)
    raise NotImplementedError(cls)


FAMILY = Family(
    name="kv",
    classes=(
        "KVCache",
        *POOLS,
        "PageMajorView",
        "FP4Layer",
        "MXFP8Layer",
        "LayerDoneCounter",
        "LayerLoadingEvent",
    ),
    build=_build,
    methods={
        **POOL_METHODS,
        **_storage_methods("FP4Layer"),
        **_storage_methods("MXFP8Layer"),
        **VIEW_METHODS,
        **LOADING_METHODS,
    },
    exempt=LOADING_EXEMPT,
    abstract=("KVCache",),
)
