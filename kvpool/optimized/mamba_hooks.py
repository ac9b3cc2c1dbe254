"""The lifecycle's Mamba hooks (optimized twin): what a hybrid model adds to every path.

Same hooks, call points, results and errors as :mod:`kvpool.reference.mamba_hooks` (read its
docstring). The state tag of a forward is the request's cached running KV tag of its last
computed token (equal to :func:`kvpool.tags.mamba_state_tag` of the tokens so far), and the
device work goes through the twin's batched Mamba steps.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Any

from kvpool.config import PoolConfig
from kvpool.errors import OutOfMemoryError
from kvpool.optimized.hybrid_req_to_token_pool import HybridReqToTokenPool
from kvpool.optimized.mamba_lifecycle import forward_state, prepare_forward
from kvpool.optimized.options import TwinOptions, twin_options
from kvpool.optimized.req import Req
from kvpool.reference.mamba_hooks import check_hybrid_config
from kvpool.snapshot import HybridStateSnapshot, MambaReqSnapshot
from kvpool.tags import mamba_state_tag


def hybrid_pool(config: PoolConfig, options: TwinOptions | None = None) -> HybridReqToTokenPool:
    """The request table of a hybrid configuration."""
    assert config.mamba_slots is not None
    return HybridReqToTokenPool(config.req_pool_size, config.max_context_len, config.mamba_slots,
                                config.mamba_layers, config.mamba_track_buffers,
                                rules=config.rules, options=twin_options(options))  # fmt: skip


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
        tag = int(req.kv_tags_upto(stop)[stop - 1]) if stop > 0 else 0
        forward_state(self.pool, [req], [tag])

    def after_writes(self, reqs: Sequence[Req], stops: Sequence[int]) -> None:
        """:meth:`after_write` for a batch: one state write for every request."""
        if not reqs:
            return
        tags = [
            int(r.kv_tags_upto(s)[s - 1]) if s > 0 else 0 for r, s in zip(reqs, stops, strict=True)
        ]
        forward_state(self.pool, list(reqs), tags)

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
