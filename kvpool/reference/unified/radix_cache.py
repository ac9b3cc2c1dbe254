"""``UnifiedRadixCache`` with the FULL component: SGLang 0.5.23's default prefix cache.

SGLang 0.5.23 builds one ``UnifiedRadixCache`` for every ordinary server (FULL; FULL+SWA for
sliding-window models; FULL+MAMBA for hybrid SSM models; specs/unified_cache.md). For the FULL
component set its tree behaves as the legacy radix cache that :class:`RadixCache` states, node
for node (the same splits, ids, locks, eviction order and amounts), with one difference of
contract, which this class adds:

- **The tree frees the duplicates.** ``insert(key, value, prev_prefix_len=P)`` frees the caller's
  slots ``value[P:cached]`` that duplicate what the tree already held (``cached`` = the returned
  length, page-aligned), one free per overlapped node, in walk order; the legacy tree frees
  nothing and leaves them to the caller. ``P`` (tokens, default 0) is the length the caller
  already had from the tree (its ``cache_protected_len``): those slots are the tree's own.
  ``checkpoint`` inserts so (``P = cache_protected_len``), where the legacy tree's checkpoint
  frees the same slots in one call: the free list comes out in another order when the
  duplicates span two nodes or more.
- **A split keeps the creation time.** The new upper node of a split takes the creation time
  of the node it was cut from (the legacy tree gives it the walk's time), which decides the
  ``fifo`` / ``filo`` order.

Units: tokens and token slots, as in :class:`RadixCache`.
"""

from __future__ import annotations

from kvpool.errors import InvalidArgumentError
from kvpool.reference.radix.checks import check_key
from kvpool.reference.radix.radix_cache import RadixCache
from kvpool.reference.radix_key import RadixKey, TreeNode
from kvpool.reference.req import Req


class UnifiedRadixCache(RadixCache):
    """:class:`RadixCache` whose ``insert`` frees the duplicate slots (module docstring)."""

    frees_duplicates = True
    """Callers read this: an insert leaves no duplicate slot for the caller to free."""

    def insert(
        self,
        key: RadixKey,
        value: list[int] | None = None,
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
        spans = self._overlap_spans(key)
        cached = super().insert(key, value, priority, chunked, inserted_len)
        if value is not None and not self.disable:
            self._free_duplicates(value, spans, prev_prefix_len)
        return cached

    def _insert_checkpoint(self, req: Req, key: RadixKey, value: list[int], chunked: bool) -> int:
        """:meth:`checkpoint`'s insert frees the duplicates itself, as ``insert`` with
        ``prev_prefix_len = cache_protected_len``: one ``free_segment`` per overlapped node, in
        walk order (SGLang 0.5.23's ``checkpoint_into_tree``), where the legacy tree makes one
        free of them all."""
        spans = self._overlap_spans(key)
        cached = self._insert_req(req, key, value, chunked)
        self._free_duplicates(value, spans, req.cache_protected_len)
        return cached

    def _free_duplicates(self, value: list[int], spans: list[tuple[int, int]], at: int) -> None:
        """Free ``value[max(start, at):end]`` for each overlapped node's ``[start, end)``
        (tokens), in walk order, each one ``free_segment`` from column 0 (its pages are whole:
        node bounds are page-aligned)."""
        for start, end in spans:
            lo = max(start, at)
            if lo < end:
                self.token_to_kv_pool_allocator.free_segment(list(value[lo:end]), 0)

    def _split_node(self, child: TreeNode, split_len: int) -> TreeNode:
        """The legacy split, except that the new upper node keeps ``child``'s creation time
        (SGLang 0.5.23's unified tree copies it; the legacy tree stamps the walk's time): under
        ``fifo`` / ``filo`` the upper half is as old as the node it was cut from."""
        upper = super()._split_node(child, split_len)
        upper.creation_time = child.creation_time
        return upper

    def _overlap_spans(self, key: RadixKey) -> list[tuple[int, int]]:
        """``[start, end)`` (tokens) of each node an insert of ``key`` would walk through,
        in walk order (the part of the key that node already holds)."""
        spans: list[tuple[int, int]] = []
        key = self._align(self._tree_key(key))
        node, pos = self.root_node, 0
        while pos < len(key):
            rest = key[pos:]
            child = node.children.get(self._child_key(node, rest))
            if child is None:
                break
            n = self._match_len(child.key, rest)
            spans.append((pos, pos + n))
            pos += n
            if n < len(child.key):
                break
            node = child
        return spans


__all__ = ["UnifiedRadixCache"]
