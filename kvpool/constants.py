"""Named constants shared by every part of kvpool (no bare literals for reserved indices)."""

from __future__ import annotations

from typing import Final

RESERVED_INDEX: Final[int] = 0
"""Row 0 of the request table, token slot 0 and page 0 (slots ``[0, page_size)``) are never
handed out: padded batches (CUDA-graph capture) write their dummy data there."""

NO_LAST_LOC: Final[int] = -1
"""``last_loc`` of a request with an empty prefix: there is no slot of token ``P - 1``."""

EVICTION_POLICIES: Final[tuple[str, ...]] = (
    "lru",
    "lfu",
    "fifo",
    "mru",
    "filo",
    "priority",
    "slru",
)
"""Radix-cache eviction policies, by the names SGLang uses. ``lru`` is the default."""

ROOT_PRIORITY: Final[int] = -(2**63 - 1)
"""The radix root's priority in SGLang (``-sys.maxsize``, so that any real priority is above
it). Inserts raise the nodes they enter, never the root; a host-only node that a storage
prefetch hangs directly below the root inherits it (``priority`` eviction takes it first)."""

SUPPORTED_PAGE_SIZES_TESTED: Final[tuple[int, ...]] = (1, 2, 4, 16, 64)
"""The page sizes every stateful suite draws from."""

KERNEL_OPS: Final[tuple[str, ...]] = (
    "alloc_extend",
    "alloc_decode",
    "write_req_to_token",
    "get_last_loc",
    "create_flashinfer_kv_indices",
    "create_flashmla_kv_indices",
    "create_flashmla_kv_indices_v2p",
)
"""The kernel ops the differential harness knows, by their :mod:`kvpool.kernels` names."""

SHORT_FREE_LIST_MODES: Final[tuple[str, ...]] = ("off", "lenient", "strict")
"""How the kernel harness draws too-few-free-pages inputs
(:mod:`kvpool.testing.kernel_harness.differential`)."""


def is_power_of_two(n: int) -> bool:
    """True for 1, 2, 4, 8, ...; False for 0, negatives and everything else."""
    return n > 0 and (n & (n - 1)) == 0


def ceil_div(a: int, b: int) -> int:
    """Ceiling of ``a / b`` for ``a >= 0``, ``b > 0``."""
    return -(-a // b)


def ceil_align(n: int, page_size: int) -> int:
    """Smallest multiple of ``page_size`` that is ``>= n`` (units: tokens)."""
    return ceil_div(n, page_size) * page_size


def floor_align(n: int, page_size: int) -> int:
    """Largest multiple of ``page_size`` that is ``<= n`` (units: tokens)."""
    return (n // page_size) * page_size
