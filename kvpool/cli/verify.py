"""``kvpool verify``: the lockstep campaign, kvpool's main job.

Phase 1 (half a second): the reference pools' seeded self-check (:mod:`kvpool.testing.selfcheck`).
Phase 2 (``--seconds``): a lockstep campaign of one machine (``--component``: the lifecycle
``manager``, ``swa_manager`` (the lifecycle of a hybrid sliding-window model) or one component
alone: ``allocator`` / ``req_to_token_pool`` / ``radix_cache``, ``swa_allocator`` /
``swa_radix_cache``, a hybrid Mamba model's ``hybrid_req_to_token_pool`` /
``mamba_radix_cache``, the host tier's ``hiradix_cache``, or ``kv_pool``: a KV storage
variant and layer-wise loading), the reference (or ``--oracle SPEC``: any two implementations,
e.g. SGLang's two tree cores) against a candidate (``--impl``: the optimized twin by default,
``sglang[:SOURCE]`` for SGLang's own classes, ``--tree-core`` choosing 0.5.23's unified-cache
core, or ``MODULE:NAME`` / ``path.py:NAME``; ``--rules RELEASE``: kvpool's two sides follow
SGLang RELEASE's rules and its server's tree), every invariant checked after every step, in
``--workers`` processes so that a candidate that crashes or hangs is a reported failure, or
fanned out over a Ray cluster with ``--ray [ADDRESS]`` (blocks of runs, one task per CPU).
Prints a summary with the coverage reached, and writes it as JSON with ``--report`` (always,
also after a failure or an internal error). Exit codes: 0 clean, 1 a failure, 2 bad usage.
"""

from __future__ import annotations

import argparse
import json
import os
from typing import Any

from kvpool.cli.args import (
    add_parser,
    callable_spec,
    check_checked_env,
    fail,
    non_negative_int,
    output_path,
    positive_float,
    positive_int,
)

COMPONENTS = (
    "manager",
    "allocator",
    "req_to_token_pool",
    "radix_cache",
    "hybrid_req_to_token_pool",
    "mamba_radix_cache",
    "swa_allocator",
    "swa_radix_cache",
    "swa_manager",
    "mamba_manager",
    "hicache_manager",
    "hiradix_cache",
    "kv_pool",
    "unified_radix_cache",
    "unified_mamba_radix_cache",
    "unified_swa_radix_cache",
)
BUILTIN_IMPLS = ("reference", "optimized", "sglang")
TREE_COMPONENTS = {
    "full": "unified_radix_cache",
    "full,swa": "unified_swa_radix_cache",
    "full,mamba": "unified_mamba_radix_cache",
}
"""``--tree-components`` of ``--component unified_radix_cache``: the machine of each set."""


def impl_spec(text: str) -> str:
    """``reference``, ``optimized[BACKEND]`` (either with ``@RELEASE``), ``sglang[:SOURCE]`` or
    a user's ``MODULE:NAME`` / ``path/to/file.py:NAME``."""
    if text.split("@")[0].split("[")[0].split(":")[0] in BUILTIN_IMPLS:
        return text
    return callable_spec(text)


def ray_address(text: str) -> str:
    """``local``, ``auto``, ``ray://HOST:PORT`` or ``HOST:PORT`` (checked without importing
    ray; whether it answers is checked when the campaign connects, before any work)."""
    if text in ("local", "auto"):
        return text
    host, sep, port = text.removeprefix("ray://").rpartition(":")
    if not sep or not host or "/" in host or not port.isdigit() or not 0 < int(port) < 65536:
        raise argparse.ArgumentTypeError(
            f"got {text!r}, expected ray://HOST:PORT, HOST:PORT, auto or local"
        )
    return text


