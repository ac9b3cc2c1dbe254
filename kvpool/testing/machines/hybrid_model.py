"""The hybrid machine's model: every owner of a Mamba slot and the history behind each state.

Updated from side A's outcomes (:func:`observe_hybrid`); the invariants get their context from
it, and :func:`coverage_tags` names what each step reached.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from kvpool.config import PoolConfig
from kvpool.tags import mamba_state_tag
from kvpool.testing.machines.base import Outcome
from kvpool.testing.machines.coverage import outcome_tag
from kvpool.testing.swarm import Op


@dataclass
class ModelReq:
    """One hybrid request: row (None: waiting), running slot, track slots, the pending Mamba
    work (``"clear"`` or ``"cow"`` of checkpoint ``cow_src``), whether it is between prefill
    chunks, and the token history its state was computed from (None: unknown)."""

    row: int | None = None
    slot: int | None = None
    track: tuple[int, ...] = ()
    pending: str | None = None
    cow_src: int | None = None
    chunked: bool = False
    history: tuple[int, ...] | None = ()

    def expected_tag(self) -> int | None:
        """The state tag the request's slot must hold now (None: not known)."""
        if self.slot is None or self.pending is not None or self.history is None:
            return None
        return mamba_state_tag(self.history)

    def ready(self) -> bool:
        return self.row is not None and self.slot is not None and self.pending is None


@dataclass
class Checkpoint:
    """A state the stand-in prefix cache holds: its tag when taken and its history."""

    tag: int
    history: tuple[int, ...] | None


@dataclass
class HybridModel:
    config: PoolConfig
    reqs: dict[int, ModelReq] = field(default_factory=dict)
    tree: dict[int, Checkpoint] = field(default_factory=dict)
    """Checkpoint slot -> checkpoint, oldest first."""
    next_req: int = 0
    in_group: bool = False
    free_rows: int | None = None
    """Free rows and Mamba slots after the last step (None: the pool's initial sizes)."""
    free_mamba: int | None = None
    just_cleared: bool = False
    """The last step was a ``clear`` (generations may restart: Rules.generation_on_clear)."""

    def running(self) -> list[int]:
        return sorted(rid for rid, r in self.reqs.items() if r.row is not None)

    def waiting(self) -> list[int]:
        return sorted(rid for rid, r in self.reqs.items() if r.row is None)

    def evict(self, count: int) -> None:
        """Drop the ``count`` oldest checkpoints no staged copy reads (as the side does)."""
        locked = {r.cow_src for r in self.reqs.values() if r.pending == "cow"}
        for slot in [s for s in self.tree if s not in locked][:count]:
            del self.tree[slot]

    def admission_short(self, rids: list[int], evict: bool) -> bool:
        """Whether admitting ``rids`` finds the rows but too few Mamba slots, even after the
        eviction admission makes (``evict``: the prefix cache evicts up to three slots per
        request of headroom, as the steps do)."""
        rows = self.free_rows if self.free_rows is not None else self.config.req_pool_size
        free = self.free_mamba
        if free is None:
            free = self.config.mamba_slots or self.config.req_pool_size
        waiting = [self.reqs.get(rid, ModelReq()) for rid in rids]
        if sum(1 for r in waiting if r.row is None) > rows:
            return False  # refused for rows, before any Mamba slot is taken
        tracks = self.config.mamba_track_buffers
        need = sum((r.slot is None) + (tracks if not r.track else 0) for r in waiting
                   if r.row is None)  # fmt: skip
        if evict and free < 3 * len(rids):
            locked = {r.cow_src for r in self.reqs.values() if r.pending == "cow"}
            unlocked = sum(1 for s in self.tree if s not in locked)
            free += min(3 * len(rids) - free, unlocked)
        return need > free

    def take(self, rid: int) -> ModelReq:
        self.next_req = max(self.next_req, rid + 1)
        return self.reqs.setdefault(rid, ModelReq())


