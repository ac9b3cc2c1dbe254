"""The KV pool machine: a storage variant's writes, moves and tags, and layer-wise loading.

A side is one KV pool (``Implementation.kv_cache``: the variant ``PoolConfig.kv_storage`` names)
with a ``LayerDoneCounter`` registered (``Implementation.layer_done_counter``). Operations:
``set_kv`` (values exact in float32 and in nothing smaller, so every format rounds them),
``write_tags``, ``move``, ``read_tags``; and the loading steps ``load_start``
(``update_producer`` + ``set_consumer``), ``load_layer`` (the producer's event completes one layer,
in any order), ``read_layer`` (``get_key_buffer``) and ``load_reset``.

A read of a layer whose load has not completed raises ``LayerNotLoadedError`` in the reference;
the twin's counter waits, and in this single-threaded machine nothing can complete the layer, so
the twin's implementation gives it a short timeout that raises the same error. Each side counts
the reads that returned while their layer was still loading (asked of the counter before the
read); the snapshot carries the count, and ``INV-LAYER-LOADED`` fires on any. The snapshot also
holds everything the pool stores (bytes and scales, or the raw buffer, or the no-op's tag
record) and every slot's tag, so the two sides are compared byte for byte.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from kvpool.config import PoolConfig
from kvpool.errors import InvariantViolation
from kvpool.tags import TAG_MODULUS
from kvpool.testing.bundle import Implementation
from kvpool.testing.machines.base import Outcome
from kvpool.testing.machines.coverage import outcome_tag
from kvpool.testing.swarm import Chooser, Op

GEOMETRY: dict[tuple[str, str], dict[str, Any]] = {
    ("mha", "plain"): {"head_num": 1, "head_dim": 2},
    ("mha", "fp4"): {"head_num": 2, "head_dim": 8},
    ("mha", "mxfp8"): {"head_num": 1, "head_dim": 32},
    ("mha", "page_major"): {"head_num": 2, "head_dim": 2, "v_head_dim": 3},
    ("mha", "noop"): {"head_num": 1, "head_dim": 2},
    ("mla", "plain"): {"kv_lora_rank": 2, "qk_rope_head_dim": 1},
    ("mla", "fp4"): {"kv_lora_rank": 12, "qk_rope_head_dim": 4},
}
"""The head geometry each (layout, storage) is drawn with."""


KINDS = ("set_kv", "write_tags", "write_tags", "move", "read_tags", "load_start", "load_layer",
         "load_layer", "read_layer", "read_layer", "load_reset")  # fmt: skip
"""Operation kinds, drawn uniformly (writes of tags and the loading steps twice as often)."""


@dataclass
class KVSide:
    pool: Any
    counter: Any
    index: Any
    early_reads: int = 0


@dataclass
class KVModel:
    config: PoolConfig
    producer: int = -1
    consumer: int = -1
    loaded: dict[int, set[int]] = field(default_factory=dict)


def _plain(x: Any) -> Any:
    """Nested lists of a tensor (uint8 view of fp8) or of lists."""
    if hasattr(x, "tolist"):
        if "float8" in str(getattr(x, "dtype", "")):
            x = x.view(__import__("torch").uint8)
        return x.tolist()
    return x


def stored_state(pool: Any) -> Any:
    """Everything ``pool`` stores, as plain nested lists, in one shape for both twins."""
    if hasattr(pool, "raw_bytes"):
        return list(pool.raw_bytes())
    if hasattr(pool, "tag_record"):
        return sorted(pool.tag_record.items())
    if hasattr(pool, "k_layers"):  # reference FP4 / MXFP8
        return [(layer.data, layer.scales) for layer in (*pool.k_layers, *pool.v_layers)]
    if hasattr(pool, "kv_layers"):  # reference MLA FP4
        return [(layer.data, layer.scales) for layer in pool.kv_layers]
    if hasattr(pool, "k_scale_buffer"):  # twin FP4 / MXFP8
        data = (*pool.k_buffer, *pool.v_buffer)
        scales = (*pool.k_scale_buffer, *pool.v_scale_buffer)
        return [(_plain(d), _plain(s)) for d, s in zip(data, scales, strict=True)]
    if hasattr(pool, "kv_scale_buffer"):  # twin MLA FP4
        return [(_plain(d), _plain(s))
                for d, s in zip(pool.kv_buffer, pool.kv_scale_buffer, strict=True)]  # fmt: skip
    if hasattr(pool, "kv_buffer"):  # plain MLA
        return [_plain(b) for b in pool.kv_buffer]
    return [_plain(b) for b in (*pool.k_buffer, *pool.v_buffer)]


class KVPoolTarget:
    """:class:`~kvpool.testing.machines.base.Target` of the KV pool machine."""

    name = "kv_pool"

    def draw_config(self, c: Chooser, impl: Implementation) -> PoolConfig:
        layout = c.choice(("mha", "mha", "mha", "mla"))
        storages = ("plain", "fp4") if layout == "mla" else ("plain", "fp4", "mxfp8",
                                                             "page_major", "noop")  # fmt: skip
        storage = c.choice(storages)
        ps = c.choice((1, 2, 4))
        return PoolConfig(size=ps * c.integer(2, 6), page_size=ps, kv_layout=layout,
                          kv_storage=storage, num_layers=c.integer(1, 3),
                          start_layer=c.integer(0, 2), rules=impl.rules_or_default(),
                          **GEOMETRY[(layout, storage)])  # fmt: skip

    def build(self, impl: Implementation, config: PoolConfig) -> KVSide:
        assert impl.kv_cache is not None and impl.layer_done_counter is not None
        pool = impl.kv_cache(config)
        counter = impl.layer_done_counter(config.num_layers)
        pool.register_layer_transfer_counter(counter)
        return KVSide(pool, counter, impl.index)

    def snapshot(self, side: KVSide) -> dict[str, Any]:
        pool, counter = side.pool, side.counter
        return {
            "stored": stored_state(pool),
            "tags": pool.read_tags(side.index(list(range(pool.num_rows)))),
            "producer": counter.producer_index,
            "consumer": counter.consumer_index,
            "done": [list(e.done) for e in counter.events],
            "early_reads": side.early_reads,
        }

    def new_model(self, config: PoolConfig) -> KVModel:
        return KVModel(config)

    def pretty(self, snap: Any) -> str:
        shown = {k: v for k, v in snap.items() if k != "stored"}
        return f"{shown} (stored: {len(repr(snap['stored']))} characters)"

    def draw_op(self, c: Chooser, model: KVModel, rejects_misuse: bool) -> Op:
        kind = c.choice(KINDS)
        rows = model.config.size + model.config.page_size
        layers = model.config.num_layers
        if kind == "set_kv":
            n = c.integer(1, 3)
            slots = tuple(c.integer(0, rows - 1) for _ in range(n))
            return Op("set_kv", (c.integer(0, layers - 1), slots, c.integer(0, 2**16),
                                 c.choice((None, 2.0))))  # fmt: skip
        if kind == "write_tags":
            n = c.integer(1, 3)
            slots = tuple(c.integer(0, rows - 1) for _ in range(n))
            return Op("write_tags", (slots, tuple(c.integer(1, TAG_MODULUS) for _ in slots)))
        if kind == "move":
            n = c.integer(1, 2)
            return Op("move", (tuple(c.integer(0, rows - 1) for _ in range(n)),
                               tuple(c.integer(0, rows - 1) for _ in range(n))))  # fmt: skip
        if kind == "read_tags":
            return Op("read_tags", (tuple(c.integer(0, rows - 1) for _ in range(3)),))
        if kind in ("load_layer", "read_layer"):
            return Op(kind, (c.integer(0, layers - 1),))
        return Op(kind)

    def materialize(self, model: KVModel, op: Op) -> Op | None:
        if op.name == "load_layer" and model.producer < 0:
            return None
        if op.name == "move":
            tgt, src = op.args
            return Op("move", (tgt, src[: len(tgt)]))
        return op

    def call(self, side: KVSide, op: Op) -> Any:
        pool, counter, index = side.pool, side.counter, side.index
        if op.name == "set_kv":
            layer, slots, seed, scale = op.args
            k = _values(seed, len(slots), pool.head_num, _k_dim(pool))
            v = _values(seed + 1, len(slots), pool.head_num, getattr(pool, "v_head_dim", 1))
            pool.set_kv_buffer(pool.start_layer + layer, index(list(slots)),
                               _as(side, k), _as(side, v), k_scale=scale)  # fmt: skip
            return None
        if op.name == "write_tags":
            pool.write_tags(index(list(op.args[0])), list(op.args[1]))
            return None
        if op.name == "move":
            pool.move_kv_cache(index(list(op.args[0])), index(list(op.args[1])))
            return None
        if op.name == "read_tags":
            return pool.read_tags(index(list(op.args[0])))
        if op.name == "load_start":
            event = counter.update_producer()
            counter.set_consumer(event)
            return event
        if op.name == "load_layer":
            counter.events[counter.producer_index].complete(op.args[0])
            return None
        if op.name == "read_layer":
            layer = op.args[0]
            loading = counter.consumer_index >= 0
            ready = not loading or counter.events[counter.consumer_index].is_complete(layer)
            pool.get_key_buffer(pool.start_layer + layer)
            if not ready:
                side.early_reads += 1
            return None
        counter.reset()
        return None

    def observe(self, model: KVModel, op: Op, outcome: Outcome) -> None:
        if outcome.error is not None:
            return
        if op.name == "load_start":
            model.producer = model.consumer = outcome.result
        elif op.name == "load_reset":
            model.producer = model.consumer = -1

    def check(self, model: KVModel, snap: Any, previous: Any) -> int:
        if snap["early_reads"]:
            raise InvariantViolation(
                "INV-LAYER-LOADED", f"{snap['early_reads']} layer read(s) before their load"
            )
        return 1

    def refusal_must_not_change(self, config: PoolConfig, op: Op, outcome: Outcome) -> bool:
        return outcome.error is not None

    def coverage(self, model: KVModel, op: Op, outcome: Outcome) -> list[str]:
        tags = [outcome_tag(op, outcome.result, outcome.error)]
        tags.append(f"storage:{model.config.kv_layout}-{model.config.kv_storage}")
        return tags


def _k_dim(pool: Any) -> int:
    return int(getattr(pool, "kv_dim", getattr(pool, "head_dim", 1)))


def _values(seed: int, n: int, heads: int, dim: int) -> list[list[list[float]]]:
    """Deterministic values exact in float32: multiples of 1/8 in [-20, 20]."""
    out, x = [], seed
    for _ in range(n):
        row = []
        for _ in range(heads):
            head = []
            for _ in range(dim):
                x = (x * 1_103_515_245 + 12_345) % 2**31
                head.append((x % 321 - 160) / 8)
            row.append(head)
        out.append(row)
    return out


def _as(side: KVSide, values: list[list[list[float]]]) -> Any:
    """Values in the side's container (lists, or a float32 tensor for a tensor side)."""
    probe = side.index([0])
    if isinstance(probe, list):
        return values
    import torch

    return torch.tensor(values, dtype=torch.float32, device=probe.device)


__all__ = ["GEOMETRY", "KVPoolTarget", "stored_state"]
