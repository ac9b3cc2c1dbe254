"""The contract suite's machinery: every public method, one bad argument at a time.

The promise under test (README, "Errors"): a call given a bad argument raises a
:class:`~kvpool.errors.KVPoolError` subclass, or gives its documented answer to that input (an
allocation that cannot be met returns ``None``), and in both cases leaves the whole state exactly
as it was. No call may change state and then raise, and no call may raise a foreign exception
(``TypeError``, ``OverflowError``, a torch ``RuntimeError``...).

A :class:`Family` names the public classes it covers and builds, for a class and a seed, a
:class:`Subject`: an object in a state reached by seeded legal calls, with a function that reads
its whole state (snapshot, requests, sessions, host side). Its :class:`Method` table says, for
each public method, the valid keyword arguments in that state and the bad values that need the
state to name (a slot the caller does not hold, a duplicate, a node of another tree, a request
in the wrong phase). Bad values of the wrong *type* are derived from the method's annotations
(:func:`generic_bad`): a bool, a float, ``None``, a string or a NumPy scalar for an ``int``; a
2-D, float or bool tensor for an index tensor; and so on. :func:`judge` makes one call and
classifies what happened (:class:`Outcome`).

A side is the reference, or the optimized twin in a checked mode (:class:`tests.bad_inputs.
harness.Twin`). Bad values marked ``device_read`` (ownership and duplicates inside tensors) are
refused only where the side checks device data: the reference and the checked twin always, the
unchecked twin never (README, "Checked mode"): there such a value is the caller's to avoid, and
whatever the call does with it is documented.
"""

from __future__ import annotations

import inspect
import random
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch

from kvpool.errors import KVPoolError
from tests.bad_inputs.harness import Twin

SIDES = (Twin("reference"), Twin("optimized", None), Twin("optimized", False))
"""The reference, the twin in its default mode on CPU (checked) and the twin unchecked."""


@dataclass(frozen=True)
class Bad:
    """One bad value for one parameter. ``device_read``: refusing it needs a device read, so
    the unchecked twin may take it (documented)."""

    label: str
    value: Any
    device_read: bool = False


@dataclass
class Subject:
    """An object in a reachable state. ``state()`` reads everything a call could change
    (comparable with ``==``); ``handles`` are things the family's argument builders use (held
    slots, a live request, a node...)."""

    obj: Any
    state: Callable[[], Any]
    handles: dict[str, Any] = field(default_factory=dict)


Args = Callable[[Twin, Subject], dict[str, Any]]
BadValues = Callable[[Twin, Subject], Sequence[Bad]]


def _never(_: Any) -> bool:
    return False


@dataclass(frozen=True)
class Method:
    """One public method's contract.

    ``args``: valid keyword arguments in the subject's state (every parameter the call needs);
    ``None`` for a method without parameters. ``bad``: per parameter, the bad values the state
    names (range, ownership, duplicates, phase). ``generic``: parameters that get the
    annotation-derived bad values (default: all of ``args``); ``signed``: int parameters for
    which a negative value is legal, ``unbounded``: int parameters for which a huge value is
    legal. ``answer``: the documented non-error answer to bad input (``None`` from an
    allocation). ``reads``: a parameterless method that changes nothing (a read).
    """

    args: Args | None = None
    bad: Mapping[str, BadValues] = field(default_factory=dict)
    generic: tuple[str, ...] | None = None
    signed: tuple[str, ...] = ()
    unbounded: tuple[str, ...] = ()
    answer: Callable[[Any], bool] = _never
    reads: bool = False
    refused_in: Callable[[Twin, Subject], Sequence[tuple[str, Subject]]] | None = None
    """Wrong states: given the built subject, ``(label, subject)`` pairs in which the call (with
    ``args``, or none) must be refused with a KVPoolError and change nothing: a request or node
    in the wrong phase, a free group closed that was never opened."""


