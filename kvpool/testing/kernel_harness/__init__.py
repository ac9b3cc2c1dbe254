"""The kernel harness: differential testing of one kernel against kvpool's pure-Python reference
(specs/kernel_harness.md). The lockstep harness, which drives whole implementations, is the rest
of :mod:`kvpool.testing`.

- :mod:`~kvpool.testing.kernel_harness.differential`: :func:`check_kernel`,
  :func:`assert_kernel_matches`, :class:`KernelReport`;
- :mod:`~kvpool.testing.kernel_harness.inputs`: the generated inputs (``kernel_cases``, ``OPS``);
- :mod:`~kvpool.testing.kernel_harness.ops`: running a candidate and the reference on one input;
- :mod:`~kvpool.testing.kernel_harness.interpreter`: Triton's interpreter on CPU, checked
  (:func:`checked_interpreter`: out-of-bounds accesses, device asserts, program order), with
  :mod:`~kvpool.testing.kernel_harness.guarded_memory` and
  :mod:`~kvpool.testing.kernel_harness.program_order` behind it.
"""

from __future__ import annotations

from kvpool.testing.kernel_harness.differential import (
    KernelReport,
    assert_kernel_matches,
    check_kernel,
)
from kvpool.testing.kernel_harness.interpreted import interpreted
from kvpool.testing.kernel_harness.interpreter import (
    DeviceAssertFailure,
    KernelCheckFailure,
    OrderDependence,
    OutOfBoundsAccess,
    allow_access,
    checked_interpreter,
)

__all__ = [
    "DeviceAssertFailure",
    "KernelCheckFailure",
    "KernelReport",
    "OrderDependence",
    "OutOfBoundsAccess",
    "allow_access",
    "assert_kernel_matches",
    "check_kernel",
    "checked_interpreter",
    "interpreted",
]
