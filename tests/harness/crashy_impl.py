"""Candidates that break the process or start broken, for the worker-process tests
(``--impl tests.harness.crashy_impl:NAME``): the reference allocator, except that an
allocation of exactly 3 pages raises SIGSEGV (as a wild kernel pointer would) in ``crashy``,
sleeps for an hour in ``hangy``, kills the Ray worker that started its process in
``ray_killer`` (outside Ray it never breaks), ``born_broken`` lists the reserved page 0 as
free, ``one_thread_only`` cannot be built where torch has more than one intra-op thread, and
``noisy`` logs a warning at every allocation."""

from __future__ import annotations

import dataclasses
import logging
import os
import signal
import time
from collections.abc import Callable
from typing import Any

from kvpool.config import PoolConfig
from kvpool.testing.bundle import Implementation
from kvpool.testing.implementations import reference_implementation

CRASH_PAGES = 3
"""The allocation size (pages) that breaks the candidate."""


class _Delegate:
    """Everything as ``inner`` does it, but what a subclass overrides."""

    def __init__(self, inner: Any) -> None:
        self._inner = inner

    def __getattr__(self, name: str) -> Any:
        return getattr(self._inner, name)


class _Breaking(_Delegate):
    def __init__(self, inner: Any, how: str) -> None:
        super().__init__(inner)
        self._how = how

    def alloc(self, need_size: int) -> Any:
        if need_size // self._inner.page_size == CRASH_PAGES:
            if self._how == "kill-ray-worker":
                if _parent_is_a_ray_worker():
                    time.sleep(0.5)  # the task's checkpoint of the ops so far goes out
                    os.kill(os.getppid(), signal.SIGKILL)
                    time.sleep(0.5)
                    os._exit(1)
                return self._inner.alloc(need_size)
            if self._how == "segv":
                os.kill(os.getpid(), signal.SIGSEGV)
            time.sleep(3600)
        return self._inner.alloc(need_size)


def _parent_is_a_ray_worker() -> bool:
    """Ray titles its worker processes ``ray::TASK``."""
    try:
        with open(f"/proc/{os.getppid()}/cmdline", "rb") as f:
            return f.read().startswith(b"ray::")
    except OSError:
        return False


def _around_reference(name: str, wrap: Callable[[Any], Any]) -> Implementation:
    """The reference allocator, each one built wrapped by ``wrap``."""
    make = reference_implementation().allocator
    assert make is not None

    def allocator(config: PoolConfig) -> Any:
        return wrap(make(config))

    return Implementation(name, allocator=allocator)


def _wrapped(how: str) -> Implementation:
    return _around_reference(f"breaking[{how}]", lambda inner: _Breaking(inner, how))


def crashy() -> Implementation:
    return _wrapped("segv")


def hangy() -> Implementation:
    return _wrapped("hang")


def ray_killer() -> Implementation:
    return _wrapped("kill-ray-worker")


def born_broken() -> Implementation:
    make = reference_implementation().allocator
    assert make is not None

    def allocator(config: PoolConfig) -> Any:
        alloc = make(config)
        alloc.restore_state(((1, 2), ()))
        alloc.free_pages = [0, *alloc.free_pages]  # the reserved page listed as free
        alloc._free_set.add(0)
        return alloc

    return Implementation("born-broken", allocator=allocator)


class _Noisy(_Delegate):
    """An allocator that logs a warning at every allocation (as SGLang's own pools log theirs)."""

    def alloc(self, need_size: int) -> Any:
        logging.getLogger("noisy.pool").warning("asked for %d slots", need_size)
        return self._inner.alloc(need_size)


def noisy() -> Implementation:
    return _around_reference("noisy", _Noisy)


def one_thread_only() -> Implementation:
    make = reference_implementation().allocator
    assert make is not None

    def allocator(config: PoolConfig) -> Any:
        import torch

        threads = torch.get_num_threads()
        if threads != 1:
            raise RuntimeError(f"torch has {threads} intra-op threads in this worker")
        return make(config)

    return Implementation("one-thread-only", allocator=allocator)


class _CrashingEviction(_Delegate):
    """The twin's lifecycle, except that an eviction that frees something raises SIGSEGV."""

    def evict(self, num_tokens: int) -> int:
        freed = int(self._inner.evict(num_tokens))
        if freed > 0:
            os.kill(os.getpid(), signal.SIGSEGV)
        return freed


def crashy_manager() -> Implementation:
    """The torch twin whose ``evict`` kills its process once the tree had something to free:
    a crash a few operations deep (a request must finish into the tree first)."""
    from kvpool.testing.implementations import optimized_implementation

    twin = optimized_implementation("torch")
    make = twin.manager
    assert make is not None

    def manager(config: PoolConfig, **parts: Any) -> Any:
        return _CrashingEviction(make(config, **parts))

    return dataclasses.replace(twin, label="crashy-manager", manager=manager)
