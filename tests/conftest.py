"""Test-wide setup: hypothesis profiles, the opt-in SGLang wheel flag."""

from __future__ import annotations

import importlib
import os
import pkgutil

import pytest

import kvpool
import tests
from kvpool.testing.profiles import load_profile_from_env

# The optimized twin runs in checked mode throughout the suite (it raises the reference's typed
# errors on misuse); tests of the unchecked hot path pass checked=False explicitly.
os.environ.setdefault("KVPOOL_CHECKED", "1")

load_profile_from_env()


def _import_every_local_module() -> None:
    """Hypothesis mixes constants found in local modules into its draws, rescanning whenever
    ``sys.modules`` grows. Importing every kvpool and test-helper module up front fixes that set
    before any test runs, so a derandomized run draws the same examples whatever the test order
    or the xdist split."""
    for package in (kvpool, tests):
        for info in pkgutil.walk_packages(package.__path__, package.__name__ + "."):
            leaf = info.name.rpartition(".")[2]
            if not leaf.startswith("test_") and leaf not in ("__main__", "conftest"):
                importlib.import_module(info.name)


_import_every_local_module()


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption(
        "--run-sglang-wheel",
        action="store_true",
        default=False,
        help="download SGLang's published wheel and run the kernel harness on its kernels",
    )


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    if config.getoption("--run-sglang-wheel"):
        return
    skip = pytest.mark.skip(reason="opt-in: pass --run-sglang-wheel")
    for item in items:
        if "sglang_wheel" in item.keywords:
            item.add_marker(skip)
