"""Radix-tree building blocks of the optimized twin: ``RadixKey``, ``TreeNode``, ``MatchResult``.

Same names and fields as :mod:`kvpool.reference.radix_key`, built for long prompts:

- a :class:`RadixKey` holds its token ids either as a Python list or as a 1-D int32/int64 numpy
  array (int32 whenever the ids fit) and converts lazily (once, cached) to the other form; the
  tree compares keys in array form, so a caller holding token ids in an array (as an engine
  does) never pays a per-token Python cost, and a list is packed into an array by
  :func:`~kvpool.optimized.key_match.compact_tokens` (about 5 ns a token);
- a :class:`TreeNode` keeps its key both as a ``RadixKey`` and as the token array ``arr`` the
  match loop compares against, and its ``value`` (the slots of those tokens) as an int64 tensor
  (plus ``vnp``, a numpy view of the same memory when it lives on the CPU).

Units: keys are token ids; values are token-slot ids (one per token).
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import Any, Protocol, overload

import numpy as np
import numpy.typing as npt
import torch

from kvpool.constants import RESERVED_INDEX
from kvpool.errors import IndexOutOfRangeError, InvalidArgumentError, ReservedIndexError
from kvpool.host_checks import TOKEN_ID_LIMIT, as_str
from kvpool.optimized.key_match import (
    TokenArray,
    as_token_array,
    child_key,
    compact_tokens,
    is_integer_dtype,
)
from kvpool.reference.radix_key import check_page_size

ChildKey = int | tuple[int, ...] | tuple[str | None, int | tuple[int, ...]]
"""A ``children`` dict key, as :data:`kvpool.reference.radix_key.ChildKey`: the first token id
(page size 1) or the tuple of the first page of token ids; at the root the pair
``(extra_key, that key)``."""

SlotsLike = torch.Tensor | npt.NDArray[np.integer] | Sequence[int]
"""Slots given by a caller: a tensor, a numpy array or a sequence of ints."""

# Left open: one list serves both kinds, where a union would need a cast at every join.
PathSlots = Any
"""One matched node's slots: a numpy view (``TreeNode.vnp``) on the CPU, else an int64 tensor;
one path holds one kind."""


class RadixKey:
    """Token ids plus an optional namespace (``extra_key``); different namespaces never share a
    tree node. ``len()`` is the number of tokens; slicing with a slice keeps the ``extra_key``.

    Accepts a list/sequence of ints, a numpy array or a tensor. ``token_ids`` (list) and
    ``array`` (int32/int64 numpy array) are both available; whichever was not given is built on
    first use and cached."""

    __slots__ = ("_array", "_list", "extra_key")

    def __init__(
        self,
        token_ids: Sequence[int] | TokenArray | torch.Tensor,
        extra_key: str | None = None,
    ) -> None:
        self._list: list[int] | None
        self._array: TokenArray | None
        if isinstance(token_ids, (np.ndarray, torch.Tensor)):
            self._array = as_token_array(token_ids)
            self._list = None
        else:
            self._list = token_ids if isinstance(token_ids, list) else list(token_ids)
            self._array = None
        self.extra_key = extra_key

    @classmethod
    def from_array(cls, array: TokenArray, extra_key: str | None = None) -> RadixKey:
        """Wrap a 1-D int32/int64 array without a copy (hot paths). Its metadata only is
        checked (InvalidArgumentError for anything but a 1-D int32/int64 numpy array, or an
        ``extra_key`` that is neither a str nor None); the ids are the caller's (a token array
        of a request or of another key)."""
        if not (type(array) is np.ndarray and array.ndim == 1 and array.dtype in _TOKEN_DTYPES):
            raise InvalidArgumentError(
                f"array must be a 1-D int32/int64 numpy array, got {type(array).__name__} "
                f"{getattr(array, 'dtype', '')} {getattr(array, 'shape', '')}"
            )
        if extra_key is not None and type(extra_key) is not str:
            as_str("extra_key", extra_key)  # raises: names the value
        return _wrap(array, extra_key)

    @property
    def token_ids(self) -> list[int]:
        """The token ids as a Python list (built once from the array if needed)."""
        if self._list is None:
            assert self._array is not None
            self._list = self._array.tolist()
        return self._list

    @property
    def array(self) -> TokenArray:
        """The token ids as a 1-D int32/int64 array (built once from the list if needed)."""
        if self._array is None:
            assert self._list is not None
            self._array = compact_tokens(self._list)
        return self._array

    def __len__(self) -> int:
        if self._array is not None:
            return int(self._array.shape[0])
        assert self._list is not None
        return len(self._list)

    @overload
    def __getitem__(self, idx: int) -> int: ...

    @overload
    def __getitem__(self, idx: slice) -> RadixKey: ...

    def __getitem__(self, idx: int | slice) -> int | RadixKey:
        if not isinstance(idx, slice):
            if self._list is not None:
                return self._list[idx]
            return int(self.array[idx])
        if self._array is not None:
            return _wrap(self._array[idx], self.extra_key)
        assert self._list is not None
        return RadixKey(self._list[idx], self.extra_key)

    def plain_child_key(self, page_size: int) -> int | tuple[int, ...]:
        """The key's first token id (page size 1) or the tuple of its first page of ids, as plain
        ints; read from the list when there is one, so a list key is not converted for it.
        PageSizeError / InvalidArgumentError as the reference (a bad page size; an empty key)."""
        check_page_size(page_size)
        if len(self) == 0:
            raise InvalidArgumentError("an empty key has no child key")
        if self._array is None:
            assert self._list is not None
            if page_size == 1:
                return int(self._list[0])
            return tuple(map(int, self._list[:page_size]))
        return child_key(self._array, 0, page_size)

    def __iter__(self) -> Iterator[int]:
        return iter(self.token_ids)

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, RadixKey):
            return NotImplemented
        return self.extra_key == other.extra_key and bool(np.array_equal(self.array, other.array))

    __hash__ = None  # type: ignore[assignment]

    def __repr__(self) -> str:
        ids = self.token_ids
        shown = f"{ids[:8]}..." if len(ids) > 8 else f"{ids}"
        return f"RadixKey(extra_key={self.extra_key!r}, token_ids={shown}, len={len(ids)})"


_TOKEN_DTYPES = (np.dtype(np.int32), np.dtype(np.int64))
assert TOKEN_ID_LIMIT == 2**31  # bigram_key's shift
"""The dtypes of a token array (:data:`~kvpool.optimized.key_match.TokenArray`)."""


def _wrap(array: TokenArray, extra_key: str | None) -> RadixKey:
    """A key over ``array`` with no check or copy: for arrays of keys and requests only."""
    key = RadixKey.__new__(RadixKey)
    key._array = array
    key._list = None
    key.extra_key = extra_key
    return key


class TreeNode:
    """One radix-tree node. ``key``/``arr``: its tokens; ``value``: their slots (int64 tensor).

    ``child_key`` is the key under which the node sits in ``parent.children`` (first token id,
    or tuple of the first page of token ids; prefixed by the namespace under the root).
    ``parent is None`` for the root and for a node evicted from the tree (detached)."""

    __slots__ = (
        "_value",
        "_vnp",
        "arr",
        "child_key",
        "children",
        "creation_time",
        "hit_count",
        "key",
        "last_access_time",
        "lock_ref",
        "node_id",
        "parent",
        "priority",
    )

    def __init__(
        self,
        node_id: int,
        key: RadixKey,
        value: torch.Tensor,
        parent: TreeNode | None,
        now: float,
        priority: int = 0,
    ) -> None:
        self.node_id = node_id
        self.key = key
        self.arr: TokenArray = key.array
        self._vnp: npt.NDArray[np.int64] | None = None
        self._value = value
        self.children: dict[ChildKey, TreeNode] = {}
        self.parent = parent
        # a ChildKey, None at the root only; left open because callers index ``children`` with it
        # once they know the node is not the root
        self.child_key: Any = None
        self.lock_ref = 0
        self.last_access_time = now
        self.creation_time = now
        self.hit_count = 0
        self.priority = priority

    @property
    def value(self) -> torch.Tensor:
        """The slots of the node's tokens (int64 tensor, one per token)."""
        return self._value

    @value.setter
    def value(self, value: torch.Tensor) -> None:
        self._value = value
        self._vnp = None

    @property
    def vnp(self) -> npt.NDArray[np.int64]:
        """A numpy view of ``value``'s memory (CPU tensors only; made on first use), so a match
        concatenates values without torch's per-call cost."""
        view = self._vnp
        if view is None:
            view = self._vnp = self._value.numpy()
        return view

    @property
    def evicted(self) -> bool:
        """True once the node has been removed from its tree."""
        return self.parent is None and self.node_id != 0

    def is_leaf(self) -> bool:
        """No children."""
        return not self.children

    def __len__(self) -> int:
        return int(self.arr.shape[0])

    def __repr__(self) -> str:
        return f"TreeNode(id={self.node_id}, len={len(self)}, lock_ref={self.lock_ref})"


