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

from hypothesis import Phase, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, precondition, rule

from kvpool.testing.lockstep_driver import ConfigDrawer, Factory, Lockstep, LockstepFailure
from kvpool.testing.swarm import draw_config, draw_op

SHRINK_REPLAYS = 160
"""Replays the in-machine shrinker may make (greedy deletion over a ``ci`` trace of 40 steps
needs about 120)."""
SHRINK_SECONDS = 8.0
"""Clock guard of the in-machine shrinker (the replay bound normally stops it first)."""


def fast_shrink_settings(parent: settings | None = None) -> settings:
    """``parent`` (default: the loaded profile) without hypothesis' own shrink phase: the
    machine shrinks a failing trace itself, replaying plain op lists (seconds instead of the
    minutes hypothesis can spend re-drawing a stateful example)."""
    base = parent if parent is not None else settings()
    return settings(base, phases=[p for p in base.phases if p != Phase.shrink])


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
    stops: ClassVar[bool] = False
    """Whether finishes may stop a request before its last output token (``finished_lens``;
    both managers must take it: :attr:`kvpool.testing.swarm.View.stops`)."""
    last_pair: ClassVar[Lockstep | None] = None
    """The pair of the latest example (the failing one after a failure)."""
    shrink_failures: ClassVar[bool] = False
    """Shrink a failing trace in the machine (:func:`fast_shrink_settings` then drops
    hypothesis' shrink phase) and raise the shrunk failure."""
    _shrunk_cache: ClassVar[dict[tuple[str, ...], LockstepFailure]] = {}

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
        view = self.pair.view()
        view.stops = type(self).stops
        view.session_stops = self.pair.config.mamba_slots is None
        op = draw_op(chooser, view, kind)
        type(self).steps += 1
        try:
            self.pair.run(op)
        except LockstepFailure as failure:
            if not type(self).shrink_failures:
                raise
            raise self._shrunk(failure) from None

    def _shrunk(self, failure: LockstepFailure) -> LockstepFailure:
        """The failure of the shortest sub-trace found by the campaign's shrinker (cached:
        hypothesis replays the failing example once more to report it)."""
        from kvpool.testing.campaign import shrink

        cls, pair = type(self), self.pair
        assert pair is not None
        key = tuple(op.render() for op in pair.ops)
        if key not in cls._shrunk_cache:
            _, final = shrink(cls.factory_a, cls.factory_b, pair.config, pair.ops,
                              failure.detector, cls.labels, SHRINK_SECONDS,
                              SHRINK_REPLAYS)  # fmt: skip
            cls._shrunk_cache[key] = final or failure
        return cls._shrunk_cache[key]

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
    shrink_failures: bool = False,
    stops: bool = False,
) -> type[LockstepMachine]:
    """A :class:`LockstepMachine` subclass bound to two factories (optionally a config drawer
    ``(Chooser) -> PoolConfig``, a tuple of operation kinds to focus the runs, in-machine
    shrinking of failures, and finishes that stop a request early: ``stops``, when both
    managers take ``finished_lens``)."""
    attrs: dict[str, Any] = {
        "factory_a": staticmethod(factory_a),
        "factory_b": staticmethod(factory_b),
        "labels": labels,
        "examples": 0,
        "steps": 0,
        "last_pair": None,
        "kinds": kinds,
        "shrink_failures": shrink_failures,
        "stops": stops,
        "_shrunk_cache": {},
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
    stops: bool = False,
) -> type[unittest.TestCase]:
    """A ``unittest.TestCase`` (collected by pytest) that runs the lockstep machine over A and
    B under the loaded hypothesis profile (or ``test_settings``). A failure is shrunk by the
    machine (:func:`fast_shrink_settings`), so a simple bug is reported with a short trace
    within seconds."""
    machine = make_lockstep_machine(
        factory_a, factory_b, config_drawer, labels, name, shrink_failures=True, stops=stops
    )
    case: type[unittest.TestCase] = machine.TestCase
    case.settings = fast_shrink_settings(test_settings)  # type: ignore[attr-defined]
    return case
