"""Reusable test tooling: hypothesis profiles and the lockstep stateful harness (this package),
the kernel differential harness (:mod:`kvpool.testing.kernel_harness`) and the quality suite's
hunts (:mod:`kvpool.testing.quality`). Users plug their own allocator or kernel into these."""
