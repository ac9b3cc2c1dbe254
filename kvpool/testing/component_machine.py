"""Component machines as pytest TestCases: ``make_allocator_test`` and friends.

:func:`make_component_test` turns a component machine (:data:`kvpool.testing.machines.TARGETS`)
into a hypothesis ``RuleBasedStateMachine`` TestCase driving a candidate against the reference.
Every choice is a hypothesis draw; a failing trace is shrunk by the machine itself (plain op
lists replayed, :func:`kvpool.testing.campaign.shrink_run`), and hypothesis' own shrink phase is
dropped, so a simple bug comes back as a short trace within seconds.

A candidate is an :class:`~kvpool.testing.bundle.Implementation`, or just the factory of the
component (``(PoolConfig) -> allocator`` and so on; a torch implementation passes
``index=`` too, see :class:`Implementation`).
"""

from __future__ import annotations

import unittest
from collections.abc import Callable
from typing import Any, ClassVar

from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, precondition, rule

from kvpool.testing.bundle import Implementation
from kvpool.testing.lockstep_driver import LockstepFailure
from kvpool.testing.lockstep_machine import (
    SHRINK_REPLAYS,
    SHRINK_SECONDS,
    HypothesisChooser,
    fast_shrink_settings,
)
from kvpool.testing.machines import TARGETS, Pair, make_pair

Candidate = Implementation | Callable[..., Any]


class ComponentMachine(RuleBasedStateMachine):
    """One component of A (the reference) and B, stepped together; subclasses bind them."""

    component: ClassVar[str]
    impl_a: ClassVar[Implementation]
    impl_b: ClassVar[Implementation]
    labels: ClassVar[tuple[str, str]] = ("reference", "candidate")

    def __init__(self) -> None:
        super().__init__()
        self.pair: Pair | None = None
        self.config: Any = None

    @initialize(data=st.data())
    def setup(self, data: st.DataObject) -> None:
        cls = type(self)
        self.config = TARGETS[cls.component].draw_config(HypothesisChooser(data), cls.impl_b)
        self.pair = make_pair(TARGETS[cls.component], cls.impl_a, cls.impl_b, self.config,
                              cls.labels)  # fmt: skip

    def _ready(self) -> bool:
        return self.pair is not None

    @precondition(_ready)
    @rule(data=st.data())
    def step(self, data: st.DataObject) -> None:
        assert self.pair is not None
        op = self.pair.draw(HypothesisChooser(data))
        try:
            self.pair.run(op)
        except LockstepFailure as failure:
            raise self._shrunk(failure) from None

    def _shrunk(self, failure: LockstepFailure) -> LockstepFailure:
        from kvpool.testing.campaign import shrink_run

        cls, pair = type(self), self.pair
        assert pair is not None
        _, final = shrink_run(cls.component, cls.impl_a, cls.impl_b, self.config, pair.ops,
                              failure.detector, cls.labels, SHRINK_SECONDS,
                              SHRINK_REPLAYS)  # fmt: skip
        return final or failure


def as_implementation(component: str, candidate: Candidate, label: str) -> Implementation:
    """``candidate`` itself, or an Implementation holding it as ``component``'s factory."""
    if isinstance(candidate, Implementation):
        return candidate
    parts: dict[str, Any] = {component: candidate}
    return Implementation(label, **parts)


def make_component_test(
    component: str,
    candidate: Candidate,
    reference: Implementation | None = None,
    test_settings: settings | None = None,
    name: str | None = None,
) -> type[unittest.TestCase]:
    """A TestCase running ``component``'s machine: ``reference`` (default: kvpool's) against
    ``candidate``, under the loaded profile (or ``test_settings``) without hypothesis' shrink
    phase."""
    from kvpool.testing.implementations import reference_implementation

    impl_b = as_implementation(component, candidate, "candidate")
    machine: Any = type(
        f"{name or component.title().replace('_', '')}Machine",
        (ComponentMachine,),
        {
            "component": component,
            "impl_a": reference or reference_implementation(),
            "impl_b": impl_b,
            "labels": ("reference", impl_b.label),
        },
    )
    case: type[unittest.TestCase] = machine.TestCase
    case.settings = fast_shrink_settings(test_settings)  # type: ignore[attr-defined]
    return case


def make_allocator_test(candidate: Candidate, **kwargs: Any) -> type[unittest.TestCase]:
    """The allocator machine over ``candidate`` (an Implementation or ``(config) -> alloc``)."""
    return make_component_test("allocator", candidate, **kwargs)


def make_req_to_token_pool_test(candidate: Candidate, **kwargs: Any) -> type[unittest.TestCase]:
    """The ReqToTokenPool machine over ``candidate`` (or ``(config) -> pool``)."""
    return make_component_test("req_to_token_pool", candidate, **kwargs)


def make_radix_cache_test(candidate: Implementation, **kwargs: Any) -> type[unittest.TestCase]:
    """The radix-cache machine over ``candidate`` (it needs the tree, its key type, allocator
    and table factories: an Implementation)."""
    return make_component_test("radix_cache", candidate, **kwargs)


__all__ = [
    "ComponentMachine",
    "make_allocator_test",
    "make_component_test",
    "make_radix_cache_test",
    "make_req_to_token_pool_test",
]
