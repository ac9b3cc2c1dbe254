"""The SWA radix-cache machine: an ``SWARadixCache`` over its SWA allocator, against the
reference.

Operations, materialized against the model (token sequences come from a few bases sharing
prefixes, so inserts and matches overlap):

- ``insert_new(tokens, k)``: what a finishing request does: fresh slots in both pools for
  ``tokens``, the SWA slots of its first ``k`` tokens released (they slid out of the window),
  then ``insert(key, slots, 0, k)`` (the tree frees the duplicates and recovers tombstones);
- ``lock(tokens)``: ``match_prefix`` then ``inc_lock_ref`` of the node (a running request);
- ``release_swa(h)``: ``dec_swa_lock_only`` (holder ``h``'s window moved past its prefix);
- ``unlock(h)``: ``dec_lock_ref`` (with ``skip_swa`` after a release);
- ``evict(full, swa)``, and invalid calls (negative eviction sizes).

Under EAGLE's bigram keys (``PoolConfig.is_eagle``, drawn for one pool size in three when the
candidate's trees say ``radix_models_eagle``) every key is spelled with one token more, so that
its bigrams name exactly the slots an insert allocates and a lock matches.

Every step checks the ``INV-SWA-*`` invariants with the tree (tombstones, locks and sizes, SWA
accounting against the tree's SWA sizes) and both pools' allocator invariants (the full pool
against the tree's pages).
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Any

from kvpool.config import PoolConfig
from kvpool.invariants import check_swa_allocator
from kvpool.snapshot import SWAAllocatorSnapshot, TreeSnapshot
from kvpool.testing.bundle import Implementation
from kvpool.testing.machines.base import Outcome
from kvpool.testing.machines.coverage import outcome_tag
from kvpool.testing.machines.radix import eagle_pages
from kvpool.testing.swarm import Chooser, Op

PAGE_SIZES = (1, 2, 4)
Snap = tuple[SWAAllocatorSnapshot, TreeSnapshot]


def tokens_of(base: int, n: int, ps: int) -> list[int]:
    """``n`` tokens of base sequence ``base``: bases share their first ``(base % 3) * 2`` pages
    with base 0's tokens, then diverge."""
    shared = (base % 3) * 2 * ps
    return [1 + i if i < shared else 1000 * (base + 1) + i for i in range(n)]


@dataclass
class TreeModel:
    """Side A's holders (``released``: their SWA lock was dropped) and latest snapshot."""

    config: PoolConfig
    released: list[bool] = field(default_factory=list)
    nodes: list[int] = field(default_factory=list)
    """Each holder's locked node id (0: the root, nothing locked)."""
    snap: Snap | None = None


@dataclass
class TreeSide:
    """One side: allocator, tree, index/key converters and its holders' (node, swa_uuid)."""

    alloc: Any
    tree: Any
    index: Any
    key: Any
    holders: list[tuple[Any, Any]] = field(default_factory=list)
    eagle: bool = False
    """The configuration's ``is_eagle``: a key of ``n + 1`` tokens names ``n`` slots."""


def recency_ranks(tree: TreeSnapshot) -> TreeSnapshot:
    """``tree`` with every node's ``last_access_time`` replaced by its rank in least-recently-used
    order (1.0 for the least recent; the root keeps 0.0): the order the smallest
    ``(last_access_time, depth, node_id)`` takes, which is the order eviction reads. kvpool stamps
    a clock per walk, SGLang keeps linked lists; the machine compares the order, not the
    stamps."""
    by_id = {n.node_id: n for n in tree.nodes}

    def depth(node_id: int) -> int:
        d, parent = 0, by_id[node_id].parent_id
        while parent is not None:
            d, parent = d + 1, by_id[parent].parent_id
        return d

    root = tree.nodes[0].node_id if tree.nodes else None
    order = sorted(
        (n for n in tree.nodes if n.node_id != root),
        key=lambda n: (n.last_access_time, depth(n.node_id), n.node_id),
    )
    rank = {n.node_id: float(i + 1) for i, n in enumerate(order)}
    nodes = tuple(replace(n, last_access_time=rank.get(n.node_id, 0.0)) for n in tree.nodes)
    return replace(tree, nodes=nodes)


