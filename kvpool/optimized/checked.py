"""The checked-mode switch of the optimized twin.

Checked mode decides the checks that need a device-to-host read (the values inside a tensor):
slots out of range or reserved, double frees, ``last_loc`` of a free page, a host copy that
differs from its device tensor, tree values of slot 0. On, the twin raises the reference's typed
:class:`kvpool.errors.KVPoolError` subclass and changes nothing; off, the hot paths skip those
reads (no sync, no membership mask) and misuse corrupts silently, as in SGLang.

Checks that need no device read (lengths, shapes, dtypes, host integers and host copies of the
lengths, configuration values) are always on, in both modes and in both twins.

Resolution of ``checked=None``: the environment variable :data:`CHECKED_ENV_VAR` when set
(``"1"`` on, ``"0"`` off), else ON for CPU tensors and OFF on any other device (a CUDA engine
asks for speed; a CPU user gets safety). Every kvpool tool (verify, replay, the bench harness's
correctness runs) passes ``checked=True`` explicitly.
"""

from __future__ import annotations

import os
from typing import Final

import torch

from kvpool.errors import ConfigError

CHECKED_ENV_VAR: Final[str] = "KVPOOL_CHECKED"
"""Environment variable read when ``checked`` is ``None``: ``"1"`` on, ``"0"`` off."""


def resolve_checked(checked: bool | None, device: str | torch.device = "cpu") -> bool:
    """The effective mode: ``checked`` itself when given; else ``$KVPOOL_CHECKED`` when set to
    ``"1"`` or ``"0"``; else on exactly for a CPU ``device``. ConfigError for another value of
    the variable (a typo must not silently turn the checks off)."""
    if checked is not None:
        if not isinstance(checked, bool):
            raise ConfigError(f"checked must be True, False or None, got {checked!r}")
        return checked
    env = os.environ.get(CHECKED_ENV_VAR, "").strip()
    if env in ("0", "1"):
        return env == "1"
    if env:
        raise ConfigError(f"${CHECKED_ENV_VAR} must be '0' or '1', got {env!r}")
    return torch.device(device).type == "cpu"
