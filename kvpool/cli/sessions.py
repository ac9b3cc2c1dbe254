"""``kvpool sessions``: generated streaming sessions on SGLang's own session code.

Each run draws a plan of one to four turns of streaming sessions (new tokens, sampled tokens,
a speculative reserve, a stop inside the run, an abort, a retraction under overlap or plain, the
next step launched or not) and plays it through SGLang's own unified cache, session, pools and
release on a fresh world: full attention at page size 1 or 4, a hybrid Mamba model, a sliding
window at page size 1 or 4; the Rust and the Python tree core; one session, or two taking
turns that share the first one's first prompt; the sessions alone, or with a plain request
after every turn pressing on the pool so that the tree evicts; whole or chunked prefills; with
--eagle, EAGLE's bigram tree too. At page size 4 SGLang's paged allocators take their torch
path (as on a platform without Triton); --allocation-kernels triton runs their Triton kernels,
the GPU's code, through Triton's interpreter instead.
kvpool's rules are checked after every step: no KV slot, row, SWA slot or Mamba state leaked
or freed twice, no page a session's row names free, a kept turn holding exactly its tokens
through the stop, every resumed position holding its own token's KV, every lent Mamba state
matching the prefix it resumes, every state the tree caches matching its node, every resumed
window live; then SGLang's own scheduler checks ("Mem Leak Detected", the KV page check, the
tree's sanity check when idle).

The first failing plan is shrunk and printed, turn by turn and as Python; a failure that
findings 10, 11 and 12 of specs/sglang_findings.md explain says so. With --skip-known those are
counted and the campaign goes on, so that only a new behaviour stops it. Same seed, same plans,
however many --workers share the runs. A plan whose playing kills its process (a fault in
SGLang's compiled tree core) is a failure too, "killed", named with the signal, and so is one
still playing after --run-timeout seconds, "hung": its worker posted the run it was playing,
and the plan is shrunk in a sandbox where every candidate plays in a forked child.
--plan PLAN plays one plan (as a report prints it, or its JSON report holds it) on every chosen
setup instead, each in a forked child, and prints each setup's verdict: to check a fix of
SGLang's code against a failure found before.
Exit 0: no failure; 1: a failure; 2: bad input (a source that does not load, a release without
0.5.23's unified session, a model without that page size).
"""

from __future__ import annotations

import argparse
import json
import os
from pathlib import Path
from typing import Any

from kvpool.cli.args import (
    add_parser,
    fail,
    non_negative_int,
    output_path,
    positive_float,
    positive_int,
)

MODELS = ("full", "hybrid", "swa")
CORES = ("rust", "python")
RUN_TIMEOUT = 60.0


def _run(args: argparse.Namespace) -> int:
    from kvpool.errors import KVPoolError
    from kvpool.sglang.session_campaign import PAGE_SIZES, parse_plan, setups
    from kvpool.sglang.session_workers import run_parallel

    plan = None
    if args.plan is not None:
        try:
            plan = parse_plan(args.plan)
        except ValueError as exc:
            fail(f"sessions: --plan: {exc}")
        if args.skip_known or args.runs is not None:
            fail("sessions: --plan plays one plan; --skip-known and --runs are for campaigns")
    models = MODELS if args.model is None else (args.model,)
    if args.page_size is not None and not any(args.page_size in PAGE_SIZES[m] for m in models):
        sizes = ", ".join(map(str, PAGE_SIZES[models[0]]))
        fail(f"sessions: --model {args.model} runs at page size {sizes} only, not {args.page_size}")
    chosen = setups(
        models,
        None if args.page_size is None else (args.page_size,),
        CORES if args.tree_core is None else (args.tree_core,),
        args.sglang,
        {"both": (False, True), "with": (True,), "without": (False,)}[args.plain_requests],
        {"both": (1, 2), "1": (1,), "2": (2,)}[args.sessions],
        {"both": (False, True), "with": (True,), "without": (False,)}[args.chunked_prefill],
        {"both": (False, True), "with": (True,), "without": (False,)}[args.eagle],
        args.allocation_kernels == "triton",
    )
    if not chosen:
        fail(f"sessions: --eagle with runs the full and swa models only, not {args.model} "
             "(SGLang keeps token keys in a tree with a Mamba component)")  # fmt: skip
    try:  # load the release (and each core) before the campaign: bad input is exit 2
        for setup in {(s.model == "swa", s.core): s for s in chosen}.values():
            setup.build()
    except KVPoolError as exc:
        fail(f"sessions: --sglang {args.sglang}: {exc}")
    head = {"source": args.sglang, "setups": [str(s) for s in chosen]}
    if plan is not None:
        return _replay(plan, chosen, args.sglang, args.report, head)
    from kvpool.testing.progress import CampaignBar

    bar = CampaignBar(args.seconds, "sessions", "plans") if args.progress and args.workers else None
    try:
        result = run_parallel(chosen, args.seconds, args.seed, args.runs, args.skip_known,
                              args.workers, args.run_timeout,
                              None if bar is None else bar.update)  # fmt: skip
        if bar is not None:
            bar.update(result.seconds, result.plans)  # where the workers ended
    finally:
        if bar is not None:
            bar.close()
    _write(args.report, {**head, "workers": args.workers, **result.record()})
    print(f"kvpool sessions: SGLang {args.sglang}'s streaming session, seed {args.seed}")
    print(f"  setups           {len(chosen)}")
    print(f"  workers          {args.workers or 'none (this process)'}")
    print(f"  plans            {result.plans}")
    print(f"  turns            {result.turns}")
    print(f"  failures         {int(result.failure is not None)}")
    print(f"  seconds          {result.seconds:.1f}")
    if args.skip_known:
        known = ", ".join(f"{n}: {c}" for n, c in sorted(result.known.items())) or "none"
        print(f"  known findings   {known} (plans per finding, skipped)")
    if result.failure is not None:
        print("\n".join(result.failure.lines()))
        return 1
    return 0