def as_slots(value: SlotsLike, device: torch.device) -> torch.Tensor:
    """``value`` (slots: a tensor, array or list) as an int64 tensor on ``device`` (no copy when
    it already is one)."""
    if isinstance(value, torch.Tensor):
        if value.dtype == torch.int64 and value.device == device:
            return value
        return value.to(device, torch.int64)
    return torch.as_tensor(value, dtype=torch.int64, device=device)


def tree_value(value: SlotsLike, device: torch.device) -> torch.Tensor:
    """Slots a tree node will own, as :func:`as_slots`, after checking their dtype
    (InvalidArgumentError for non-integers: metadata, checked in both modes)."""
    t = value if isinstance(value, torch.Tensor) else torch.as_tensor(value)
    if t.numel() and not is_integer_dtype(t.dtype):
        raise InvalidArgumentError(f"slots must be integers, got dtype {t.dtype}")
    return as_slots(t, device)


def check_tree_range(slots: torch.Tensor, limit: int | None) -> None:
    """Checked mode (a device read): every slot in ``[0, limit)`` (IndexOutOfRangeError), none
    is slot 0 (ReservedIndexError), as :func:`kvpool.reference.radix_key.check_tree_slots`."""
    if not slots.numel():
        return
    if slots.is_cpu and slots.dtype in (torch.int64, torch.int32):  # a NumPy view: no launch
        host = slots.numpy()
        low, high = int(host.min()), int(host.max())
    else:
        low, high = int(slots.min()), int(slots.max())
    if low < 0 or (limit is not None and high >= limit):
        bad = slots[(slots < 0) | (slots >= (high + 1 if limit is None else limit))]
        raise IndexOutOfRangeError(f"tree slots out of range [0, {limit}): {bad[:8].tolist()}")
    if low == RESERVED_INDEX:
        raise ReservedIndexError(f"slot {RESERVED_INDEX} is reserved and cannot be cached")


