"""The radix-cache machine: a prefix tree driven directly over its own pool and allocator.

Operations (``reset`` is a flush: the tree, its allocator and its table cleared together):
``insert`` (allocate the key's page-aligned slots, insert, free the duplicates the
tree already had, as a caller must), ``match_prefix`` (keys on and around page boundaries, in
a few namespaces; the matched node becomes a lock handle named by the key), ``inc_lock_ref`` /
``dec_lock_ref`` of a handle, ``evict``, ``reset``, and, when the candidate rejects misuse, an
unlock of an unlocked handle and a negative eviction. Handles are named by key, not by object,
so a shrunk run stays valid (a handle whose match was dropped is skipped).

Checked after every step: the allocator invariants (tree slots are the only held pages), and
``INV-TREE-SHAPE`` / ``INV-LOCKS`` with the machine's lock handles as the lock holders.

Under EAGLE's bigram keys (``PoolConfig.is_eagle``, drawn for one page count in three when the
candidate's trees say ``radix_models_eagle``) an insert allocates the slots its bigrams keep
and spells them with one token more (:func:`insert_span`), and a handle names its node with
one token more (:func:`handle_tokens`).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from kvpool.config import PoolConfig
from kvpool.constants import EVICTION_POLICIES, SUPPORTED_PAGE_SIZES_TESTED
from kvpool.invariants.allocator import check_allocator
from kvpool.invariants.tree import check_locks, check_tree_shape
from kvpool.reference.radix_key import bigram_codes, cached_len
from kvpool.snapshot import (
    AllocatorSnapshot,
    PoolSnapshot,
    ReqSnapshot,
    ReqToTokenSnapshot,
    TreeSnapshot,
)
from kvpool.testing.bundle import Implementation
from kvpool.testing.machines.base import Outcome
from kvpool.testing.machines.coverage import outcome_tag
from kvpool.testing.swarm import ALPHABET, Chooser, Op, draw_length, shared_prefix

Handle = tuple[tuple[int, ...], str | None]
"""A lock handle: the matched tokens and the namespace."""


@dataclass
class RadixSide:
    pool: Any
    alloc: Any
    tree: Any
    key: Any
    index: Any
    nodes: dict[Handle, Any] = field(default_factory=dict)
    eagle: bool = False
    """The configuration's ``is_eagle``: inserts and handles spell bigram keys."""


@dataclass(frozen=True)
class RadixSnapshot:
    allocator: AllocatorSnapshot
    tree: TreeSnapshot


@dataclass
class RadixModel:
    config: PoolConfig
    locks: dict[Handle, int] = field(default_factory=dict)
    """Handle -> how many times the machine locked it (and not yet unlocked)."""
    matched: dict[Handle, int] = field(default_factory=dict)
    """Handle -> matched length (tokens) when it was matched."""
    snap: RadixSnapshot | None = None

    def unlocked(self, handle: Handle) -> bool:
        """Whether the handle's node exists with ``lock_ref == 0`` (an unlock would underflow)."""
        if self.snap is None:
            return False
        node_id = _node_at(self.snap.tree, *handle, eagle=self.config.is_eagle)
        nodes = {n.node_id: n for n in self.snap.tree.nodes}
        return node_id is not None and nodes[node_id].lock_ref == 0


