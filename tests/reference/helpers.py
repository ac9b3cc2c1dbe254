"""Assertions shared by the reference allocator tests: misuse raises and changes nothing, a
failed allocation returns None and changes nothing (both judged by the allocator's snapshot)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Protocol

import pytest

from kvpool.errors import KVPoolError


class Snapshotting(Protocol):
    """Anything whose whole state is compared through ``snapshot()`` (an allocator)."""

    def snapshot(self) -> object: ...


def assert_refused(
    alloc: Snapshotting, error: type[KVPoolError], action: Callable[[], object]
) -> KVPoolError:
    """``action`` raises ``error`` and the allocator's snapshot is unchanged; returns the error."""
    before = alloc.snapshot()
    with pytest.raises(error) as info:
        action()
    assert alloc.snapshot() == before
    return info.value


def assert_none_unchanged(alloc: Snapshotting, action: Callable[[], object]) -> None:
    """``action`` returns None (an allocation that does not fit) and changes no state."""
    before = alloc.snapshot()
    assert action() is None
    assert alloc.snapshot() == before
