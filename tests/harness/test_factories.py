"""The project's factories: the twin takes its kernel backend and checked mode at construction."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from kvpool.config import PoolConfig
from kvpool.optimized.lifecycle.memory_manager import MemoryManager
from kvpool.testing.factories import load_factory, optimized_factory, reference_factory


@pytest.mark.parametrize("page_size", [1, 4])
def test_kernel_backend_reaches_the_allocator(page_size: int) -> None:
    config = PoolConfig(size=32, page_size=page_size)
    assert MemoryManager(config).token_to_kv_pool_allocator.kernel_backend is None
    built = MemoryManager(config, kernel_backend="interpret")
    assert built.token_to_kv_pool_allocator.kernel_backend == "interpret"


def test_optimized_factory_passes_backend_and_checked_mode() -> None:
    manager = optimized_factory("torch", checked=False)(PoolConfig(size=32, page_size=2))
    assert manager.token_to_kv_pool_allocator.kernel_backend == "torch"
    assert manager.token_to_kv_pool_allocator.checked is False
    default = optimized_factory(None)(PoolConfig(size=32, page_size=2))
    assert default.token_to_kv_pool_allocator.kernel_backend is None
    assert default.token_to_kv_pool_allocator.checked is True


def test_load_factory_resolves_module_and_name() -> None:
    assert load_factory("kvpool.testing.factories:reference_factory") is reference_factory
    with pytest.raises(ValueError, match="MODULE:FACTORY"):
        load_factory("kvpool.testing.factories")
    with pytest.raises(TypeError, match="not callable"):
        load_factory("kvpool.constants:RESERVED_INDEX")
    with pytest.raises(ValueError, match="no attribute 'nope'"):
        load_factory("kvpool.testing.factories:nope")


def test_load_factory_finds_a_module_of_the_current_directory(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The installed ``kvpool`` script does not put the current directory on sys.path.
    (tmp_path / "kvpool_user_factory.py").write_text("def build(config):\n    return config\n")
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(sys, "path", [p for p in sys.path if p not in ("", str(tmp_path))])
    monkeypatch.delitem(sys.modules, "kvpool_user_factory", raising=False)
    factory = load_factory("kvpool_user_factory:build")
    assert factory(PoolConfig(size=8)) == PoolConfig(size=8)
    with pytest.raises(ImportError):
        load_factory("kvpool_no_such_module:build")
