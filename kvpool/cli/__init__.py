"""The ``kvpool`` command line.

Each subcommand lives in its own module exposing ``register(subparsers)``, which adds its parser
and sets ``func`` to a ``(args) -> int`` runner; a module imports only light things at the top
(torch, numpy, hypothesis inside its runner), so ``kvpool --help`` starts fast.

Errors and exit codes (``main``):

- 0 success; 1 the check ran and found a failure (``verify``, ``diff-kernel``, ``sessions``);
- 2 bad input: an unknown option, a bad value, a missing or malformed file, an unwritable output
  path, an ``--impl`` that does not load. One line ``kvpool: error: ...`` on stderr naming the
  value and what is expected, printed before any work starts
  (:class:`kvpool.cli.args.CLIError`; subcommands turn input errors of the library, such as a
  trace line that is not a record, into one);
- 3 an internal error: an exception nobody expected (a bug in kvpool or in the code given to
  it). One line ``kvpool: internal error: ...`` that says to rerun with ``--debug``, which shows
  the traceback instead; 3 keeps it apart from a usage error (2) and a verdict (1);
- 130 interrupted (Ctrl-C).
"""

from __future__ import annotations

import importlib
import sys
from collections.abc import Sequence

from kvpool.cli.args import CLIError, HelpFormatter, Parser

_SUBCOMMAND_MODULES = (
    "kvpool.cli.verify",
    "kvpool.cli.diff_kernel",
    "kvpool.cli.replay",
    "kvpool.cli.sessions",
    "kvpool.cli.bench",
)

DESCRIPTION = "kvpool: a verified model of SGLang's KV-cache memory pool."

EPILOG = """\
main job: `kvpool verify` (lockstep campaign, reference vs optimized twin).
`kvpool COMMAND --help` shows a command's options and their defaults.
exit codes: 0 ok, 1 a failure found, 2 bad input (one line on stderr, before any work),
3 internal error (one line; rerun with --debug for the traceback), 130 interrupted.
"""

EXIT_OK, EXIT_FAILURE, EXIT_USAGE, EXIT_INTERNAL, EXIT_INTERRUPTED = 0, 1, 2, 3, 130


def build_parser() -> Parser:
    """The top-level parser with every subcommand (a missing module is an install error)."""
    parser = Parser(prog="kvpool", description=DESCRIPTION, epilog=EPILOG,
                    formatter_class=HelpFormatter)  # fmt: skip
    parser.add_argument("--debug", action="store_true",
                        help="show the full traceback of an unexpected error")  # fmt: skip
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    for name in _SUBCOMMAND_MODULES:
        importlib.import_module(name).register(sub)
    return parser


def _debug_requested(argv: Sequence[str]) -> bool:
    """``--debug`` anywhere before ``--`` (so ``kvpool replay ... --debug`` works too)."""
    head = list(argv)[: list(argv).index("--")] if "--" in argv else list(argv)
    return "--debug" in head


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the ``kvpool`` script; returns the process exit code (module docstring)."""
    args_list = list(sys.argv[1:] if argv is None else argv)
    debug = _debug_requested(args_list)
    if debug:
        args_list.remove("--debug")
    try:
        args = build_parser().parse_args(args_list)
        args.debug = debug
        code: int = args.func(args)
        return code
    except CLIError as exc:
        print(f"kvpool: error: {exc}", file=sys.stderr)
        return EXIT_USAGE
    except KeyboardInterrupt:
        print("kvpool: interrupted", file=sys.stderr)
        return EXIT_INTERRUPTED
    except Exception as exc:
        if debug:
            raise
        text = str(exc).splitlines()[0] if str(exc) else ""
        print(f"kvpool: internal error: {type(exc).__name__}: {text} (rerun with --debug for "
              "the traceback)", file=sys.stderr)  # fmt: skip
        return EXIT_INTERNAL


if __name__ == "__main__":
    sys.exit(main())