class RadixTarget:
    """:class:`~kvpool.testing.machines.base.Target` of the radix-cache machine."""

    name = "radix_cache"

    def draw_config(self, c: Chooser, impl: Implementation) -> PoolConfig:
        ps = c.choice(SUPPORTED_PAGE_SIZES_TESTED)
        pages = c.integer(4, 24) if ps <= 4 else c.integer(3, 10)
        rules = impl.rules_or_default()
        return PoolConfig(size=pages * ps, page_size=ps, eviction_policy=c.choice(
            EVICTION_POLICIES), need_sort=c.choice((False, True)), rules=rules,
            is_eagle=eagle_pages(impl, pages))  # fmt: skip

    def build(self, impl: Implementation, config: PoolConfig) -> RadixSide:
        assert impl.radix_cache and impl.allocator and impl.req_to_token_pool and impl.radix_key
        pool, alloc = impl.req_to_token_pool(config), impl.allocator(config)
        return RadixSide(pool, alloc, impl.radix_cache(config, pool, alloc), impl.radix_key,
                         impl.index, eagle=config.is_eagle)  # fmt: skip

    def snapshot(self, side: RadixSide) -> RadixSnapshot:
        return RadixSnapshot(side.alloc.snapshot(), side.tree.snapshot())

    def new_model(self, config: PoolConfig) -> RadixModel:
        return RadixModel(config)

    def pretty(self, snap: Any) -> str:
        from kvpool.testing.report import render_tree

        return f"{snap.allocator}\n{render_tree(snap.tree)}"

    # ---------------------------------------------------------------- drawing
    def _key(self, c: Chooser, ps: int) -> tuple[tuple[int, ...], str | None]:
        n = draw_length(c, ps, 4 * ps + 3)
        head = shared_prefix(c.integer(0, 2), c.integer(0, n))
        tokens = head + [c.choice(ALPHABET) for _ in range(n - len(head))]
        return tuple(tokens), c.choice((None, None, "a"))

    def draw_op(self, c: Chooser, model: RadixModel, rejects_misuse: bool) -> Op:
        ps = model.config.page_size
        kind = c.choice(("insert", "insert", "insert", "match", "match", "lock", "unlock",
                         "evict", "reset", "invalid"))  # fmt: skip
        if kind in ("insert", "match"):
            tokens, extra = self._key(c, ps)
            name = "insert" if kind == "insert" else "match_prefix"
            return Op(name, (list(tokens),), (("extra_key", extra),))
        if kind in ("lock", "unlock"):
            return Op("inc_lock_ref" if kind == "lock" else "dec_lock_ref", (c.integer(0, 7),))
        if kind == "evict":
            return Op("evict", (c.integer(0, model.config.size // 2),))
        if kind == "reset" and not model.locks:
            return Op("reset")
        if rejects_misuse:
            return Op("invalid", (c.integer(0, 7),), expect_error=True)
        return Op("evict", (ps,))

    def materialize(self, model: RadixModel, op: Op) -> Op | None:
        handles = sorted(model.matched, key=lambda h: (h[0], h[1] or ""))
        if op.name == "inc_lock_ref":
            if not handles:
                return None
            return Op("inc_lock_ref", (handles[op.args[0] % len(handles)],))
        if op.name == "dec_lock_ref":
            locked = [h for h in handles if model.locks.get(h)]
            return Op("dec_lock_ref", (locked[op.args[0] % len(locked)],)) if locked else None
        if op.name == "reset":
            return None if any(model.locks.values()) else op
        if op.name == "invalid":
            unlocked = [h for h in handles if model.unlocked(h)]
            if unlocked and op.args[0] % 2:
                return Op("dec_lock_ref", (unlocked[op.args[0] % len(unlocked)],),
                          expect_error=True)  # fmt: skip
            return Op("evict", (-1 - op.args[0],), expect_error=True)
        return op

    # ---------------------------------------------------------------- calling
    def call(self, side: RadixSide, op: Op) -> Any:
        tree = side.tree
        if op.name == "insert":
            tokens, extra = op.args[0], dict(op.kwargs)["extra_key"]
            n, key_tokens = insert_span(tokens, tree.page_size, side.eagle)
            slots = side.alloc.alloc(n)
            if slots is None:
                return None
            cached = tree.insert(side.key(key_tokens, extra), slots)
            if cached:
                side.alloc.free(slots[:cached])  # the caller frees its duplicates
            return [slots, cached]
        if op.name == "match_prefix":
            tokens, extra = op.args[0], dict(op.kwargs)["extra_key"]
            result = tree.match_prefix(side.key(tokens, extra))
            got = result.device_indices
            side.nodes[(handle_tokens(tokens, len(got), side.eagle), extra)] = (
                result.last_device_node
            )
            return got
        if op.name in ("inc_lock_ref", "dec_lock_ref"):
            node = side.nodes[op.args[0]]
            return getattr(tree, op.name)(node)
        if op.name == "reset":
            # a reset frees nothing: the pools are cleared with it, as a cache flush does
            side.nodes.clear()
            tree.reset()
            side.alloc.clear()
            return side.pool.clear()
        return getattr(tree, op.name)(*op.args)

    def observe(self, model: RadixModel, op: Op, out: Outcome) -> None:
        model.snap = out.after
        if out.error is not None or op.expect_error:
            return
        if op.name == "match_prefix":
            extra = dict(op.kwargs)["extra_key"]
            n = len(out.result)
            model.matched[(handle_tokens(op.args[0], n, model.config.is_eagle), extra)] = n
        elif op.name == "inc_lock_ref":
            model.locks[op.args[0]] = model.locks.get(op.args[0], 0) + 1
        elif op.name == "dec_lock_ref":
            model.locks[op.args[0]] -= 1
        elif op.name == "reset":
            model.locks.clear()
            model.matched.clear()
        if op.name in ("evict", "reset"):
            # handles whose nodes may have gone: forget the unlocked ones
            model.matched = {h: n for h, n in model.matched.items() if model.locks.get(h)}

    # ---------------------------------------------------------------- checks
    def check(self, model: RadixModel, snap: RadixSnapshot, previous: Any) -> int:
        ps = snap.allocator.page_size
        held = {s // ps for n in snap.tree.nodes for s in n.value}
        count = check_allocator(snap.allocator, held)
        holders = tuple(
            ReqSnapshot(f"lock{i}", "waiting", None, 0, 0, 0, 0, 0, 0, 0, node, None, h[1])
            for i, (h, times) in enumerate(sorted(model.locks.items(), key=repr))
            for node in [_node_at(snap.tree, h[0], h[1], eagle=model.config.is_eagle)] * times
            if node is not None
        )
        table = ReqToTokenSnapshot(1, 1, (), (0, 0))
        pool = PoolSnapshot(snap.allocator, table, snap.tree, holders)
        prev = None
        if previous is not None:
            prev = PoolSnapshot(previous.allocator, table, previous.tree)
        check_tree_shape(pool, prev)
        check_locks(pool, None)
        return count + 2

    def refusal_must_not_change(self, config: PoolConfig, op: Op, out: Outcome) -> bool:
        if out.error is not None:
            return True
        return op.name == "insert" and out.result is None and config.rules.refused_alloc_unchanged

    def coverage(self, model: RadixModel, op: Op, out: Outcome) -> list[str]:
        tag = outcome_tag(op, out.result, out.error)
        if op.name == "match_prefix" and out.error is None:
            tag = "match_prefix:hit" if out.result else "match_prefix:miss"
            if len(out.after.tree.nodes) > len(out.before.tree.nodes):
                return [tag, "match_prefix:split"]
        if op.name == "insert" and out.result is not None:
            tags = ["insert:duplicate" if out.result[1] else "insert:new"]
            return tags + (["insert:extra-key"] if dict(op.kwargs)["extra_key"] else [])
        if op.name == "evict" and out.error is None:
            return ["evict:freed" if out.result else "evict:nothing"]
        return [tag]


def eagle_pages(impl: Implementation, pages: int) -> bool:
    """Whether a tree machine's configuration of ``pages`` pages gets EAGLE's bigram keys: one
    page count in three (no extra draw, so every other configuration stays as it was), when
    ``impl``'s trees model them (``radix_models_eagle``)."""
    return impl.radix_models_eagle and pages % 3 == 1


def insert_span(tokens: list[int], page_size: int, eagle: bool) -> tuple[int, list[int]]:
    """An insert of ``tokens``: the slots it takes (the page-aligned part the tree keeps) and
    the token key that spells exactly them (under EAGLE's bigram keys one token more, the
    last bigram's second), as a release path builds them."""
    n = cached_len(len(tokens), page_size, eagle)
    return n, tokens[: n + eagle if n else 0]


def handle_tokens(tokens: list[int], matched: int, eagle: bool) -> tuple[int, ...]:
    """The tokens naming a match of ``matched`` slots (under EAGLE one more: a node's path is
    spelled by its bigrams)."""
    return tuple(tokens[: matched + eagle if matched else 0])


def _node_at(
    tree: TreeSnapshot, tokens: tuple[int, ...], extra: str | None, eagle: bool = False
) -> int | None:
    """Id of the node whose root path spells exactly ``tokens`` in namespace ``extra`` (None
    for the root or when no node ends there); under EAGLE the path's keys are the tokens'
    bigram codes."""
    by_id = {n.node_id: n for n in tree.nodes}
    node, rest = tree.nodes[0], tuple(bigram_codes(tokens)) if eagle else tokens
    while rest:
        for cid in node.child_ids:
            child = by_id[cid]
            if child.extra_key == extra and tuple(rest[: len(child.key)]) == child.key:
                node, rest = child, rest[len(child.key) :]
                break
        else:
            return None
    return None if node is tree.nodes[0] else node.node_id


__all__ = [
    "RadixModel",
    "RadixSide",
    "RadixSnapshot",
    "RadixTarget",
    "eagle_pages",
    "handle_tokens",
    "insert_span",
]
