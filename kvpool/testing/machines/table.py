"""The ReqToTokenPool machine: rows handed out, reused, freed, written and read directly.

Requests are machine-side objects (one per side, so that each pool sets its own
``req_pool_idx``); operations name them by number and are materialized against the model, so a
shrunk run stays valid. Misuse (a free of a rowless request, a write past ``max_context_len``,
row 0, an illegal reuse) is issued only when the candidate's rules say it rejects misuse.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from kvpool.config import PoolConfig
from kvpool.invariants import check_req_to_token
from kvpool.snapshot import ReqToTokenSnapshot
from kvpool.testing.bundle import Implementation
from kvpool.testing.machines.base import Outcome
from kvpool.testing.machines.coverage import outcome_tag
from kvpool.testing.swarm import Chooser, Op


@dataclass
class MachineReq:
    """The fields ``ReqToTokenPool.alloc`` reads (:class:`kvpool.protocols.ReqLike`)."""

    req_pool_idx: int | None = None
    is_chunked: int = 0
    kv_committed_len: int = 0


@dataclass
class TableSide:
    pool: Any
    index: Any
    reqs: dict[int, MachineReq] = field(default_factory=dict)
    written: dict[int, int] = field(default_factory=dict)


@dataclass
class TableModel:
    config: PoolConfig
    rows: dict[int, int] = field(default_factory=dict)
    """Request number -> its row, for requests holding one."""
    written: dict[int, int] = field(default_factory=dict)
    """Row -> columns written so far (what the snapshot shows)."""
    next_req: int = 0
    just_cleared: bool = False
    """The last step was a ``clear`` (which may reset generations under the rules)."""


class TableTarget:
    """:class:`~kvpool.testing.machines.base.Target` of the ReqToTokenPool machine."""

    name = "req_to_token_pool"

    def draw_config(self, c: Chooser, impl: Implementation) -> PoolConfig:
        rules = impl.rules_or_default()
        return PoolConfig(req_pool_size=c.integer(1, 8), max_context_len=c.choice((4, 16, 64)),
                          rules=rules)  # fmt: skip

    def build(self, impl: Implementation, config: PoolConfig) -> TableSide:
        assert impl.req_to_token_pool is not None
        return TableSide(impl.req_to_token_pool(config), impl.index)

    def snapshot(self, side: TableSide) -> ReqToTokenSnapshot:
        rows = [(r.req_pool_idx, side.written.get(r.req_pool_idx, 0))
                for r in side.reqs.values() if r.req_pool_idx is not None]  # fmt: skip
        snap: ReqToTokenSnapshot = side.pool.snapshot(sorted(rows))
        return snap

    def new_model(self, config: PoolConfig) -> TableModel:
        return TableModel(config)

    def pretty(self, snap: Any) -> str:
        return repr(snap)

    def draw_op(self, c: Chooser, model: TableModel, rejects_misuse: bool) -> Op:
        kind = c.choice(("alloc", "alloc", "alloc", "free", "free", "write", "write", "read",
                         "clear", "invalid"))  # fmt: skip
        if kind == "alloc":
            return Op("alloc", (c.integer(0, 3), tuple(c.integer(0, 7) for _ in range(2))))
        if kind == "free":
            return Op("free", (c.integer(0, 7),))
        if kind in ("write", "read"):
            return Op(kind, (c.integer(0, 7), c.integer(0, 20), c.integer(1, 20)))
        if kind == "clear" or not rejects_misuse:
            return Op("clear")
        return Op("invalid", (c.integer(0, 5), c.integer(0, 7)), expect_error=True)

    def _held(self, model: TableModel, sel: int) -> int | None:
        held = sorted(model.rows)
        return held[sel % len(held)] if held else None

    def materialize(self, model: TableModel, op: Op) -> Op | None:
        width = model.config.max_context_len
        if op.name == "alloc":
            fresh, reuse = op.args
            keep = sorted({r for r in (self._held(model, s) for s in reuse[:1]) if r is not None})
            new = list(range(model.next_req, model.next_req + fresh))
            return Op("alloc", (keep + new,))
        if op.name == "free":
            rid = self._held(model, op.args[0])
            return None if rid is None else Op("free", (rid,))
        if op.name in ("write", "read"):
            rid = self._held(model, op.args[0])
            if rid is None:
                return None
            row = model.rows[rid]
            # writes extend the written prefix contiguously: the snapshot shows [0, written)
            start = min(op.args[1], model.written.get(row, 0), width - 1)
            stop = min(start + op.args[2], width)
            if op.name == "read":
                return Op("read", (row, start, stop))
            return Op("write", (rid, row, start, [1000 + start + i for i in range(stop - start)]))
        if op.name == "invalid":
            rid = self._held(model, op.args[1])
            row = model.rows[rid] if rid is not None else 1
            options = [
                Op("write", (None, row, width - 1, [1, 2]), expect_error=True),
                Op("write", (None, 0, 0, [1]), expect_error=True),
                Op("read", (model.config.req_pool_size + 1, 0, 1), expect_error=True),
                Op("free", (-1,), expect_error=True),
            ]
            if rid is not None:  # a fresh, never chunked request cannot keep a row
                options.append(Op("alloc", ([-2 - rid],), expect_error=True))
            chosen: Op = options[op.args[0] % len(options)]
            return chosen
        return op

    def call(self, side: TableSide, op: Op) -> Any:
        if op.name == "alloc":
            batch = []
            for rid in op.args[0]:
                if rid <= -2:  # an illegal reuse: a copy of a held request, never chunked
                    held = side.reqs[-2 - rid]
                    batch.append(MachineReq(held.req_pool_idx))
                    continue
                req = side.reqs.setdefault(rid, MachineReq())
                if req.req_pool_idx is not None:
                    req.is_chunked = 1  # legal reuse: a chunked request between chunks
                batch.append(req)
            return side.pool.alloc(batch)
        if op.name == "free":
            return side.pool.free(side.reqs.get(op.args[0], MachineReq()))
        if op.name == "write":
            _, row, start, values = op.args
            out = side.pool.write((row, slice(start, start + len(values))), side.index(values))
            side.written[row] = max(side.written.get(row, 0), start + len(values))
            return out
        if op.name == "read":
            return side.pool.read(*op.args)
        if op.name == "clear":
            side.reqs.clear()
            side.written.clear()
        return getattr(side.pool, op.name)(*op.args)

    def observe(self, model: TableModel, op: Op, out: Outcome) -> None:
        model.just_cleared = op.name == "clear" and out.error is None
        if out.error is not None or op.expect_error:
            return
        if op.name == "alloc" and out.result is not None:
            for rid, row in zip(op.args[0], out.result, strict=True):
                model.rows[rid] = row
                model.next_req = max(model.next_req, rid + 1)
        elif op.name == "free":
            row = model.rows.pop(op.args[0])
            model.written.pop(row, None)
        elif op.name == "write":
            _, row, start, values = op.args
            model.written[row] = max(model.written.get(row, 0), start + len(values))
        elif op.name == "clear":
            model.rows.clear()
            model.written.clear()

    def check(self, model: TableModel, snap: Any, previous: Any) -> int:
        # generations may restart at a clear (Rules.generation_on_clear == "reset")
        reset = model.just_cleared and model.config.rules.generation_on_clear == "reset"
        return check_req_to_token(snap, set(model.rows.values()), None if reset else previous)

    def refusal_must_not_change(self, config: PoolConfig, op: Op, out: Outcome) -> bool:
        return out.error is not None or (op.name == "alloc" and out.result is None)

    def coverage(self, model: TableModel, op: Op, out: Outcome) -> list[str]:
        tags = [outcome_tag(op, out.result, out.error)]
        if op.name == "alloc" and out.result is None and not op.expect_error:
            tags = ["alloc:refused"]
        if op.name == "alloc" and any(r in model.rows for r in op.args[0]):
            tags.append("alloc:reuse")
        return tags


__all__ = ["MachineReq", "TableModel", "TableSide", "TableTarget"]
