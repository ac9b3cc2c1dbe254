"""The checked-mode switch of the optimized twin.

Every optimized component takes ``checked: bool | None``. ``True`` turns on the reference's misuse
checks (double free, reserved or out-of-range index, freeing what is not allocated, bad extend
arguments...): the twin then raises the same typed :class:`kvpool.errors.KVPoolError` subclass as
the reference and changes nothing. ``False`` skips every check that would cost a tensor operation,
a device-to-host sync or a scan of a free list, so the hot paths pay nothing for it. ``None``
reads the environment variable :data:`CHECKED_ENV_VAR` (``"1"`` means on); the default is off.

Checks on plain host integers (a negative size, a non-aligned paged ``alloc``, a row or column
out of range in a table write) cost nanoseconds and are always done, in both modes.
"""

from __future__ import annotations

import os
from typing import Final

CHECKED_ENV_VAR: Final[str] = "KVPOOL_CHECKED"
"""Environment variable read when ``checked`` is ``None``; ``"1"`` turns checked mode on."""


def resolve_checked(checked: bool | None) -> bool:
    """The effective mode: ``checked`` itself when given, else ``$KVPOOL_CHECKED == "1"``."""
    if checked is not None:
        return bool(checked)
    return os.environ.get(CHECKED_ENV_VAR, "").strip() == "1"
