"""The lifecycle's Mamba hooks: what a hybrid model adds to every lifecycle path.

:class:`~kvpool.reference.lifecycle_primitives.LifecyclePrimitives` builds a
:class:`MambaHooks` when ``config.mamba_slots`` is set (its request table is then a
:class:`~kvpool.reference.hybrid_req_to_token_pool.HybridReqToTokenPool`) and calls it at four
points, so that the lifecycle files carry one line per point:

- :meth:`check_admission`, before an extend changes anything: every request that needs a Mamba
  slot (and track buffers) must find one, else OutOfMemoryError with nothing changed. The prefix
  cache holds no state to evict (see below), so the free slots are all there is.
- :meth:`after_admission`, once the rows are taken: zero the fresh slots (SGLang's deferred clear
  runs in the same forward).
- :meth:`after_write`, whenever tokens' KV is computed: the forward also advanced the request's
  state, whose tag becomes that of every token computed so far.
- :meth:`before_release`, when a request's row goes back (finish, abort, retract, also inside
  prefill): its Mamba slot and track buffers go back too (SGLang frees them in
  ``release_kv_cache`` when the prefix cache does not manage Mamba states).

Scope: SGLang runs hybrid models with the radix cache either off (the chunk cache) or as a
``MambaRadixCache``; kvpool's lifecycle models the first (a hybrid configuration needs
``disable_radix_cache=True``). A session keeps its last turn's Mamba slot and track buffers
between turns with its row (:class:`~kvpool.reference.session.SessionSlot`). The Mamba radix
cache is modelled and verified as a component (:mod:`kvpool.reference.mamba_radix_cache`).
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Any

from kvpool.config import PoolConfig
from kvpool.errors import ConfigError, OutOfMemoryError
from kvpool.reference.hybrid_req_to_token_pool import HybridReqToTokenPool
from kvpool.reference.mamba_lifecycle import forward_state, prepare_forward
from kvpool.reference.req import Req
from kvpool.snapshot import HybridStateSnapshot, MambaReqSnapshot
from kvpool.tags import mamba_state_tag


def check_hybrid_config(config: PoolConfig) -> None:
    """ConfigError for a hybrid configuration the lifecycle does not model (radix cache on)."""
    if config.mamba_slots is not None and not config.disable_radix_cache:
        raise ConfigError("hybrid (Mamba) models need disable_radix_cache=True in the lifecycle")


def hybrid_pool(config: PoolConfig) -> HybridReqToTokenPool:
    """The request table of a hybrid configuration."""
    assert config.mamba_slots is not None
    return HybridReqToTokenPool(config.req_pool_size, config.max_context_len, config.mamba_slots,
                                config.mamba_layers, config.mamba_track_buffers,
                                rules=config.rules)  # fmt: skip


def mamba_hooks_for(pool: object) -> MambaHooks | None:
    """Hooks over ``pool`` when it is a hybrid pool, else None."""
    return MambaHooks(pool) if isinstance(pool, HybridReqToTokenPool) else None


class MambaHooks:
    """The Mamba work of the lifecycle over ``pool`` (see the module docstring)."""

    def __init__(self, pool: HybridReqToTokenPool) -> None:
        self.pool = pool

    def check_admission(self, reqs: Sequence[Req]) -> None:
        """OutOfMemoryError (nothing changed) when the batch needs more Mamba slots than are
        free."""
        need = self.pool.mamba_slots_needed(reqs)
        free = self.pool.mamba_allocator.schedulable_available_size()
        if need > free:
            raise OutOfMemoryError(f"need {need} Mamba slots; {free} free")

    def after_admission(self, reqs: Sequence[Req]) -> None:
        """Zero the state of every request given a fresh slot."""
        prepare_forward(self.pool, reqs)

    def after_write(self, req: Req, stop: int) -> None:
        """The forward computed tokens up to ``stop``: the state is that of ``tokens[:stop]``."""
        forward_state(self.pool, [req], [mamba_state_tag(req.all_token_ids[:stop], req.extra_key)])

    def before_release(self, req: Req) -> None:
        """Give back the request's Mamba slot and track buffers (it holds them with its row)."""
        if req.mamba_pool_idx is not None:
            self.pool.free_mamba_cache(req)

    def snapshot(self, reqs: Iterable[Req], sessions: Iterable[Any] = ()) -> HybridStateSnapshot:
        """The hybrid pool and every live request's Mamba slots with the state they must hold:
        that of every token whose KV is computed (``kv_committed_len``); then every session
        holding a slot between turns (``session ID``: the state after its committed tokens)."""
        views = tuple(
            MambaReqSnapshot(
                rid=r.rid,
                row=r.req_pool_idx,
                slot=r.mamba_pool_idx,
                track=tuple(r.mamba_ping_pong_track_buffer or ()),
                expected_tag=(
                    None
                    if r.mamba_pool_idx is None or r.mamba_needs_clear
                    else mamba_state_tag(r.all_token_ids[: r.kv_committed_len], r.extra_key)
                ),
            )
            for r in reqs
            if r.req_pool_idx is not None or r.mamba_pool_idx is not None
        )
        held = tuple(
            MambaReqSnapshot(
                rid=f"session {s.session_id}",
                row=s.req_pool_idx,
                slot=s.mamba_pool_idx,
                track=tuple(s.mamba_ping_pong_track_buffer or ()),
                expected_tag=mamba_state_tag(s.tokens, s.extra_key),
            )
            for s in sessions
            if s.mamba_pool_idx is not None
        )
        return HybridStateSnapshot(self.pool.hybrid_snapshot(), views + held)


__all__ = ["MambaHooks", "check_hybrid_config", "hybrid_pool", "mamba_hooks_for"]
