"""The lockstep harness as a hypothesis ``RuleBasedStateMachine``.

:class:`LockstepMachine` draws one pool configuration per example (its ``config_drawer``), then
one rule per step, each drawing an operation of its kind (:func:`kvpool.testing.swarm.draw_op`)
and running it on both implementations through :class:`~kvpool.testing.lockstep_driver.
Lockstep`. :func:`make_lockstep_machine` binds the machine to two factories
``(PoolConfig) -> MemoryManagerProtocol``; :func:`make_lockstep_test` turns it into a
pytest-collectable ``unittest.TestCase``.
"""

from __future__ import annotations

import unittest
from typing import Any, ClassVar

from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, precondition, rule

from kvpool.testing.lockstep_driver import ConfigDrawer, Factory, Lockstep
from kvpool.testing.swarm import draw_config, draw_op


class HypothesisChooser:
    """Chooser over hypothesis' ``data`` (every choice shrinks)."""

    def __init__(self, data: st.DataObject) -> None:
        self.data = data

    def integer(self, lo: int, hi: int) -> int:
        return self.data.draw(st.integers(lo, hi))

    def choice(self, options: Any) -> Any:
        return options[self.data.draw(st.integers(0, len(options) - 1))]


class LockstepMachine(RuleBasedStateMachine):
    """Hypothesis state machine over the whole lifecycle; subclasses set the factories."""

    factory_a: ClassVar[Factory]
    factory_b: ClassVar[Factory]
    config_drawer: ClassVar[ConfigDrawer] = staticmethod(draw_config)
    labels: ClassVar[tuple[str, str]] = ("reference", "candidate")
    examples: ClassVar[int] = 0
    """Machines built so far (one per example): the quality suite's 'examples needed'."""
    steps: ClassVar[int] = 0
    kinds: ClassVar[tuple[str, ...] | None] = None
    """When set, rules of other kinds draw one of these instead (focused runs)."""
    last_pair: ClassVar[Lockstep | None] = None
    """The pair of the latest example (the failing one after a failure)."""

    def __init__(self) -> None:
        super().__init__()
        type(self).examples += 1
        self.pair: Lockstep | None = None

    @initialize(data=st.data())
    def setup(self, data: st.DataObject) -> None:
        config = type(self).config_drawer(HypothesisChooser(data))
        cls = type(self)
        self.pair = cls.last_pair = Lockstep(cls.factory_a, cls.factory_b, config, cls.labels)

    def _do(self, data: st.DataObject, kind: str) -> None:
        assert self.pair is not None
        chooser = HypothesisChooser(data)
        focus = type(self).kinds
        if focus is not None and kind not in focus:
            kind = chooser.choice(focus)
        op = draw_op(chooser, self.pair.view(), kind)
        type(self).steps += 1
        self.pair.run(op)

    def _ready(self) -> bool:
        return self.pair is not None

    @precondition(_ready)
    @rule(data=st.data())
    def new_req(self, data: st.DataObject) -> None:
        self._do(data, "new_req")

    @precondition(_ready)
    @rule(data=st.data())
    def twin_req(self, data: st.DataObject) -> None:
        self._do(data, "twin_req")

    @precondition(_ready)
    @rule(data=st.data())
    def match_prefix(self, data: st.DataObject) -> None:
        self._do(data, "match_prefix")

    @precondition(_ready)
    @rule(data=st.data())
    def extend(self, data: st.DataObject) -> None:
        self._do(data, "extend")

    @precondition(_ready)
    @rule(data=st.data())
    def decode(self, data: st.DataObject) -> None:
        self._do(data, "decode")

    @precondition(_ready)
    @rule(data=st.data())
    def spec_step(self, data: st.DataObject) -> None:
        self._do(data, "spec_step")

    @precondition(_ready)
    @rule(data=st.data())
    def spec_draft_v1(self, data: st.DataObject) -> None:
        self._do(data, "spec_draft_v1")

    @precondition(_ready)
    @rule(data=st.data())
    def finish(self, data: st.DataObject) -> None:
        self._do(data, "finish")

    @precondition(_ready)
    @rule(data=st.data(), kind=st.sampled_from(("abort", "retract")))
    def abort_or_retract(self, data: st.DataObject, kind: str) -> None:
        self._do(data, kind)

    @precondition(_ready)
    @rule(data=st.data(), kind=st.sampled_from(("open_session", "session_turn", "close_session")))
    def session(self, data: st.DataObject, kind: str) -> None:
        self._do(data, kind)

    @precondition(_ready)
    @rule(data=st.data())
    def evict(self, data: st.DataObject) -> None:
        self._do(data, "evict")

    @precondition(_ready)
    @rule(data=st.data())
    def invalid(self, data: st.DataObject) -> None:
        self._do(data, "invalid")


def make_lockstep_machine(
    factory_a: Factory,
    factory_b: Factory,
    config_drawer: ConfigDrawer | None = None,
    labels: tuple[str, str] = ("reference", "candidate"),
    name: str = "Lockstep",
    kinds: tuple[str, ...] | None = None,
) -> type[LockstepMachine]:
    """A :class:`LockstepMachine` subclass bound to two factories (optionally a config drawer
    ``(Chooser) -> PoolConfig`` and a tuple of operation kinds to focus the runs)."""
    attrs: dict[str, Any] = {
        "factory_a": staticmethod(factory_a),
        "factory_b": staticmethod(factory_b),
        "labels": labels,
        "examples": 0,
        "steps": 0,
        "last_pair": None,
        "kinds": kinds,
    }
    if config_drawer is not None:
        attrs["config_drawer"] = staticmethod(config_drawer)
    return type(name + "Machine", (LockstepMachine,), attrs)


def make_lockstep_test(
    factory_a: Factory,
    factory_b: Factory,
    config_drawer: ConfigDrawer | None = None,
    test_settings: settings | None = None,
    labels: tuple[str, str] = ("reference", "candidate"),
    name: str = "Lockstep",
) -> type[unittest.TestCase]:
    """A ``unittest.TestCase`` (collected by pytest) that runs the lockstep machine over A and
    B under the loaded hypothesis profile (or ``test_settings``)."""
    machine = make_lockstep_machine(factory_a, factory_b, config_drawer, labels, name)
    case: type[unittest.TestCase] = machine.TestCase
    if test_settings is not None:
        case.settings = test_settings  # type: ignore[attr-defined]
    return case
