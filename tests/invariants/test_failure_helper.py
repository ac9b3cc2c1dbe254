"""One failure helper serves every invariant module: :func:`kvpool.invariants.failure.fail`
raises only for offenders, naming each once in ascending order, and no other helper of
``kvpool/invariants`` raises an :class:`~kvpool.errors.InvariantViolation` (the checks themselves
may, for a violation that has no offender to name)."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

import kvpool.invariants
from kvpool.errors import InvariantViolation
from kvpool.invariants.failure import fail

INVARIANTS_DIR = Path(kvpool.invariants.__file__).parent


def test_no_offender_no_failure() -> None:
    fail("INV-EXAMPLE", "nothing wrong", [])
    fail("INV-EXAMPLE", "nothing wrong", set())


def test_offenders_named_once_in_order() -> None:
    with pytest.raises(InvariantViolation) as caught:
        fail("INV-EXAMPLE", "slots freed twice", [7, 3, 7, 5])
    assert caught.value.invariant_id == "INV-EXAMPLE"
    assert caught.value.indices == (3, 5, 7)
    assert str(caught.value) == "[INV-EXAMPLE] slots freed twice offending: [3, 5, 7]"


def _is_check(func: ast.FunctionDef) -> bool:
    """Registered by ``@invariant(...)``."""
    return any(
        isinstance(d, ast.Call) and isinstance(d.func, ast.Name) and d.func.id == "invariant"
        for d in func.decorator_list
    )


def _raises_violation(func: ast.FunctionDef) -> bool:
    for node in ast.walk(func):
        if isinstance(node, ast.Raise) and isinstance(node.exc, ast.Call):
            target = node.exc.func
            if isinstance(target, ast.Name) and target.id == "InvariantViolation":
                return True
    return False


def test_no_module_keeps_a_failure_helper_of_its_own() -> None:
    modules = sorted(p for p in INVARIANTS_DIR.glob("*.py") if p.name != "failure.py")
    assert len(modules) >= 9
    helpers = [
        f"{path.name}:{node.name}"
        for path in modules
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8")))
        if isinstance(node, ast.FunctionDef) and not _is_check(node) and _raises_violation(node)
    ]
    assert helpers == []
    shared = "from kvpool.invariants.failure import fail"
    users = [p.name for p in modules if shared in p.read_text(encoding="utf-8")]
    assert len(users) >= 7