def join_slots(values: list[PathSlots], device: torch.device) -> torch.Tensor:
    """The slots of a matched path as one int64 tensor. ``values`` holds each node's slots in
    path order: numpy views (``TreeNode.vnp``) on the CPU, joined by one ``np.concatenate`` (a
    fraction of ``torch.cat``'s per-call cost) and wrapped without a copy; tensors elsewhere."""
    if not values:
        return torch.empty(0, dtype=torch.int64, device=device)
    if isinstance(values[0], np.ndarray):
        return torch.from_numpy(np.concatenate(values))
    return torch.cat(values)


class KeySource(Protocol):
    """What :func:`req_key` reads of a request (the twin's ``Req`` also offers ``token_array``,
    its cached token array, which is used when present)."""

    @property
    def extra_key(self) -> str | None: ...
    @property
    def all_token_ids(self) -> Sequence[int]: ...


def bigram_key(key: RadixKey) -> RadixKey:
    """``key``'s bigram key: the codes of :func:`kvpool.reference.radix_key.bigram_codes`
    (``TOKEN_ID_LIMIT`` is ``2**31``), int64, in one vectorised step."""
    arr = key.array.astype(np.int64)
    return _wrap((arr[:-1] << 31) | arr[1:] if len(arr) > 1 else arr[:0], key.extra_key)


def req_key(req: KeySource, stop: int) -> RadixKey:
    """Key of the request's first ``stop`` tokens (``fill_ids`` is always a prefix of the full
    token list); uses the twin Req's cached token array when there is one."""
    token_array = getattr(req, "token_array", None)
    if token_array is not None:
        return _wrap(token_array(stop), req.extra_key)
    return RadixKey(req.all_token_ids[:stop], req.extra_key)


@dataclass
class MatchResult:
    """``device_indices``: the slots of the matched prefix (int64 tensor, concatenation of the
    matched nodes' values); ``last_device_node``: the deepest matched node (the root when nothing
    matched; ``None`` from a chunk cache, which has no tree); ``last_host_node``: the same node
    in a plain radix cache, the deepest matched node with a host copy in a ``HiRadixCache``
    (whose ``host_hit_length`` counts the tokens matched in host-only nodes)."""

    device_indices: torch.Tensor
    last_device_node: TreeNode | None
    last_host_node: TreeNode | None
    host_hit_length: int = 0


__all__ = [
    "ChildKey",
    "MatchResult",
    "PathSlots",
    "RadixKey",
    "SlotsLike",
    "TreeNode",
    "as_slots",
    "bigram_key",
    "check_tree_range",
    "join_slots",
    "req_key",
    "tree_value",
]
