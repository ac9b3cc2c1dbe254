"""A deterministic time source for SGLang's radix cache.

SGLang stamps ``last_access_time`` / ``creation_time`` from ``time.monotonic()``, read several
times per operation (once per walk, once per node created). kvpool's reference reads an
injectable logical clock once per walk (1.0, 2.0, ...). :func:`install_clock` replaces the
``time`` global of SGLang's loaded ``radix_cache`` module (only that module: the real ``time``
module is untouched) by :class:`FrozenTime`, whose ``monotonic()`` returns the value set by the
innermost :func:`frozen_at` block, so every read inside one adapter operation returns the same
tick. Outside such a block it is the real ``time.monotonic``. Every other ``time`` attribute is
the real one (``perf_counter`` feeds only SGLang's metrics).
"""

from __future__ import annotations

import contextlib
import contextvars
import time
from collections.abc import Iterator
from typing import Any

_NOW: contextvars.ContextVar[float | None] = contextvars.ContextVar(
    "kvpool_sglang_now", default=None
)


class FrozenTime:
    """Stands for the ``time`` module inside SGLang's radix cache module."""

    def monotonic(self) -> float:
        now = _NOW.get()
        return time.monotonic() if now is None else now

    def __getattr__(self, name: str) -> Any:
        return getattr(time, name)


@contextlib.contextmanager
def frozen_at(now: float) -> Iterator[None]:
    """Within this block SGLang's radix cache reads ``now`` from ``time.monotonic()``."""
    token = _NOW.set(now)
    try:
        yield
    finally:
        _NOW.reset(token)


def install_clock(module: Any) -> None:
    """Give SGLang's loaded ``module`` the :class:`FrozenTime` clock (idempotent)."""
    if not isinstance(module.__dict__.get("time"), FrozenTime):
        module.time = FrozenTime()


__all__ = ["FrozenTime", "frozen_at", "install_clock"]
