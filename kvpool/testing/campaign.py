"""The time-budgeted lockstep campaign behind ``kvpool verify``.

A campaign is a sequence of runs. Run ``i`` seeds ``random.Random((seed, i))``, draws a pool
configuration from the swarm (:func:`kvpool.testing.swarm.draw_config`) and ``steps_per_run``
operations (:data:`kvpool.testing.swarm.KINDS`), executing each on both implementations through
:class:`kvpool.testing.lockstep.Lockstep`. It stops at the time budget or at the first failure.

A failure is shrunk without hypothesis: the failing run's operations are plain data, so the
campaign replays sub-lists (dropping chunks, then single steps) and keeps any that still fail with
the same detector. The result is deterministic for a given seed and failing run.
"""

from __future__ import annotations

import importlib
import inspect
import random
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

from kvpool.config import PoolConfig
from kvpool.testing.lockstep import Factory, Lockstep, LockstepFailure
from kvpool.testing.swarm import KINDS, Op, RandomChooser, draw_config, draw_op

Progress = Callable[[float, int], None]
"""Called after each run with (seconds elapsed, steps so far)."""


@dataclass
class CampaignFailure:
    """The shrunk failure: the run's config, the detector, the minimal ops and the report."""

    run: int
    config: dict[str, Any]
    detector: str
    original_steps: int
    ops: list[str]
    report: str


@dataclass
class CampaignResult:
    """Totals of a campaign (``steps_per_second`` counts lockstep steps: one op on both)."""

    seed: int
    seconds: float
    configurations: int = 0
    steps: int = 0
    invariant_checks: int = 0
    failures: int = 0
    page_sizes: dict[str, int] = field(default_factory=dict)
    failure: CampaignFailure | None = None

    @property
    def steps_per_second(self) -> float:
        return self.steps / self.seconds if self.seconds > 0 else 0.0

    def to_json(self) -> dict[str, Any]:
        out = asdict(self)
        out["steps_per_second"] = round(self.steps_per_second, 1)
        return out


def reference_factory(config: PoolConfig) -> Any:
    """The pure-Python reference memory manager."""
    from kvpool.reference.memory_manager import MemoryManager

    return MemoryManager(config)


def optimized_factory(backend: str | None = "torch", checked: bool = True) -> Factory:
    """A factory of the optimized twin on the CPU (checked mode unless ``checked=False``, as the
    quality suite's mutants run), its kernels run by ``backend``
    (``torch`` fallbacks, ``interpret`` for Triton through the interpreter, None: default). The
    twin is imported on the first build, which also sets torch to ONE intra-op thread: lockstep
    tensors are tiny, and on a loaded 2-core machine OpenMP workers only contend (a 40-element
    ``repeat_interleave`` takes ~15 ms with 2 threads under load, ~10 us with 1)."""

    def build(config: PoolConfig) -> Any:
        import torch

        from kvpool.optimized.memory_manager import MemoryManager

        if torch.get_num_threads() != 1:
            torch.set_num_threads(1)

        params = inspect.signature(MemoryManager).parameters
        kwargs: dict[str, Any] = {}
        if "checked" in params:
            kwargs["checked"] = checked
        if backend is not None and "kernel_backend" in params:
            kwargs["kernel_backend"] = backend
        manager = MemoryManager(config, **kwargs)
        allocator = manager.token_to_kv_pool_allocator
        if backend is not None and hasattr(allocator, "kernel_backend"):
            allocator.kernel_backend = backend  # the allocator is what calls the kernels
        return manager

    return build


def load_factory(spec: str) -> Factory:
    """``MODULE:NAME`` -> that callable (a factory ``(PoolConfig) -> MemoryManagerProtocol``)."""
    module_name, sep, attr = spec.partition(":")
    if not sep or not module_name or not attr:
        raise ValueError(f"expected MODULE:FACTORY, got {spec!r}")
    factory = getattr(importlib.import_module(module_name), attr)
    if not callable(factory):
        raise TypeError(f"{spec} is not callable")
    built: Factory = factory
    return built


