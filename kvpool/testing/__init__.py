"""Reusable test tooling: hypothesis profiles, the lockstep stateful harness and the kernel
differential harness. Users plug their own allocator or kernel into these."""
