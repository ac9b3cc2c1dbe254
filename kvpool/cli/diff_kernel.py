"""``kvpool diff-kernel TARGET --op OP``: run the kernel differential harness on a user's kernel
and print a verdict (PASS with counts, or FAIL with the smallest differing input).

TARGET is ``MODULE:FUNCTION`` (an importable module) or ``path/to/file.py:FUNCTION``, loaded by
:func:`kvpool.testing.factories.load_factory` (as ``kvpool verify --impl``). FUNCTION has the
signature of ``kvpool.kernels.<op>`` minus ``backend`` (``--backend NAME`` passes
``backend=NAME`` through, for kvpool's own kernels). Without CUDA, ``TRITON_INTERPRET=1`` is set
before the module is imported so its ``@triton.jit`` kernels run in Triton's interpreter.

``--checked`` / ``--shuffle`` run every call inside the checked interpreter, which sees only
Triton kernels launched through it. When FUNCTION launched none (a torch or Python function,
or a kvpool kernel without ``--backend interpret``), nothing was checked there: the verdict is
printed as "outputs compared only", and the command ends with a one-line error and exit code 2
rather than claim a check that did not happen.

Exit code 0 on PASS, 1 on FAIL, 2 for bad input (a target that does not load, a bad option) or
checks that did not apply.
"""

from __future__ import annotations

import argparse
import functools
import os
from collections.abc import Callable
from typing import Any

from kvpool.cli.args import add_parser, callable_spec, fail, positive_int, power_of_two_list
from kvpool.constants import KERNEL_OPS, SHORT_FREE_LIST_MODES, SUPPORTED_PAGE_SIZES_TESTED
from kvpool.errors import KVPoolError

SHUFFLE_SEEDS = (0, 1, 2)
"""Program orders tried by ``--shuffle`` (besides grid order)."""


def register(subparsers: Any) -> None:
    """Add the ``diff-kernel`` subcommand to the ``kvpool`` parser."""
    p = add_parser(subparsers, "diff-kernel",
                   help="check a kernel against kvpool's reference on generated inputs",
                   description=__doc__)  # fmt: skip
    p.add_argument(
        "target",
        type=callable_spec,
        metavar="TARGET",
        help="MODULE:FUNCTION or path/to/file.py:FUNCTION",
    )
    p.add_argument(
        "--op", required=True, choices=KERNEL_OPS, help="which kernel contract to check (required)"
    )
    p.add_argument("--examples", type=positive_int, default=100, help="generated inputs")
    p.add_argument("--seed", type=int, default=0, help="generation seed (any integer)")
    p.add_argument(
        "--page-sizes",
        type=power_of_two_list,
        default=SUPPORTED_PAGE_SIZES_TESTED,
        help="comma-separated powers of two",
    )
    p.add_argument(
        "--max-tokens",
        type=positive_int,
        default=4096,
        help="longest extension of one request, in tokens",
    )
    p.add_argument("--max-batch", type=positive_int, default=32, help="largest batch, in requests")
    p.add_argument(
        "--short",
        choices=SHORT_FREE_LIST_MODES,
        default="lenient",
        help="too-few-free-pages inputs: off, lenient (padded free list) or strict",
    )
    p.add_argument(
        "--backend", default=None, help="pass backend=NAME to the function (default: not passed)"
    )
    p.add_argument(
        "--checked",
        action="store_true",
        help="run every call under the checked interpreter (Triton kernels only)",
    )
    p.add_argument(
        "--shuffle",
        action="store_true",
        help="also run programs in shuffled orders (implies --checked)",
    )
    p.set_defaults(func=run)


def load_target(target: str) -> Callable[..., Any]:
    """The function named by ``MODULE:FUNCTION`` or ``file.py:FUNCTION``; raises
    :class:`KVPoolError` when it cannot be loaded (any exception of the import, too)."""
    from kvpool.testing.factories import load_factory

    try:
        fn: Callable[..., Any] = load_factory(target, what="FUNCTION")
    except Exception as exc:
        raise KVPoolError(f"cannot load {target}: {type(exc).__name__}: {exc}") from exc
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
    except KVPoolError as exc:
        fail(f"diff-kernel: {exc}")
    if args.backend is not None:
        fn = functools.partial(fn, backend=args.backend)
    from kvpool.testing.kernel_harness.differential import check_kernel
    from kvpool.testing.kernel_harness.interpreter import checked_launch_count

    checked = bool(args.checked or args.shuffle)
    launches = checked_launch_count()
    report = check_kernel(
        fn,
        args.op,
        max_examples=args.examples,
        seed_value=args.seed,
        page_sizes=args.page_sizes,
        max_tokens=args.max_tokens,
        max_batch=args.max_batch,
        short_free_lists=args.short,
        checked=checked,
        shuffle_seeds=SHUFFLE_SEEDS if args.shuffle else (),
    )
    launches = checked_launch_count() - launches
    applied = checked and launches > 0
    mode = ""
    if applied:
        mode = f" (checked interpreter{', shuffled orders' if args.shuffle else ''}: " \
               f"{launches} launches)"  # fmt: skip
    elif checked:
        mode = " (outputs compared only: no Triton kernel was launched in the checked interpreter)"
    print(f"kvpool diff-kernel {args.target} --op {args.op}{mode}")
    print(report.render())
    if checked and not applied and report.passed:
        fail(
            f"diff-kernel: --checked/--shuffle did not apply: {args.target} launched no Triton "
            "kernel through the interpreter (a torch or Python function? drop the flags)"
        )
    return 0 if report.passed else 1
