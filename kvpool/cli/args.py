"""Shared argument machinery of the ``kvpool`` command line (imports nothing heavy).

- :class:`CLIError`: bad input found by a subcommand before its work starts; ``kvpool.cli.main``
  prints it as one line ``kvpool: error: ...`` and exits 2.
- :class:`Parser`: an ``ArgumentParser`` whose usage errors raise :class:`CLIError` instead of
  printing the usage block, so every bad invocation ends in the same one line.
- :class:`HelpFormatter`: raw descriptions and epilogs, and ``(default: X)`` after every option
  whose default is a value (options defaulting to None say in their help what None means).
- ``type=`` validators, each naming the bad value and what is expected: :func:`positive_int`,
  :func:`non_negative_int`, :func:`positive_float`, :func:`power_of_two`,
  :func:`power_of_two_list`, :func:`output_path`, :func:`plot_path`, :func:`callable_spec`.
"""

from __future__ import annotations

import argparse
import math
import os
import re
from pathlib import Path
from typing import Any, NoReturn

from kvpool.errors import KVPoolError

PLOT_SUFFIXES = (".png", ".pdf", ".svg")
"""File types ``--plot`` writes (matplotlib picks the format from the suffix)."""

_MODULE = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*(\.[A-Za-z_][A-Za-z0-9_]*)*$")


class CLIError(KVPoolError):
    """Bad command-line input, reported as one line and exit code 2 before any work starts."""


class Parser(argparse.ArgumentParser):
    """An ``ArgumentParser`` that raises :class:`CLIError` (the message names the parser, for
    example ``kvpool replay: argument --page-size: ...``) instead of printing usage and exiting.
    Subparsers are built with the same class."""

    def error(self, message: str) -> NoReturn:
        raise CLIError(f"{self.prog}: {message} (see {self.prog} --help)")


class HelpFormatter(argparse.RawDescriptionHelpFormatter):
    """Keeps descriptions and epilogs as written; appends ``(default: X)`` to an option's help
    unless the help already shows it or the default is None, False or suppressed."""

    def _get_help_string(self, action: argparse.Action) -> str:
        text = action.help or ""
        default = action.default
        if (
            "%(default)" in text
            or default is None
            or default is False
            or default == argparse.SUPPRESS
        ):
            return text
        if action.option_strings or action.nargs in (argparse.OPTIONAL, argparse.ZERO_OR_MORE):
            shown = (
                ",".join(map(str, default)) if isinstance(default, list | tuple) else "%(default)s"
            )
            return f"{text} (default: {shown})"
        return text


def _bad(text: str, expected: str) -> argparse.ArgumentTypeError:
    return argparse.ArgumentTypeError(f"got {text!r}, expected {expected}")


def _int(text: str, expected: str) -> int:
    try:
        return int(text)
    except ValueError:
        raise _bad(text, expected) from None


def positive_int(text: str) -> int:
    """An integer >= 1."""
    value = _int(text, "a positive integer")
    if value < 1:
        raise _bad(text, "a positive integer")
    return value


def non_negative_int(text: str) -> int:
    """An integer >= 0."""
    value = _int(text, "an integer >= 0")
    if value < 0:
        raise _bad(text, "an integer >= 0")
    return value


def positive_float(text: str) -> float:
    """A finite number > 0 (``nan``, ``inf``, 0 and negatives are refused)."""
    try:
        value = float(text)
    except ValueError:
        raise _bad(text, "a positive finite number") from None
    if not math.isfinite(value) or value <= 0:
        raise _bad(text, "a positive finite number")
    return value


def power_of_two(text: str) -> int:
    """A positive power of two (1, 2, 4, ...): a page size."""
    value = _int(text, "a positive power of two")
    if value < 1 or value & (value - 1):
        raise _bad(text, "a positive power of two")
    return value


def power_of_two_list(text: str) -> tuple[int, ...]:
    """Comma-separated positive powers of two (``1,4,16``)."""
    parts = text.split(",")
    try:
        return tuple(power_of_two(p.strip()) for p in parts)
    except argparse.ArgumentTypeError:
        raise _bad(text, "comma-separated positive powers of two, like 1,4,16") from None


def output_path(text: str) -> Path:
    """A file kvpool may write: not a directory, its folder exists and is writable (checked when
    the arguments are parsed, so a bad path fails before the work, not after it)."""
    path = Path(text)
    parent = path.parent if str(path.parent) else Path(".")
    if not text or path.is_dir():
        raise _bad(text, "a file path, not a directory")
    if not parent.is_dir():
        raise _bad(text, f"a file in an existing folder ({parent} does not exist)")
    if not os.access(parent, os.W_OK) or (path.exists() and not os.access(path, os.W_OK)):
        raise _bad(text, "a file path kvpool may write (permission denied)")
    return path


def plot_path(text: str) -> Path:
    """An :func:`output_path` ending in one of :data:`PLOT_SUFFIXES`."""
    path = output_path(text)
    if path.suffix.lower() not in PLOT_SUFFIXES:
        raise _bad(text, f"a file name ending in {', '.join(PLOT_SUFFIXES)}")
    return path


def callable_spec(text: str) -> str:
    """``MODULE:NAME`` (a dotted module name) or ``path/to/file.py:NAME`` (an existing file);
    whether the module imports and has NAME is checked when the subcommand loads it."""
    expected = "MODULE:NAME or path/to/file.py:NAME"
    module, sep, name = text.rpartition(":")
    if not sep or not name.isidentifier():
        raise _bad(text, expected)
    if module.endswith(".py"):
        if not Path(module).is_file():
            raise _bad(text, f"{expected} ({module}: no such file)")
    elif not _MODULE.match(module):
        raise _bad(text, expected)
    return text


def fail(message: str) -> NoReturn:
    """Raise :class:`CLIError` (one line, exit 2): for checks that need several arguments."""
    raise CLIError(message)


_ROLE = re.compile(r":[a-z]+:`~?([^`]+)`")


def check_checked_env(command: str) -> None:
    """Refuse (one line, exit 2) a ``$KVPOOL_CHECKED`` other than unset, ``0`` or ``1``: the
    twin reads it to choose its checked mode, and a typo must not silently change the mode."""
    from kvpool.errors import ConfigError
    from kvpool.optimized.checked import resolve_checked

    try:
        resolve_checked(None)
    except ConfigError as exc:
        fail(f"{command}: {exc}")


def plain(text: str) -> str:
    """A docstring as terminal text: ``code`` and :role:`target` markup dropped."""
    return _ROLE.sub(r"\1", text).replace("``", "")


def add_parser(sub: Any, name: str, **kwargs: Any) -> Parser:
    """``sub.add_parser(name, ...)`` with :class:`HelpFormatter` (a subparsers object) and the
    ``description`` (a module docstring, usually) as :func:`plain` text."""
    kwargs.setdefault("formatter_class", HelpFormatter)
    if kwargs.get("description"):
        kwargs["description"] = plain(kwargs["description"])
    parser: Parser = sub.add_parser(name, **kwargs)
    return parser
