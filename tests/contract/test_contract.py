"""The contract, property-based: hypothesis draws a reachable state (the family builder's
seed) and the sweep makes every bad call of every public method on it, on the reference and on
the twin in both checked modes. Each call must raise a KVPoolError or give its documented
answer, and leave the whole state unchanged (see tests/contract/machinery.py)."""

from __future__ import annotations

import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from tests.contract.machinery import SIDES, klass, sweep
from tests.contract.registry import FAMILIES

pytestmark = pytest.mark.slow  # a sweep per class: 1 to 8 s each on two cores

CASES = [
    pytest.param(family, cls, id=f"{family.name}-{cls}")
    for family in FAMILIES
    for cls in family.classes
    if cls not in family.abstract
]


@pytest.fixture(autouse=True)
def _library_default_mode(monkeypatch: pytest.MonkeyPatch) -> None:
    """The twin's default checked mode is the library's own (the suite's environment turns it
    on everywhere)."""
    monkeypatch.delenv("KVPOOL_CHECKED", raising=False)


@pytest.mark.parametrize(("family", "cls"), CASES)
@settings(
    max_examples=4, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(seed=st.integers(0, 2**16))
@example(seed=0)
def test_bad_calls_are_refused_and_change_nothing(family, cls, seed) -> None:  # type: ignore[no-untyped-def]
    failures = []
    for side in SIDES:
        try:
            klass(side, cls)
        except AttributeError:
            continue  # a class only one twin has
        for outcome in sweep(family, cls, side, seed):
            if not outcome.ok:
                failures.append(outcome.line())
    assert not failures, f"{len(failures)} bad calls broke the contract:\n" + "\n".join(
        failures[:40]
    )