def register(sub: Any) -> None:
    """Add the ``verify`` subcommand to ``sub`` (an argparse subparsers object)."""
    p = add_parser(
        sub,
        "verify",
        help="lockstep campaign: the reference against a candidate",
        description=__doc__,
    )
    p.add_argument(
        "--seconds",
        type=positive_float,
        default=60.0,
        help="time budget of the campaign, in seconds",
    )
    p.add_argument("--seed", type=int, default=0, help="campaign seed (any integer)")
    p.add_argument(
        "--component",
        choices=COMPONENTS,
        default="manager",
        help="the machine to run: the whole lifecycle or one component",
    )
    p.add_argument(
        "--impl",
        type=impl_spec,
        default=None,
        metavar="SPEC",
        help="candidate: optimized[BACKEND], sglang[:SOURCE], MODULE:NAME or "
        "path/to/file.py:NAME (an Implementation, a function returning one, or a "
        "factory of the component) (default: the optimized twin with --backend)",
    )
    p.add_argument(
        "--sglang",
        metavar="SOURCE",
        default=None,
        help="shorthand for --impl sglang:SOURCE (a release such as 0.5.16, a source "
        "path, or 'installed') (default: none)",
    )
    p.add_argument(
        "--tree-core",
        choices=("rust", "python"),
        default=None,
        help="with SGLang 0.5.23: the unified radix cache's tree core (default: rust, as "
        "SGLang's server)",
    )
    p.add_argument(
        "--tree-components",
        choices=tuple(TREE_COMPONENTS),
        default="full",
        # the choices hold commas: argparse's own {a,b,c} would run them together
        metavar="{" + " | ".join(TREE_COMPONENTS) + "}",
        help="with --component unified_radix_cache: the unified cache's component set "
        "(full: an ordinary model; full,swa: sliding-window; full,mamba: hybrid SSM)",
    )
    p.add_argument(
        "--oracle",
        type=impl_spec,
        default="reference",
        metavar="SPEC",
        help="the side the candidate is checked against, any spec --impl takes, e.g. "
        "sglang:0.5.23+python-core to run SGLang's Python tree core against its Rust core",
    )
    p.add_argument(
        "--rules",
        metavar="RELEASE",
        default=None,
        help="both sides, kvpool's own, follow SGLang RELEASE's rules preset and run the "
        "lifecycle over the tree that release's server builds (reference@RELEASE against "
        "optimized@RELEASE) (default: none, kvpool's own rules)",
    )
    p.add_argument(
        "--naive",
        action="store_true",
        help="with SGLang: its paged allocators' torch path instead of their Triton kernels, "
        "whoever calls them (alloc_extend_naive; from 0.5.23 alloc_decode_naive too), the SWA "
        "allocator's included: more steps a second (specs/harness.md, specs/performance.md)",
    )
    p.add_argument(
        "--backend",
        choices=("torch", "interpret"),
        default="torch",
        help="kernel backend of the optimized twin",
    )
    p.add_argument(
        "--workers",
        type=non_negative_int,
        default=os.cpu_count() or 1,
        help="worker processes (0: run in this process, no crash protection)",
    )
    p.add_argument(
        "--step-timeout",
        type=positive_float,
        default=60.0,
        help="seconds one step may take before the candidate counts as hung",
    )
    p.add_argument(
        "--interpret",
        action="store_true",
        help="run the candidate's Triton kernels through Triton's interpreter",
    )
    p.add_argument(
        "--checked",
        action="store_true",
        help="run them under kvpool's checked interpreter (implies --interpret)",
    )
    p.add_argument(
        "--report",
        type=output_path,
        default=None,
        metavar="FILE.json",
        help="also write the JSON report here, always (default: none)",
    )
    p.add_argument(
        "--steps-per-run", type=positive_int, default=60, help="lockstep steps per configuration"
    )
    p.add_argument("--no-progress", action="store_true", help="hide the progress bar")
    p.add_argument(
        "--ray",
        nargs="?",
        const="auto",
        type=ray_address,
        default=None,
        metavar="ADDRESS",
        help="run the campaign on a Ray cluster: ray://HOST:PORT, HOST:PORT, 'auto' (the "
        "running cluster; the value when ADDRESS is left out) or 'local' (a private one of "
        "--workers CPUs) (default: none, this machine)",
    )
    p.set_defaults(func=run)


