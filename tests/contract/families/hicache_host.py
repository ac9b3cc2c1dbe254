"""Contracts of the ``hicache`` family, the parts that stand without a tree: the host pools
(``HostKVCache``, ``MHATokenToKVPoolHost``, ``MLATokenToKVPoolHost``), an acknowledgement
(``HiCacheAck``) and a prefetch operation (``PrefetchOperation``), with the value helpers the
whole family shares. :mod:`tests.contract.families.hicache` assembles the family.

Reachable states: the host pools (MHA and MLA, page size 2, 18 slots) over their device pools
(16 slots), with a seeded mix of host allocations and frees; an acknowledgement and a prefetch
operation built on their own.
"""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

from kvpool.optimized.options import TwinOptions
from tests.bad_inputs.harness import Twin
from tests.contract.machinery import Bad, Method, Subject, klass, rng


# --------------------------------------------------------------------------- shared values
def _opts(side: Twin) -> dict[str, Any]:
    return {} if side.is_ref else {"options": TwinOptions.make("cpu", side.checked)}


def _plain(x: Any) -> list[int]:
    return [] if x is None else [int(v) for v in (x.tolist() if hasattr(x, "tolist") else x)]


def _slots(side: Twin, values: list[int]) -> Any:
    return side.idx(values)


def _host_slot_bads(side: Twin, s: Subject) -> list[Bad]:
    """Host slots a call must refuse: outside the host pool, a free one, twice."""
    g = s.handles["g"]
    used = [i for i in range(g.host.size) if bool(g.host.slot_used[i])]
    free = [i for i in range(g.host.size) if not bool(g.host.slot_used[i])]
    out = [Bad("past-host-pool", _slots(side, [g.host.size + 3]), device_read=True)]
    if free:
        out.append(Bad("free-host-slot", _slots(side, [free[0]]), device_read=True))
    if used:
        out.append(Bad("duplicate", _slots(side, [used[0], used[0]]), device_read=True))
    return out


# --------------------------------------------------------------------------- host pools
def _host_pool(side: Twin, cls: str, seed: int) -> Subject:
    """A host pool (page size 2, 18 slots) over its device pool, with a seeded mix of
    allocations and frees; device slots 2..5 hold tags."""
    r = rng(seed)
    if cls == "MLATokenToKVPoolHost":
        dev = klass(side, "MLATokenToKVPool")(16, 2, 4, 2, 2, **_opts(side))
    else:
        dev = klass(side, "MHATokenToKVPool")(16, 2, "float32", 1, 2, 2, **_opts(side))
    host = klass(side, cls)(dev, 1.0, 0, 2)
    dev.write_tags(_slots(side, [2, 3, 4, 5]), [11, 12, 13, 14])
    held: list[list[int]] = []
    for _ in range(r.randint(2, 4)):
        got = host.alloc(2 * r.randint(1, 2))
        if got is not None:
            held.append(_plain(got))
    if len(held) > 1 and r.random() < 0.5:
        host.free(_slots(side, held.pop(0)))
    rows = _slots(side, list(range(dev.num_rows)))

    def state() -> Any:
        return (host.snapshot(), _plain(host.slot_used), list(_plain(dev.read_tags(rows))))

    g = SimpleNamespace(host=host, dev=dev, held=[x for h in held for x in h])
    return Subject(
        host,
        state,
        {
            "g": g,
            "other_dev": klass(side, "MHATokenToKVPool")(16, 2, "float32", 1, 2, 2, **_opts(side)),
        },
    )


def _copy_args(side: Twin, s: Subject) -> dict[str, Any]:
    g = s.handles["g"]
    return {
        "device_pool": g.dev,
        "host_indices": _slots(side, g.held[:1]),
        "device_indices": _slots(side, [2]),
    }


COPY_BADS = {
    "device_pool": lambda side, s: [Bad("other-pool", s.handles["other_dev"])],
    "host_indices": lambda side, s: [
        *_host_slot_bads(side, s),
        Bad("length-mismatch", _slots(side, [])),
    ],
    "device_indices": lambda side, s: [
        Bad("past-device", _slots(side, [99]), device_read=True),
        Bad("length-mismatch", _slots(side, [2, 3])),
    ],
}

HOST_METHODS = {
    "alloc": Method(
        lambda side, s: {"need_size": 2},
        bad={"need_size": lambda side, s: [Bad("unaligned", 3)]},
        answer=lambda got: got is None,
    ),
    "free": Method(
        lambda side, s: {"indices": _slots(side, s.handles["g"].held[:2])},
        bad={"indices": _host_slot_bads},
    ),
    "backup_from_device_all_layer": Method(_copy_args, bad=COPY_BADS),
    "load_to_device_all_layer": Method(_copy_args, bad=COPY_BADS),
    **{name: Method(reads=True) for name in ("available_size", "get_size_per_token", "snapshot")},
}


# --------------------------------------------------------------------------- small classes
def _ack(side: Twin, seed: int) -> Subject:
    """An acknowledgement of a write of host slot 1 from device slot 3."""
    ack = klass(side, "HiCacheAck")("write", [seed % 5], _slots(side, [1]), _slots(side, [3]))
    return Subject(ack, ack.snapshot)


def _operation(side: Twin, seed: int) -> Subject:
    """A prefetch operation that has fetched ``seed % 3`` tokens of 4."""
    op = klass(side, "PrefetchOperation")("p0", _slots(side, [5, 6, 7, 8]))
    op.storage_hit_count = 4
    op.increment(seed % 3)
    return Subject(op, lambda: (op.completed_tokens, op.terminated, op.storage_hit_count))


OPERATION_METHODS = {
    "PrefetchOperation.increment": Method(lambda side, s: {"num_tokens": 1}),
}
