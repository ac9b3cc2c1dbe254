"""The contract suite finds planted contract breaks: each bug below is kept here, patched into
the reference for one test, and the sweep must report it with the right verdict. Without this,
a sweep that judged nothing (a family whose bad values never reach a check) would pass too.

The planted bugs are the field's usual ones: a check that truncates (``int()`` on a float
slot), a check that runs after the first change (a row taken, then a refusal), a foreign
exception (a ``KeyError`` out of a lookup), a check that is simply missing, and a new public
method nobody gave a contract.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Sequence
from typing import Any

import pytest

import kvpool.reference as ref_pkg
from kvpool.errors import InvalidArgumentError
from kvpool.reference.pools.allocator import BaseTokenToKVPoolAllocator
from kvpool.reference.pools.req_to_token_pool import ReqToTokenPool
from tests.contract.families import pools
from tests.contract.machinery import SIDES, Outcome, public_methods, sweep

REFERENCE = SIDES[0]


@pytest.fixture(autouse=True)
def _library_default_mode(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("KVPOOL_CHECKED", raising=False)


def _broken(cls: str, method: str) -> list[Outcome]:
    """The reference's outcomes of ``cls.method`` that broke the contract (seed 0)."""
    return [o for o in sweep(pools.FAMILY, cls, REFERENCE, 0) if o.method == method and not o.ok]


# --------------------------------------------------------------------------- the planted bugs
def truncating_free(original: Callable[..., None]) -> Callable[..., None]:
    """``free`` that converts with ``int()`` before checking: 1.5 becomes slot 1. (Each planted
    method keeps the real one's annotations: the sweep derives its generic bad values from
    them.)"""

    def free(self: BaseTokenToKVPoolAllocator, free_index: Sequence[int]) -> None:
        with contextlib.suppress(TypeError, ValueError):
            free_index = [int(x) for x in free_index]
        original(self, free_index)

    return free


def change_then_refuse(original: Callable[..., Any]) -> Callable[..., Any]:
    """``alloc`` that finds a request named twice only after handing it a row."""

    def alloc(self: ReqToTokenPool, reqs: Sequence[Any]) -> Any:
        if isinstance(reqs, list) and len(reqs) > 1 and reqs[0] is reqs[1]:
            original(self, reqs[:1])
            raise InvalidArgumentError("a request appears twice in the batch")
        return original(self, reqs)

    return alloc


def foreign_error(original: Callable[..., Any]) -> Callable[..., Any]:
    """``read`` that looks the row up in a dict first: a bad row is a bare ``KeyError``."""

    def read(self: ReqToTokenPool, row: int, start: int, stop: int) -> Any:
        rows = {r: r for r in range(1, self.size + 1)}
        return original(self, rows[row], start, stop)

    return read


def missing_check(original: Callable[..., Any]) -> Callable[..., Any]:
    """``alloc`` without its size check: ``need_size=-3`` or ``True`` reaches the free list."""

    def alloc(self: BaseTokenToKVPoolAllocator, need_size: int) -> Any:
        n = int(need_size)
        if n <= 0:
            return []
        return original(self, n)

    return alloc


PLANTED = [
    ("truncating-free", BaseTokenToKVPoolAllocator, "free", truncating_free, "free_index"),
    ("change-then-refuse", ReqToTokenPool, "alloc", change_then_refuse, "reqs"),
    ("foreign-error", ReqToTokenPool, "read", foreign_error, "row"),
    ("missing-check", BaseTokenToKVPoolAllocator, "alloc", missing_check, "need_size"),
]


@pytest.mark.parametrize(
    ("name", "owner", "method", "plant", "param"), PLANTED, ids=[p[0] for p in PLANTED]
)
def test_the_sweep_reports_a_planted_break(
    monkeypatch: pytest.MonkeyPatch,
    name: str,
    owner: type,
    method: str,
    plant: Callable[[Callable[..., Any]], Callable[..., Any]],
    param: str,
) -> None:
    cls = "ReqToTokenPool" if owner is ReqToTokenPool else "TokenToKVPoolAllocator"
    assert not _broken(cls, method), "the unpatched reference must keep the contract"
    monkeypatch.setattr(owner, method, plant(getattr(owner, method)))
    broken = _broken(cls, method)
    assert broken, f"{name}: the sweep did not notice"
    assert any(o.param == param for o in broken), [o.line() for o in broken]
    verdicts = {o.verdict for o in broken}
    expected = {
        "truncating-free": "accepted",
        "change-then-refuse": "changed-then-raised",
        "foreign-error": "untyped",
        "missing-check": "accepted",
    }[name]
    assert expected in verdicts, [o.line() for o in broken]


def test_a_public_method_without_a_contract_is_named(monkeypatch: pytest.MonkeyPatch) -> None:
    """A new public method fails the coverage test until its family gives it a contract."""

    def shrink(self: ReqToTokenPool, rows: int) -> None:  # a planted new public method
        raise InvalidArgumentError(f"rows must be positive, got {rows!r}")

    monkeypatch.setattr(ref_pkg.ReqToTokenPool, "shrink", shrink, raising=False)
    names = public_methods(ref_pkg.ReqToTokenPool)
    assert "shrink" in names
    family = pools.FAMILY
    missing = [
        m
        for m in names
        if family.contract("ReqToTokenPool", m) is None
        and family.exemption("ReqToTokenPool", m) is None
    ]
    assert missing == ["shrink"]
