"""Seeded radix-tree bugs: lock counts, node splits, size bookkeeping, eviction.

Each function patches one optimized twin in place (see :mod:`kvpool.testing.quality.mutant`);
:mod:`tests.quality.mutants` registers them with the detectors that must catch them.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from kvpool.testing.quality import need, wrap


def lock_wrong_node(mm: Any) -> None:
    tree = mm.tree_cache

    def make(orig: Any) -> Callable[[Any], int]:
        def inc_lock_ref(node: Any) -> int:
            parent = getattr(node, "parent", None)
            target = parent if parent is not None and parent is not tree.root_node else node
            return orig(target)  # type: ignore[no-any-return]

        return inc_lock_ref

    wrap(tree, "inc_lock_ref", make)


def lock_lost_on_split(mm: Any) -> None:
    def make(orig: Any) -> Callable[..., Any]:
        def split(child: Any, at: int) -> Any:
            upper = orig(child, at)
            upper.lock_ref = 0  # the new upper node forgets the locks it inherited
            return upper

        return split

    wrap(mm.tree_cache, "_split", make)


def sizes_drift(mm: Any) -> None:
    tree = mm.tree_cache
    need(tree, "evictable_size_")

    def make(orig: Any) -> Callable[[Any], int]:
        def dec_lock_ref(node: Any) -> int:
            delta: int = orig(node)
            if delta > 0:
                tree.evictable_size_ -= 1  # out by one token less than it came in
            return delta

        return dec_lock_ref

    wrap(tree, "dec_lock_ref", make)


def evict_locked(mm: Any) -> None:
    tree = mm.tree_cache
    need(tree, "root_node", "_push")

    def make(orig: Any) -> Callable[[int], int]:
        def evict(num_tokens: int) -> int:
            # The candidate filter forgets lock_ref: locked leaves look evictable.
            stack, locked = [tree.root_node], []
            while stack:
                node = stack.pop()
                stack.extend(node.children.values())
                if node is not tree.root_node and not node.children and node.lock_ref > 0:
                    locked.append((node, node.lock_ref))
            for node, _ in locked:
                node.lock_ref = 0
                tree._push(node)
            try:
                return orig(num_tokens)  # type: ignore[no-any-return]
            finally:
                for node, count in locked:
                    node.lock_ref = count

        return evict

    wrap(tree, "evict", make)
