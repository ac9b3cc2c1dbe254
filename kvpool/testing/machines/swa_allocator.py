"""The SWA allocator machine: a sliding-window hybrid allocator driven directly, against the
reference.

The model holds sequences (a full slot per token, page-laid-out at page size > 1) and, per
sequence, how many leading tokens have left the window (their SWA slots released by
``free_swa``). Operations are symbolic and materialized against the model, as in the allocator
machine: ``extend`` / ``decode`` grow sequences in both pools (``alloc`` at page size 1,
``alloc_extend`` / ``alloc_decode`` above), ``tail`` is a disaggregated-decode preallocation
(``alloc_extend_swa_tail``: SWA slots for the window only), ``slide`` releases the SWA slots of
the whole pages that left the window, ``free_seq`` frees a sequence from a page boundary on
(inside or outside a free group), plus translations, backup/restore windows, merges, clears and
deliberately invalid calls. Every step checks the ``INV-SWA-*`` invariants and both pools'
allocator invariants (the full pool against the pages the model holds).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from kvpool.config import PoolConfig
from kvpool.constants import NO_LAST_LOC, RESERVED_INDEX, ceil_div, floor_align
from kvpool.invariants import check_swa_allocator
from kvpool.snapshot import SWAAllocatorSnapshot
from kvpool.testing.bundle import Implementation
from kvpool.testing.machines.base import Outcome
from kvpool.testing.machines.coverage import outcome_tag
from kvpool.testing.swarm import Chooser, Op

PAGE_SIZES = (1, 2, 4, 16)


@dataclass
class Seq:
    """A sequence: its full slots (one per token) and ``swa_from``: leading tokens without an
    SWA slot (slid out of the window, or before a preallocated tail); page-aligned."""

    slots: list[int]
    swa_from: int = 0


@dataclass
class SWAModel:
    """What side A holds, as the generator sees it."""

    config: PoolConfig
    seqs: list[Seq] = field(default_factory=list)
    blobs: list[list[int]] = field(default_factory=list)
    pending: list[int] = field(default_factory=list)
    group_open: bool = False
    backup_taken: bool = False
    snap: SWAAllocatorSnapshot | None = None

    @property
    def window(self) -> int:
        return self.config.sliding_window or 1

    def held_full_pages(self) -> set[int]:
        ps = self.config.page_size
        slots = [s for q in self.seqs for s in q.slots] + [s for b in self.blobs for s in b]
        return {s // ps for s in slots + self.pending}


class SWAAllocatorTarget:
    """:class:`~kvpool.testing.machines.base.Target` of the SWA allocator machine."""

    name = "swa_allocator"

    # ---------------------------------------------------------------- sides
    def draw_config(self, c: Chooser, impl: Implementation) -> PoolConfig:
        ps = c.choice(PAGE_SIZES)
        pages = c.integer(3, 24)
        window = c.choice((1, max(ps // 2, 1), ps, ps + 1, 2 * ps + 3, c.integer(1, 4 * ps)))
        ratio = c.choice((0.25, 0.5, 0.8, 1.0, 1.5))
        rules = impl.rules_or_default()
        return PoolConfig(size=pages * ps, page_size=ps, need_sort=c.choice((False, True)),
                          sliding_window=window, swa_full_tokens_ratio=ratio,
                          rules=rules)  # fmt: skip

    def build(self, impl: Implementation, config: PoolConfig) -> Any:
        assert impl.swa_allocator is not None
        return SWASide(impl.swa_allocator(config), impl.index)

    def snapshot(self, side: Any) -> SWAAllocatorSnapshot:
        snap: SWAAllocatorSnapshot = side.alloc.snapshot()
        return snap

    def new_model(self, config: PoolConfig) -> SWAModel:
        return SWAModel(config)

    def pretty(self, snap: Any) -> str:
        return repr(snap)

    # ---------------------------------------------------------------- drawing
    def draw_op(self, c: Chooser, model: SWAModel, rejects_misuse: bool) -> Op:
        ps = model.config.page_size
        kind = c.choice(
            ("extend", "extend", "extend", "decode", "decode", "decode", "tail", "slide", "slide",
             "free_seq", "free_seq", "free_blob", "group", "group", "translate", "backup",
             "restore", "merge", "clear", "invalid")
        )  # fmt: skip
        if kind == "extend":
            grows = [(c.integer(0, 5), c.choice((1, ps, ps + 1, c.integer(1, 3 * ps + 2))))
                     for _ in range(c.integer(1, 3))]  # fmt: skip
            return Op("extend", (tuple(grows),))
        if kind == "decode":
            return Op("decode", (tuple(c.integer(0, 5) for _ in range(c.integer(1, 3))),))
        if kind == "tail":
            return Op("tail", (c.integer(1, 4 * ps + 3),))
        if kind in ("slide", "translate", "free_blob"):
            return Op(kind, (c.integer(0, 5),))
        if kind == "free_seq":
            return Op("free_seq", (c.integer(0, 5), c.integer(0, 3)))
        if kind == "group":
            return Op("free_group_begin" if c.integer(0, 1) else "free_group_end")
        if kind in ("backup", "restore", "merge", "clear"):
            name = {"backup": "backup_state", "restore": "restore_state",
                    "merge": "merge_and_sort_free", "clear": "clear"}[kind]  # fmt: skip
            return Op(name)
        if rejects_misuse:
            return Op("invalid", (c.integer(0, 9), c.integer(0, 1 << 20)), expect_error=True)
        return Op("merge_and_sort_free")

    # ---------------------------------------------------------------- materializing
    def materialize(self, model: SWAModel, op: Op) -> Op | None:
        """The concrete call for ``op`` in the model's state; None: not applicable (skipped)."""
        ps = model.config.page_size
        seqs = model.seqs
        if op.name == "extend":
            return self._extend(model, op.args[0])
        if op.name == "decode":
            picked = {id(q): q for q in (self._growable(model, s) for s in op.args[0]) if q}
            if not picked:
                return None
            if ps == 1:
                return Op("alloc", (len(picked),), (("_grow", tuple(picked)),))
            lens = [len(q.slots) + 1 for q in picked.values()]
            need = sum((n - 1) % ps == 0 for n in lens) * ps
            leaky = not model.config.rules.swa_decode_refusal_clean
            if leaky and model.snap is not None and need > model.snap.available_size():
                return None  # such an implementation leaks the pages of the pool that fits
            return Op("alloc_decode", (lens, lens, [q.slots[-1] for q in picked.values()]))
        if op.name == "tail":
            if ps == 1:
                return None
            (n,) = op.args
            start = floor_align(max(0, n - model.window), ps)
            return Op("alloc_extend_swa_tail", ([0], [0], [n], [n], [NO_LAST_LOC], n, n - start))
        if op.name == "slide":
            q = seqs[op.args[0] % len(seqs)] if seqs else None
            if q is None:
                return None
            cut = floor_align(max(0, len(q.slots) - model.window), ps)
            if cut <= q.swa_from:
                return None
            return Op("free_swa", (q.slots[q.swa_from : cut],))
        if op.name == "translate":
            q = seqs[op.args[0] % len(seqs)] if seqs else None
            return Op("translate_loc_from_full_to_swa", ([NO_LAST_LOC, *(q.slots if q else [])],))
        if op.name == "free_seq":
            q = seqs[op.args[0] % len(seqs)] if seqs else None
            if q is None:
                return None
            start = min(op.args[1] * ps, floor_align(len(q.slots), ps))
            return self._free(model, q.slots[start:]) if start < len(q.slots) else None
        if op.name == "free_blob":
            blobs = model.blobs
            return self._free(model, blobs[op.args[0] % len(blobs)]) if blobs else None
        if op.name in ("free_group_begin", "free_group_end"):
            misuse = model.group_open == (op.name == "free_group_begin")
            if not misuse:
                return op
            return Op(op.name, expect_error=True) if model.config.rules.rejects_misuse else None
        if op.name == "backup_state" and model.group_open:
            return Op(op.name, expect_error=True) if model.config.rules.rejects_misuse else None
        if op.name == "restore_state":
            # an implementation that restores only the free lists leaves stale entries (its
            # rules say so: Rules.swa_restore_mapping); kvpool does not restore it
            usable = model.backup_taken and not model.group_open
            return op if usable and model.config.rules.swa_restore_mapping else None
        if op.name == "clear":
            return None if model.group_open else op
        if op.name == "invalid":
            return self._invalid(model, op.args[0], op.args[1])
        return op

    @staticmethod
    def _free(model: SWAModel, slots: list[int]) -> Op:
        """``free(slots)``; for an implementation whose ``free`` needs every slot still mapped
        at page size 1 (``Rules.swa_free_unmapped == "caller"``), the slots without an SWA
        slot go first to ``free_full``, as SGLang 0.5.23's ``free_kv_row_segments`` frees a
        row: ``free_row(dead, alive)``."""
        snap = model.snap
        if model.config.rules.swa_free_unmapped != "caller" or model.config.page_size != 1:
            return Op("free", (slots,))
        mapping = snap.full_to_swa if snap is not None else ()
        dead = [s for s in slots if s < len(mapping) and mapping[s] == RESERVED_INDEX]
        if not dead:
            return Op("free", (slots,))
        return Op("free_row", (dead, [s for s in slots if s not in set(dead)]))

    @staticmethod
    def _growable(model: SWAModel, sel: int) -> Seq | None:
        """Sequence ``sel`` if its last token still has an SWA slot (a decode needs it)."""
        if not model.seqs:
            return None
        q = model.seqs[sel % len(model.seqs)]
        return q if q.swa_from < len(q.slots) else None

    def _extend(self, model: SWAModel, grows: Any) -> Op | None:
        ps = model.config.page_size
        picked: list[tuple[Seq | None, int]] = []
        for sel, grow in grows:
            q = self._growable(model, sel) if sel < len(model.seqs) else None
            if q is None or all(q is not p for p, _ in picked):
                picked.append((q, grow))
        if ps == 1:
            total = sum(g for _, g in picked)
            return Op("alloc", (total,), (("_extend", tuple((id(q), g) for q, g in picked)),))
        prefix = [len(q.slots) if q else 0 for q, _ in picked]
        seq = [p + g for p, (_, g) in zip(prefix, picked, strict=True)]
        last = [q.slots[-1] if q else NO_LAST_LOC for q, _ in picked]
        total = sum(g for _, g in picked)
        return Op("alloc_extend", (prefix, prefix, seq, seq, last, total))

    def _invalid(self, model: SWAModel, which: int, salt: int) -> Op:
        ps, limit = model.config.page_size, model.config.size + model.config.page_size
        snap = model.snap
        free = list(snap.full.free_pages + snap.full.release_pages) if snap else []
        # SWA alloc is for page size 1 only, alloc_extend for page sizes above
        wrong_kind = Op("alloc", (ps,), expect_error=True)
        if ps == 1:
            wrong_kind = Op("alloc_extend", ([0], [0], [1], [1], [-1], 1), expect_error=True)
        options = [
            Op("free", ([RESERVED_INDEX + salt % ps],), expect_error=True),
            Op("free", ([limit + salt % 7],), expect_error=True),
            Op("free_swa", ([limit + salt % 5],), expect_error=True),
            Op("translate_loc_from_full_to_swa", ([-2 - salt % 3],), expect_error=True),
            Op("alloc", (-1 - salt % 4,), expect_error=True),
            Op("restore_state", (("bad",),), expect_error=True),
            wrong_kind,
        ]
        if ps > 1:
            n = 2 * ps + 1  # a tail starting mid-page
            options.append(Op("alloc_extend_swa_tail", ([0], [0], [n], [n], [-1], n, ps),
                              expect_error=True))  # fmt: skip
        if free:
            page = free[salt % len(free)]
            options.append(Op("free", ([page * ps + salt % ps],), expect_error=True))
        return options[which % len(options)]

    # ---------------------------------------------------------------- calling
    def call(self, side: Any, op: Op) -> Any:
        alloc, index = side.alloc, side.index
        if op.name in ("free", "free_swa", "translate_loc_from_full_to_swa"):
            return getattr(alloc, op.name)(index(op.args[0]))
        if op.name == "free_row":
            dead, alive = op.args
            alloc.free_full(index(dead))
            return alloc.free(index(alive)) if alive else None
        if op.name in ("alloc_extend", "alloc_extend_swa_tail") and len(op.args) >= 6:
            p, p_cpu, s, s_cpu, last, *rest = op.args
            return getattr(alloc, op.name)(index(p), p_cpu, index(s), s_cpu, index(last), *rest)
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
    def observe(self, model: SWAModel, op: Op, out: Outcome) -> None:
        model.snap = out.after
        if out.error is not None or op.expect_error:
            return
        got, ps = out.result, model.config.page_size
        if op.name == "alloc" and got is not None:
            self._observe_alloc(model, op, list(got))
        elif op.name == "alloc_extend" and got is not None:
            prefix, _, seq, _, last, _ = op.args
            pos = 0
            for p, s, loc in zip(prefix, seq, last, strict=True):
                new = list(got[pos : pos + s - p])
                pos += s - p
                owner = next((q for q in model.seqs if p and q.slots[-1] == loc), None)
                if owner is not None:
                    owner.slots.extend(new)
                else:
                    model.seqs.append(Seq(new))
        elif op.name == "alloc_extend_swa_tail" and got is not None:
            n, tail = op.args[5], op.args[6]
            model.seqs.append(Seq(list(got), n - tail))
        elif op.name == "alloc_decode" and got is not None:
            for loc, slot in zip(op.args[2], got, strict=True):
                next(q for q in model.seqs if q.slots[-1] == loc).slots.append(slot)
        elif op.name == "free_swa":
            q = next(q for q in model.seqs if q.slots[q.swa_from :][:1] == op.args[0][:1])
            q.swa_from += len(op.args[0])
        elif op.name == "free":
            self._forget(model, list(op.args[0]))
        elif op.name == "free_row":
            self._forget(model, list(op.args[0]) + list(op.args[1]))
        elif op.name == "free_group_begin":
            model.group_open, model.pending = True, []
        elif op.name == "free_group_end":
            model.group_open, model.pending = False, []
        elif op.name == "backup_state":
            model.backup_taken = True
        elif op.name == "restore_state":
            self._reconcile(model, ps)
        elif op.name == "clear":
            model.seqs, model.blobs, model.pending, model.backup_taken = [], [], [], False

    @staticmethod
    def _observe_alloc(model: SWAModel, op: Op, got: list[int]) -> None:
        """Page size 1: an extend or decode is one ``alloc``, cut per sequence in the model."""
        plan = dict(op.kwargs)
        if "_grow" in plan:
            owners = {id(q): q for q in model.seqs}
            for key, slot in zip(plan["_grow"], got, strict=True):
                owners[key].slots.append(slot)
            return
        owners = {id(q): q for q in model.seqs}
        pos = 0
        for key, grow in plan.get("_extend", ()):
            new = got[pos : pos + grow]
            pos += grow
            if key in owners:
                owners[key].slots.extend(new)
            else:
                model.seqs.append(Seq(new))

    @staticmethod
    def _forget(model: SWAModel, slots: list[int]) -> None:
        """Drop freed slots (whole pages) from sequences and blobs; buffer them in a group."""
        ps = model.config.page_size
        pages = {s // ps for s in slots}
        if model.group_open:
            model.pending.extend(slots)
        for q in model.seqs:
            q.slots = [s for s in q.slots if s // ps not in pages]
            q.swa_from = min(q.swa_from, len(q.slots))
        model.seqs = [q for q in model.seqs if q.slots]
        model.blobs = [b for b in ([s for s in b if s // ps not in pages] for b in model.blobs)
                       if b]  # fmt: skip

    @staticmethod
    def _reconcile(model: SWAModel, ps: int) -> None:
        """After a restore the pools are the backup's: sequences with a page free again are
        forgotten; full pages held but unknown to the model become a blob (freed later)."""
        snap = model.snap
        assert snap is not None
        free = set(snap.full.free_pages) | set(snap.full.release_pages)
        model.seqs = [q for q in model.seqs if not any(s // ps in free for s in q.slots)]
        # a token allocated after the backup in a page held before it is unmapped again: its
        # sequence can no longer grow (it is only freed, as a blob)
        mapping = snap.full_to_swa
        stale = [q for q in model.seqs if any(not mapping[s] for s in q.slots[q.swa_from :])]
        model.seqs = [q for q in model.seqs if all(q is not t for t in stale)]
        model.blobs.extend(q.slots for q in stale)
        model.blobs = [b for b in model.blobs if not any(s // ps in free for s in b)]
        known = model.held_full_pages()
        lost = [p for p in range(1, snap.full.num_pages + 1) if p not in free | known]
        if lost:
            model.blobs.append([p * ps + i for p in lost for i in range(ps)])
        model.backup_taken = False

    def check(self, model: SWAModel, snap: Any, previous: Any) -> int:
        return check_swa_allocator(snap, model.held_full_pages())

    def refusal_must_not_change(self, config: PoolConfig, op: Op, out: Outcome) -> bool:
        if out.error is not None:
            return True
        allocating = op.name in ("alloc", "alloc_extend", "alloc_decode", "alloc_extend_swa_tail")
        return allocating and out.result is None and config.rules.refused_alloc_unchanged

    def coverage(self, model: SWAModel, op: Op, out: Outcome) -> list[str]:
        tags = [outcome_tag(op, out.result, out.error)]
        if tags[0] == "alloc_extend_swa_tail:ok" and out.result is None:
            tags[0] = "alloc_extend_swa_tail:refused"
        before, ps = out.before, model.config.page_size
        if tags[0].endswith(":refused") and not op.expect_error:
            need = self._tokens_needed(op, ps)
            tags.append("refused:full-short" if need > before.full.available_size()
                        else "refused:swa-short")  # fmt: skip
        if op.name == "free" and out.error is None:
            if before.full.in_free_group:
                tags.append("free:in-group")
            if any(before.full_to_swa[s] == RESERVED_INDEX for s in op.args[0]):
                tags.append("free:unmapped-slots")
        if op.name == "free_row" and out.error is None:
            tags.append("free:unmapped-slots")
            if before.full.in_free_group:
                tags.append("free:in-group")
        if op.name == "free_swa" and out.error is None:
            tags.append("free_swa:in-group" if before.full.in_free_group else "free_swa:slide")
        return tags

    @staticmethod
    def _tokens_needed(op: Op, ps: int) -> int:
        if op.name == "alloc":
            return int(op.args[0])
        if op.name == "alloc_decode":
            return ps * sum(1 for s in op.args[0] if (s - 1) % ps == 0)
        prefix, seq = op.args[0], op.args[2]
        return ps * sum(ceil_div(s, ps) - ceil_div(p, ps) for p, s in zip(prefix, seq, strict=True))


@dataclass
class SWASide:
    """One side: the SWA allocator, its index converter and its latest ``backup_state``."""

    alloc: Any
    index: Any
    backup: Any = None


__all__ = ["SWAAllocatorTarget", "SWAModel", "SWASide", "Seq"]
