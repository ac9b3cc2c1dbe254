"""A deterministic time source for SGLang's radix cache.

SGLang stamps ``last_access_time`` / ``creation_time`` from ``time.monotonic()``, read several
times per operation (once per walk, once per node created). kvpool's reference reads an
injectable logical clock once per walk (1.0, 2.0, ...). :func:`install_clock` replaces the
``time`` global of SGLang's loaded ``radix_cache`` module (only that module: the real ``time``
module is untouched) by :class:`FrozenTime`, whose ``monotonic()`` returns the tick set by the
innermost :func:`frozen_at` block plus a tiny increment per read (:data:`READ_STEP`): like the
real clock, every read is later than the one before, so nodes stamped in one operation keep
SGLang's creation order (which decides ties between equal-priority leaves, as kvpool's reference
does with node ids), while the adapter's snapshot reports the tick (``floor``), which is what
kvpool's reference stamps. Outside such a block it is the real ``time.monotonic``. Every other
``time`` attribute is the real one (``perf_counter`` feeds only SGLang's metrics).
"""

from __future__ import annotations

import contextlib
import contextvars
import time
from collections.abc import Iterator
from typing import Any

_NOW: contextvars.ContextVar[list[float] | None] = contextvars.ContextVar(
    "kvpool_sglang_now", default=None
)

READ_STEP = 2.0**-20
"""How much later each read inside one operation is (far below one tick: an operation reads
the clock a few hundred times at most)."""


class FrozenTime:
    """Stands for the ``time`` module inside SGLang's radix cache module."""

    def monotonic(self) -> float:
        now = _NOW.get()
        if now is None:
            return time.monotonic()
        now[1] += READ_STEP
        return now[0] + now[1]

    def __getattr__(self, name: str) -> Any:
        return getattr(time, name)


@contextlib.contextmanager
def frozen_at(now: float) -> Iterator[None]:
    """Within this block SGLang's radix cache reads ``now`` (plus :data:`READ_STEP` per read
    already made in the block) from ``time.monotonic()``."""
    token = _NOW.set([now, 0.0])
    try:
        yield
    finally:
        _NOW.reset(token)


def install_clock(module: Any) -> None:
    """Give SGLang's loaded ``module`` the :class:`FrozenTime` clock (idempotent)."""
    if not isinstance(module.__dict__.get("time"), FrozenTime):
        module.time = FrozenTime()


__all__ = ["FrozenTime", "frozen_at", "install_clock"]
