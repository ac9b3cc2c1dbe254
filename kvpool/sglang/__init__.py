"""kvpool.sglang: SGLang's own memory-pool classes behind kvpool's protocols (specs/sglang.md).

- :func:`load_sglang` loads SGLang's allocator, ``ReqToTokenPool`` and ``RadixCache`` modules
  from an installed package, a path or a release number, without SGLang's heavy dependencies;
- :class:`SGLangAllocator`, :class:`SGLangReqToTokenPool`, :class:`SGLangRadixCache` wrap them
  into :mod:`kvpool.protocols` on the CPU (Triton kernels through the interpreter);
- :func:`implementation` packs them as a :class:`kvpool.testing.bundle.Implementation` with the
  matching :class:`kvpool.rules.Rules`.

Importing this package imports torch (not SGLang); loading imports triton.
"""

from __future__ import annotations

from kvpool.sglang.allocators import SGLangAllocator
from kvpool.sglang.cache_req import CacheReq
from kvpool.sglang.host_pool import SGLangHostPool
from kvpool.sglang.implementation import from_spec, implementation
from kvpool.sglang.loader import PARTIAL_MODULES, REAL_MODULES, SGLangModules, load_sglang
from kvpool.sglang.radix import SGLangMatch, SGLangRadixCache, make_radix_key, to_sglang_key
from kvpool.sglang.req_to_token import ReqProxy, SGLangReqToTokenPool
from kvpool.sglang.source import SGLangSource, default_cache_dir, download_wheel, resolve_source

__all__ = [
    "PARTIAL_MODULES",
    "REAL_MODULES",
    "CacheReq",
    "ReqProxy",
    "SGLangAllocator",
    "SGLangHostPool",
    "SGLangMatch",
    "SGLangModules",
    "SGLangRadixCache",
    "SGLangReqToTokenPool",
    "SGLangSource",
    "default_cache_dir",
    "download_wheel",
    "from_spec",
    "implementation",
    "load_sglang",
    "make_radix_key",
    "resolve_source",
    "to_sglang_key",
]
