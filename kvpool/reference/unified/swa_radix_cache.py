"""``UnifiedSWARadixCache``: SGLang 0.5.23's default tree for a sliding-window model
(``UnifiedRadixCache`` with the FULL and SWA components).

kvpool's :class:`~kvpool.reference.swa.radix_cache.SWARadixCache` models 0.5.16's
``SWARadixCache``; this subclass states, and implements, where 0.5.23's unified tree differs
(found by running both SGLang tree cores in lockstep with this model; specs/unified_cache.md,
"The FULL + SWA set"). Units: tokens, as in the base class.

1. **New leaves keep SWA slots for the last window only, and a leaf without any stays.** An
   insert's new tail is one leaf first (the next node id); tokens before ``swa_evicted_seqlen``
   are split off above it as a tombstone (the upper half takes the next id), and what is left is
   capped at ``ceil(sliding_window_size / page_size)`` pages: a longer rest is split again, its
   older part (next id) above the capped leaf. Both parts get SWA values (the older first). A
   tail wholly before ``swa_evicted_seqlen`` stays as a tombstone leaf holding its full KV
   (0.5.16 freed it and added no node).
2. **Full eviction follows ``eviction_policy``** (0.5.16: least recently used only) over the
   unlocked leaves (no lock of either kind, no child), ordered by the policy's key and then by
   access time; a leaf's deletion frees its full slots and, unless it is a tombstone, its SWA
   slots. **Tombstones left as leaves stay** (0.5.16 deleted them with their full KV): they are
   ordinary full-evictable leaves. Nodes carry a creation time (a split's upper half keeps the
   cut node's), hit counts (an insert counts one on every node it walks and on its new leaf) and
   priorities (0 here), as in kvpool's :class:`~kvpool.reference.unified.radix_cache.
   UnifiedRadixCache`.
3. **SWA recency is its own list** (0.5.16: one recency for both evictions). SWA eviction walks
   an LRU list of the nodes holding SWA slots: a node enters it at the front when it gets SWA
   slots; a split puts the upper half right behind the node it was cut from; the end of a match
   or insert moves its last node and the ancestors within ``sliding_window_size + page_size``
   tokens of it (counted over every node, tombstones too) to the front, the last node first.
   Walks of a match or an insert do not touch it otherwise. SWA eviction visits it from the
   least recent end once, skipping nodes with an SWA lock: an unlocked leaf (no lock of either
   kind) is deleted, any other node loses its SWA slots (tombstone).
4. **A window lock counts tombstones.** ``inc_lock_ref`` SWA-locks every node from the node up
   until ``sliding_window_size`` tokens of keys are covered, tombstones included (0.5.16
   refused: LockError); only nodes holding SWA slots move between the SWA sizes.
   ``dec_swa_lock_only`` walks from the node up to the uuid's node (or the root) and tombstones
   a node whose SWA lock reaches 0 only if it is an unlocked leaf, which a holder's own path
   never is (0.5.16 tombstoned every leaf at once).
5. **The tree frees with segment frees and splits duplicates at the window.** Duplicates of an
   insert (past ``prev_prefix_len``) before ``swa_evicted_seqlen`` are freed full-side only
   (``free_full_segment``: the request released their SWA slots), the rest with
   ``free_segment``, one call each per node walked; a recovered tombstone's old full slots go
   with ``free_full_segment`` before the node takes the incoming slots' SWA values; a locked
   recovery re-points the mapping and frees the incoming full slots with
   ``free_full_segment``. Evictions free with ``free_segment`` / ``free_swa_segment`` of the
   node's full slots.

Everything else (match rule, recovery of tombstones from the incoming slots, uuids, sizes,
errors) is the base class's.

**SGLang 0.5.16's unified tree.** 0.5.16 builds an earlier ``UnifiedRadixCache`` for a
sliding-window model with the radix cache on. It behaves as above except in three places, each a
``Rules`` knob (defaults: 0.5.23; ``Rules.for_sglang("0.5.16")``: 0.5.16):

- ``unified_split_recency="front"`` (difference 3): a split moves the cut node to the front of
  the SWA list and puts the upper half right behind it.
- ``unified_tombstone_lock="skip"`` (difference 4): a window lock skips tombstones (no SWA lock,
  their tokens not counted, so the segment reaches further up); ``dec_lock_ref`` walks from the
  node up, skips nodes whose SWA count is 0 (without looking at their uuid) and stops after
  decrementing the uuid's node (None: at the root); ``dec_swa_lock_only`` skips tombstones and
  nodes whose count is 0, stops at the uuid's node whether it decremented it or not, and
  tombstones a node whose count reaches 0 if it is an unlocked leaf. Neither raises for an SWA
  count that is 0 (0.5.16 skips it); a full count that would go negative is still a LockError.
- ``unified_free="free"`` (difference 5): an insert's duplicates are one ``free``, a recovered
  tombstone's old full slots one ``free``, the incoming full slots of a locked recovery one
  ``free_full``; a deleted leaf is one ``free`` (a tombstone leaf ``free_full``); a tombstoned
  node's SWA slots one ``free_swa``.
"""