def replay(
    factory_a: Factory,
    factory_b: Factory,
    config: PoolConfig,
    ops: Sequence[Op],
    labels: tuple[str, str] = ("reference", "candidate"),
) -> LockstepFailure | None:
    """Run ``ops`` on a fresh pair; the failure they trigger, if any."""
    try:
        pair = Lockstep(factory_a, factory_b, config, labels)
        for op in ops:
            pair.run(op)
    except LockstepFailure as failure:
        return failure
    return None


def shrink(
    factory_a: Factory,
    factory_b: Factory,
    config: PoolConfig,
    ops: Sequence[Op],
    detector: str,
    labels: tuple[str, str] = ("reference", "candidate"),
    budget_s: float = 20.0,
) -> tuple[list[Op], LockstepFailure | None]:
    """Smallest sub-list of ``ops`` found that still fails with ``detector`` (greedy chunk then
    single-step deletion, within ``budget_s`` seconds) and its failure."""
    deadline = time.monotonic() + budget_s
    best = list(ops)
    last = replay(factory_a, factory_b, config, best, labels)

    def still_fails(candidate: list[Op]) -> LockstepFailure | None:
        found = replay(factory_a, factory_b, config, candidate, labels)
        return found if found is not None and found.detector == detector else None

    chunk = max(len(best) // 2, 1)
    while chunk >= 1 and time.monotonic() < deadline:
        i = 0
        while i + chunk <= len(best) and time.monotonic() < deadline:
            found = still_fails(best[:i] + best[i + chunk :])
            if found is None:
                i += chunk
                continue
            # Steps after the failing one never ran: drop them too.
            best, last = (best[:i] + best[i + chunk :])[: found.step], found
        chunk //= 2
    return best, last


def run_campaign(
    factory_a: Factory,
    factory_b: Factory,
    seconds: float,
    seed: int = 0,
    steps_per_run: int = 60,
    labels: tuple[str, str] = ("reference", "candidate"),
    progress: Progress | None = None,
    config_drawer: Callable[[RandomChooser], PoolConfig] | None = None,
    max_runs: int | None = None,
) -> CampaignResult:
    """Run lockstep runs until ``seconds`` have passed (or ``max_runs`` runs were made) or one
    fails (then shrink it)."""
    result = CampaignResult(seed=seed, seconds=0.0)
    factory_a(PoolConfig())  # warm-up outside the budget: first imports (torch) take seconds
    factory_b(PoolConfig())
    start = time.monotonic()
    run = 0
    while time.monotonic() - start < seconds and (max_runs is None or run < max_runs):
        chooser = RandomChooser(random.Random(f"{seed}/{run}"))
        config = (config_drawer or draw_config)(chooser)
        result.configurations += 1
        key = f"page_size={config.page_size}"
        result.page_sizes[key] = result.page_sizes.get(key, 0) + 1
        pair = Lockstep(factory_a, factory_b, config, labels)
        try:
            for _ in range(steps_per_run):
                pair.run(draw_op(chooser, pair.view(), chooser.choice(KINDS)))
                result.steps += 1
        except LockstepFailure as failure:
            result.steps += 1
            result.failures = 1
            result.invariant_checks += pair.checks
            result.seconds = time.monotonic() - start
            ops, shrunk = shrink(factory_a, factory_b, config, pair.ops, failure.detector, labels)
            final = shrunk or failure
            result.failure = CampaignFailure(
                run,
                asdict(config),
                final.detector,
                len(pair.ops),
                [op.render() for op in ops],
                str(final),
            )
            return result
        result.invariant_checks += pair.checks
        run += 1
        if progress is not None:
            progress(time.monotonic() - start, result.steps)
    result.seconds = time.monotonic() - start
    return result
