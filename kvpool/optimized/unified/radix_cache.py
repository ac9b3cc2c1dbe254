"""``UnifiedRadixCache`` with the FULL component (mirrors the reference's
:mod:`kvpool.reference.unified.radix_cache`).

The twin's :class:`RadixCache` plus the unified cache's contract: ``insert`` frees the caller's
duplicate slots ``value[prev_prefix_len:cached]`` itself, one free per overlapped node, in walk
order (tokens and token slots).
"""

from __future__ import annotations

import torch

from kvpool.constants import floor_align
from kvpool.errors import InvalidArgumentError
from kvpool.optimized.key_match import child_key, matched_tokens
from kvpool.optimized.radix.radix_cache import RadixCache
from kvpool.optimized.radix_key import RadixKey, TreeNode
from kvpool.optimized.req import Req
from kvpool.reference.radix.checks import check_key  # a pure host check, shared


class UnifiedRadixCache(RadixCache):
    """:class:`RadixCache` whose ``insert`` frees the duplicate slots (module docstring)."""

    frees_duplicates = True
    """Callers read this: an insert leaves no duplicate slot for the caller to free."""

    def insert(
        self,
        key: RadixKey,
        value: torch.Tensor | None = None,
        priority: int = 0,
        chunked: bool = False,
        inserted_len: int | None = None,
        prev_prefix_len: int | None = None,
    ) -> int:
        """:meth:`RadixCache.insert`, then free ``value[prev_prefix_len:cached]`` (tokens),
        one free per overlapped node; returns ``cached``. ``prev_prefix_len=None`` frees
        nothing (the legacy contract: kvpool's own release path frees the duplicates itself).
        InvalidArgumentError (nothing changed) for a ``prev_prefix_len`` that is not an int in
        ``[0, len(key)]``."""
        if prev_prefix_len is None:
            return super().insert(key, value, priority, chunked, inserted_len)
        check_key(key, RadixKey)  # the spans below walk it before the base insert checks it
        if isinstance(prev_prefix_len, bool) or not isinstance(prev_prefix_len, int):
            raise InvalidArgumentError(f"prev_prefix_len must be an int, got {prev_prefix_len!r}")
        stored = len(key) - self.is_eagle if len(key) else 0  # the tree's key: its bigrams
        if not 0 <= prev_prefix_len <= stored:
            raise InvalidArgumentError(
                f"prev_prefix_len {prev_prefix_len} outside [0, {stored}] (the key's tokens)"
            )
        spans = [] if self.disable else self._overlap_spans(key)
        cached = super().insert(key, value, priority, chunked, inserted_len)
        if value is not None and not self.disable:
            self._free_duplicates(value, spans, prev_prefix_len)
        return cached

    def _insert_checkpoint(
        self, req: Req, key: RadixKey, value: torch.Tensor, chunked: bool
    ) -> int:
        """:meth:`checkpoint`'s insert frees the duplicates itself, as ``insert`` with
        ``prev_prefix_len = cache_protected_len``: one ``free_segment`` per overlapped node, in
        walk order (see the reference)."""
        spans = self._overlap_spans(key)
        cached = self._insert_req(req, key, value, chunked)
        self._free_duplicates(value, spans, req.cache_protected_len)
        return cached

    def _free_duplicates(self, value: torch.Tensor, spans: list[tuple[int, int]], at: int) -> None:
        """Free ``value[max(start, at):end]`` for each overlapped node's ``[start, end)``
        (tokens), in walk order, each one ``free_segment`` from column 0."""
        for start, end in spans:
            lo = max(start, at)
            if lo < end:
                self.token_to_kv_pool_allocator.free_segment(value[lo:end], 0)

    def _split(self, child: TreeNode, at: int) -> TreeNode:
        """The legacy split, except that the new upper node keeps ``child``'s creation time
        (SGLang 0.5.23's unified tree copies it; the legacy tree stamps the walk's time): under
        ``fifo`` / ``filo`` the upper half is as old as the node it was cut from."""
        upper = super()._split(child, at)
        upper.creation_time = child.creation_time
        return upper

    def _overlap_spans(self, key: RadixKey) -> list[tuple[int, int]]:
        """``[start, end)`` (tokens) of each node an insert of ``key`` would walk through, in
        walk order; reads the tree only (no stamp, no split)."""
        ps = self.page_size
        key = self._tree_key(key)
        n = floor_align(len(key), ps)
        spans: list[tuple[int, int]] = []
        if n == 0:
            return spans
        child = self.root_node.children.get((key.extra_key, key.plain_child_key(ps)))
        arr = key.array if child is not None else None
        pos = 0
        while child is not None and arr is not None:
            matched = matched_tokens(child.arr, arr, pos, n)
            if ps > 1:
                matched = (matched // ps) * ps
            spans.append((pos, pos + matched))
            pos += matched
            if pos >= n or matched < len(child.arr):
                break
            child = child.children.get(child_key(arr, pos, ps))
        return spans


__all__ = ["UnifiedRadixCache"]
