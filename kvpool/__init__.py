"""kvpool: a verified model of SGLang's KV-cache memory pool.

Subpackages: :mod:`kvpool.reference` (pure-Python executable specification),
:mod:`kvpool.optimized` (the torch twin), :mod:`kvpool.kernels` (Triton kernels with torch and
pure-Python fallbacks), :mod:`kvpool.invariants` (named properties over plain snapshots),
:mod:`kvpool.testing` (lockstep and kernel differential harnesses) and :mod:`kvpool.cli`.

Importing ``kvpool`` imports neither torch nor any twin.
"""

from kvpool.config import PoolConfig
from kvpool.constants import RESERVED_INDEX
from kvpool.errors import KVPoolError

__all__ = ["RESERVED_INDEX", "KVPoolError", "PoolConfig"]
__version__ = "0.1.0"