def observe_hybrid(model: HybridModel, op: Op, out: Outcome) -> None:
    """Update the model from side A's outcome of ``op``."""
    model.just_cleared = False
    if out.error is not None or op.expect_error:
        return
    model.just_cleared = op.name == "clear"
    model.in_group = out.after.mamba_allocator.in_group
    model.free_rows = len(out.after.table.free_slots)
    model.free_mamba = len(out.after.mamba_allocator.free_slots)
    name, args, result = op.name, op.args, out.result
    if name == "admit":
        model.evict(result[-1])
        if result[0] is None:
            for rid in args[0]:
                model.take(rid)
            return
        for rid, row, flag, (slot, track) in zip(args[0], result[0], args[1], result[1],
                                                 strict=True):  # fmt: skip
            req = model.take(rid)
            if req.slot is None:
                req.pending, req.history = "clear", ()
            req.row, req.slot, req.track, req.chunked = row, slot, tuple(track or ()), flag
    elif name == "stage_cow":
        req = model.take(args[0])
        if result[0]:
            req.slot, req.pending, req.cow_src = result[1], "cow", args[1]
    elif name == "prepare_forward":
        for rid in args[0]:
            req = model.reqs[rid]
            if req.pending == "cow":
                assert req.cow_src is not None
                req.history = model.tree[req.cow_src].history
            elif req.pending == "clear":
                req.history = ()
            req.pending, req.cow_src = None, None
    elif name == "forward_state":
        for rid, tokens in zip(args[0], args[2], strict=True):
            req = model.reqs[rid]
            req.history = None if req.history is None else req.history + tuple(tokens)
    elif name == "cache_state" and result is not None:
        req = model.reqs[args[0]]
        model.tree[result[0]] = Checkpoint(out.after.mamba_pool.state_tag(result[0]), req.history)
    elif name == "release":
        req = model.reqs.pop(args[0])
        for slot in result:
            # A track buffer's history is not modelled, nor a state whose clear or copy is due.
            history = req.history if args[2] and req.pending is None else None
            model.tree[slot] = Checkpoint(out.after.mamba_pool.state_tag(slot), history)
    elif name == "abort_waiting":
        model.reqs.pop(args[0], None)
    elif name == "evict":
        model.evict(result)
    elif name == "clear":
        model.reqs.clear()
        model.tree.clear()


def coverage_tags(model: HybridModel, op: Op, out: Outcome) -> list[str]:
    """Tags of one step (model as it was before the step)."""
    tags = [outcome_tag(op, out.result, out.error)]
    if op.expect_error or out.error is not None:
        return tags
    name, args, result = op.name, op.args, out.result
    if name == "admit":
        tags = ["admit:refused" if result[0] is None else "admit:ok"]
        if result[-1]:
            tags.append("admit:evicted")
        if any(model.reqs.get(rid, ModelReq()).row is not None for rid in args[0]):
            tags.append("admit:chunk-keeps-slot")
        cowed = any(model.reqs.get(rid, ModelReq()).pending == "cow" for rid in args[0])
        if cowed and result[0] is not None:
            tags.append("admit:after-cow")
    elif name == "stage_cow":
        tags = ["stage_cow:ok" if result[0] else "stage_cow:refused"]
    elif name == "prepare_forward":
        tags += ["prepare_forward:copied"] * bool(result[0])
        tags += ["prepare_forward:cleared"] * bool(result[1])
    elif name == "release":
        req = model.reqs[args[0]]
        tags.append("release:donate" if args[2] else "release:keep-track" if args[1] is not None
                    else "release:free")  # fmt: skip
        if req.chunked:
            tags.append("release:in-prefill")
        if req.track:
            tags.append("release:with-track")
    elif name == "abort_waiting":
        tags.append("abort_waiting:freed" if result else "abort_waiting:nothing")
    elif name == "cache_state" and result is None:
        tags = ["cache_state:refused"]
    return tags


__all__ = ["Checkpoint", "HybridModel", "ModelReq", "coverage_tags", "observe_hybrid"]
