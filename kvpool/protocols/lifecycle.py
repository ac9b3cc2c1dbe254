"""The request lifecycle: ``MemoryManagerProtocol``, the request-level API the lockstep harness
drives.

The rules every method shares: :mod:`kvpool.protocols`.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol

from kvpool.protocols.index import IdxT_co
from kvpool.snapshot import (
    PoolSnapshot,
)


class MemoryManagerProtocol(Protocol[IdxT_co]):
    """The request lifecycle over one set of pools (``req_to_token_pool``,
    ``token_to_kv_pool_allocator``, ``tree_cache``, ``kv_cache``), built from a
    :class:`kvpool.config.PoolConfig`. This request-level API is what the lockstep harness drives;
    every result is compared exactly across twins.

    Request states: ``waiting`` -> (``match_prefix`` may lock a prefix while still waiting) ->
    ``running`` (after its first ``extend``; ``is_chunked > 0`` while its prompt is only partly
    prefilled) -> ``finished`` or ``aborted``; ``retract`` sends a running request back to
    ``waiting`` with its KV released and its generated tokens appended to its prompt.

    KV content: whenever a token's KV is computed (extend, decode, accepted speculative tokens) the
    manager writes its tag (:func:`kvpool.tags.kv_tags` of the request's full token list and
    ``extra_key``) into that token's slot on every layer.
    """

    def new_req(
        self,
        rid: str,
        input_ids: Sequence[int],
        extra_key: str | None = None,
        session_id: str | None = None,
    ) -> None:
        """Register a waiting request. With ``session_id`` the request is the session's next
        turn: its full token list is the session's committed tokens followed by ``input_ids``,
        and its first ``extend`` restores the session's row, KV and lock."""
        ...

    def match_prefix(self, rid: str) -> int:
        """For a waiting request: match its tokens (capped at ``len - 1``) in the tree, lock the
        last matched node (releasing any lock it held before) and remember the prefix. Returns
        the prefix length in tokens (0 with the radix cache disabled)."""
        ...

    def extend(
        self, rids: Sequence[str], chunk_sizes: Sequence[int | None] | None = None
    ) -> IdxT_co:
        """One prefill batch. Each request is waiting (matched here if it was not) or a chunked
        request continuing. ``chunk_sizes[i]`` caps the new tokens of request ``i`` this step
        (``None``: all remaining prompt tokens). Evicts what it needs first, then
        ``alloc_for_extend``. A request left with prompt tokens to go becomes chunked and goes
        through ``cache_unfinished_req(chunked=True)``. Returns ``out_cache_loc``: the new slots
        of every request, in batch order."""
        ...

    def decode(self, rids: Sequence[str], token_ids: Sequence[int]) -> IdxT_co:
        """One decode step: request ``i`` (running, prompt fully prefilled) appends
        ``token_ids[i]``; one slot each (``alloc_for_decode``), unless speculative over-allocation
        already covers it. Returns the slots, in batch order."""
        ...

    def spec_step(
        self, rids: Sequence[str], accepted: Sequence[Sequence[int]], reserve: int
    ) -> IdxT_co:
        """EAGLE v2 step: grow each allocation to ``ceil_align(kv_committed_len + 2 * reserve,
        page_size)`` (never shrinking), then commit ``accepted[i]`` (at most ``2 * reserve``
        tokens). Returns the newly allocated slots (batch order); the excess stays allocated
        until release."""
        ...

    def spec_draft_v1(self, rids: Sequence[str], num_draft: int) -> IdxT_co:
        """EAGLE v1: borrow ``num_draft`` slots per request with backup_state / alloc /
        restore_state and write draft tags there; the slots stay officially free. Returns them."""
        ...

    def finish(
        self,
        rids: Sequence[str],
        is_insert: bool = True,
        finished_lens: Sequence[int | None] | None = None,
    ) -> None:
        """Release a batch inside ``free_group_begin/end``: ``release_kv_cache`` for each (or the
        session takes the row, KV and lock when the request is a session turn).
        ``finished_lens``: per request, None or the output tokens through its stop (a stop
        inside the last speculative run); the release keeps what ``Rules.release_upto`` says,
        a session turn hands over the tokens through the stop."""
        ...

    def abort(self, rid: str) -> None:
        """Abort a waiting (maybe locked) or running request: locks dropped, everything it holds
        freed without inserting into the tree."""
        ...

    def retract(self, rid: str) -> None:
        """Running -> waiting: release without insert; its tokens so far become its prompt."""
        ...

    def open_session(self, session_id: str) -> None: ...

    def close_session(self, session_id: str) -> None:
        """Drop the session's lock, free ``[cache_protected_len, allocated)`` and its row."""
        ...

    def evict(self, num_tokens: int) -> int:
        """Evict from the tree (tokens actually freed)."""
        ...

    def snapshot(self) -> PoolSnapshot:
        """The whole state for :mod:`kvpool.invariants`."""
        ...


__all__ = ["MemoryManagerProtocol"]
