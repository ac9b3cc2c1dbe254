"""A seeded bug (:class:`Mutant`) and the helpers its patches use.

A mutant patches one freshly built :class:`kvpool.optimized.lifecycle.memory_manager.MemoryManager`
in place (instance attributes only: no file is edited and other instances are untouched) and names
the detectors expected to catch it: invariant ids or ``lockstep-diff``. The mutated twin runs with
checked mode OFF, as in production, so that the harness's invariants, not the twin's own misuse
checks, have to find the damage. ``page_sizes``, ``overrides`` (config fields) and ``kinds``
(operation kinds) focus the runs where the bug can show.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from kvpool.config import PoolConfig
from kvpool.testing.factories import optimized_factory
from kvpool.testing.lockstep_driver import Factory
from kvpool.testing.swarm import Chooser, draw_config

Patch = Callable[[Any], None]


@dataclass(frozen=True)
class Mutant:
    """A seeded bug: ``patch(manager)`` injects it; ``expected`` detectors should catch it."""

    name: str
    kind: str
    expected: tuple[str, ...]
    patch: Patch
    page_sizes: tuple[int, ...] = (1, 2, 4, 16)
    overrides: dict[str, Any] = field(default_factory=dict)
    kinds: tuple[str, ...] | None = None
    stops: bool = False
    """Whether its runs' finishes may stop a request early (``finished_lens``)."""

    def config_drawer(self) -> Callable[[Chooser], PoolConfig]:
        def draw(c: Chooser) -> PoolConfig:
            return draw_config(c, page_size=c.choice(self.page_sizes), **self.overrides)

        return draw

    def factory(self, base: Factory | None = None) -> Factory:
        """A factory of mutated twins (``base`` defaults to the unchecked torch twin)."""
        build = base or optimized_factory("torch", checked=False)

        def mutated(config: PoolConfig) -> Any:
            manager = build(config)
            self.patch(manager)
            return manager

        return mutated


def need(obj: Any, *names: str) -> None:
    """Fail loudly when the twin no longer has an attribute a mutant patches (it was renamed):
    better a clear error than a mutant that silently injects nothing."""
    missing = [n for n in names if not hasattr(obj, n)]
    if missing:
        raise AttributeError(
            f"{type(obj).__name__} has no {missing}: update the seeded bug's patch"
        )


def wrap(obj: Any, name: str, make: Callable[[Any], Callable[..., Any]]) -> None:
    """Replace ``obj.name`` (bound) by ``make(original)`` on this instance only."""
    need(obj, name)
    setattr(obj, name, make(getattr(obj, name)))


def during(obj: Any, name: str, replacement: Callable[..., Any], call: Callable[[], Any]) -> Any:
    """Run ``call()`` with ``obj.name`` temporarily replaced."""
    saved = obj.__dict__.get(name)
    setattr(obj, name, replacement)
    try:
        return call()
    finally:
        if saved is None:
            delattr(obj, name)
        else:
            setattr(obj, name, saved)
