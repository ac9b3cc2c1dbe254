"""``Req``: one request's record in the lifecycle (SGLang's field names).

Units: every ``*_len`` is tokens; ``req_pool_idx`` is a row of the request table; slots are token
slots. The full token list is ``origin_input_ids + output_ids``; token ``p``'s slot is
``req_to_token[req_pool_idx, p]``.

Lengths (``cache_protected_len <= kv_committed_len <= kv_allocated_len <= max_context_len``):

- ``kv_committed_len``: tokens whose KV has been computed and written.
- ``kv_allocated_len``: columns of the row that point at slots the request holds; the part past
  ``ceil_align(kv_committed_len, page_size)`` is speculative over-allocation.
- ``cache_protected_len``: leading tokens whose slots belong to the radix tree (locked through
  ``last_node``); always page-aligned. The request privately owns
  ``[cache_protected_len, ceil_align(kv_allocated_len, page_size))``.
- ``cache_inserted_len``: tokens this request has inserted into the tree so far (SGLang 0.5.23's
  ``kv.cache_inserted_len``; read under ``Rules.hit_count == "inserted_len"``); 0 again once its
  KV is released.

``finished_len`` (SGLang's name): set by ``finish``, the output tokens the client receives, the
stop token included (None: every output token). A speculative step commits its whole accepted
run, so a stop may lie before the last committed token; the release then keeps only the tokens
through the stop (``Rules.release_upto``).
"""

from __future__ import annotations

from collections.abc import Sequence

from kvpool.reference.radix_key import TreeNode

REQ_STATES: tuple[str, ...] = ("waiting", "running", "finished", "aborted")
"""Lifecycle states: waiting -> running -> finished | aborted; retract: running -> waiting."""


class Req:
    """A request. ``prefix_indices`` are the slots of the prefix it starts (or continues) from;
    ``fill_ids`` the tokens prefilled so far; ``is_chunked`` is 1 while the prompt is only partly
    prefilled (between chunks), else 0. ``matched`` is True once ``match_prefix`` ran for the
    current waiting period (so ``extend`` does not match again)."""

    def __init__(
        self,
        rid: str,
        origin_input_ids: Sequence[int],
        extra_key: str | None = None,
        session_id: str | None = None,
        priority: int = 0,
    ) -> None:
        self.rid = rid
        self.origin_input_ids: list[int] = [int(t) for t in origin_input_ids]
        self.output_ids: list[int] = []
        self.extra_key = extra_key
        self.session_id = session_id
        self.priority = priority
        self.state = "waiting"
        self.req_pool_idx: int | None = None
        self.prefix_indices: list[int] = []
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

    @property
    def all_token_ids(self) -> list[int]:
        """The full token list: prompt followed by generated tokens (a fresh list)."""
        return self.origin_input_ids + self.output_ids

    def seq_len(self) -> int:
        """Tokens in the full token list."""
        return len(self.origin_input_ids) + len(self.output_ids)

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
        self.prefix_indices = []
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