from __future__ import annotations

from collections.abc import Callable

from kvpool.constants import floor_align
from kvpool.errors import InvalidArgumentError, LockError
from kvpool.host_checks import as_bool, as_count, int_list
from kvpool.reference.radix.checks import check_count, check_distinct, check_key
from kvpool.reference.radix.evict_policy import get_priority_fn
from kvpool.reference.radix_key import RadixKey, check_tree_slots, tree_slot_limit
from kvpool.reference.swa.allocator import SWATokenToKVPoolAllocator
from kvpool.reference.swa.radix_cache import SWAMatchResult, SWARadixCache
from kvpool.reference.swa.tree_node import SWATreeNode
from kvpool.rules import Rules


class UnifiedSWARadixCache(SWARadixCache):
    """SGLang 0.5.23's FULL+SWA tree over an :class:`SWATokenToKVPoolAllocator` (module
    docstring). ConfigError for an unknown ``eviction_policy``."""

    def __init__(
        self,
        token_to_kv_pool_allocator: SWATokenToKVPoolAllocator,
        page_size: int,
        sliding_window_size: int,
        clock: Callable[[], float] | None = None,
        *,
        eviction_policy: str = "lru",
        rules: Rules | None = None,
        is_eagle: bool = False,
    ) -> None:
        self.rules = rules if rules is not None else Rules()
        self.eviction_policy = eviction_policy
        self._policy_key = get_priority_fn(eviction_policy)
        self.swa_lru: list[SWATreeNode] = []
        """Nodes holding SWA slots, most recently used first (difference 3)."""
        super().__init__(token_to_kv_pool_allocator, page_size, sliding_window_size, clock,
                         is_eagle=is_eagle)  # fmt: skip

    def reset(self) -> None:
        """Forget the tree (frees nothing); node ids and swa_uuids restart."""
        self.swa_lru = []
        super().reset()

    # ----------------------------------------------------------------- SWA recency list
    def _lru_insert_after(self, anchor: SWATreeNode | None, node: SWATreeNode) -> None:
        """Put ``node`` right behind ``anchor`` (None: at the front)."""
        at = 0 if anchor is None else self.swa_lru.index(anchor) + 1
        self.swa_lru.insert(at, node)

    def _lru_remove(self, node: SWATreeNode) -> None:
        if node in self.swa_lru:
            self.swa_lru.remove(node)

    def _refresh_window(self, node: SWATreeNode) -> None:
        """The end of a match or insert: ``node`` and its ancestors within the window plus a
        page move to the front of the SWA list, ``node`` first (difference 3)."""
        prev: SWATreeNode | None = None
        covered, limit = 0, self.sliding_window_size + self.page_size
        while node is not self.root_node and covered < limit:
            if not node.swa_tombstone:
                self._lru_remove(node)
                self._lru_insert_after(prev, node)
                prev = node
            covered += len(node.key)
            assert node.parent is not None
            node = node.parent

    def _publish(self, node: SWATreeNode) -> None:
        """``node`` gets the SWA slots its full slots map to (front of the SWA list)."""
        node.swa_tombstone = False
        self.swa_lru.insert(0, node)
        if node.swa_lock_ref > 0:
            self.swa_protected_size_ += len(node.value)
        else:
            self.swa_evictable_size_ += len(node.value)

    def _tombstone(self, node: SWATreeNode) -> None:
        """Free ``node``'s SWA slots; its full slots stay (difference 5)."""
        if self.rules.unified_free == "free":
            self.token_to_kv_pool_allocator.free_swa(node.value)
        else:
            self.token_to_kv_pool_allocator.free_swa_segment(node.value, 0)
        node.swa_tombstone = True
        self._lru_remove(node)
        if node.swa_lock_ref > 0:
            self.swa_protected_size_ -= len(node.value)
        else:
            self.swa_evictable_size_ -= len(node.value)

    def _split_node(self, child: SWATreeNode, split_len: int) -> SWATreeNode:
        """The base split; the upper half keeps ``child``'s creation time, hit count and
        priority and sits right behind ``child`` in the SWA list (``unified_split_recency
        "front"``: ``child`` moves to the front first)."""
        upper = super()._split_node(child, split_len)
        upper.creation_time = child.creation_time
        upper.hit_count = child.hit_count
        upper.priority = child.priority
        if not child.swa_tombstone and child in self.swa_lru:
            if self.rules.unified_split_recency == "front":
                self._lru_remove(child)
                self.swa_lru.insert(0, child)
            self._lru_insert_after(child, upper)
        return upper

    # ----------------------------------------------------------------- match / insert
    def match_prefix(self, key: RadixKey) -> SWAMatchResult:
        """The base match, then the SWA window refresh of the node it returns."""
        result = super().match_prefix(key)
        if result.last_device_node is not self.root_node:
            self._refresh_window(result.last_device_node)
        return result

    def insert(self, key: RadixKey, value: list[int], prev_prefix_len: int = 0,
               swa_evicted_seqlen: int = 0, inserted_len: int = 0) -> int:  # fmt: skip
        """Insert the page-aligned part of ``key`` at full slots ``value`` (module docstring);
        returns the tokens that were already cached. A hit counts on each walked node and the new
        leaf that ends past ``inserted_len`` tokens (SGLang 0.5.23's ``InsertParams.inserted_len``:
        a request's own earlier checkpoints counted the rest). InvalidArgumentError (nothing
        changed) for a key that is not a RadixKey, fewer slots than tokens, an
        ``swa_evicted_seqlen`` that is not a page multiple in ``[0, len(key)]``, a negative
        ``prev_prefix_len`` or ``inserted_len`` (past the key they free and count nothing), or
        any of the three that is not an int (a bool or a float is refused, not truncated); slots
        outside the full pool or slot 0 (IndexOutOfRangeError, ReservedIndexError), a slot named
        twice (DoubleFreeError) or one on a free page (InvalidArgumentError), as the base. Under
        ``is_eagle`` the tree walks ``key``'s bigrams and every bound counts them."""
        check_key(key, RadixKey)
        key = self._tree_key(key)
        prev_prefix_len = as_count("prev_prefix_len", prev_prefix_len)
        swa_evicted_seqlen = as_count("swa_evicted_seqlen", swa_evicted_seqlen)
        inserted_len = as_count("inserted_len", inserted_len)
        value = int_list("value", value)
        if len(value) < len(key):
            raise InvalidArgumentError(f"{len(value)} slots for a key of {len(key)} tokens")
        limit = tree_slot_limit(self.token_to_kv_pool_allocator)
        value = check_tree_slots(value[: len(key)], limit)
        check_distinct(value)
        key = key[: floor_align(len(key), self.page_size)]
        value = value[: len(key)]
        self.token_to_kv_pool_allocator._check_full_held(value)
        if not 0 <= swa_evicted_seqlen <= len(key) or swa_evicted_seqlen % self.page_size:
            raise InvalidArgumentError(f"bad swa_evicted_seqlen {swa_evicted_seqlen}")
        self.last_insert_node = self.root_node
        """The node the last insert's key ended on (SGLang's ``InsertResult.last_device_node``;
        the root for an empty key)."""
        if len(key) == 0:
            return 0
        self._start_walk()
        node, total = self.root_node, 0
        while len(key) > 0:
            child = node.children.get(self._child_key(node, key))
            if child is None:
                break
            child.last_access_time = self._stamp()
            n = self._match_len(child.key, key)
            if n < len(child.key):
                child = self._split_node(child, n)
            node = child
            if prev_prefix_len < total + n:
                node = self._overlap(node, value[:n], total, prev_prefix_len, swa_evicted_seqlen)
            node.hit_count += 1 if total + n > inserted_len else 0
            total += n
            key, value = key[n:], value[n:]
        target = node
        if len(key) > 0:
            end = total + len(key)
            target = self._new_tail(node, key, value, total, swa_evicted_seqlen)
            target.hit_count += 1 if end > inserted_len else 0
        if target is not self.root_node:
            self._refresh_window(target)
        self.last_insert_node = target
        return total

    def _overlap(self, node: SWATreeNode, incoming: list[int], start: int,
                 prev_prefix_len: int, swa_evicted_seqlen: int) -> SWATreeNode:  # fmt: skip
        """A walked node holding tokens ``[start, start + len(incoming))``: recover it if it is a
        tombstone reaching into the window, then free the incoming duplicates past
        ``prev_prefix_len`` (module docstring, difference 5). Returns the node the walk goes on
        from (the lower half when a recovery split it)."""
        alloc = self.token_to_kv_pool_allocator
        n = len(incoming)
        end = start + n
        consumed = n
        live = max(start, swa_evicted_seqlen)
        if node.swa_tombstone and live < end:
            if live > start:
                self._split_node(node, live - start)  # the older part stays a tombstone
            fresh = list(incoming[live - start :])
            plain = self.rules.unified_free == "free"
            if node.full_lock_ref > 0:
                # a running request reads these full slots: keep them, adopt the SWA slots
                swa = alloc.translate_loc_from_full_to_swa(fresh)
                alloc.set_full_to_swa_mapping(fresh, [0] * len(fresh))
                alloc.set_full_to_swa_mapping(node.value, swa)
                if plain:
                    alloc.free_full(fresh)
                else:
                    alloc.free_full_segment(fresh, 0)
            else:
                old = node.value
                node.value = fresh
                if plain:
                    alloc.free(old)
                else:
                    alloc.free_full_segment(old, 0)
            self._publish(node)
            consumed = live - start
        dup_lo = max(0, prev_prefix_len - start)
        if dup_lo < consumed and self.rules.unified_free == "free":
            alloc.free(list(incoming[dup_lo:consumed]))
        elif dup_lo < consumed:
            dup = list(incoming[dup_lo:consumed])
            gone = min(max(swa_evicted_seqlen - (start + dup_lo), 0), len(dup))
            if gone:
                alloc.free_full_segment(dup[:gone], 0)
            if gone < len(dup):
                alloc.free_segment(dup[gone:], 0)
        return node

    def _new_tail(self, parent: SWATreeNode, key: RadixKey, value: list[int], start: int,
                  swa_evicted_seqlen: int) -> SWATreeNode:  # fmt: skip
        """The insert's new tail (difference 1): one tombstone leaf, split at the window
        cursor and capped at one window of pages, then given SWA values (older part first)."""
        leaf = self._add_node(parent, key, list(value), tombstone=True)
        end = start + len(key)
        live = max(start, swa_evicted_seqlen)
        if live >= end:
            return leaf  # no window KV left: a tombstone leaf with its full KV
        if live > start:
            self._split_node(leaf, live - start)
        ps = self.page_size
        cap = -(-self.sliding_window_size // ps) * ps
        older = None
        if len(leaf.key) > cap:
            older = self._split_node(leaf, len(leaf.key) - cap)
        if older is not None:
            self._publish(older)
        self._publish(leaf)
        return leaf

    # ----------------------------------------------------------------- locks
    def _swa_segment(self, node: SWATreeNode) -> tuple[list[SWATreeNode], bool]:
        """The nodes a window lock on ``node`` counts (keys covering the window, tombstones
        included) and whether they cover it."""
        part, covered, cur = [], 0, node
        while cur is not self.root_node and covered < self.sliding_window_size:
            part.append(cur)
            covered += len(cur.key)
            assert cur.parent is not None
            cur = cur.parent
        return part, covered >= self.sliding_window_size

    def _swa_segment_skipping(self, node: SWATreeNode) -> tuple[list[SWATreeNode], bool]:
        """``unified_tombstone_lock "skip"``: the nodes a window lock on ``node`` locks (from
        ``node`` up, tombstones skipped and not counted, until their keys cover the window)
        and whether they cover it."""
        part, covered, cur = [], 0, node
        while cur is not self.root_node and covered < self.sliding_window_size:
            if not cur.swa_tombstone:
                part.append(cur)
                covered += len(cur.key)
            assert cur.parent is not None
            cur = cur.parent
        return part, covered >= self.sliding_window_size

    def inc_lock_ref(self, node: SWATreeNode) -> int | None:
        """Full-lock ``node`` -> root and window-lock its segment (difference 4); the swa_uuid
        of the node where the window was covered (None: the segment reached the root)."""
        path = self._path_to_root(node)
        if self.rules.unified_tombstone_lock == "skip":
            part, covered = self._swa_segment_skipping(node)
        else:
            part, covered = self._swa_segment(node)
        for cur in path:
            if cur.full_lock_ref == 0:
                self.full_evictable_size_ -= len(cur.value)
                self.full_protected_size_ += len(cur.value)
            cur.full_lock_ref += 1
        for cur in part:
            if cur.swa_lock_ref == 0 and not cur.swa_tombstone:
                self.swa_evictable_size_ -= len(cur.value)
                self.swa_protected_size_ += len(cur.value)
            cur.swa_lock_ref += 1
        if not covered:
            return None
        last = part[-1]
        if last.swa_uuid is None:
            self._next_uuid += 1
            last.swa_uuid = self._next_uuid
        return last.swa_uuid

    def _check_swa_unlock(self, part: list[SWATreeNode]) -> None:
        bad = [c.node_id for c in part if c.swa_lock_ref <= 0]
        if bad:
            raise LockError(f"no SWA lock to release on nodes {bad}")

    def dec_lock_ref(self, node: SWATreeNode, swa_uuid_for_lock: int | None = None,
                     skip_swa: bool = False) -> None:  # fmt: skip
        """Undo :meth:`inc_lock_ref` (``skip_swa``: its window part was released already);
        only nodes holding SWA slots move between the SWA sizes. LockError (nothing changed)
        if a count would go negative; InvalidArgumentError for a ``swa_uuid_for_lock`` that is
        neither None nor an int, or a ``skip_swa`` that is not a bool."""
        path = self._path_to_root(node)
        self._check_uuid(swa_uuid_for_lock)
        as_bool("skip_swa", skip_swa)
        if any(c.full_lock_ref <= 0 for c in path):
            raise LockError(f"full lock_ref would go negative above node {node.node_id}")
        if skip_swa:
            part = []
        elif self.rules.unified_tombstone_lock == "skip":
            part = self._swa_unlock_skipping(path, swa_uuid_for_lock)
        else:
            part = self._swa_part(path, swa_uuid_for_lock)
        self._check_swa_unlock(part)
        for cur in path:
            if cur.full_lock_ref == 1:
                self.full_evictable_size_ += len(cur.value)
                self.full_protected_size_ -= len(cur.value)
            cur.full_lock_ref -= 1
        for cur in part:
            if cur.swa_lock_ref == 1 and not cur.swa_tombstone:
                self.swa_evictable_size_ += len(cur.value)
                self.swa_protected_size_ -= len(cur.value)
            cur.swa_lock_ref -= 1

    def _swa_unlock_skipping(self, path: list[SWATreeNode],
                             uuid: int | None) -> list[SWATreeNode]:  # fmt: skip
        """``unified_tombstone_lock "skip"``: the nodes ``dec_lock_ref`` decrements (0.5.16's
        walk from the node up: a node whose SWA count is 0 is passed over, uuid unread; it
        stops after decrementing the uuid's node)."""
        part: list[SWATreeNode] = []
        for cur in path:
            if cur.swa_lock_ref == 0:
                continue
            part.append(cur)
            if uuid is not None and cur.swa_uuid == uuid:
                break
        return part

    def _swa_release_skipping(self, path: list[SWATreeNode],
                              uuid: int | None) -> list[SWATreeNode]:  # fmt: skip
        """``unified_tombstone_lock "skip"``: the nodes ``dec_swa_lock_only`` decrements
        (0.5.16's walk from the node up: tombstones and nodes whose SWA count is 0 are passed
        over; it stops at the uuid's node either way)."""
        part: list[SWATreeNode] = []
        for cur in path:
            if not cur.swa_tombstone and cur.swa_lock_ref > 0:
                part.append(cur)
            if uuid is not None and cur.swa_uuid == uuid:
                break
        return part

    def dec_swa_lock_only(self, node: SWATreeNode, swa_uuid_for_lock: int | None = None) -> None:
        """Release the window part of a lock early (difference 4): a node whose SWA lock
        reaches 0 becomes SWA-evictable, and is tombstoned only if it is an unlocked leaf.
        LockError (nothing changed) if a count would go negative; InvalidArgumentError for a
        ``swa_uuid_for_lock`` that is neither None nor an int."""
        path = self._path_to_root(node)
        self._check_uuid(swa_uuid_for_lock)
        if self.rules.unified_tombstone_lock == "skip":
            part = self._swa_release_skipping(path, swa_uuid_for_lock)
        else:
            part = self._swa_part(path, swa_uuid_for_lock)
        self._check_swa_unlock(part)
        for cur in part:
            cur.swa_lock_ref -= 1
            if cur.swa_lock_ref == 0 and not cur.swa_tombstone:
                self.swa_protected_size_ -= len(cur.value)
                self.swa_evictable_size_ += len(cur.value)
                if self._evictable_leaf(cur):
                    self._tombstone(cur)

    # ----------------------------------------------------------------- eviction
    def _evictable_leaf(self, node: SWATreeNode) -> bool:
        """No lock of either kind and no child: full eviction may delete it."""
        return (node is not self.root_node and not node.children and node.full_lock_ref == 0
                and node.swa_lock_ref == 0)  # fmt: skip

    def _full_key(self, node: SWATreeNode) -> tuple[float, ...]:
        """The policy's order, then access time (SGLang's heap and node order)."""
        return (*self._policy_key(node)[:-1], node.last_access_time)

    def _delete(self, node: SWATreeNode) -> tuple[int, int]:
        """Delete an evictable leaf, freeing its slots; (full, SWA) tokens freed."""
        alloc = self.token_to_kv_pool_allocator
        n = len(node.value)
        swa = 0 if node.swa_tombstone else n
        plain = self.rules.unified_free == "free"
        if node.swa_tombstone and plain:
            alloc.free_full(node.value)
        elif node.swa_tombstone:
            alloc.free_full_segment(node.value, 0)
        else:
            if plain:
                alloc.free(node.value)
            else:
                alloc.free_segment(node.value, 0)
            self._lru_remove(node)
        self._delete_leaf(node)
        return n, swa

    def evict(self, num_tokens: int, swa_num_tokens: int = 0) -> tuple[int, int]:
        """Free at least ``num_tokens`` full and ``swa_num_tokens`` SWA tokens if the tree
        allows (differences 2 and 3); returns (full tokens freed, SWA tokens freed).
        InvalidArgumentError unless both are counts (ints >= 0)."""
        num_tokens = check_count("num_tokens", num_tokens)
        swa_num_tokens = check_count("swa_num_tokens", swa_num_tokens)
        full = swa = 0
        while full < num_tokens:
            leaves = [n for n in self._nodes() if self._evictable_leaf(n)]
            if not leaves:
                break
            f, s = self._delete(min(leaves, key=self._full_key))
            full, swa = full + f, swa + s
        if swa >= swa_num_tokens:
            return full, swa
        for x in [n for n in reversed(self.swa_lru) if n.swa_lock_ref == 0]:
            if swa >= swa_num_tokens:
                break
            if x.swa_tombstone or x.parent is None:
                continue  # tombstoned or deleted since the walk began
            if self._evictable_leaf(x):
                f, s = self._delete(x)
                full, swa = full + f, swa + s
            else:
                swa += len(x.value)
                self._tombstone(x)
        return full, swa


__all__ = ["UnifiedSWARadixCache"]
