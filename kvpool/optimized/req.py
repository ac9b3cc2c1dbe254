"""``Req`` (optimized twin): one request's record in the lifecycle (SGLang's field names).

Same fields and meaning as :class:`kvpool.reference.req.Req` (see there for the length
invariants); slot containers (``prefix_indices``) are int64 tensors. Two caches make long prompts
cheap, both valid because a request's token list only ever grows at its end:

- :meth:`Req.token_array` gives the token ids as a numpy array (built once per prompt,
  extended with generated tokens), so radix keys never convert a Python list per call;
- :meth:`Req.kv_tags_upto` continues the running KV-tag hash (:mod:`kvpool.tags`) from the last
  computed position instead of rehashing the whole prefix at every decode step, and computes a
  run of new tags as a vectorised scan (see :func:`scan_kv_tags`).

Units: every ``*_len`` is tokens; ``req_pool_idx`` is a row; slots are token slots.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import torch

from kvpool.errors import InvalidArgumentError
from kvpool.host_checks import as_count
from kvpool.optimized.key_match import TokenArray, compact_tokens
from kvpool.optimized.radix_key import TreeNode
from kvpool.tags import TAG_MODULUS, TAG_MULTIPLIER, namespace_seed

_SCAN_MIN = 64
"""Runs shorter than this are hashed by a plain loop (numpy's per-call cost would dominate)."""


def scan_kv_tags(h0: int, tokens: TokenArray) -> TokenArray:
    """Tags of ``tokens`` continuing the running hash from state ``h0`` (int64 array).

    The hash step ``h -> (h * M + t + 1) mod P`` is an affine map; an inclusive Hillis-Steele
    scan composes the maps in ``log2(n)`` vectorised steps (products stay below 2**48, exact in
    int64 because ``P < 2**24``). Tag ``p`` is ``h_p + 1``, as :func:`kvpool.tags.kv_tags`."""
    p = TAG_MODULUS
    a = np.full(tokens.shape[0], TAG_MULTIPLIER % p, dtype=np.int64)
    b = np.mod(tokens.astype(np.int64) + 1, p)
    d = 1
    n = tokens.shape[0]
    while d < n:
        # element i absorbs the map ending at i - d: (a_i, b_i) o (a_j, b_j)
        new_b = (a[d:] * b[:-d] + b[d:]) % p
        a[d:] = (a[d:] * a[:-d]) % p
        b[d:] = new_b
        d *= 2
    out: TokenArray = (a * h0 + b) % p + 1
    return out


REQ_STATES: tuple[str, ...] = ("waiting", "running", "finished", "aborted")
"""Lifecycle states: waiting -> running -> finished | aborted; retract: running -> waiting."""


_NO_SLOTS = torch.empty(0, dtype=torch.int64)


def _empty_slots() -> torch.Tensor:
    """No slots (one shared empty tensor: nothing can be written into it, and a request
    forgetting its pool fields then costs no tensor operation)."""
    return _NO_SLOTS


class Req:
    """A request; see :class:`kvpool.reference.req.Req`. ``prefix_indices`` is an int64 tensor."""

    def __init__(
        self,
        rid: str,
        origin_input_ids: Sequence[int],
        extra_key: str | None = None,
        session_id: str | None = None,
        priority: int = 0,
    ) -> None:
        self.rid = rid
        # a list is taken as given (ints expected; the manager converts once in new_req)
        self.origin_input_ids: list[int] = (
            list(origin_input_ids)
            if isinstance(origin_input_ids, list)
            else [int(t) for t in origin_input_ids]
        )
        self.output_ids: list[int] = []
        self.extra_key = extra_key
        self.session_id = session_id
        self.priority = priority
        self.state = "waiting"
        self.req_pool_idx: int | None = None
        self.prefix_indices: torch.Tensor = _empty_slots()
        self.last_node: TreeNode | None = None
        self.fill_ids: list[int] = []
        self.kv_committed_len = 0
        self.kv_allocated_len = 0
        self.cache_protected_len = 0
        self.cache_inserted_len = 0
        self.is_chunked = 0
        self.matched = False
        self.finished_len: int | None = None
        self._reset_mamba_fields()
        self._array: TokenArray = np.empty(0, dtype=np.int32)
        self._tags: TokenArray = np.empty(0, dtype=np.int64)

    @property
    def all_token_ids(self) -> list[int]:
        """The full token list: prompt followed by generated tokens (a fresh list)."""
        return self.origin_input_ids + self.output_ids

    def seq_len(self) -> int:
        """Tokens in the full token list."""
        return len(self.origin_input_ids) + len(self.output_ids)

    def _check_stop(self, stop: object) -> int:
        """``stop`` as a token count in ``[0, seq_len()]``: InvalidArgumentError otherwise (a
        bool or a float included), before the caches change."""
        if type(stop) is int and 0 <= stop <= self.seq_len():
            return stop  # the common case, without the helper's cost
        n = as_count("stop", stop)
        if n > self.seq_len():
            raise InvalidArgumentError(f"stop {n} past the request's {self.seq_len()} tokens")
        return n

    def token_array(self, stop: int) -> TokenArray:
        """The first ``stop`` tokens as an int32 numpy array (int64 once an id needs it;
        cached; only grows). ``stop`` must be in ``[0, seq_len()]`` (InvalidArgumentError)."""
        stop = self._check_stop(stop)
        have = int(self._array.shape[0])
        if have < stop:
            tokens = self.all_token_ids
            # amortised growth for decode steps; the first read takes every token (a prefill
            # reads the whole prompt right after the match read all but its last)
            grow = max(stop, min(len(tokens), 2 * have)) if have else len(tokens)
            self._array = np.concatenate((self._array, compact_tokens(tokens[have:grow])))
        return self._array[:stop]

    def kv_tags_upto(self, stop: int) -> TokenArray:
        """KV tags of tokens ``[0, stop)`` as an int64 array (equal to
        ``kv_tags(all_token_ids[:stop], extra_key)``), continuing the running hash from the last
        position computed (cached; only grows). ``stop`` must be in ``[0, seq_len()]``
        (InvalidArgumentError)."""
        stop = self._check_stop(stop)
        tags = self._tags
        have = int(tags.shape[0])
        if have < stop:
            h = int(tags[-1]) - 1 if have else namespace_seed(self.extra_key)
            new = self.token_array(stop)[have:stop]
            if stop - have < _SCAN_MIN:
                vals = []
                for t in new.tolist():
                    h = (h * TAG_MULTIPLIER + t + 1) % TAG_MODULUS
                    vals.append(h + 1)
                grown = np.asarray(vals, dtype=np.int64)
            else:
                grown = scan_kv_tags(h, new)
            self._tags = tags = np.concatenate((tags, grown))
        return tags[:stop]

    def _prefix_len(self) -> int:
        """``len(prefix_indices)`` (tokens): a 1-D tensor's ``shape[0]``, without
        ``Tensor.__len__``'s Python-level dispatch; any other container's ``len``."""
        prefix = self.prefix_indices
        if type(prefix) is torch.Tensor and prefix.dim() == 1:
            n: int = prefix.shape[0]
            return n
        return len(prefix)

    def _reset_mamba_fields(self) -> None:
        """Hybrid models: the Mamba slot, its pending clear or copy, the track buffers
        (:class:`kvpool.protocols.MambaReqLike`); None / False for other models."""
        self.mamba_pool_idx: int | None = None
        self.mamba_needs_clear = False
        self.mamba_cow_src_index: int | None = None
        self.mamba_ping_pong_track_buffer: list[int] | None = None
        self.mamba_next_track_idx: int | None = None

    def reset_kv_fields(self) -> None:
        """Forget every pool resource (after they were released or handed over)."""
        self.req_pool_idx = None
        self.prefix_indices = _empty_slots()
        self.last_node = None
        self.fill_ids = []
        self.kv_committed_len = 0
        self.kv_allocated_len = 0
        self.cache_protected_len = 0
        self.cache_inserted_len = 0
        self.is_chunked = 0
        self.matched = False
        self._reset_mamba_fields()

    def __repr__(self) -> str:
        return (
            f"Req({self.rid!r}, state={self.state}, row={self.req_pool_idx}, "
            f"len={self.seq_len()}, committed={self.kv_committed_len}, "
            f"allocated={self.kv_allocated_len}, protected={self.cache_protected_len}, "
            f"chunked={self.is_chunked})"
        )


__all__ = ["REQ_STATES", "Req"]
