"""``Implementation``: one implementation's component factories, as the harness consumes them.

The component machines (allocator, ReqToTokenPool, radix cache) and the lifecycle machine drive
two implementations side by side. Each side is described by an :class:`Implementation`: a
factory per component it provides, the key type its radix cache takes, and the
:class:`~kvpool.rules.Rules` it follows (applied to every configuration the swarm draws, so that
the reference behaves as the implementation's documented rules say).

Factory shapes (every size comes from the :class:`~kvpool.config.PoolConfig`):

- ``allocator(config)``: a :class:`~kvpool.protocols.TokenAllocatorProtocol` of ``config.size``
  tokens, ``config.page_size`` (a paged allocator, with ``alloc_extend`` / ``alloc_decode``,
  when it is above 1) and ``config.need_sort``;
- ``req_to_token_pool(config)``: a :class:`~kvpool.protocols.ReqToTokenPoolProtocol` of
  ``config.req_pool_size`` rows and ``config.max_context_len`` columns;
- ``radix_cache(config, req_to_token_pool, allocator)``: a
  :class:`~kvpool.protocols.RadixCacheProtocol` over the two objects given (built by this same
  implementation's factories), with ``config.eviction_policy``;
- ``radix_key(token_ids, extra_key)``: the key its radix cache takes;
- ``manager(config)``: a whole :class:`~kvpool.protocols.MemoryManagerProtocol`; one with a
  ``run_own_checks()`` method (its own checks, raising
  :class:`~kvpool.errors.InvariantViolation`) has them run after kvpool's invariants at every
  step (:mod:`kvpool.testing.lockstep_driver`);
- ``hybrid_req_to_token_pool(config)``: a ``HybridReqToTokenPool`` of ``config.req_pool_size``
  rows and ``config.mamba_slots`` Mamba slots (``config.mamba_layers`` layers,
  ``config.mamba_track_buffers`` track buffers per request), with ``mamba_steps``: the module
  (or any object) holding the scheduler's Mamba steps over it (``admit``, ``stage_cow``,
  ``prepare_forward``, ``forward_state``, ``release_waiting``, ``release_running``; see
  :mod:`kvpool.reference.mamba.lifecycle`);
- ``mamba_radix_cache(config, hybrid_req_to_token_pool, allocator)``: a ``MambaRadixCache`` over
  the two objects given (page size 1), its keys made by ``radix_key``.
- ``swa_allocator(config)``: a sliding-window hybrid allocator (SGLang's
  ``SWATokenToKVPoolAllocator`` API) of ``config.size`` full tokens and ``config.swa_size`` SWA
  tokens, ``config.page_size`` and ``config.need_sort``;
- ``swa_radix_cache(config, swa_allocator)``: a sliding-window prefix tree (SGLang's
  ``SWARadixCache`` API) over the SWA allocator given, window ``config.sliding_window``;
- ``swa_manager(config)``: a whole lifecycle on a hybrid sliding-window model (a
  ``MemoryManagerProtocol`` whose snapshots carry ``swa``).
- ``hiradix_cache(config, req_to_token_pool, allocator)``: a hierarchical cache (SGLang's
  ``HiRadixCache`` API) over the allocator given, with its own device KV buffers and a host pool
  of ``config.hicache_ratio`` times the device size, ``config.hicache_write_policy``, the
  ``hicache_*`` thresholds and storage; its ``host_snapshot()`` is a ``HostTierSnapshot``.

A missing factory means the implementation does not provide that component; the harness says so
rather than guessing a substitute.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from kvpool.config import PoolConfig
from kvpool.rules import Rules

COMPONENTS = (
    "allocator",
    "req_to_token_pool",
    "radix_cache",
    "manager",
    "hybrid_req_to_token_pool",
    "mamba_radix_cache",
    "swa_allocator",
    "swa_radix_cache",
    "swa_manager",
    "hiradix_cache",
    "kv_pool",
    "unified_radix_cache",
    "unified_mamba_radix_cache",
    "unified_swa_radix_cache",
)
"""Component names, as ``kvpool verify --component`` spells them."""


@dataclass(frozen=True)
class Implementation:
    """The factories of one implementation (see the module docstring for their shapes)."""

    label: str
    allocator: Callable[[PoolConfig], Any] | None = None
    req_to_token_pool: Callable[[PoolConfig], Any] | None = None
    radix_cache: Callable[[PoolConfig, Any, Any], Any] | None = None
    radix_key: Callable[[Sequence[int], str | None], Any] | None = None
    manager: Callable[[PoolConfig], Any] | None = None
    hybrid_req_to_token_pool: Callable[[PoolConfig], Any] | None = None
    mamba_steps: Any = None
    mamba_radix_cache: Callable[[PoolConfig, Any, Any], Any] | None = None
    swa_allocator: Callable[[PoolConfig], Any] | None = None
    swa_radix_cache: Callable[[PoolConfig, Any], Any] | None = None
    swa_manager: Callable[[PoolConfig], Any] | None = None
    rules: Rules | None = None
    """The rules this implementation follows; None: kvpool's default :class:`Rules`."""
    index: Callable[[Sequence[int]], Any] = list
    """Converts a list of slot ids (or lengths) into the implementation's index container
    (``list`` for the reference, an int64 tensor for torch implementations)."""
    hiradix_cache: Callable[[PoolConfig, Any, Any], Any] | None = None
    hiradix_storage: bool = True
    """Whether its ``hiradix_cache`` runs storage prefetches (the machine draws storage
    configurations only then)."""
    kv_cache: Callable[[PoolConfig], Any] | None = None
    """The KV pool ``PoolConfig.kv_storage`` names (the ``kv_pool`` machine)."""
    layer_done_counter: Callable[[int], Any] | None = None
    """A ``LayerDoneCounter`` for a number of layers (the ``kv_pool`` machine)."""
    unified_radix_cache: Callable[[PoolConfig, Any, Any], Any] | None = None
    """SGLang 0.5.23's ``UnifiedRadixCache`` (FULL component) with the ``radix_cache`` shape;
    the ``unified_radix_cache`` machine drives it, and the lifecycle uses it as its tree when
    ``unified_lifecycle`` is set (SGLang's server default)."""
    reachability: Callable[[PoolConfig, Sequence[Any]], str] | None = None
    """For a candidate whose manager runs another system's own scheduler glue (SGLang's):
    one line saying whether a failing lifecycle trace (its ops) is reachable through that
    system's scheduler paths; the lifecycle machine adds it to every failure report."""
    absent: tuple[tuple[str, str], ...] = ()
    """(component, why) for components this implementation cannot provide, named in the
    usage error ``kvpool verify`` prints (e.g. a class the release removed)."""
    manager_runs_hybrid: bool = True
    """Whether ``manager`` runs hybrid (Mamba) lifecycles (the lifecycle machine draws hybrid
    configurations for an implementation with a manager and a hybrid pool only then)."""
    unified_mamba_radix_cache: Callable[[PoolConfig, Any, Any], Any] | None = None
    """SGLang 0.5.23's ``UnifiedRadixCache`` with the FULL and MAMBA components, with the
    ``mamba_radix_cache`` shape (over a hybrid pool and a token allocator, page size 1); the
    ``unified_mamba_radix_cache`` machine drives it."""
    unified_swa_radix_cache: Callable[[PoolConfig, Any], Any] | None = None
    """SGLang 0.5.23's ``UnifiedRadixCache`` with the FULL and SWA components (or kvpool's model
    of it), with the ``swa_radix_cache`` shape (over ``swa_allocator``); the
    ``unified_swa_radix_cache`` machine drives it."""
    radix_models_eagle: bool = False
    """Whether its ``radix_cache`` and ``unified_radix_cache`` trees, and its sliding-window
    trees (``swa_radix_cache``, ``unified_swa_radix_cache``), key by bigrams under
    ``PoolConfig.is_eagle`` (the tree machines draw such configurations only then)."""
    manager_models_eagle: bool = False
    """Whether ``manager`` keys its radix tree by bigrams under ``PoolConfig.is_eagle`` (EAGLE:
    the lifecycle machine draws such configurations only then), and ``swa_manager`` too (the
    ``swa_manager`` machine's radix runs)."""
    manager_models_stops: bool = False
    """Whether ``manager``'s ``finish`` (and ``swa_manager``'s) takes ``finished_lens`` (a stop
    before a request's last output token) and releases as ``Rules.release_upto`` says (the
    lifecycle and ``swa_manager`` machines draw such finishes only then; never for a hybrid
    model's session turn, and less than a window back)."""
    unified_lifecycle: bool = False
    """Whether the lifecycle's tree is ``unified_radix_cache`` (SGLang 0.5.23's server default)
    rather than ``radix_cache``."""
    coarse_unified_tree: bool = False
    """Whether the snapshot of its unified tree leaves out what SGLang's tree cores do not
    expose (access times, hit counts, priorities, the children's order): a lifecycle over the
    unified tree then compares both sides' trees as
    :func:`~kvpool.testing.machines.unified.coarse_tree` does. False (kvpool's twins, whose
    snapshots are whole): compared exactly."""

    def rules_or_default(self) -> Rules:
        """The rules this implementation follows (kvpool's default when it names none)."""
        return self.rules if self.rules is not None else Rules()

    def provides(self, component: str) -> bool:
        """Whether this implementation can be driven by the machine of ``component``."""
        if component == "manager":  # else the twin's manager around the components it has
            return any(
                f is not None
                for f in (self.manager, self.allocator, self.req_to_token_pool, self.radix_cache)
            )
        if component == "hicache_manager":  # a whole manager with a host tier
            return self.manager is not None and self.hiradix_cache is not None
        if component == "mamba_manager":  # a whole manager that runs hybrid models
            return (
                self.manager is not None
                and self.manager_runs_hybrid
                and self.hybrid_req_to_token_pool is not None
            )
        if component == "unified_radix_cache":
            return self.unified_radix_cache is not None and all(
                f is not None for f in (self.radix_key, self.allocator, self.req_to_token_pool)
            )
        if component == "radix_cache":
            return all(
                f is not None
                for f in (self.radix_cache, self.radix_key, self.allocator, self.req_to_token_pool)
            )
        if component == "hybrid_req_to_token_pool":
            return self.hybrid_req_to_token_pool is not None and self.mamba_steps is not None
        if component == "mamba_radix_cache":
            return all(f is not None for f in (self.mamba_radix_cache, self.mamba_steps,
                                               self.hybrid_req_to_token_pool, self.allocator,
                                               self.radix_key))  # fmt: skip
        if component == "unified_swa_radix_cache":
            return all(f is not None for f in (self.unified_swa_radix_cache, self.swa_allocator,
                                               self.radix_key))  # fmt: skip
        if component == "unified_mamba_radix_cache":
            return all(f is not None for f in (self.unified_mamba_radix_cache, self.mamba_steps,
                                               self.hybrid_req_to_token_pool, self.allocator,
                                               self.radix_key))  # fmt: skip
        if component == "hiradix_cache":
            return all(f is not None for f in (self.hiradix_cache, self.allocator,
                                               self.req_to_token_pool, self.radix_key))  # fmt: skip
        if component == "swa_radix_cache":
            return all(f is not None for f in (self.swa_radix_cache, self.swa_allocator,
                                               self.radix_key))  # fmt: skip
        if component == "kv_pool":
            return self.kv_cache is not None and self.layer_done_counter is not None
        return getattr(self, component) is not None


__all__ = ["COMPONENTS", "Implementation"]