class SWARadixTarget:
    """:class:`~kvpool.testing.machines.base.Target` of the SWA radix-cache machine."""

    name = "swa_radix_cache"

    def draw_config(self, c: Chooser, impl: Implementation) -> PoolConfig:
        ps = c.choice(PAGE_SIZES)
        window = c.choice((1, ps, ps + 1, 2 * ps, 3 * ps + 1))
        rules = impl.rules_or_default()
        pages = c.integer(12, 40)
        return PoolConfig(size=pages * ps, page_size=ps, sliding_window=window,
                          swa_full_tokens_ratio=c.choice((0.5, 0.8, 1.0)),
                          need_sort=c.choice((False, True)), rules=rules,
                          is_eagle=eagle_pages(impl, pages))  # fmt: skip

    def build(self, impl: Implementation, config: PoolConfig) -> TreeSide:
        assert impl.swa_allocator and impl.swa_radix_cache and impl.radix_key
        alloc = impl.swa_allocator(config)
        return TreeSide(alloc, impl.swa_radix_cache(config, alloc), impl.index, impl.radix_key,
                        eagle=config.is_eagle)  # fmt: skip

    def snapshot(self, side: TreeSide) -> Snap:
        return side.alloc.snapshot(), recency_ranks(side.tree.snapshot())

    def new_model(self, config: PoolConfig) -> TreeModel:
        return TreeModel(config)

    def pretty(self, snap: Any) -> str:
        return f"{snap[0]!r}\n{snap[1]!r}"

    # ---------------------------------------------------------------- drawing
    def draw_op(self, c: Chooser, model: TreeModel, rejects_misuse: bool) -> Op:
        kind = c.choice(("insert", "insert", "insert", "lock", "lock", "release", "unlock",
                         "unlock", "evict", "invalid"))  # fmt: skip
        if kind == "insert":
            return Op("insert", (c.integer(0, 3), c.integer(1, 8), c.integer(0, 4)))
        if kind == "lock":
            return Op("lock", (c.integer(0, 3), c.integer(1, 8)))
        if kind in ("release", "unlock"):
            return Op(kind, (c.integer(0, 7),))
        if kind == "evict":
            return Op("evict", (c.choice((0, 1, 4, 16)), c.choice((0, 1, 4, 16))))
        if rejects_misuse:
            return Op("invalid", (c.integer(0, 7),), expect_error=True)
        return Op("evict", (0, 0))

    def materialize(self, model: TreeModel, op: Op) -> Op | None:
        ps, more = model.config.page_size, model.config.is_eagle
        if op.name == "insert":
            base, pages, gone = op.args
            n = pages * ps
            return Op("insert_new", (tokens_of(base, n + more, ps), min(gone, pages) * ps))
        if op.name == "lock":
            return Op("lock", (tokens_of(op.args[0], op.args[1] * ps + more, ps),))
        if op.name in ("release", "unlock"):
            live = [i for i, r in enumerate(model.released) if op.name == "unlock" or not r]
            if not live:
                return None
            i = live[op.args[0] % len(live)]
            if op.name == "release":
                return Op("release", (i,))
            return Op("unlock", (i,), (("skip_swa", model.released[i]),))
        if op.name == "invalid":
            # (a second SWA release is no reliable misuse: other holders' counts absorb it)
            sizes = (-1 - op.args[0], 0) if op.args[0] % 2 else (0, -1 - op.args[0])
            return Op("evict", sizes, expect_error=True)
        return op

    # ---------------------------------------------------------------- calling
    def call(self, side: TreeSide, op: Op) -> Any:
        alloc, tree, index = side.alloc, side.tree, side.index
        if op.name == "insert_new":
            tokens, gone = op.args
            n = len(tokens) - side.eagle  # slots: one per bigram under EAGLE
            if alloc.page_size == 1:
                slots = alloc.alloc(n)
            else:
                slots = alloc.alloc_extend(index([0]), [0], index([n]), [n], index([-1]), n)
            if slots is None:
                return None
            if gone:
                alloc.free_swa(slots[:gone])
            return list(slots), tree.insert(side.key(tokens, None), slots, 0, gone)
        if op.name == "lock":
            match = tree.match_prefix(side.key(op.args[0], None))
            uuid = tree.inc_lock_ref(match.last_device_node)
            side.holders.append((match.last_device_node, uuid))
            return list(match.device_indices), match.last_device_node.node_id, uuid
        if op.name == "release":
            node, uuid = side.holders[op.args[0]]
            return tree.dec_swa_lock_only(node, uuid)
        if op.name == "unlock":
            node, uuid = side.holders.pop(op.args[0])
            return tree.dec_lock_ref(node, uuid, skip_swa=dict(op.kwargs)["skip_swa"])
        if op.name == "evict":
            return tree.evict(*op.args)
        raise AssertionError(op.name)

    # ---------------------------------------------------------------- model and checks
    def observe(self, model: TreeModel, op: Op, out: Outcome) -> None:
        model.snap = out.after
        if out.error is not None or op.expect_error:
            return
        if op.name == "lock":
            model.released.append(False)
            model.nodes.append(out.result[1])
        elif op.name == "release":
            model.released[op.args[0]] = True
        elif op.name == "unlock":
            model.released.pop(op.args[0])
            model.nodes.pop(op.args[0])

    def check(self, model: TreeModel, snap: Any, previous: Any) -> int:
        alloc_snap, tree = snap
        ps = tree.page_size
        pages = {s // ps for n in tree.nodes for s in n.value}
        swa_held = tree.swa_evictable_size + tree.swa_protected_size
        return check_swa_allocator(alloc_snap, pages, swa_held, tree)

    def refusal_must_not_change(self, config: PoolConfig, op: Op, out: Outcome) -> bool:
        if out.error is not None:
            return True
        return op.name == "insert_new" and out.result is None

    def coverage(self, model: TreeModel, op: Op, out: Outcome) -> list[str]:
        tag = outcome_tag(op, out.result, out.error)
        if op.name == "insert_new" and out.result is None and out.error is None:
            tag = "insert_new:refused"
        tags = [tag]
        if out.error is not None or op.expect_error:
            return tags
        before, after = out.before[1], out.after[1]
        tomb_before = sum(n.swa_tombstone for n in before.nodes)
        tomb_after = sum(n.swa_tombstone for n in after.nodes)
        if op.name == "insert_new" and out.result is not None:
            tags.append("insert:duplicate" if out.result[1] else "insert:new")
            if op.args[1]:
                tags.append("insert:window-slid")
            recovered = {n.node_id for n in before.nodes if n.swa_tombstone} - {
                n.node_id for n in after.nodes if n.swa_tombstone}  # fmt: skip
            if recovered:
                locked = {n.node_id for n in after.nodes if n.lock_ref}
                tags.append("insert:recovered-locked" if recovered & locked
                            else "insert:recovered")  # fmt: skip
        if op.name == "lock":
            tags.append("lock:hit" if out.result[0] else "lock:miss")
            if out.result[2] is not None:
                tags.append("lock:window-bounded")
        if op.name == "release" and tomb_after > tomb_before:
            tags.append("release:leaf-tombstoned")
        if op.name == "evict":
            full, swa = out.result
            if tomb_after > tomb_before:
                tags.append("evict:tombstoned")
            tags.append("evict:freed" if full or swa else "evict:nothing")
        return tags


__all__ = ["SWARadixTarget", "TreeModel", "TreeSide", "recency_ranks", "tokens_of"]
