"""Test-wide setup: hypothesis profiles, the opt-in SGLang wheel flag."""

from __future__ import annotations

import os

import pytest

from kvpool.testing.profiles import load_profile_from_env

# The optimized twin runs in checked mode throughout the suite (it raises the reference's typed
# errors on misuse); tests of the unchecked hot path pass checked=False explicitly.
os.environ.setdefault("KVPOOL_CHECKED", "1")

load_profile_from_env()


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
