"""The allocator machine: a token or paged allocator driven directly, against the reference.

It issues what the lifecycle never does: allocations beyond capacity (None, nothing changed),
invalid frees (typed errors, when the candidate's rules say it rejects misuse), free groups whose
pieces share a page, frees between ``backup_state`` and ``restore_state`` followed by a restore,
direct ``merge_and_sort_free`` and ``clear``, and extends of thousands of tokens at every page
size (crossing every block width of the allocation kernels).

Operations are symbolic (``extend`` names sequences by position, ``free_seq`` a sequence and how
many pages it keeps) and are materialized against the model at run time, so that any sub-list
of a run (the shrinker's candidates) is still a list of valid calls.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from itertools import chain
from typing import Any

from kvpool.config import PoolConfig
from kvpool.constants import NO_LAST_LOC, RESERVED_INDEX, SUPPORTED_PAGE_SIZES_TESTED
from kvpool.invariants.allocator import check_allocator
from kvpool.snapshot import AllocatorSnapshot
from kvpool.testing.bundle import Implementation
from kvpool.testing.machines.base import Outcome
from kvpool.testing.machines.coverage import extend_tags
from kvpool.testing.swarm import Chooser, Op

LONG_GROWS = (1023, 1024, 1025, 2047, 2048, 2049, 4100)
"""Extend lengths (tokens) around the kernels' block widths."""


