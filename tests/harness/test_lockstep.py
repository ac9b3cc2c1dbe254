"""The lockstep machine over the project's own implementations.

- reference vs reference: the harness itself (generation, comparison, every invariant) on the
  executable specification;
- reference vs the optimized twin with torch fallbacks;
- reference vs the optimized twin with the Triton kernels run by the interpreter (slow: a small
  budget of its own).

All follow the loaded hypothesis profile (``ci`` in the test command; ``nightly`` goes deep).
"""

from __future__ import annotations

from hypothesis import settings

from kvpool.testing.campaign import optimized_factory, reference_factory
from kvpool.testing.lockstep import make_lockstep_test

TestReferenceVsReference = make_lockstep_test(
    reference_factory, reference_factory, labels=("reference", "reference"), name="RefRef"
)

TestReferenceVsOptimized = make_lockstep_test(
    reference_factory, optimized_factory("torch"), labels=("reference", "optimized"), name="RefOpt"
)

_LOADED = settings()  # the loaded profile's values
_INTERPRETER_BUDGET = settings(
    _LOADED,
    max_examples=min(_LOADED.max_examples, 6),
    stateful_step_count=min(_LOADED.stateful_step_count, 25),
)

TestReferenceVsInterpretedKernels = make_lockstep_test(
    reference_factory,
    optimized_factory("interpret"),
    test_settings=_INTERPRETER_BUDGET,
    labels=("reference", "optimized[interpret]"),
    name="RefInterp",
)


def test_interpret_factory_runs_the_kernels_through_the_interpreter() -> None:
    from kvpool.config import PoolConfig

    manager = optimized_factory("interpret")(PoolConfig(size=32, page_size=4))
    assert manager.token_to_kv_pool_allocator.kernel_backend == "interpret"
