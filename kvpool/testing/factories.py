"""Factories ``(PoolConfig) -> MemoryManagerProtocol`` for the lockstep harness and its CLIs.

:func:`reference_factory` builds the pure-Python reference; :func:`optimized_factory` returns a
factory of the torch twin with a chosen kernel backend and checked mode; :func:`load_factory`
imports a user's factory named ``MODULE:NAME`` or ``file.py:NAME`` (``kvpool verify --impl``,
``kvpool diff-kernel``).
"""

from __future__ import annotations

import importlib
import importlib.util
import os
import sys
from pathlib import Path
from types import ModuleType
from typing import Any

from kvpool.config import PoolConfig
from kvpool.testing.lockstep_driver import Factory


def reference_factory(config: PoolConfig) -> Any:
    """The pure-Python reference memory manager."""
    from kvpool.reference.lifecycle.memory_manager import MemoryManager

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

        from kvpool.optimized.lifecycle.memory_manager import MemoryManager

        if torch.get_num_threads() != 1:
            torch.set_num_threads(1)
        return MemoryManager(config, checked=checked, kernel_backend=backend)

    return build


def import_user_module(name: str) -> ModuleType:
    """Import module ``name``: a dotted module name, searched in the current directory first
    (as ``python -m`` does: the installed ``kvpool`` script does not, and a user's module lives
    in their project), or a path to a ``.py`` file (``./mine.py``, ``src/kernels.py``), loaded
    under its stem. Raises ImportError when neither exists (or the module fails to import)."""
    if name.endswith(".py"):
        path = Path(name)
        if not path.is_file():
            raise ImportError(f"no such file: {name}")
        spec = importlib.util.spec_from_file_location(path.stem, path)
        if spec is None or spec.loader is None:
            raise ImportError(f"cannot load {name} as a Python module")
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
        return module
    if os.getcwd() not in sys.path and "" not in sys.path:
        sys.path.insert(0, os.getcwd())
    return importlib.import_module(name)


def load_factory(spec: str, what: str = "FACTORY") -> Factory:
    """``MODULE:NAME`` or ``path/to/file.py:NAME`` -> that callable (for ``kvpool verify
    --impl`` a factory ``(PoolConfig) -> MemoryManagerProtocol``; ``kvpool diff-kernel`` loads
    its kernel function here too, ``what`` naming the callable in messages).

    The module is found by :func:`import_user_module` (``tests.mine:factory`` from the project
    root). Raises ValueError for a malformed spec or a missing name, ImportError for a missing
    module, TypeError for a non-callable."""
    module_name, sep, attr = spec.rpartition(":")
    if not sep or not module_name or not attr:
        raise ValueError(f"expected MODULE:{what} or path/to/file.py:{what}, got {spec!r}")
    module = import_user_module(module_name)
    factory = getattr(module, attr, None)
    if factory is None:
        raise ValueError(f"module {module_name} has no attribute {attr!r}")
    if not callable(factory):
        raise TypeError(f"{spec} is not callable")
    built: Factory = factory
    return built
