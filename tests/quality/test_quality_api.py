"""The quality suite pointed at another implementation: :mod:`kvpool.testing.quality` hunts bugs
seeded by its caller into a base of the caller's choosing. Here the base is the pure-Python
reference (standing in for a user's implementation) with a bug written against its own
attributes: the harness must catch it, and must pass the unmutated base on the same budget."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import pytest
from hypothesis import settings

from kvpool.testing.factories import reference_factory
from kvpool.testing.implementations import reference_implementation
from kvpool.testing.profiles import register_profiles
from kvpool.testing.quality import ComponentMutant, Mutant, format_table, hunt, hunt_component, wrap


def _free_drops_last_slot(alloc: Any) -> None:
    """A user's bug: ``free`` forgets the last slot it is given (a leak)."""

    def make(orig: Callable[[Sequence[int]], None]) -> Callable[[Sequence[int]], None]:
        def free(free_index: Sequence[int]) -> None:
            orig(list(free_index)[:-1])

        return free

    wrap(alloc, "free", make)


LEAK = ("INV-TOKEN-ACCOUNTING", "INV-POOL-ACCOUNTING")


@pytest.mark.slow
def test_component_bug_in_another_implementation_is_caught() -> None:
    bug = ComponentMutant("user-free-leak", "leak", LEAK, _free_drops_last_slot, "allocator", (1,))
    result = hunt_component(bug, base=reference_implementation())
    assert result.as_expected, format_table([result])
    clean = ComponentMutant("no-bug", "control", ("none",), lambda obj: None, "allocator", (1,))
    control = hunt_component(clean, base=reference_implementation())
    assert not control.caught, control.report


def _budget() -> settings:
    register_profiles()
    return settings.get_profile("mutants")


@pytest.mark.slow
def test_manager_bug_in_another_implementation_is_caught() -> None:
    def patch(manager: Any) -> None:
        _free_drops_last_slot(manager.token_to_kv_pool_allocator)

    bug = Mutant("user-manager-leak", "leak", LEAK, patch, (1,))
    result = hunt(bug, _budget(), base=reference_factory)
    assert result.as_expected, format_table([result])
    control = hunt(Mutant("no-bug", "control", ("none",), lambda m: None, (1,)), _budget(),
                   base=reference_factory)  # fmt: skip
    assert not control.caught, control.report