def _write(path: Path | None, payload: dict[str, Any]) -> None:
    """Write the JSON report to ``path`` (None: no report)."""
    if path is not None:
        path.write_text(json.dumps(payload, indent=2) + "\n")


def _replay(plan: list[Any], chosen: list[Any], source: str, report: Path | None,
            head: dict[str, Any]) -> int:  # fmt: skip
    """Play ``plan`` on every setup of ``chosen``; 1 if it fails on any."""
    from kvpool.sglang.session_campaign import describe_turn, isolated_sandbox, judge_isolated

    print(f"kvpool sessions: one plan on SGLang {source}'s streaming session")
    for i, turn in enumerate(plan):
        print(f"  turn {i}: {describe_turn(turn)}")
    failed = 0
    verdicts: list[dict[str, Any] | None] = []
    with isolated_sandbox() as sandbox:  # a plan that kills its process is a verdict too
        found = [judge_isolated(sandbox, setup, plan) for setup in chosen]
    for setup, verdict in zip(chosen, found, strict=True):
        verdicts.append(None if verdict is None else verdict.record())
        if verdict is None:
            print(f"  {setup}: every check holds")
            continue
        failed += 1
        known = (
            f" (known: finding(s) {', '.join(map(str, verdict.known))})" if verdict.known else ""
        )
        print(f"  {setup}: [{verdict.detector}] {verdict.message}{known}")
    print(f"failures: {failed} of {len(chosen)} setups")
    _write(report, {**head, "plan": [list(turn) for turn in plan], "verdicts": verdicts})
    return 1 if failed else 0


def register(subparsers: Any) -> None:
    """Add the ``sessions`` subcommand."""
    p = add_parser(
        subparsers,
        "sessions",
        help="generated streaming sessions on SGLang's own session code",
        description=__doc__,
    )
    p.add_argument(
        "--sglang",
        metavar="SOURCE",
        default="0.5.23",
        help="SGLang release, wheel or source folder with 0.5.23's unified cache session",
    )
    p.add_argument("--model", choices=MODELS, default=None,
                   help="only this model (default: all three)")  # fmt: skip
    p.add_argument("--page-size", type=positive_int, choices=(1, 4), default=None,
                   help="only this page size, in tokens (default: each model's)")  # fmt: skip
    p.add_argument("--tree-core", choices=CORES, default=None,
                   help="only this tree core (default: both)")  # fmt: skip
    p.add_argument("--plain-requests", choices=("both", "with", "without"), default="both",
                   help="setups with a plain request after every turn, pressing on the pool "
                   "so that the tree evicts, without, or both")  # fmt: skip
    p.add_argument("--sessions", choices=("both", "1", "2"), default="both",
                   help="setups with one streaming session, with two taking turns that share "
                   "the first one's first prompt (as sessions sharing a system prompt do), or "
                   "both")  # fmt: skip
    p.add_argument("--chunked-prefill", choices=("both", "with", "without"), default="both",
                   help="setups whose prefills run in chunks (two tokens, a page at page size "
                   "4), each but the last stashed as the scheduler's chunked prefill does, "
                   "whole prefills, or both")  # fmt: skip
    p.add_argument("--eagle", choices=("both", "with", "without"), default="without",
                   help="setups on EAGLE's tree (bigram keys, as speculative decoding with "
                   "EAGLE builds it; full and swa models), without (the default), or "
                   "both")  # fmt: skip
    p.add_argument("--allocation-kernels", choices=("torch", "triton"), default="torch",
                   help="how SGLang's paged allocators (page size 4) allocate: its torch path "
                   "(the default; as on a platform without Triton) or its Triton kernels run by "
                   "Triton's interpreter (the GPU's code; several times slower here)")  # fmt: skip
    p.add_argument("--seconds", type=positive_float, default=20.0,
                   help="time budget, in seconds")  # fmt: skip
    p.add_argument("--runs", type=positive_int, default=None,
                   help="stop after this many plans (default: the time budget only)")  # fmt: skip
    p.add_argument("--seed", type=int, default=0, help="campaign seed (any integer)")
    p.add_argument("--run-timeout", type=positive_float, default=RUN_TIMEOUT, metavar="SECONDS",
                   help="a run still playing after this long is hung: its worker is killed and "
                   "the run is the failure 'hung', shrunk with the same limit per plan "
                   f"(default {RUN_TIMEOUT:g}; a plan takes milliseconds)")  # fmt: skip
    p.add_argument("--workers", type=non_negative_int, default=os.cpu_count() or 1,
                   help="worker processes, each taking every N-th run (0: this process, where a "
                   "plan that kills its process ends the command); the same plans and the "
                   "same first failure whatever the number")  # fmt: skip
    p.add_argument("--plan", default=None, metavar="PLAN",
                   help="play this plan (a Python list of turns, as a report prints it) on "
                   "every chosen setup instead of a campaign (default: none)")  # fmt: skip
    p.add_argument("--report", type=output_path, default=None, metavar="FILE.json",
                   help="also write the outcome as JSON here (default: none)")  # fmt: skip
    p.add_argument("--skip-known", action="store_true",
                   help="count plans that only findings 10-12 explain and go on")  # fmt: skip
    p.add_argument("--no-progress", dest="progress", action="store_false",
                   help="no progress bar on stderr (there is none with --workers 0)")  # fmt: skip
    p.set_defaults(func=_run)
