"""The lockstep machine over the project's own implementations.

- reference vs reference: the harness itself (generation, comparison, every invariant) on the
  executable specification;
- reference vs the optimized twin with torch fallbacks;
- reference vs the optimized twin with the Triton kernels run by the interpreter (slow: a small
  budget of its own).

All follow the loaded hypothesis profile (``ci`` in the test command; ``nightly`` goes deep).
"""

from __future__ import annotations

import pytest
from hypothesis import settings

from kvpool.config import PoolConfig
from kvpool.testing.factories import optimized_factory, reference_factory
from kvpool.testing.lockstep_machine import make_lockstep_test
from kvpool.testing.swarm import Chooser, draw_config

_LOADED = settings()  # the loaded profile's values

TestReferenceVsReference = make_lockstep_test(
    reference_factory,
    reference_factory,
    labels=("reference", "reference"),
    name="RefRef",
    stops=True,
)
TestReferenceVsReference = pytest.mark.slow(TestReferenceVsReference)

# The twin is the project's product: it gets a deeper run than the profile's default (the
# profile still wins when it asks for more, e.g. nightly).
_DEEPER = settings(
    _LOADED,
    max_examples=max(_LOADED.max_examples, 200),
    stateful_step_count=max(_LOADED.stateful_step_count, 50),
)

TestReferenceVsOptimized = make_lockstep_test(
    reference_factory,
    optimized_factory("torch"),
    test_settings=_DEEPER,
    labels=("reference", "optimized"),
    name="RefOpt",
    stops=True,
)
TestReferenceVsOptimized = pytest.mark.slow(TestReferenceVsOptimized)

_INTERPRETER_BUDGET = settings(
    _LOADED,
    max_examples=min(_LOADED.max_examples, 20),
    stateful_step_count=min(_LOADED.stateful_step_count, 25),
)


def _paged_config(c: Chooser) -> PoolConfig:
    """Paged pools only: page size 1 never launches the allocation kernels."""
    return draw_config(c, page_size=c.choice((2, 4, 16)))


TestReferenceVsInterpretedKernels = make_lockstep_test(
    reference_factory,
    optimized_factory("interpret"),
    config_drawer=_paged_config,
    test_settings=_INTERPRETER_BUDGET,
    labels=("reference", "optimized[interpret]"),
    name="RefInterp",
)
TestReferenceVsInterpretedKernels = pytest.mark.slow(TestReferenceVsInterpretedKernels)


def test_interpret_factory_runs_the_kernels_through_the_interpreter() -> None:
    manager = optimized_factory("interpret")(PoolConfig(size=32, page_size=4))
    assert manager.token_to_kv_pool_allocator.kernel_backend == "interpret"
