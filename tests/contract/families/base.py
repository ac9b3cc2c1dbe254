"""Contracts of the ``base`` family: the request, the radix key, node and match result, and the
twin's options.

Reachable states (seeded):

- a ``Req`` of 1 to 8 prompt tokens and 0 to 3 generated ones, holding a row and some lengths;
  on the twin its token-array and KV-tag caches filled up to a seeded position;
- a ``RadixKey`` of 0 to 6 token ids in a seeded namespace (on the twin held as a list or, for
  some seeds, as an int32 array);
- a ``TreeNode`` under a root, with 0 to 2 children; a ``MatchResult`` over it;
- a ``TwinOptions`` on the CPU in a seeded checked mode (the twin only).

Bad values: a ``stop`` past the request's tokens, a page size that is not a power of two, an
array of the wrong dtype or shape, a device or kernel backend that does not exist.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import torch

from tests.bad_inputs.harness import Twin
from tests.contract.machinery import Bad, Family, Method, Subject, klass, rng


def _plain(value: Any) -> Any:
    """``value`` as comparable plain data (tensors and arrays as lists)."""
    if isinstance(value, torch.Tensor | np.ndarray):
        return value.tolist()
    if isinstance(value, list | tuple):
        return [_plain(v) for v in value]
    return value


def _fields(obj: Any) -> Any:
    """Every attribute of ``obj`` (``__dict__`` or ``__slots__``), as plain data."""
    names = sorted(getattr(obj, "__dict__", {}) or _slot_names(type(obj)))
    return {n: _plain(getattr(obj, n)) for n in names if hasattr(obj, n)}


def _slot_names(cls: type) -> list[str]:
    return [n for k in cls.__mro__ for n in getattr(k, "__slots__", ())]


# --------------------------------------------------------------------------- Req
def _req(side: Twin, seed: int) -> Subject:
    r = rng(seed)
    tokens = [r.randint(0, 50) for _ in range(r.randint(1, 8))]
    req = klass(side, "Req")(f"r{seed}", tokens, r.choice((None, "ns")))
    req.output_ids = [r.randint(0, 50) for _ in range(r.randint(0, 3))]
    req.req_pool_idx = r.randint(1, 4)
    req.kv_committed_len = req.kv_allocated_len = r.randint(0, req.seq_len())
    if not side.is_ref:  # fill the caches part way: a bad call must not grow them
        req.kv_tags_upto(r.randint(0, req.seq_len()))
    return Subject(req, lambda: _fields(req))


def _stop_values(side: Twin, s: Subject) -> list[Bad]:
    n = s.obj.seq_len()
    return [Bad("past-the-tokens", n + 1), Bad("far-past", n + 1000)]


REQ_METHODS = {
    "Req.seq_len": Method(reads=True),
    "Req.token_array": Method(
        lambda side, s: {"stop": s.obj.seq_len()}, bad={"stop": _stop_values}
    ),
    "Req.kv_tags_upto": Method(
        lambda side, s: {"stop": s.obj.seq_len()}, bad={"stop": _stop_values}
    ),
}


# --------------------------------------------------------------------------- RadixKey
def _key(side: Twin, seed: int) -> Subject:
    r = rng(seed)
    tokens = [r.randint(0, 50) for _ in range(r.randint(0, 6))]
    given: Any = tokens
    if not side.is_ref and r.random() < 0.5:
        given = np.asarray(tokens, dtype=np.int32)
    key = klass(side, "RadixKey")(given, r.choice((None, "ns")))
    return Subject(key, lambda: (list(key.token_ids), key.extra_key))


def _page_sizes(side: Twin, s: Subject) -> list[Bad]:
    return [Bad("not-a-power-of-two", 3), Bad("zero", 0), Bad("numpy-3", np.int64(3))]


def _arrays(side: Twin, s: Subject) -> list[Bad]:
    return [
        Bad("float-array", np.array([1.5])),
        Bad("uint8-array", np.array([1], dtype=np.uint8)),
        Bad("2-D-array", np.array([[1]], dtype=np.int32)),
        Bad("list", [1, 2]),
        Bad("tensor", torch.tensor([1, 2])),
    ]


KEY_METHODS = {
    "RadixKey.plain_child_key": Method(
        lambda side, s: {"page_size": 1}, bad={"page_size": _page_sizes}
    ),
    "RadixKey.from_array": Method(
        lambda side, s: {"array": np.array([1, 2], dtype=np.int32), "extra_key": None},
        bad={"array": _arrays},
    ),
}


# --------------------------------------------------------------------------- TreeNode, MatchResult
def _node(side: Twin, seed: int) -> tuple[Any, Any]:
    r = rng(seed)
    node_cls, key_cls = klass(side, "TreeNode"), klass(side, "RadixKey")

    def slots(values: list[int]) -> Any:
        return values if side.is_ref else torch.tensor(values, dtype=torch.int64)

    root = node_cls(0, key_cls([]), slots([]), None, 0.0)
    n = r.randint(1, 4)
    node = node_cls(1, key_cls(list(range(n))), slots(list(range(1, n + 1))), root, 1.0)
    root.children[0] = node
    for i in range(r.randint(0, 2)):
        child = node_cls(2 + i, key_cls([10 + i]), slots([20 + i]), node, 2.0)
        node.children[10 + i] = child
    return root, node


def _tree_node(side: Twin, seed: int) -> Subject:
    root, node = _node(side, seed)

    def state() -> Any:
        return _fields(node), sorted(node.children), _fields(root)

    return Subject(node, state)


def _match_result(side: Twin, seed: int) -> Subject:
    _, node = _node(side, seed)
    value = node.value
    result = klass(side, "MatchResult")(value, node, node)
    return Subject(result, lambda: (_plain(result.device_indices), result.host_hit_length))


NODE_METHODS = {"TreeNode.is_leaf": Method(reads=True)}


# --------------------------------------------------------------------------- TwinOptions
def _options(side: Twin, seed: int) -> Subject:
    cls: Any = klass(side, "TwinOptions")
    opts = cls.make("cpu", rng(seed).random() < 0.5)
    return Subject(opts, lambda: (opts.device, opts.checked, opts.backend))


OPTIONS_METHODS = {
    "TwinOptions.make": Method(
        lambda side, s: {"device": "cpu", "checked": True, "backend": None},
        bad={
            "device": lambda side, s: [Bad("unknown-device", "no-such-device")],
            "backend": lambda side, s: [
                Bad("unknown-backend", "no-such-backend"),
                Bad("triton-on-the-cpu", "triton"),
            ],
        },
    ),
}

# --------------------------------------------------------------------------- the family
_BUILDERS = {
    "Req": _req,
    "RadixKey": _key,
    "TreeNode": _tree_node,
    "MatchResult": _match_result,
    "TwinOptions": _options,
}


def _build(side: Twin, cls: str, seed: int) -> Subject:
    return _BUILDERS[cls](side, seed)


FAMILY = Family(
    name="base",
    classes=tuple(_BUILDERS),
    build=_build,
    methods={**REQ_METHODS, **KEY_METHODS, **NODE_METHODS, **OPTIONS_METHODS},
    exempt={
        "Req.reset_kv_fields": "forgets every pool field of a request record (no arguments); "
        "the record has no phase that forbids it: the lifecycle calls it once the pools let go",
    },
)