@dataclass(frozen=True)
class Family:
    """A family's public classes, how to build each in a reachable state, and its methods.

    ``methods`` maps a method name to its contract for every class of the family that has it;
    ``only`` narrows an entry to some classes (``{"Cls.method": Method(...)}`` overrides the
    plain name for that class). ``exempt`` maps ``"Cls.method"`` or ``"method"`` to the reason a
    method has no bad argument to test (it must say why)."""

    name: str
    classes: tuple[str, ...]
    build: Callable[[Twin, str, int], Subject]
    methods: Mapping[str, Method]
    exempt: Mapping[str, str] = field(default_factory=dict)
    abstract: tuple[str, ...] = ()
    """Classes with no instance of their own (a base class): their methods need contracts,
    which the sweeps check on the subclasses that inherit them."""

    def __repr__(self) -> str:
        return f"Family({self.name!r})"

    def contract(self, cls: str, method: str) -> Method | None:
        """The contract of ``cls.method``: the class-specific entry, else the plain one."""
        return self.methods.get(f"{cls}.{method}", self.methods.get(method))

    def exemption(self, cls: str, method: str) -> str | None:
        return self.exempt.get(f"{cls}.{method}", self.exempt.get(method))


def public_methods(cls: type) -> list[str]:
    """The public methods of ``cls`` (inherited ones too; properties and dunders are not
    methods to call with arguments)."""
    names = []
    for name in dir(cls):
        if name.startswith("_"):
            continue
        raw = inspect.getattr_static(cls, name)
        if isinstance(raw, property):
            continue
        if isinstance(raw, staticmethod | classmethod) or inspect.isfunction(raw):
            names.append(name)
    return sorted(names)


def parameters(fn: Callable[..., Any]) -> dict[str, str]:
    """``fn``'s parameters (bound method: without ``self``) and their annotations as text."""
    out = {}
    for p in inspect.signature(fn).parameters.values():
        if p.kind in (p.VAR_POSITIONAL, p.VAR_KEYWORD):
            continue
        ann = p.annotation
        out[p.name] = ann if isinstance(ann, str) else getattr(ann, "__name__", repr(ann))
    return out


# --------------------------------------------------------------------------- generic bad values
_INT_TYPES = (
    Bad("bool", True),
    Bad("float", 1.5),
    Bad("integral-float", 2.0),
    Bad("str", "1"),
    Bad("np.float64", np.float64(1.0)),
    Bad("np.bool_", np.bool_(True)),
)
_SEQ_TYPES = (
    Bad("int-not-sequence", 3),
    Bad("str", "12"),
    Bad("float-items", [1.5]),
    Bad("bool-items", [True]),
    Bad("None-items", [None]),
    Bad("2-D", [[1]]),
)


def _tensor_types() -> tuple[Bad, ...]:
    return (
        Bad("float-tensor", torch.tensor([1.0])),
        Bad("bool-tensor", torch.tensor([True])),
        Bad("2-D-tensor", torch.tensor([[1]])),
        Bad("float-ndarray", np.array([1.5])),
    )


def annotation_kind(ann: str) -> str:
    """The kind of generic bad values an annotation gets: ``int``, ``ints`` (indices or
    lengths, list or tensor), ``bool``, ``str``, ``float``, ``object`` (a typed object: a
    request, a key, a node...) or ``any`` (no generic bad value). A union takes the kind of
    its first part that is not ``None``, or ``ints`` if any part is."""
    parts = [p.strip() for p in ann.split("|") if p.strip() not in ("None", "")]
    kinds = [_kind(p) for p in parts] or ["any"]
    return "ints" if "ints" in kinds else kinds[0]


def _kind(core: str) -> str:
    if core in ("int", "SupportsIndex"):
        return "int"
    if core in ("bool", "str", "float"):
        return core
    if core in ("object", "Any") or core.startswith(("Callable", "Iterable[")):
        return "any"
    ints = ("Sequence[int]", "list[int]", "Tensor", "torch.Tensor", "IndexLike", "Indices")
    if core in ints or core.endswith(("Tensor", "Lens", "Indices", "Index")):
        return "ints"
    if "Sequence[Sequence" in core or core.startswith(("tuple", "Sequence[tuple")):
        return "any"
    return "object"


