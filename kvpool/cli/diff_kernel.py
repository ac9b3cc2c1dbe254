"""``kvpool diff-kernel MODULE:FUNCTION --op OP``: run the kernel differential harness on a
user's kernel and print a verdict (PASS with counts, or FAIL with the smallest differing input).

``MODULE`` is an importable module name or a path to a ``.py`` file; ``FUNCTION`` has the
signature of ``kvpool.kernels.<op>`` minus ``backend`` (``--backend NAME`` passes
``backend=NAME`` through, for kvpool's own kernels). Without CUDA, ``TRITON_INTERPRET=1`` is set
before the module is imported so its ``@triton.jit`` kernels run in Triton's interpreter.
Exit code 0 on PASS, 1 on FAIL, 2 when the target cannot be loaded.
"""

from __future__ import annotations

import argparse
import functools
import importlib
import importlib.util
import os
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

from kvpool.constants import SUPPORTED_PAGE_SIZES_TESTED, is_power_of_two
from kvpool.errors import KVPoolError
from kvpool.testing.factories import import_user_module
from kvpool.testing.kernel_inputs import OPS
from kvpool.testing.kernels import SHORT_MODES, check_kernel

SHUFFLE_SEEDS = (0, 1, 2)
"""Program orders tried by ``--shuffle`` (besides grid order)."""


def register(subparsers: Any) -> None:
    """Add the ``diff-kernel`` subcommand to the ``kvpool`` parser."""
    p = subparsers.add_parser(
        "diff-kernel",
        help="check a kernel against kvpool's reference on generated inputs",
        description=__doc__.splitlines()[0] if __doc__ else None,
    )
    p.add_argument("target", help="MODULE:FUNCTION (module name or path to a .py file)")
    p.add_argument("--op", required=True, choices=OPS, help="which kernel contract to check")
    p.add_argument("--examples", type=int, default=100, help="generated inputs (default 100)")
    p.add_argument("--seed", type=int, default=0, help="generation seed (default 0)")
    p.add_argument(
        "--page-sizes",
        default=",".join(map(str, SUPPORTED_PAGE_SIZES_TESTED)),
        help="comma-separated powers of two (default %(default)s)",
    )
    p.add_argument("--max-tokens", type=int, default=4096, help="longest extension, in tokens")
    p.add_argument("--max-batch", type=int, default=32, help="largest batch, in requests")
    p.add_argument("--short", choices=SHORT_MODES, default="lenient", help="too-few-pages inputs")
    p.add_argument("--backend", default=None, help="pass backend=NAME to the function")
    p.add_argument("--checked", action="store_true", help="run under the checked interpreter")
    p.add_argument(
        "--shuffle",
        action="store_true",
        help="also run programs in shuffled orders (implies --checked)",
    )
    p.set_defaults(func=run)


def load_target(target: str) -> Callable[..., Any]:
    """The function named by ``MODULE:FUNCTION``; raises :class:`KVPoolError` when absent."""
    module_name, sep, func_name = target.rpartition(":")
    if not sep or not module_name or not func_name:
        raise KVPoolError(f"expected MODULE:FUNCTION, got {target!r}")
    if module_name.endswith(".py"):
        path = Path(module_name)
        spec = importlib.util.spec_from_file_location(path.stem, path)
        if spec is None or spec.loader is None or not path.exists():
            raise KVPoolError(f"cannot load {module_name}")
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
    else:
        try:
            module = import_user_module(module_name)
        except ImportError as exc:
            raise KVPoolError(f"cannot import {module_name}: {exc}") from exc
    fn: Callable[..., Any] | None = getattr(module, func_name, None)
    if not callable(fn):
        raise KVPoolError(f"{module_name} has no callable {func_name!r}")
    return fn


def _cuda_available() -> bool:
    import torch

    return bool(torch.cuda.is_available())


def run(args: argparse.Namespace) -> int:
    """Run the harness as asked by ``args``; print the verdict; return the exit code."""
    if not _cuda_available():
        os.environ.setdefault("TRITON_INTERPRET", "1")
    try:
        fn = load_target(args.target)
        page_sizes = tuple(int(x) for x in args.page_sizes.split(","))
        if not all(is_power_of_two(ps) for ps in page_sizes):
            raise ValueError(f"page sizes must be powers of two, got {args.page_sizes}")
    except (KVPoolError, ValueError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    if args.backend is not None:
        fn = functools.partial(fn, backend=args.backend)
    report = check_kernel(
        fn,
        args.op,
        max_examples=args.examples,
        seed_value=args.seed,
        page_sizes=page_sizes,
        max_tokens=args.max_tokens,
        max_batch=args.max_batch,
        short_free_lists=args.short,
        checked=args.checked or args.shuffle,
        shuffle_seeds=SHUFFLE_SEEDS if args.shuffle else (),
    )
    mode = " (checked interpreter" + (", shuffled orders)" if args.shuffle else ")")
    print(
        f"kvpool diff-kernel {args.target} --op {args.op}"
        + (mode if args.checked or args.shuffle else "")
    )
    print(report.render())
    return 0 if report.passed else 1
