"""A lockstep TestCase (the way most users meet kvpool) reports a simple bug with a short trace
within seconds, under the default (dev) and the ci profiles: the machine shrinks the failing op
list itself instead of hypothesis re-drawing the stateful example for minutes."""

from __future__ import annotations

import time
import unittest

import pytest
from hypothesis import settings

from kvpool.testing.factories import reference_factory
from kvpool.testing.lockstep_machine import make_lockstep_test
from kvpool.testing.profiles import register_profiles
from tests.harness.buggy_impl import leaky_factory

BUDGET_S = 10.0
"""CPU seconds (the process's own time: a loaded machine does not make the test flaky)."""


@pytest.mark.slow
@pytest.mark.parametrize("profile", ["dev", "ci"])
def test_freed_too_little_is_reported_short_within_seconds(profile: str) -> None:
    register_profiles()
    # derandomized and without the example database: the test must not depend on earlier runs
    chosen = settings(settings.get_profile(profile), derandomize=True, database=None)
    case = make_lockstep_test(reference_factory, leaky_factory, test_settings=chosen,
                              name=f"Leaky{profile}")  # fmt: skip
    result = unittest.TestResult()
    cpu, wall = time.process_time(), time.monotonic()
    case("runTest").run(result)
    cpu, wall = time.process_time() - cpu, time.monotonic() - wall
    problems = result.failures + result.errors
    assert problems, "the leak was not found"
    text = problems[0][1]
    line = next(x for x in text.splitlines() if "minimal trace (" in x)
    steps = int(line.split("minimal trace (")[1].split()[0])
    assert steps <= 8, text[-3000:]
    assert cpu < BUDGET_S, f"{cpu:.1f} s CPU ({wall:.1f} s wall)"
