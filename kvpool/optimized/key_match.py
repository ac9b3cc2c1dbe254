"""Vectorisation helpers for the optimized radix tree's token keys (no reference mirror: the
reference compares Python lists token by token, which needs none of this).

- :func:`compact_tokens` turns a list of token ids into an int32 array (int64 when some id does
  not fit). A list of ints is packed by :mod:`struct` straight into the array's buffer, several
  times faster than ``np.asarray`` (which inspects every element before converting it); anything
  ``struct`` refuses (negative ids, ids of 2**32 or more, non-integers) goes through numpy as
  before, so the result (values and dtype) is the same either way.
- :func:`matched_tokens` finds where a node's key and a stretch of the searched key first differ:
  one vectorised ``!=`` and one ``argmax``, never a Python loop over tokens.
- :func:`child_key` builds the dict key a child is filed under.

Units: token ids; positions and lengths in tokens.
"""

from __future__ import annotations

import struct
from collections.abc import Sequence
from functools import lru_cache

import numpy as np
import numpy.typing as npt
import torch

TokenArray = npt.NDArray[np.signedinteger]
"""A 1-D numpy array of token ids: int32 when every id fits (half the memory traffic of a key
comparison), else int64. Arrays of either width compare correctly with each other."""


_INTEGER_DTYPES = frozenset(
    getattr(torch, name)
    for name in ("int8", "int16", "int32", "int64", "uint8", "uint16", "uint32", "uint64")
    if hasattr(torch, name)
)
"""torch's plain integer dtypes (one set lookup on a hot path)."""


def is_integer_dtype(dtype: torch.dtype) -> bool:
    """True for torch's integer dtypes (bool excluded): tensor metadata, no device read."""
    return dtype in _INTEGER_DTYPES


@lru_cache(maxsize=512)
def _uint32_packer(count: int) -> struct.Struct:
    """A packer of ``count`` native unsigned 32-bit ints (cached: building one parses a format)."""
    return struct.Struct(f"{count}I")


def _pack_uint32(token_ids: Sequence[int]) -> TokenArray | None:
    """``token_ids`` as int32 when every id is in ``[0, 2**31)``, as int64 when every id is in
    ``[0, 2**32)``; None when ``struct`` refuses an element (the caller then uses numpy)."""
    count = len(token_ids)
    try:
        # pack(*ids) copies the list once into the call's arguments (pack_into(buf, 0, *ids)
        # would copy it twice); the bytes are then copied into a bytearray (a plain memcpy) so
        # that the array is writable and can back a tensor without a warning.
        buf = bytearray(_uint32_packer(count).pack(*token_ids))
    except Exception:  # whatever struct refuses, numpy decides (same value or error as before)
        return None
    arr = np.frombuffer(buf, dtype=np.int32)
    if count and int(arr.min()) < 0:  # an id in [2**31, 2**32): wrapped around in int32
        return np.frombuffer(buf, dtype=np.uint32).astype(np.int64)
    return arr


def compact_tokens(token_ids: Sequence[int]) -> TokenArray:
    """A list of ids as an int32 array, or int64 when some id does not fit in 32 bits."""
    if len(token_ids):
        packed = _pack_uint32(token_ids)
        if packed is not None:
            return packed
    try:
        return np.asarray(token_ids, dtype=np.int32).reshape(-1)
    except OverflowError:
        return np.asarray(token_ids, dtype=np.int64).reshape(-1)


def as_token_array(token_ids: Sequence[int] | TokenArray | torch.Tensor) -> TokenArray:
    """``token_ids`` as a 1-D signed-integer numpy array; an int32/int64 array is kept as it is
    (no copy), other integer arrays are widened to int64, lists go through
    :func:`compact_tokens`."""
    if isinstance(token_ids, torch.Tensor):
        token_ids = token_ids.detach().cpu().numpy()
    if isinstance(token_ids, np.ndarray):
        if token_ids.dtype in (np.int32, np.int64):
            return token_ids.reshape(-1)
        return token_ids.astype(np.int64).reshape(-1)
    return compact_tokens(token_ids)


def matched_tokens(node_arr: TokenArray, key_arr: TokenArray, pos: int, stop: int) -> int:
    """How many leading tokens of ``node_arr`` equal ``key_arr[pos:stop]`` (at most
    ``min(len(node_arr), stop - pos)``)."""
    length = min(node_arr.shape[0], stop - pos)
    neq = node_arr[:length] != key_arr[pos : pos + length]
    first = int(neq.argmax())  # 0 when nothing differs: told apart by neq[first]
    return first if neq[first] else length


def child_key(arr: TokenArray, pos: int, page_size: int) -> int | tuple[int, ...]:
    """Dict key of the child starting at token ``pos`` of ``arr``: the token id (a plain int) at
    page size 1, else the tuple of the page's ids."""
    if page_size == 1:
        return int(arr[pos])
    return tuple(arr[pos : pos + page_size].tolist())


__all__ = [
    "TokenArray",
    "as_token_array",
    "child_key",
    "compact_tokens",
    "is_integer_dtype",
    "matched_tokens",
]
