"""The bad-input table's machinery: one case, run on both twins, judged the same way.

A :class:`Case` names a fixture (a component in a known state, built by the same code for both
twins through a :class:`Twin`), one bad call, and the expected answer: a typed
:class:`kvpool.errors.KVPoolError` subclass (exactly that type) or a documented value (``None``
for an allocation that does not fit). :func:`run_case` checks, on each twin, the answer and that
the component's state (:func:`state`) is unchanged; then that both twins gave the same answer and
hold the same state. Cases whose check needs no device read (``host=True``) also run on the
optimized twin with ``checked=False``: those checks are always on.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from types import SimpleNamespace
from typing import Any

import pytest
import torch

import kvpool.optimized as opt_pkg
import kvpool.reference as ref_pkg
from kvpool.errors import KVPoolError
from kvpool.optimized.options import TwinOptions

MODULES = (
    "pools.allocator",
    "pools.token_allocator",
    "pools.paged_allocator",
    "swa.allocator",
    "swa.pure_allocator",
    "mamba.allocator",
    "pools.req_to_token_pool",
    "mamba.hybrid_req_to_token_pool",
    "kv.kv_cache",
    "kv.mha",
    "kv.mla",
    "swa.kv_pool",
    "mamba.pool",
    "radix.radix_cache",
    "radix_key",
    "radix.chunk_cache",
    "swa.chunk_cache",
    "swa.radix_cache",
    "mamba.radix_cache",
    "unified.mamba_radix_cache",
    "unified.radix_cache",
    "unified.swa_radix_cache",
    "lifecycle.memory_manager",
    "lifecycle.swa_memory_manager",
    "req",
)


def _namespace(package: str) -> SimpleNamespace:
    """Every public name of the twin's modules listed in :data:`MODULES`, flat."""
    import importlib

    names: dict[str, Any] = {}
    for module in MODULES:
        mod = importlib.import_module(f"{package}.{module}")
        names.update({k: v for k, v in vars(mod).items() if k[:1].isupper()})
    return SimpleNamespace(**names)


REF = _namespace(ref_pkg.__name__)
OPT = _namespace(opt_pkg.__name__)


@dataclass(frozen=True)
class Twin:
    """One side of a case: the reference, or the optimized twin in one checked mode (``None``:
    its default for CPU tensors)."""

    name: str
    checked: bool | None = None

    @property
    def is_ref(self) -> bool:
        return self.name == "reference"

    @property
    def ns(self) -> SimpleNamespace:
        """The twin's classes by name (``tw.ns.RadixCache``...)."""
        return REF if self.is_ref else OPT

    @property
    def kw(self) -> dict[str, Any]:
        """Keyword arguments that place an optimized component (none for the reference)."""
        return {} if self.is_ref else {"options": TwinOptions.make("cpu", self.checked)}

    def idx(self, values: Sequence[Any], dtype: torch.dtype = torch.int64) -> Any:
        """Indices or lengths as the twin takes them: a list, or a tensor of ``dtype``."""
        return list(values) if self.is_ref else torch.tensor(list(values), dtype=dtype)

    def floats(self, values: Sequence[float]) -> Any:
        """Non-integer indices: floats in a list, a float32 tensor for the twin."""
        return (
            [float(v) for v in values] if self.is_ref else torch.tensor(values, dtype=torch.float32)
        )

    def data(self, shape: tuple[int, ...], fill: float = 1.0) -> Any:
        """A KV payload of ``shape`` (nested lists for the reference)."""
        t = torch.full(shape, fill)
        return t.tolist() if self.is_ref else t

    def new(self, cls: str, *args: Any, **kwargs: Any) -> Any:
        """``cls(*args, **kwargs)`` of this twin, placed by :attr:`kw` where it takes options."""
        return getattr(self.ns, cls)(*args, **kwargs, **self.kw)


@dataclass(frozen=True)
class Case:
    """One bad call. ``build(tw)`` returns the fixture (``.target`` is the component whose
    state is judged); ``call(tw, fx)`` makes the bad call; ``expect`` is the error type or the
    documented answer; ``host`` marks checks that need no device read."""

    id: str
    build: Callable[[Twin], SimpleNamespace]
    call: Callable[[Twin, SimpleNamespace], Any]
    expect: type[KVPoolError] | object
    host: bool = True
    tags: tuple[str, ...] = field(default=())


def state(target: Any) -> Any:
    """The component's whole state as plain values, comparable across twins (a tuple of
    components: each one's state)."""
    if isinstance(target, tuple):
        return tuple(state(t) for t in target)
    if hasattr(target, "hybrid_snapshot"):
        rows = [(r, target.max_context_len) for r in range(1, target.size + 1)]
        return target.hybrid_snapshot(rows)
    if hasattr(target, "max_context_len") and hasattr(target, "free_slots"):  # request table
        return target.snapshot([(r, target.max_context_len) for r in range(1, target.size + 1)])
    if hasattr(target, "read_swa_tags"):  # SWA KV pool: both sides
        full = range(target.size + target.page_size)
        swa = range(target.size_swa + target.page_size)
        return (target.full_kv_pool.read_tags(list(full)), target.swa_kv_pool.read_tags(list(swa)))
    if hasattr(target, "read_tags") and hasattr(target, "num_rows"):  # KV buffers
        return tuple(target.read_tags(list(range(target.num_rows))))
    return target.snapshot()


def _outcome(tw: Twin, case: Case) -> tuple[str, Any, Any]:
    """(answer kind, answer, state after), after checking the state did not change."""
    fx = case.build(tw)
    before = state(fx.target)
    try:
        got: Any = case.call(tw, fx)
        kind = "value"
    except KVPoolError as exc:
        got, kind = type(exc), "error"
    after = state(fx.target)
    assert after == before, f"{tw}: state changed by {case.id}"
    if isinstance(got, torch.Tensor):
        got = got.tolist()
    return kind, got, after


def run_case(case: Case, modes: Sequence[bool | None]) -> None:
    """The expected answer and an unchanged state on the reference and on the optimized twin in
    each of ``modes``; both twins' answers and states equal."""
    ref = _outcome(Twin("reference"), case)
    for mode in modes:
        twin = _outcome(Twin("optimized", mode), case)
        assert twin[:2] == ref[:2], f"reference {ref[:2]} vs optimized[checked={mode}] {twin[:2]}"
        assert twin[2] == ref[2], f"states differ (checked={mode})"
    if isinstance(case.expect, type) and issubclass(case.expect, KVPoolError):
        assert ref[:2] == ("error", case.expect), f"{ref[:2]} instead of {case.expect.__name__}"
    else:
        assert ref[:2] == ("value", case.expect), f"{ref[:2]} instead of {case.expect!r}"


def modes_of(case: Case) -> list[bool | None]:
    """The optimized twin's default (checked on CPU), and unchecked too for host-only checks."""
    return [None, False] if case.host else [None]


def params(cases: Sequence[Case]) -> list[Any]:
    """pytest parameters, one per case, named by the case id."""
    ids = [c.id for c in cases]
    assert len(set(ids)) == len(ids), "case ids must be unique"
    return [pytest.param(c, id=c.id) for c in cases]


@pytest.fixture(autouse=True)
def default_checked_mode(monkeypatch: pytest.MonkeyPatch) -> None:
    """Run under the library's own default (the test suite's environment turns checked on)."""
    monkeypatch.delenv("KVPOOL_CHECKED", raising=False)


def fixture(target: Any, **handles: Any) -> SimpleNamespace:
    """A built fixture: ``target`` (judged) and named handles for the call."""
    return SimpleNamespace(target=target, **handles)
