"""The HybridReqToTokenPool machine: hybrid requests' rows, Mamba slots and states, in lockstep.

Each side is a ``HybridReqToTokenPool`` and its implementation's Mamba steps
(:mod:`kvpool.reference.mamba.lifecycle`); the machine plays the prefix cache as a queue of
state checkpoints (``tree``, oldest first) that it fills (a copy of a running state, or the
slot a finishing request donates) and evicts. Operations follow a hybrid request's life: copy a
cached state into a waiting request (``stage_cow``), admission with or without eviction
(``admit``; a chunked request keeps its row and slot), the deferred copy and clear
(``prepare_forward``), forwards that write each request's state tag (``forward_state``), and
every release path (``release`` of a running request, inside prefill or not, freeing, keeping a
track buffer or donating its slot; ``abort_waiting`` of one that never ran).

The model (from side A's outcomes) knows every owner of a slot and the token history behind
each state, so the Mamba invariants (:mod:`kvpool.invariants.mamba`) run exactly after every
step, on both sides.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from kvpool.config import PoolConfig
from kvpool.invariants import check_req_to_token
from kvpool.invariants.mamba import MambaContext, MambaReqView, check_mamba
from kvpool.snapshot import HybridReqToTokenSnapshot
from kvpool.testing import report
from kvpool.testing.bundle import Implementation
from kvpool.testing.machines.base import Outcome
from kvpool.testing.machines.hybrid_model import HybridModel, coverage_tags, observe_hybrid
from kvpool.testing.machines.hybrid_ops import draw_hybrid_op, materialize_hybrid
from kvpool.testing.swarm import Chooser, Op


@dataclass
class MachineMambaReq:
    """The fields a hybrid pool reads and writes (:class:`~kvpool.protocols.MambaReqLike`)."""

    req_pool_idx: int | None = None
    is_chunked: int = 0
    kv_committed_len: int = 0
    mamba_pool_idx: int | None = None
    mamba_needs_clear: bool = False
    mamba_cow_src_index: int | None = None
    mamba_ping_pong_track_buffer: list[int] | None = None
    mamba_next_track_idx: int | None = None


@dataclass
class HybridSide:
    pool: Any
    steps: Any
    index: Any
    reqs: dict[int, MachineMambaReq] = field(default_factory=dict)
    tree: list[int] = field(default_factory=list)
    """Checkpoint slots the stand-in prefix cache holds, oldest first."""

    def locked(self) -> set[int]:
        """Checkpoints a staged copy still reads (a match locks its node until the copy)."""
        return {r.mamba_cow_src_index for r in self.reqs.values()
                if r.mamba_cow_src_index is not None}  # fmt: skip

    def evict(self, n: int) -> int:
        """Free up to ``n`` unlocked checkpoints, oldest first; returns how many."""
        locked = self.locked()
        victims = [s for s in self.tree if s not in locked][: max(n, 0)]
        if victims:
            self.pool.mamba_allocator.free(self.index(victims))
            self.tree = [s for s in self.tree if s not in victims]
        return len(victims)


def _slots(req: MachineMambaReq) -> tuple[Any, Any]:
    return report.normalize(req.mamba_pool_idx), report.normalize(req.mamba_ping_pong_track_buffer)


class HybridTarget:
    """:class:`~kvpool.testing.machines.base.Target` of the hybrid request-table machine."""

    name = "hybrid_req_to_token_pool"

    def draw_config(self, c: Chooser, impl: Implementation) -> PoolConfig:
        rules = impl.rules_or_default()
        return PoolConfig(req_pool_size=c.integer(1, 6), max_context_len=16,
                          mamba_slots=c.integer(1, 9), mamba_layers=c.integer(1, 2),
                          mamba_track_buffers=c.choice((0, 0, 1, 2)), rules=rules)  # fmt: skip

    def build(self, impl: Implementation, config: PoolConfig) -> HybridSide:
        assert impl.hybrid_req_to_token_pool is not None
        return HybridSide(impl.hybrid_req_to_token_pool(config), impl.mamba_steps, impl.index)

    def snapshot(self, side: HybridSide) -> HybridReqToTokenSnapshot:
        snap: HybridReqToTokenSnapshot = side.pool.hybrid_snapshot()
        return snap

    def new_model(self, config: PoolConfig) -> HybridModel:
        return HybridModel(config)

    def pretty(self, snap: Any) -> str:
        return repr(snap)

    def draw_op(self, c: Chooser, model: HybridModel, rejects_misuse: bool) -> Op:
        return draw_hybrid_op(c, rejects_misuse)

    def materialize(self, model: HybridModel, op: Op) -> Op | None:
        return materialize_hybrid(model, op)

    def call(self, side: HybridSide, op: Op) -> Any:
        pool, steps, reqs = side.pool, side.steps, side.reqs
        if op.name == "admit":
            rids, chunked, evict = op.args
            batch = [reqs.setdefault(rid, MachineMambaReq()) for rid in rids]
            for req in batch:
                if req.req_pool_idx is not None:
                    req.is_chunked = 1  # a chunked request between chunks keeps its row
            before = len(side.tree)
            rows = steps.admit(pool, batch, side.evict if evict else None)
            evicted = before - len(side.tree)
            if rows is None:
                return None, evicted
            for req, flag in zip(batch, chunked, strict=True):
                req.is_chunked = int(flag)
            return report.normalize(rows), [_slots(r) for r in batch], evicted
        if op.name == "stage_cow":
            rid, src = op.args
            req = reqs.setdefault(rid, MachineMambaReq())
            return steps.stage_cow(pool, req, src), _slots(req)[0]
        if op.name == "prepare_forward":
            return steps.prepare_forward(pool, [reqs[r] for r in op.args[0]])
        if op.name == "forward_state":
            return steps.forward_state(pool, [reqs[r] for r in op.args[0]], op.args[1])
        if op.name == "cache_state":
            got = pool.mamba_allocator.alloc(1)
            if got is None:
                return None
            pool.mamba_pool.copy_from(side.index([op.args[1]]), got)
            side.tree.extend(report.normalize(got))
            return report.normalize(got)
        if op.name == "release":
            rid, keep, donate = op.args
            donated = report.normalize(steps.release_running(pool, reqs[rid], keep, donate))
            side.tree.extend(donated)
            reqs.pop(rid)
            return donated
        if op.name == "abort_waiting":
            freed = steps.release_waiting(pool, reqs.get(op.args[0], MachineMambaReq()))
            reqs.pop(op.args[0], None)
            return report.normalize(freed)
        if op.name == "evict":
            return side.evict(op.args[0])
        if op.name in ("alloc_group_begin", "alloc_group_end"):
            return getattr(pool.mamba_allocator, op.name)(*op.args)
        if op.name == "clear":
            side.reqs.clear()
            side.tree.clear()
            return pool.clear()
        return invalid_call(side, op)

    def observe(self, model: HybridModel, op: Op, out: Outcome) -> None:
        observe_hybrid(model, op, out)

    def check(self, model: HybridModel, snap: Any, previous: Any) -> int:
        views = tuple(
            MambaReqView(f"req {rid}", r.row, r.slot, r.track, r.expected_tag())
            for rid, r in sorted(model.reqs.items())
        )
        ctx = MambaContext(views, tuple((s, c.tag) for s, c in model.tree.items()))
        held_rows = {r.row for r in model.reqs.values() if r.row is not None}
        reset = model.just_cleared and model.config.rules.generation_on_clear == "reset"
        before = previous.table if previous is not None and not reset else None
        count = check_req_to_token(snap.table, held_rows, before)
        return count + check_mamba(snap, ctx)

    def refusal_must_not_change(self, config: PoolConfig, op: Op, out: Outcome) -> bool:
        if out.error is not None:
            return True
        if op.name == "admit" and out.result is not None and out.result[0] is None:
            return not op.args[2]  # an admission that evicted has changed the tree
        if op.name == "stage_cow":
            return out.result is not None and out.result[0] is False
        return op.name == "cache_state" and out.result is None

    def coverage(self, model: HybridModel, op: Op, out: Outcome) -> list[str]:
        return coverage_tags(model, op, out)


def invalid_call(side: HybridSide, op: Op) -> Any:
    """The deliberately invalid calls (each must raise and change nothing)."""
    pool, steps = side.pool, side.steps
    kind = op.args[0]
    if kind == "free-mamba-twice":
        return pool.free_mamba_cache(MachineMambaReq(req_pool_idx=1))
    if kind == "free-reserved":
        return pool.mamba_allocator.free(side.index([0]))
    if kind == "free-free-slot":
        return pool.mamba_allocator.free(side.index([op.args[1]]))
    if kind == "release-waiting-as-running":
        return steps.release_running(pool, MachineMambaReq())
    if kind == "copy-out-of-range":
        return pool.mamba_pool.copy_from(side.index([1]), side.index([pool.mamba_pool.size + 1]))
    if kind == "cow-own-slot":
        req = side.reqs[op.args[1]]
        return steps.stage_cow(pool, req, op.args[2])
    raise AssertionError(f"unknown op {op.name} {kind}")


__all__ = ["HybridSide", "HybridTarget", "MachineMambaReq"]