@dataclass
class AllocModel:
    """What side A holds, as the generator sees it: raw blobs, sequences (slot per token),
    slots buffered by an open free group, and the free-list state at the last step."""

    config: PoolConfig
    blobs: list[list[int]] = field(default_factory=list)
    seqs: list[list[int]] = field(default_factory=list)
    pending: list[int] = field(default_factory=list)
    group_open: bool = False
    backup_taken: bool = False
    window_frees: int = 0
    snap: AllocatorSnapshot | None = None

    def held_pages(self) -> set[int]:
        ps = self.config.page_size
        slots = chain(chain.from_iterable(self.blobs), chain.from_iterable(self.seqs), self.pending)
        return set(slots) if ps == 1 else {s // ps for s in slots}


def _seq(model: AllocModel, sel: int) -> list[int] | None:
    return model.seqs[sel % len(model.seqs)] if model.seqs else None


class AllocatorTarget:
    """:class:`~kvpool.testing.machines.base.Target` of the allocator machine."""

    name = "allocator"

    # ---------------------------------------------------------------- sides
    def draw_config(self, c: Chooser, impl: Implementation) -> PoolConfig:
        ps = c.choice(SUPPORTED_PAGE_SIZES_TESTED)
        small = c.integer(0, 3) > 0
        pages = c.integer(3, 24) if small else c.integer(4200 // ps + 2, 9000 // ps + 2)
        rules = impl.rules_or_default()
        return PoolConfig(size=pages * ps, page_size=ps, need_sort=c.choice((False, True)),
                          rules=rules)  # fmt: skip

    def build(self, impl: Implementation, config: PoolConfig) -> Any:
        assert impl.allocator is not None
        return AllocSide(impl.allocator(config), impl.index)

    def snapshot(self, side: Any) -> AllocatorSnapshot:
        snap: AllocatorSnapshot = side.alloc.snapshot()
        return snap

    def new_model(self, config: PoolConfig) -> AllocModel:
        return AllocModel(config)

    def pretty(self, snap: Any) -> str:
        return repr(snap)

    # ---------------------------------------------------------------- drawing
    def draw_op(self, c: Chooser, model: AllocModel, rejects_misuse: bool) -> Op:
        ps = model.config.page_size
        kind = c.choice(
            ("alloc", "alloc", "extend", "extend", "extend", "decode", "decode", "free_blob",
             "free_seq", "free_seq", "group", "group", "backup", "restore", "merge", "clear",
             "invalid")
        )  # fmt: skip
        if kind == "alloc":
            pages = c.choice((0, 1, 2, c.integer(0, model.config.num_pages + 2)))
            odd = c.integer(0, 5) == 0 and ps > 1
            return Op("alloc", (pages * ps + (c.integer(1, ps - 1) if odd else 0),))
        if kind == "extend":
            batch = []
            for _ in range(c.integer(1, 3)):
                grow = c.choice((1, ps - 1 or 1, ps, ps + 1, 2 * ps + 1, c.integer(1, 3 * ps + 2)))
                if c.integer(0, 5) == 0:
                    grow = c.choice(LONG_GROWS)
                batch.append((c.integer(0, 5), grow))
            return Op("extend", (tuple(batch),))
        if kind == "decode":
            return Op("decode", (tuple(c.integer(0, 5) for _ in range(c.integer(1, 3))),))
        if kind == "free_blob":
            return Op("free_blob", (c.integer(0, 7),))
        if kind == "free_seq":
            split = c.integer(1, ps - 1) if ps > 1 and c.integer(0, 1) else 0
            return Op("free_seq", (c.integer(0, 5), c.integer(0, 2), split))
        if kind == "group":
            return Op("free_group_begin" if c.integer(0, 1) else "free_group_end")
        if kind in ("backup", "restore", "merge", "clear"):
            name = {"backup": "backup_state", "restore": "restore_state",
                    "merge": "merge_and_sort_free", "clear": "clear"}[kind]  # fmt: skip
            return Op(name)
        if rejects_misuse:
            return Op("invalid", (c.integer(0, 7), c.integer(0, 1 << 20)), expect_error=True)
        return Op("merge_and_sort_free")

    # ---------------------------------------------------------------- materializing
    def materialize(self, model: AllocModel, op: Op) -> Op | None:
        """The concrete call for ``op`` in the model's state; None: not applicable (skipped)."""
        ps, snap = model.config.page_size, model.snap
        if op.name == "alloc":
            (n,) = op.args
            if n % ps and model.config.rules.unaligned_paged_alloc == "error":
                return Op("alloc", (n,), expect_error=True) if self._strict(model) else None
            return Op("alloc", (n,))
        if op.name == "extend":
            return self._extend(model, op.args[0])
        if op.name == "decode":
            seqs = {id(q): q for q in (_seq(model, s) for s in op.args[0]) if q}
            if not seqs or ps == 1:
                return None
            lens = [len(q) + 1 for q in seqs.values()]
            return Op("alloc_decode", (lens, lens, [q[-1] for q in seqs.values()]))
        if op.name == "free_blob":
            if not model.blobs:
                return None
            return Op("free", (model.blobs[op.args[0] % len(model.blobs)],))
        if op.name == "free_seq":
            q = _seq(model, op.args[0])
            if q is None:
                return None
            start = min(op.args[1] * ps, len(q) // ps * ps)
            if op.args[2] and model.group_open and start + op.args[2] < len(q):
                start += op.args[2]  # mid-page: the rest of this page is freed by a later piece
            elif start % ps:
                start -= start % ps
            return Op("free", (q[start:],))
        if op.name in ("free_group_begin", "free_group_end"):
            misuse = model.group_open == (op.name == "free_group_begin")
            if not misuse:
                return op
            return Op(op.name, expect_error=True) if self._strict(model) else None
        if op.name == "restore_state":
            return op if model.backup_taken and not model.group_open else None
        if op.name == "clear":
            return None if model.group_open else op
        if op.name == "invalid":
            return self._invalid(model, op.args[0], op.args[1], snap)
        return op

    @staticmethod
    def _strict(model: AllocModel) -> bool:
        return model.config.rules.rejects_misuse

    def _extend(self, model: AllocModel, batch: Any) -> Op | None:
        ps = model.config.page_size
        picked: list[tuple[list[int] | None, int]] = []
        seen: set[int] = set()
        for sel, grow in batch:
            q = model.seqs[sel] if sel < len(model.seqs) else None
            if q is not None and id(q) in seen:
                continue
            if q is not None:
                seen.add(id(q))
            picked.append((q, grow))
        if ps == 1:
            return Op("alloc", (sum(g for _, g in picked),), (("_extend", len(picked)),))
        prefix = [len(q) if q else 0 for q, _ in picked]
        seq = [p + g for p, (_, g) in zip(prefix, picked, strict=True)]
        last = [q[-1] if q else NO_LAST_LOC for q, _ in picked]
        total = sum(s - p for p, s in zip(prefix, seq, strict=True))
        return Op("alloc_extend", (prefix, prefix, seq, seq, last, total))

    def _invalid(
        self, model: AllocModel, which: int, salt: int, snap: AllocatorSnapshot | None
    ) -> Op:
        ps, limit = model.config.page_size, (model.config.num_pages + 1) * model.config.page_size
        free = list(snap.free_pages + snap.release_pages) if snap else []
        options = [
            Op("free", ([RESERVED_INDEX + salt % ps],), expect_error=True),
            Op("free", ([limit + salt % 7],), expect_error=True),
            Op("free", ([-1 - salt % 3],), expect_error=True),
            Op("alloc", (-1 - salt % 4,), expect_error=True),
            Op("restore_state", (("bad",),), expect_error=True),
            Op("alloc_extend", ([0, 0], [0, 0], [1], [1], [NO_LAST_LOC], 1), expect_error=True),
        ]
        if free:
            page = free[salt % len(free)]
            options.append(Op("free", ([page * ps + salt % ps],), expect_error=True))
            if ps > 1 and model.seqs:
                # a decode whose last_loc sits in a free page
                options.append(Op("alloc_decode", ([2], [2], [page * ps]), expect_error=True))
        return options[which % len(options)]

    # ---------------------------------------------------------------- calling
    def call(self, side: Any, op: Op) -> Any:
        alloc, index = side.alloc, side.index
        if op.name == "free":
            return alloc.free(index(op.args[0]))
        if op.name == "alloc_extend":
            p, p_cpu, s, s_cpu, last, total = op.args
            return alloc.alloc_extend(index(p), p_cpu, index(s), s_cpu, index(last), total)
        if op.name == "alloc_decode":
            s, s_cpu, last = op.args
            return alloc.alloc_decode(index(s), s_cpu, index(last))
        if op.name == "backup_state":
            side.backup = alloc.backup_state()
            return None
        if op.name == "restore_state":
            return alloc.restore_state(op.args[0] if op.args else side.backup)
        return getattr(alloc, op.name)(*op.args)

    # ---------------------------------------------------------------- model and checks
    def observe(self, model: AllocModel, op: Op, out: Outcome) -> None:
        ps = model.config.page_size
        model.snap = out.after
        if out.error is not None or op.expect_error:
            return
        got = out.result
        if op.name == "alloc" and got:
            n_new = dict(op.kwargs).get("_extend")
            if n_new is None:
                model.blobs.append(list(got))
            else:  # page size 1: an extend is one alloc, cut per sequence in the model only
                model.seqs.append(list(got))
        elif op.name == "alloc_extend" and got is not None:
            prefix, _, seq, _, last, _ = op.args
            pos = 0
            for p, s, loc in zip(prefix, seq, last, strict=True):
                new = list(got[pos : pos + s - p])
                pos += s - p
                owner = next((q for q in model.seqs if q and q[-1] == loc), None)
                if p and owner is not None:
                    owner.extend(new)
                else:
                    model.seqs.append(new)
        elif op.name == "alloc_decode" and got is not None:
            for loc, slot in zip(op.args[2], got, strict=True):
                owner = next(q for q in model.seqs if q and q[-1] == loc)
                owner.append(slot)
        elif op.name == "free":
            self._forget(model, list(op.args[0]))
        elif op.name == "free_group_begin":
            model.group_open, model.pending = True, []
        elif op.name == "free_group_end":
            # the group frees whole pages: drop what owners still hold of the pending pages
            pages = {s // ps for s in model.pending}
            for owners in (model.blobs, model.seqs):
                for q in owners:
                    q[:] = [s for s in q if s // ps not in pages]
                owners[:] = [q for q in owners if q]
            model.group_open, model.pending = False, []
        elif op.name == "backup_state":
            model.backup_taken, model.window_frees = True, 0
        elif op.name == "restore_state":
            self._reconcile(model)
        elif op.name == "clear":
            model.blobs, model.seqs, model.pending, model.backup_taken = [], [], [], False

    def _forget(self, model: AllocModel, slots: list[int]) -> None:
        """Drop freed slots (whole pages) from their owners; buffer them in an open group."""
        ps = model.config.page_size
        if model.backup_taken:
            model.window_frees += 1
        pages = {s // ps for s in slots}
        if model.group_open:
            model.pending.extend(slots)
        for owners in (model.blobs, model.seqs):
            for q in owners:
                if model.group_open:
                    # only the named slots leave now; the rest of a shared page goes later
                    named = set(slots)
                    q[:] = [s for s in q if s not in named]
                else:
                    q[:] = [s for s in q if s // ps not in pages]
            owners[:] = [q for q in owners if q]

    def _reconcile(self, model: AllocModel) -> None:
        """After a restore the free lists are the backup's: pages allocated since are free
        again (their holders lose them), pages freed since are held by no one the model knows:
        keep them as a blob so that they can be freed again."""
        ps = model.config.page_size
        snap = model.snap
        assert snap is not None
        free = set(snap.free_pages) | set(snap.release_pages)
        for owners in (model.blobs, model.seqs):
            owners[:] = [q for q in owners if not any(s // ps in free for s in q)]
        accounted = free | model.held_pages()  # once, not per page
        lost = [p for p in range(1, model.config.num_pages + 1) if p not in accounted]
        if lost:
            model.blobs.append([p * ps + i for p in lost for i in range(ps)])
        model.backup_taken = False

    def check(self, model: AllocModel, snap: Any, previous: Any) -> int:
        return check_allocator(snap, model.held_pages())

    def refusal_must_not_change(self, config: PoolConfig, op: Op, out: Outcome) -> bool:
        if out.error is not None:
            return True
        allocating = op.name in ("alloc", "alloc_extend", "alloc_decode")
        return allocating and out.result is None and config.rules.refused_alloc_unchanged

    def coverage(self, model: AllocModel, op: Op, out: Outcome) -> list[str]:
        return extend_tags(op, out, window=model.backup_taken)


@dataclass
class AllocSide:
    """One side: the allocator, its index converter and its latest ``backup_state``."""

    alloc: Any
    index: Any
    backup: Any = None


__all__ = ["AllocModel", "AllocSide", "AllocatorTarget"]
