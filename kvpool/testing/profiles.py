"""Hypothesis profiles registered by kvpool.

- ``ci``: deterministic (derandomized, no example database), bounded; the test command uses it.
- ``dev``: the default for local runs; random, with the local example database.
- ``nightly``: deep and unseeded, for long campaigns.
- ``mutants``: for the seeded-bug quality suite: deterministic and no shrinking phase, so a kill
  is counted fast.

Select one with ``HYPOTHESIS_PROFILE=<name>`` (tests/conftest.py loads it).
"""

from __future__ import annotations

import os

from hypothesis import HealthCheck, Phase, settings

_SUPPRESS = [HealthCheck.too_slow, HealthCheck.data_too_large, HealthCheck.filter_too_much]

PROFILES = ("ci", "dev", "nightly", "mutants")


def register_profiles() -> None:
    """Register the four profiles (idempotent)."""
    settings.register_profile(
        "ci",
        max_examples=60,
        stateful_step_count=40,
        derandomize=True,
        database=None,
        deadline=None,
        print_blob=True,
        suppress_health_check=_SUPPRESS,
    )
    settings.register_profile(
        "dev",
        max_examples=100,
        stateful_step_count=50,
        deadline=None,
        print_blob=True,
        suppress_health_check=_SUPPRESS,
    )
    settings.register_profile(
        "nightly",
        max_examples=5000,
        stateful_step_count=200,
        deadline=None,
        print_blob=True,
        suppress_health_check=_SUPPRESS,
    )
    settings.register_profile(
        "mutants",
        max_examples=300,
        stateful_step_count=60,
        derandomize=True,
        database=None,
        deadline=None,
        phases=[Phase.explicit, Phase.reuse, Phase.generate, Phase.target],
        suppress_health_check=_SUPPRESS,
    )


def load_profile_from_env(default: str = "dev") -> str:
    """Register the profiles and load ``$HYPOTHESIS_PROFILE`` (or ``default``); returns its name."""
    register_profiles()
    name = os.environ.get("HYPOTHESIS_PROFILE", default)
    settings.load_profile(name)
    return name
