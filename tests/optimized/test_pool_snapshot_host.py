"""The twin's pool snapshot reads a foreign host tier (an adapter's ``host_snapshot``) once a
step: an adapter that declares ``host_snapshot_takes_parts`` is handed the tree snapshot just
taken and, when the tree's allocator is the manager's, the allocator snapshot too; any other is
called as the protocol says, with no argument."""

from __future__ import annotations

from typing import Any

from kvpool.optimized.lifecycle.pool_snapshot import _host_snapshot


def _device() -> Any:
    """A stand-in for the allocator snapshot (only its identity matters here)."""
    return object()


class _Tree:
    """A foreign host-tier tree recording how it was asked."""

    def __init__(self, allocator: object, takes_parts: bool) -> None:
        self.allocator = allocator
        self.calls: list[tuple[Any, ...]] = []
        if takes_parts:
            self.host_snapshot_takes_parts = True

    def host_snapshot(self, *parts: Any) -> Any:
        self.calls.append(parts)
        return ("host", parts)


def test_an_adapter_taking_parts_gets_the_tree_and_its_allocators_snapshots() -> None:
    allocator, tree_snap, device = object(), object(), _device()
    tree = _Tree(allocator, takes_parts=True)
    got: Any = _host_snapshot(tree, tree_snap, allocator, device)
    assert got == ("host", (tree_snap, device))
    assert tree.calls == [(tree_snap, device)]


def test_a_device_snapshot_of_another_allocator_is_not_handed_over() -> None:
    tree_snap, device = object(), _device()
    tree = _Tree(object(), takes_parts=True)
    _host_snapshot(tree, tree_snap, object(), device)
    assert tree.calls == [(tree_snap, None)]


def test_any_other_host_tier_is_read_as_the_protocol_says() -> None:
    allocator = object()
    tree = _Tree(allocator, takes_parts=False)
    _host_snapshot(tree, object(), allocator, _device())
    assert tree.calls == [()]
    assert _host_snapshot(object(), object(), allocator, _device()) is None
