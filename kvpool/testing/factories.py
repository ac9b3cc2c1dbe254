"""Factories ``(PoolConfig) -> MemoryManagerProtocol`` for the lockstep harness and its CLIs.

:func:`reference_factory` builds the pure-Python reference; :func:`optimized_factory` returns a
factory of the torch twin with a chosen kernel backend and checked mode; :func:`load_factory`
imports a user's factory named ``MODULE:NAME`` (``kvpool verify --impl``).
"""

from __future__ import annotations

import importlib
from typing import Any

from kvpool.config import PoolConfig
from kvpool.testing.lockstep_driver import Factory


def reference_factory(config: PoolConfig) -> Any:
    """The pure-Python reference memory manager."""
    from kvpool.reference.memory_manager import MemoryManager

    return MemoryManager(config)


def optimized_factory(backend: str | None = "torch", checked: bool = True) -> Factory:
    """A factory of the optimized twin on the CPU (checked mode unless ``checked=False``, as the
    quality suite's mutants run), its kernels run by ``backend``
    (``torch`` fallbacks, ``interpret`` for Triton through the interpreter, None: default). The
    twin is imported on the first build, which also sets torch to ONE intra-op thread: lockstep
    tensors are tiny, and on a loaded 2-core machine OpenMP workers only contend (a 40-element
    ``repeat_interleave`` takes ~15 ms with 2 threads under load, ~10 us with 1)."""

    def build(config: PoolConfig) -> Any:
        import torch

        from kvpool.optimized.memory_manager import MemoryManager

        if torch.get_num_threads() != 1:
            torch.set_num_threads(1)
        return MemoryManager(config, checked=checked, kernel_backend=backend)

    return build


def load_factory(spec: str) -> Factory:
    """``MODULE:NAME`` -> that callable (a factory ``(PoolConfig) -> MemoryManagerProtocol``)."""
    module_name, sep, attr = spec.partition(":")
    if not sep or not module_name or not attr:
        raise ValueError(f"expected MODULE:FACTORY, got {spec!r}")
    factory = getattr(importlib.import_module(module_name), attr)
    if not callable(factory):
        raise TypeError(f"{spec} is not callable")
    built: Factory = factory
    return built
