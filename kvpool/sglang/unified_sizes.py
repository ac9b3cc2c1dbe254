"""The eviction and size calls of SGLang's unified FULL+SWA and FULL+MAMBA trees, shared by the
adapters of both releases' trees (0.5.23: :mod:`kvpool.sglang.unified_swa_radix`,
:mod:`kvpool.sglang.unified_mamba_radix`; 0.5.16: :mod:`kvpool.sglang.unified16_swa_radix`,
:mod:`kvpool.sglang.unified16_mamba_radix`), whose ``evict`` takes the same ``EvictParams`` and
whose sizes are the same methods. Units: tokens for KV, states for Mamba."""

from __future__ import annotations

from contextlib import AbstractContextManager
from typing import Any, Protocol

from kvpool.sglang.loader import SGLangModules
from kvpool.sglang.unified_base import BASE


class _TreeAdapter(Protocol):
    """What the calls below use of an adapter: SGLang's modules, its cache and the call guard
    (the adapter's node counter kept around each SGLang call)."""

    modules: SGLangModules
    impl: Any  # SGLang's UnifiedRadixCache of either release (no types of SGLang's here)

    def _call(self) -> AbstractContextManager[None]: ...


class _MambaTreeAdapter(_TreeAdapter, Protocol):
    """An adapter with the FULL+MAMBA ``evict`` below."""

    def evict(self, num_tokens: int = 0, mamba_num: int = 0) -> tuple[int, int]: ...


class SWATreeSizes:
    """``evict`` and the four sizes of a FULL+SWA tree."""

    def evict(self: _TreeAdapter, num_tokens: int, swa_num_tokens: int = 0) -> tuple[int, int]:
        """(full tokens freed, SWA tokens freed)."""
        params = self.modules.attr(BASE, "EvictParams")(
            num_tokens=num_tokens, swa_num_tokens=swa_num_tokens
        )
        with self._call():
            result = self.impl.evict(params)
        return int(result.num_tokens_evicted), int(result.swa_num_tokens_evicted)

    def full_evictable_size(self: _TreeAdapter) -> int:
        return int(self.impl.full_evictable_size())

    def full_protected_size(self: _TreeAdapter) -> int:
        return int(self.impl.full_protected_size())

    def swa_evictable_size(self: _TreeAdapter) -> int:
        return int(self.impl.swa_evictable_size())

    def swa_protected_size(self: _TreeAdapter) -> int:
        return int(self.impl.swa_protected_size())


class MambaTreeSizes:
    """``evict`` (and its two one-sided forms), the four sizes and the held states of a
    FULL+MAMBA tree."""

    def evict(self: _TreeAdapter, num_tokens: int = 0, mamba_num: int = 0) -> tuple[int, int]:
        """SGLang's ``evict``: ``(tokens, states)`` it reports evicted."""
        params = self.modules.attr(BASE, "EvictParams")(num_tokens=num_tokens,
                                                        mamba_num=mamba_num)  # fmt: skip
        with self._call():
            result = self.impl.evict(params)
        return int(result.num_tokens_evicted), int(result.mamba_num_evicted)

    def evict_mamba(self: _MambaTreeAdapter, mamba_num: int) -> int:
        return self.evict(0, mamba_num)[1]

    def evict_full(self: _MambaTreeAdapter, full_num_tokens: int) -> int:
        return self.evict(full_num_tokens, 0)[0]

    def full_evictable_size(self: _TreeAdapter) -> int:
        return int(self.impl.full_evictable_size())

    def mamba_evictable_size(self: _TreeAdapter) -> int:
        return int(self.impl.mamba_evictable_size())

    def full_protected_size(self: _TreeAdapter) -> int:
        return int(self.impl.full_protected_size())

    def mamba_protected_size(self: _TreeAdapter) -> int:
        return int(self.impl.mamba_protected_size())

    def all_mamba_values(self: _TreeAdapter) -> list[int]:
        return [int(s) for s in self.impl.all_mamba_values_flatten().reshape(-1).tolist()]


__all__ = ["MambaTreeSizes", "SWATreeSizes"]
