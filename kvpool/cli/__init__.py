"""The ``kvpool`` command line. Each subcommand lives in its own module exposing
``register(subparsers)``, which adds its parser and sets ``func`` to a ``(args) -> int`` runner.

Subcommands: ``verify`` (the main job), ``diff-kernel``, ``replay``, ``bench``.
"""

from __future__ import annotations

import argparse
import importlib
import sys
from collections.abc import Sequence

_SUBCOMMAND_MODULES = (
    "kvpool.cli.verify",
    "kvpool.cli.diff_kernel",
    "kvpool.cli.replay",
    "kvpool.cli.bench",
)


def build_parser() -> argparse.ArgumentParser:
    """The top-level parser with every subcommand (a missing module is an install error)."""
    parser = argparse.ArgumentParser(prog="kvpool", description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="command", required=True)
    for name in _SUBCOMMAND_MODULES:
        importlib.import_module(name).register(sub)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the ``kvpool`` script; returns the process exit code."""
    args = build_parser().parse_args(argv)
    code: int = args.func(args)
    return code


if __name__ == "__main__":
    sys.exit(main())