def generic_bad(ann: str, side: Twin, method: Method, name: str) -> list[Bad]:
    """The annotation-derived bad values for parameter ``name`` (see the module docstring)."""
    optional = "None" in ann
    kind = annotation_kind(ann)
    out: list[Bad] = []
    if kind == "int":
        out += _INT_TYPES
        if name not in method.signed:
            out.append(Bad("negative", -3))
        if name not in method.unbounded:
            out.append(Bad("huge", 2**64))
    elif kind == "ints":
        out += _SEQ_TYPES
        if not side.is_ref:
            out += _tensor_types()
        out.append(Bad("negative-item", [-3]))
        out.append(Bad("huge-item", [2**64]))
    elif kind == "bool":
        out += (Bad("int", 1), Bad("str", "false"), Bad("float", 0.0))
    elif kind == "str":
        out += (Bad("int", 1), Bad("bytes", b"r"), Bad("list", ["r"]))
    elif kind == "float":
        out += (Bad("str", "1.0"), Bad("nan", float("nan")), Bad("inf", float("inf")))
    elif kind == "object":
        out += (Bad("int", 3), Bad("str", "x"), Bad("object", object()))
    if not optional and kind != "any":
        out.append(Bad("None", None))
    return out


# --------------------------------------------------------------------------- one call
@dataclass(frozen=True)
class Outcome:
    """What one bad call did. ``verdict``: ``typed`` (a KVPoolError, nothing changed),
    ``answer`` (the documented answer, nothing changed), ``accepted`` (returned something else;
    ``changed`` says whether state moved), ``untyped`` (a foreign exception), or
    ``changed-then-raised`` (an exception after a state change)."""

    family: str
    cls: str
    method: str
    param: str
    label: str
    side: str
    verdict: str
    detail: str
    changed: bool
    device_read: bool

    @property
    def ok(self) -> bool:
        if self.verdict in ("typed", "answer"):
            return True
        # A value only a device read can refuse is the caller's to avoid on the unchecked twin
        # (README, "Checked mode"): on a GPU it is a device-side assert, on a CPU torch's own
        # error; whatever the call does with it is documented.
        return self.device_read and self.side.endswith("checked=False]")

    def line(self) -> str:
        return (
            f"{self.side}: {self.cls}.{self.method}({self.param}={self.label}) -> "
            f"{self.verdict}{' (state changed)' if self.changed else ''}: {self.detail}"
        )


def side_name(side: Twin) -> str:
    return side.name if side.is_ref else f"optimized[checked={side.checked}]"


def judge(
    family: Family, cls: str, method: str, side: Twin, fresh: Callable[[], Subject]
) -> Iterator[Outcome]:
    """Every bad call of ``cls.method``: one per (parameter, bad value), on a subject from
    ``fresh()``.

    The subject is reused across calls (a correct call changes nothing); after a call that
    changed the state, the next one gets a fresh subject."""
    contract = family.contract(cls, method)
    assert contract is not None, f"{cls}.{method} has no contract"
    subject = fresh()
    if contract.refused_in is not None:
        yield from _judge_states(family, cls, method, side, subject, contract)
        subject = fresh()
    if contract.args is None:
        yield from _judge_read(family, cls, method, side, subject, contract)
        return
    anns = parameters(getattr(subject.obj, method))
    generic = (
        contract.generic if contract.generic is not None else tuple(contract.args(side, subject))
    )
    for name in anns:
        bads = _bad_values(anns[name], name, name in generic, contract, side, subject)
        for i in range(len(bads)):
            bad = bads[i]
            kwargs = contract.args(side, subject)
            kwargs[name] = bad.value
            bound = getattr(subject.obj, method)
            outcome = _call(family, cls, method, name, bad, side, subject, bound, kwargs, contract)
            yield outcome
            if outcome.changed:
                # The next values are named again from the fresh subject (its own nodes,
                # requests and slots; the builder is deterministic, so the list is the same).
                subject = fresh()
                bads = _bad_values(anns[name], name, name in generic, contract, side, subject)


def _bad_values(
    ann: str, name: str, generic: bool, contract: Method, side: Twin, subject: Subject
) -> list[Bad]:
    """Parameter ``name``'s bad values on ``subject``: the generic ones (if ``generic``), then
    the state-dependent ones of the contract."""
    bads = generic_bad(ann, side, contract, name) if generic else []
    if name in contract.bad:
        bads += contract.bad[name](side, subject)
    return bads


