"""What ``kvpool verify`` does, as a function: self-check, campaign, summary and JSON payload.

:func:`verify` never raises for a candidate's behaviour: a failure, a crash, or an internal
error while running becomes part of the :class:`VerifyOutcome` (so the JSON report is always
written); only a candidate that cannot be loaded is a usage error.
"""

from __future__ import annotations

import dataclasses
import tempfile
import time
import traceback
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from kvpool.testing import selfcheck
from kvpool.testing.campaign import CampaignResult, quiet_collector, run_machine
from kvpool.testing.machines.coverage import CATALOGUE
from kvpool.testing.progress import CampaignBar
from kvpool.testing.workers import LOG_TAG, counted_logs

if TYPE_CHECKING:
    from kvpool.testing.bundle import Implementation
    from kvpool.testing.ray_connect import Connection
    from kvpool.testing.ray_ship import Shipment
    from kvpool.testing.workers import CampaignSpec

SELF_CHECK_SECONDS = 0.5
"""Budget of phase 1 (it always runs every page size once)."""


@dataclass(frozen=True)
class VerifyOptions:
    """``kvpool verify``'s options (see the CLI's help)."""

    component: str = "manager"
    candidate: str = "optimized[torch]"
    oracle: str = "reference"
    """Side A, the one the candidate is checked against (any implementation spec)."""
    seconds: float = 60.0
    seed: int = 0
    steps_per_run: int = 60
    workers: int = 1
    step_timeout: float = 60.0
    env: tuple[tuple[str, str], ...] = ()
    progress: bool = False
    ray: str | None = None
    """A Ray cluster's address (``local``, ``auto``, ``ray://HOST:PORT``, ``HOST:PORT``): run
    the campaign there (:mod:`kvpool.testing.ray_campaign`); None: on this machine."""


@dataclass
class VerifyOutcome:
    """Printed lines, the JSON payload, the exit code, or a usage error (exit 2)."""

    lines: list[str] = field(default_factory=list)
    payload: dict[str, Any] = field(default_factory=dict)
    exit_code: int = 0
    usage_error: str | None = None


def coverage_lines(component: str, coverage: dict[str, int]) -> list[str]:
    """The coverage table: every catalogued tag with its count (``never`` when 0), then
    tags outside the catalogue."""
    lines = [f"  coverage ({component}):"]
    known = CATALOGUE.get(component, ())
    for tag in known:
        count = coverage.get(tag, 0)
        lines.append(f"    {tag:<32} {count if count else 'never'}")
    glue = sorted(t for t in coverage if t.startswith("sglang:"))
    logged = sorted(t for t in coverage if t.startswith(LOG_TAG))
    extra = sorted(t for t in coverage if t not in known and t not in glue and t not in logged)
    if extra:
        lines.append("    also: " + ", ".join(f"{t} {coverage[t]}" for t in extra))
    if glue:  # SGLang's own scheduler glue that ran (kvpool.sglang.glue_manager), with calls
        lines.append("  SGLang glue that ran (calls):")
        lines.extend(f"    {t.removeprefix('sglang:'):<44} {coverage[t]}" for t in glue)
    if logged:  # what the implementations logged in the workers (kvpool.testing.workers)
        lines.append("  logged by the implementations (records):")
        lines.extend(f"    {coverage[t]:>7}  {t.removeprefix(LOG_TAG)}" for t in logged)
    return lines


def summary_lines(result: CampaignResult, candidate: str, oracle: str = "reference") -> list[str]:
    """The human summary printed at the end."""
    return [
        f"kvpool verify: {oracle} vs {candidate}, component {result.component}, seed {result.seed}",
        f"  configurations   {result.configurations}",
        f"  steps            {result.steps}",
        f"  invariant checks {result.invariant_checks}",
        f"  failures         {result.failures}",
        f"  seconds          {result.seconds:.1f}",
        f"  steps per second {result.steps_per_second:.0f}",
        f"  workers          {result.workers or 'in-process'}",
    ]


