"""Hypothesis profiles registered by kvpool.

- ``ci``: deterministic (derandomized, no example database), bounded; the test command uses it.
- ``dev``: the default for local runs; random, with the local example database.
- ``nightly``: deep and unseeded, for long campaigns.
- ``mutants``: for the seeded-bug quality suite: the ``ci`` budget, deterministic, no shrinking
  phase, so a kill is counted fast (the suite shrinks the trace itself, see
  :func:`kvpool.testing.campaign.shrink`).

Every profile reports one bug per run (``report_multiple_bugs=False``): a lockstep failure tends
to show up under several detectors, and one readable report is what a user needs.

Select one with ``HYPOTHESIS_PROFILE=<name>`` (tests/conftest.py loads it).
"""

from __future__ import annotations

import os

from hypothesis import HealthCheck, Phase, settings

_SUPPRESS = [HealthCheck.too_slow, HealthCheck.data_too_large, HealthCheck.filter_too_much]

PROFILES = ("ci", "dev", "nightly", "mutants")

CI_MAX_EXAMPLES = 60
"""Examples per stateful test under ``ci`` (and the quality suite's kill budget)."""
CI_STEPS = 40
"""Most steps per example under ``ci`` and ``mutants``."""


def register_profiles() -> None:
    """Register the four profiles (idempotent)."""
    settings.register_profile(
        "ci",
        max_examples=CI_MAX_EXAMPLES,
        stateful_step_count=CI_STEPS,
        derandomize=True,
        database=None,
        deadline=None,
        print_blob=True,
        report_multiple_bugs=False,
        suppress_health_check=_SUPPRESS,
    )
    settings.register_profile(
        "dev",
        max_examples=100,
        stateful_step_count=50,
        deadline=None,
        print_blob=True,
        report_multiple_bugs=False,
        suppress_health_check=_SUPPRESS,
    )
    settings.register_profile(
        "nightly",
        max_examples=5000,
        stateful_step_count=200,
        deadline=None,
        print_blob=True,
        report_multiple_bugs=False,
        suppress_health_check=_SUPPRESS,
    )
    settings.register_profile(
        "mutants",
        max_examples=CI_MAX_EXAMPLES,
        stateful_step_count=CI_STEPS,
        derandomize=True,
        database=None,
        deadline=None,
        report_multiple_bugs=False,
        phases=[Phase.explicit, Phase.reuse, Phase.generate, Phase.target],
        suppress_health_check=_SUPPRESS,
    )


def load_profile_from_env(default: str = "dev") -> str:
    """Register the profiles and load ``$HYPOTHESIS_PROFILE`` (or ``default``); returns its name."""
    register_profiles()
    name = os.environ.get("HYPOTHESIS_PROFILE", default)
    settings.load_profile(name)
    return name