def _candidate(args: argparse.Namespace) -> str:
    if args.sglang is not None:
        spec = f"sglang:{args.sglang}"
    else:
        spec = args.impl or f"optimized[{args.backend}]"
    if args.naive and spec.startswith("sglang"):
        spec = (spec if ":" in spec else "sglang:0.5.16") + "+naive"
    if args.tree_core is not None and spec.startswith("sglang"):
        spec = (spec if ":" in spec else "sglang:0.5.16") + f"+{args.tree_core}-core"
    return str(spec)


def _env(args: argparse.Namespace) -> tuple[tuple[str, str], ...]:
    env: list[tuple[str, str]] = []
    if args.interpret or args.checked:
        env.append(("TRITON_INTERPRET", "1"))
    if args.checked:
        env.append(("KVPOOL_CHECKED_INTERPRETER", "1"))
    return tuple(env)


def run(args: argparse.Namespace) -> int:
    """Run both phases (see the module docstring)."""
    check_checked_env("verify")
    if args.impl and args.sglang:
        fail("verify: give --impl or --sglang, not both")
    if args.naive and not (args.sglang or str(args.impl or "").startswith("sglang")):
        fail("verify: --naive selects SGLang's naive extend path: give it with --sglang")
    if args.tree_core and not (args.sglang or str(args.impl or "").startswith("sglang")):
        fail("verify: --tree-core selects SGLang's unified-cache tree core: give it with --sglang")
    if args.ray is not None and args.workers == 0:
        fail("verify: --workers 0 runs in this process; it cannot be combined with --ray")
    if args.tree_components != "full":
        if args.component != "unified_radix_cache":
            fail("verify: --tree-components chooses the unified cache's component set: give "
                 "it with --component unified_radix_cache")  # fmt: skip
        args.component = TREE_COMPONENTS[args.tree_components]
    candidate = _candidate(args)
    oracle = args.oracle
    if args.rules is not None:
        candidate, oracle = (_following(args.rules, spec) for spec in (candidate, oracle))
    env = _env(args)
    saved = {key: os.environ.get(key) for key, _ in env}
    if args.workers == 0:  # in this process: before anything imports triton
        os.environ.update(dict(env))
    try:
        return _verify(args, candidate, oracle, env)
    finally:
        for key, value in saved.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value


def _following(release: str, spec: str) -> str:
    """``spec@release`` for one of kvpool's own implementations; a one-line usage error for
    any other (SGLang brings its release's rules; a user's implementation its own) and for a
    release without a preset."""
    from kvpool.errors import ConfigError
    from kvpool.rules import Rules
    from kvpool.testing.implementations import builtin_spec

    if not builtin_spec(spec):
        fail(f"verify: --rules sets the rules of kvpool's own sides (reference, optimized); "
             f"{spec} brings its own")  # fmt: skip
    if "@" in spec:
        fail(f"verify: {spec} names its release already: give --rules or @RELEASE, not both")
    try:
        Rules.for_sglang(release)
    except ConfigError as exc:
        fail(f"verify: --rules: {exc}")
    return f"{spec}@{release}"


def _verify(
    args: argparse.Namespace, candidate: str, oracle: str, env: tuple[tuple[str, str], ...]
) -> int:
    from kvpool.testing.verify_run import VerifyOptions, verify

    options = VerifyOptions(
        component=args.component,
        candidate=candidate,
        oracle=oracle,
        seconds=args.seconds,
        seed=args.seed,
        steps_per_run=args.steps_per_run,
        workers=args.workers,
        step_timeout=args.step_timeout,
        env=env,
        progress=not args.no_progress,
        ray=args.ray,
    )
    outcome = verify(options)
    if outcome.usage_error:
        fail(f"verify: {outcome.usage_error}")
    print("\n".join(outcome.lines))
    if args.report is not None:
        args.report.write_text(json.dumps(outcome.payload, indent=2) + "\n")
        print(f"report written to {args.report}")
    return outcome.exit_code
