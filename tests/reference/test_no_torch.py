"""The reference and the invariants are pure Python: importing them never imports torch."""

from __future__ import annotations

import subprocess
import sys

import pytest

PROBE = (
    "import sys, importlib, types\n"
    "{setup}"
    "importlib.import_module({module!r})\n"
    "loaded = sorted(m for m in sys.modules if m.split('.')[0] in ('torch', 'triton'))\n"
    "print(','.join(loaded))\n"
)


def loaded_after_import(module: str, setup: str = "") -> str:
    """Names of torch/triton modules present after importing ``module`` in a fresh process."""
    code = PROBE.format(module=module, setup=setup)
    result = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True, timeout=120
    )
    return result.stdout.strip()


@pytest.mark.parametrize("module", ["kvpool.reference", "kvpool.invariants"])
def test_import_does_not_load_torch(module: str) -> None:
    assert loaded_after_import(module) == ""


def test_the_probe_can_fail() -> None:
    """Sanity: the probe reports torch when something has loaded it (a stand-in, for speed)."""
    fake = "sys.modules['torch'] = types.ModuleType('torch')\n"
    assert loaded_after_import("kvpool.reference", setup=fake) == "torch"
