"""A candidate that kills its own process: the reference allocator, except that an allocation
of exactly 3 pages raises SIGSEGV (as a wild kernel pointer would), and one of exactly 5 pages
hangs. Used by the worker-process tests (``--impl tests.harness.crashy_impl:crashy``)."""

from __future__ import annotations

import os
import signal
import time
from typing import Any

from kvpool.config import PoolConfig
from kvpool.testing.bundle import Implementation
from kvpool.testing.implementations import reference_implementation


class _Crashy:
    def __init__(self, inner: Any, hang: bool) -> None:
        self._inner, self._hang = inner, hang

    def __getattr__(self, name: str) -> Any:
        return getattr(self._inner, name)

    def alloc(self, need_size: int) -> Any:
        pages = need_size // self._inner.page_size
        if pages == 3:
            os.kill(os.getpid(), signal.SIGSEGV)
        if pages == 5 and self._hang:
            time.sleep(3600)
        return self._inner.alloc(need_size)


def crashy(hang: bool = False) -> Implementation:
    base = reference_implementation()
    assert base.allocator is not None
    make = base.allocator

    def allocator(config: PoolConfig) -> Any:
        return _Crashy(make(config), hang)

    return Implementation("crashy", allocator=allocator)


def hangy() -> Implementation:
    return crashy(hang=True)