def _call(
    family: Family,
    cls: str,
    method: str,
    name: str,
    bad: Bad,
    side: Twin,
    subject: Subject,
    bound: Callable[..., Any],
    kwargs: dict[str, Any],
    contract: Method,
) -> Outcome:
    before = subject.state()
    try:
        got = bound(**kwargs)
    except KVPoolError as exc:
        verdict, detail = "typed", f"{type(exc).__name__}: {exc}"
    except Exception as exc:
        verdict, detail = "untyped", f"{type(exc).__name__}: {exc}"
    else:
        ok = contract.answer(got)
        verdict, detail = ("answer" if ok else "accepted"), f"returned {_short(got)}"
    changed = subject.state() != before
    if changed and verdict in ("typed", "untyped"):
        verdict = "changed-then-raised"
    return Outcome(
        family.name,
        cls,
        method,
        name,
        bad.label,
        side_name(side),
        verdict,
        detail,
        changed,
        bad.device_read,
    )


def _judge_read(
    family: Family, cls: str, method: str, side: Twin, subject: Subject, contract: Method
) -> Iterator[Outcome]:
    """A parameterless read: it answers and changes nothing."""
    if not contract.reads:
        return
    before = subject.state()
    try:
        got = getattr(subject.obj, method)()
        verdict, detail = "answer", f"returned {_short(got)}"
    except KVPoolError as exc:
        verdict, detail = "typed", f"{type(exc).__name__}: {exc}"
    except Exception as exc:
        verdict, detail = "untyped", f"{type(exc).__name__}: {exc}"
    changed = subject.state() != before
    if changed:
        verdict = "changed-then-raised" if verdict != "answer" else "accepted"
    yield Outcome(
        family.name, cls, method, "-", "read", side_name(side), verdict, detail, changed, False
    )


def _judge_states(
    family: Family, cls: str, method: str, side: Twin, subject: Subject, contract: Method
) -> Iterator[Outcome]:
    """The call in each wrong state ``contract.refused_in`` builds: refused, nothing changed
    (a documented answer does not excuse a call in a wrong state)."""
    assert contract.refused_in is not None
    for label, wrong in contract.refused_in(side, subject):
        kwargs = contract.args(side, wrong) if contract.args is not None else {}
        bad = Bad(f"state:{label}", None)
        no_answer = Method(args=contract.args)
        bound = getattr(wrong.obj, method)
        yield _call(family, cls, method, "-", bad, side, wrong, bound, kwargs, no_answer)


def _short(value: Any) -> str:
    try:
        text = repr(value)
    except Exception as exc:  # a broken object's repr must not end the sweep
        text = f"<{type(value).__name__}: repr raised {type(exc).__name__}>"
    return text if len(text) <= 60 else text[:57] + "..."


def sweep(family: Family, cls: str, side: Twin, seed: int) -> list[Outcome]:
    """Every bad call of every method of ``cls`` with a contract, on one side, from the state
    built by ``seed``."""
    outcomes: list[Outcome] = []
    for method in public_methods(klass(side, cls)):
        if family.contract(cls, method) is not None:
            outcomes += judge(family, cls, method, side, lambda: family.build(side, cls, seed))
    return outcomes


def klass(side: Twin, name: str) -> type:
    """The public class ``name`` of ``side``'s twin (every public class is exported by
    ``kvpool.reference`` / ``kvpool.optimized``)."""
    import kvpool.optimized as opt_pkg
    import kvpool.reference as ref_pkg

    cls: type = getattr(ref_pkg if side.is_ref else opt_pkg, name)
    return cls


def make(side: Twin, name: str, *args: Any, **kwargs: Any) -> Any:
    """``name(*args, **kwargs)`` on ``side``; on the twin with ``options=`` for the side's
    checked mode (CPU)."""
    if not side.is_ref:
        kwargs.update(side.kw)
    return klass(side, name)(*args, **kwargs)


def rng(seed: int) -> random.Random:
    """The seeded generator a family's builder drives its legal calls with."""
    return random.Random(seed)
