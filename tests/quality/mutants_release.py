"""Seeded bugs on the paths only an SGLang release's rules take: :data:`RELEASE_MUTANTS`.

SGLang 0.5.23's release path (``Rules.release_path == "checkpoint"``): a chunked request's
prefill caches its chunk through the tree's ``checkpoint`` (insert, free the duplicates, match
again, rewrite the row, move the lock), and its server builds the unified radix cache. kvpool's
own rules release through ``cache_unfinished_req`` on the legacy tree, so the default campaign
never calls ``checkpoint``: these bugs are caught by campaigns whose sides follow 0.5.23
(``kvpool verify --rules 0.5.23``; :attr:`ImplementationMutant.release`). Each patch rewrites the
prefix trees the unchecked torch twin builds (the legacy and the unified one), one instance at a
time.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any

from kvpool.testing.bundle import Implementation
from kvpool.testing.quality import ImplementationMutant, during, need


def _with_trees(impl: Implementation, patch: Callable[[Any], None]) -> Implementation:
    """``impl`` whose radix caches (legacy and unified) are patched by ``patch`` once built."""
    trees: dict[str, Any] = {}
    for name in ("radix_cache", "unified_radix_cache"):
        build = getattr(impl, name)
        assert build is not None, f"{impl.label} builds no {name}"

        def patched(*args: Any, _build: Any = build) -> Any:
            tree = _build(*args)
            patch(tree)
            return tree

        trees[name] = patched
    return dataclasses.replace(impl, **trees)


def checkpoint_keeps_duplicates(impl: Implementation) -> Implementation:
    """A checkpoint inserts the chunk but never frees the slots the tree already held for it
    (the duplicates stay allocated and owned by no one: a leak per shared chunk)."""

    def patch(tree: Any) -> None:
        need(tree, "_insert_checkpoint", "_insert_req")

        def insert_checkpoint(req: Any, key: Any, value: Any, chunked: bool) -> int:
            cached: int = tree._insert_req(req, key, value, chunked)
            return cached

        tree._insert_checkpoint = insert_checkpoint

    return _with_trees(impl, patch)


def checkpoint_lock_stays(impl: Implementation) -> Implementation:
    """A checkpoint moves the request to the node its chunk now ends on but leaves the lock on
    the node it ended on before (the new path is evictable under a running request, the old
    one pinned forever)."""

    def patch(tree: Any) -> None:
        need(tree, "checkpoint", "dec_lock_ref", "inc_lock_ref")
        original = tree.checkpoint

        def checkpoint(req: Any, up_to: int, chunked: bool = False) -> Any:
            def run() -> Any:
                return original(req, up_to, chunked)

            def unlocked() -> Any:
                return during(tree, "inc_lock_ref", lambda node: None, run)

            return during(tree, "dec_lock_ref", lambda node: None, unlocked)

        tree.checkpoint = checkpoint

    return _with_trees(impl, patch)


def checkpoint_frees_once(impl: Implementation) -> Implementation:
    """The unified tree's checkpoint frees its duplicates in one free, as the legacy tree does,
    instead of one ``free_segment`` per overlapped node in walk order (SGLang 0.5.23's
    ``checkpoint_into_tree``; kvpool's own checkpoint did so until 2026-12-02). The slots are
    the same; the free list's order differs once the duplicates span two nodes, and every later
    allocation hands out other slots than the engine's."""

    def patch(tree: Any) -> None:
        if not hasattr(tree, "_free_duplicates"):
            return  # the legacy tree: one free is its rule
        need(tree, "_insert_checkpoint", "_insert_req", "_free_tree_slots")

        def insert_checkpoint(req: Any, key: Any, value: Any, chunked: bool) -> int:
            protected = req.cache_protected_len
            cached: int = tree._insert_req(req, key, value, chunked)
            tree._free_tree_slots(value[protected:cached], protected)
            return cached

        tree._insert_checkpoint = insert_checkpoint

    return _with_trees(impl, patch)


RELEASE_MUTANTS: tuple[ImplementationMutant, ...] = (
    ImplementationMutant("checkpoint-keeps-duplicates", "a chunk's duplicate slots leaked",
                         ("INV-POOL-ACCOUNTING", "INV-TOKEN-ACCOUNTING"),
                         checkpoint_keeps_duplicates, "manager", "0.5.23"),
    ImplementationMutant("checkpoint-lock-stays", "the lock left behind on a checkpoint",
                         ("INV-LOCKS",), checkpoint_lock_stays, "manager", "0.5.23"),
    # duplicates over two nodes need one request to start its prefill before another's chunks
    # are cached, then overtake them: rarer than the others' paths, so a larger fixed budget
    ImplementationMutant("checkpoint-frees-once", "a chunk's duplicates freed in one call",
                         ("lockstep-diff",), checkpoint_frees_once, "manager", "0.5.23",
                         runs=120),
)  # fmt: skip
"""The seeded bugs of SGLang 0.5.23's release path."""
