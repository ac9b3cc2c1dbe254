"""The bad-input suite runs the optimized twin under the library's own default checked mode."""

from __future__ import annotations

from tests.bad_inputs.harness import default_checked_mode

__all__ = ["default_checked_mode"]