def verify(options: VerifyOptions) -> VerifyOutcome:
    """Run ``kvpool verify`` (see the module docstring)."""
    from kvpool.testing.implementations import resolve_implementation

    out = VerifyOutcome()
    try:
        impl_b = resolve_implementation(options.candidate, options.component)
    except Exception as exc:  # whatever the user's module raises on import is bad input
        first = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
        out.usage_error = f"cannot load --impl {options.candidate}: {first}"
        return out
    try:
        impl_a = resolve_implementation(options.oracle, options.component)
    except Exception as exc:
        first = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
        out.usage_error = f"cannot load --oracle {options.oracle}: {first}"
        return out
    for spec, impl in ((options.candidate, impl_b), (options.oracle, impl_a)):
        if not impl.provides(options.component):
            why = dict(impl.absent).get(options.component)
            out.usage_error = f"{spec} provides no {options.component} component" + (
                f": {why}" if why else ""
            )
            return out
    out.payload = {
        "candidate": options.candidate,
        "oracle": options.oracle,
        "component": options.component,
    }
    if options.ray is None:
        return _verify(options, out, impl_a, impl_b, None, None)
    from kvpool.testing.ray_connect import RayUnavailable, connect
    from kvpool.testing.ray_ship import stage

    with tempfile.TemporaryDirectory(prefix="kvpool-ray-") as folder:
        try:  # what the nodes need of this machine, shipped as the job's working directory
            shipment = stage(_campaign_spec(options), Path(folder))
            env = shipment.runtime_env() if shipment is not None else None
            cluster = connect(options.ray, options.workers or None, env)
        except (RayUnavailable, ValueError) as exc:
            out.usage_error = f"--ray: {exc}"
            return out
        try:  # a connection the caller made keeps its job's environment: nothing is shipped
            return _verify(options, out, impl_a, impl_b, cluster,
                           shipment if cluster.owned else None)  # fmt: skip
        finally:
            cluster.close()


def _campaign_spec(options: VerifyOptions) -> CampaignSpec:
    from kvpool.testing.workers import CampaignSpec

    labels = (options.oracle, options.candidate)
    return CampaignSpec(options.component, options.oracle, options.candidate, options.seed,
                        options.steps_per_run, labels, options.env)  # fmt: skip


def _verify(
    options: VerifyOptions,
    out: VerifyOutcome,
    impl_a: Implementation,
    impl_b: Implementation,
    cluster: Connection | None,
    shipment: Shipment | None,
) -> VerifyOutcome:
    from kvpool.testing.workers import run_parallel

    try:
        pools = selfcheck.run_campaign(SELF_CHECK_SECONDS, options.seed)
    except selfcheck.SelfCheckFailure as exc:
        out.lines.append(f"kvpool verify: reference self-check failed: {exc}")
        out.exit_code = 1
        return out
    out.payload["self_check"] = dataclasses.asdict(pools)
    out.lines.append(
        f"reference self-check: {pools.configurations} configurations, {pools.steps} steps, "
        f"{pools.invariant_checks} invariant checks, 0 failures"
    )
    bar = CampaignBar(options.seconds, "verify", "steps") if options.progress else None

    def progress(elapsed: float, steps: int) -> None:
        if bar is not None:
            bar.update(elapsed, steps)

    labels = (options.oracle, options.candidate)
    started = time.monotonic()
    result = CampaignResult(seed=options.seed, seconds=0.0, component=options.component)
    try:
        if cluster is not None:
            from kvpool.testing.ray_campaign import run_ray

            out.payload["ray"] = {"address": cluster.address, "tasks": 0, "cpus": cluster.cpus}
            result, out.payload["ray"] = run_ray(_campaign_spec(options), options.seconds,
                                                 cluster, options.step_timeout, progress,
                                                 shipment=shipment)  # fmt: skip
        elif options.workers == 0:
            with quiet_collector(), counted_logs() as logs:  # as a worker runs its runs
                result = run_machine(options.component, impl_a, impl_b, options.seconds,
                                     options.seed, options.steps_per_run, labels,
                                     progress)  # fmt: skip
            for tag, n in logs.taken().items():
                result.coverage[tag] = result.coverage.get(tag, 0) + n
        else:
            result = run_parallel(_campaign_spec(options), options.seconds, options.workers,
                                  options.step_timeout, progress)  # fmt: skip
    except Exception:  # an internal error: still report what is known
        result.error = traceback.format_exc(limit=8)
        result.seconds = time.monotonic() - started
    finally:
        if bar is not None:
            bar.close()
    if result.failure is not None:
        out.lines.append(result.failure.report)
    if result.error is not None:
        out.lines.append(f"kvpool verify: internal error (please report it):\n{result.error}")
    out.lines += summary_lines(result, options.candidate, options.oracle)
    if "ray" in out.payload:
        ray = out.payload["ray"]
        shipped = f"; shipped {', '.join(ray['shipped'])}" if ray.get("shipped") else ""
        out.lines.append(f"  ray              {ray['address']}: {ray['tasks']} blocks on "
                         f"{ray.get('actors', 0)} actors, {ray.get('nodes', 0)} nodes, "
                         f"{ray['cpus']} CPUs{shipped}")  # fmt: skip
    out.lines += coverage_lines(options.component, result.coverage)
    out.payload.update(result.to_json())
    out.exit_code = 1 if result.failures or result.error else 0
    return out


__all__ = ["VerifyOptions", "VerifyOutcome", "coverage_lines", "summary_lines", "verify"]
