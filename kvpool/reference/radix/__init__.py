"""The prefix cache: the radix tree with its release path, the chunk cache used when the tree is
disabled, eviction priorities and the tree's snapshot (the reference). Each public class is
imported here from the module that defines it.
"""

from kvpool.reference.radix.chunk_cache import ChunkCache
from kvpool.reference.radix.radix_cache import RadixCache

__all__ = ["ChunkCache", "RadixCache"]
