"""``kvpool --help``: fast (no torch at start-up), complete (every option explained, every default
shown), and not cut mid-sentence."""

from __future__ import annotations

import argparse
import subprocess
import sys
import time
from pathlib import Path

import pytest

from kvpool.cli import build_parser

ROOT = Path(__file__).resolve().parents[2]
HEAVY = ("torch", "triton", "numpy", "hypothesis", "matplotlib", "tqdm", "ray")
HELP_SECONDS = 1.0
"""Bound on ``kvpool --help`` wall time: ~0.15 s measured; importing torch alone takes ~2 s."""


def _python(code: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          timeout=60, env={"PYTHONPATH": str(ROOT)}, cwd=ROOT)  # fmt: skip


def test_building_the_parser_imports_nothing_heavy() -> None:
    code = ("import sys; from kvpool.cli import build_parser; build_parser(); "
            f"print(sorted(m for m in sys.modules if m.split('.')[0] in {HEAVY!r}))")  # fmt: skip
    done = _python(code)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "[]"


@pytest.mark.slow
def test_help_starts_fast() -> None:
    best = float("inf")
    for _ in range(3):
        start = time.perf_counter()
        done = subprocess.run([sys.executable, "-m", "kvpool", "--help"], capture_output=True,
                              text=True, timeout=60, env={"PYTHONPATH": str(ROOT)})  # fmt: skip
        best = min(best, time.perf_counter() - start)
        assert done.returncode == 0 and "usage: kvpool" in done.stdout
    assert best < HELP_SECONDS


def _subparsers() -> dict[str, argparse.ArgumentParser]:
    parser = build_parser()
    (sub,) = [a for a in parser._actions if isinstance(a, argparse._SubParsersAction)]
    return dict(sub.choices)


def test_top_level_help_is_whole() -> None:
    text = build_parser().format_help()
    for command in ("verify", "diff-kernel", "replay", "bench", "--debug", "exit codes"):
        assert command in text
    description = build_parser().description or ""
    assert description.endswith(".") and "kvpool" in description


@pytest.mark.parametrize("command", ["verify", "diff-kernel", "replay", "bench"])
def test_every_option_is_explained_with_its_default(command: str) -> None:
    parser = _subparsers()[command]
    text = " ".join(parser.format_help().split())
    assert "``" not in text and ":func:" not in text  # docstring markup, not for a terminal
    for action in parser._actions:
        if isinstance(action, argparse._HelpAction):
            continue
        assert action.help, f"{command} {action.dest}: no help"
        if action.default is not None and action.default is not False:
            shown = ",".join(map(str, action.default)) if isinstance(action.default, tuple) else (
                str(action.default))  # fmt: skip
            assert f"(default: {shown})" in text, f"{command} {action.dest}"
        elif action.default is None and action.option_strings and not action.required:
            assert "default" in action.help, f"{command} {action.dest}: what does None mean?"
