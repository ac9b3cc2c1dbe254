"""The hybrid machine's operations: drawn symbolic, materialized against the model.

A symbolic op names requests and checkpoints by selectors; :func:`materialize_hybrid` turns it
into the concrete call for the model's state (or None: not applicable now, the step is
skipped), so that any sub-list of a run stays valid when shrunk.
"""

from __future__ import annotations

from kvpool.tags import mamba_state_tag
from kvpool.testing.machines.hybrid_model import HybridModel
from kvpool.testing.swarm import Chooser, Op

KINDS = ("admit", "admit", "admit", "stage_cow", "stage_cow", "prepare_forward", "prepare_forward",
         "prepare_forward", "forward_state", "forward_state", "cache_state", "release", "release",
         "abort_waiting", "evict", "group")  # fmt: skip


def draw_hybrid_op(c: Chooser, rejects_misuse: bool) -> Op:
    """The next symbolic op; one in twelve is invalid when the candidate rejects misuse."""
    if rejects_misuse and c.integer(0, 11) == 0:
        return Op("invalid", (c.integer(0, 5), c.integer(0, 7)), expect_error=True)
    kind = "clear" if c.integer(0, 39) == 0 else c.choice(KINDS)
    if kind == "admit":
        return Op("admit", (c.integer(0, 2), c.integer(0, 1), c.integer(0, 1), c.integer(0, 7),
                            c.integer(0, 2) == 0, c.integer(0, 3) > 0))  # fmt: skip
    if kind == "stage_cow":
        return Op("stage_cow", (c.integer(0, 7), c.integer(0, 7), c.integer(0, 1) == 0))
    if kind in ("prepare_forward", "forward_state"):
        return Op(kind, (c.integer(0, 7), c.integer(1, 3), c.integer(0, 999)))
    if kind in ("cache_state", "abort_waiting"):
        return Op(kind, (c.integer(0, 7),))
    if kind == "release":
        return Op("release", (c.integer(0, 7), c.integer(0, 3)))
    if kind in ("evict", "group"):
        return Op(kind, (c.integer(0, 3),))
    return Op("clear")


def _pick(items: list[int], sel: int, n: int = 1) -> list[int]:
    """Up to ``n`` distinct items starting at ``sel`` (cyclic)."""
    if not items:
        return []
    return [items[(sel + i) % len(items)] for i in range(min(n, len(items)))]


def materialize_hybrid(model: HybridModel, op: Op) -> Op | None:
    """The concrete call for symbolic ``op`` in the model's state (None: skip)."""
    name, args = op.name, op.args
    if name == "admit":
        fresh, take_waiting, take_chunked, sel, chunked, evict = args
        between = [r for r in model.running() if model.reqs[r].chunked]
        # A waiting request that a match gave a slot is the one the scheduler admits next.
        matched = [r for r in model.waiting() if model.reqs[r].slot is not None]
        rids = _pick(between, sel, take_chunked) + _pick(
            matched or model.waiting(), sel, take_waiting
        )
        rids += list(range(model.next_req, model.next_req + fresh))
        if model.config.rules.mamba_slot_shortage == "assert" and model.admission_short(
            rids, evict
        ):
            return None  # the implementation asserts there (Rules.mamba_slot_shortage)
        return Op("admit", (rids, [chunked] * len(rids), evict)) if rids else None
    if name == "stage_cow":
        ckpt_sel, req_sel, fresh = args
        checkpoints = _pick(list(model.tree), ckpt_sel)
        if not checkpoints:
            return None
        waiting = model.waiting()
        rid = model.next_req if fresh or not waiting else _pick(waiting, req_sel)[0]
        return Op("stage_cow", (rid, checkpoints[0]))
    if name == "prepare_forward":
        # Requests with a copy or clear due first: a forward batch is where SGLang runs them.
        due = [r for r in model.running() if model.reqs[r].pending is not None]
        rids = _pick(due or model.running(), args[0], args[1])
        return Op("prepare_forward", (sorted(rids),)) if rids else None
    if name == "forward_state":
        ready = [r for r in model.running() if model.reqs[r].ready()]
        rids = sorted(_pick(ready, args[0], args[1]))
        if not rids:
            return None
        tokens = [tuple((args[2] + 7 * rid + i) % 50 for i in range(1 + rid % 3)) for rid in rids]
        tags = []
        for rid, toks in zip(rids, tokens, strict=True):
            history = model.reqs[rid].history
            tags.append(mamba_state_tag(history + toks) if history is not None else 1 + args[2])
        return Op("forward_state", (rids, tags, tokens))
    if name == "cache_state":
        ready = [r for r in model.running() if model.reqs[r].ready()]
        chosen = _pick(ready, args[0])
        return Op("cache_state", (chosen[0], model.reqs[chosen[0]].slot)) if chosen else None
    if name == "release":
        chosen = _pick(model.running(), args[0])
        if not chosen:
            return None
        mode, tracks = args[1], len(model.reqs[chosen[0]].track)
        keep = mode - 1 if mode in (1, 2) and mode - 1 < tracks else None
        return Op("release", (chosen[0], keep, mode == 3))
    if name == "abort_waiting":
        chosen = _pick(model.waiting(), args[0])
        return Op("abort_waiting", (chosen[0],)) if chosen else None
    if name == "evict":
        return Op("evict", args)
    if name == "group":
        return Op("alloc_group_end") if model.in_group else Op("alloc_group_begin", args)
    if name == "invalid":
        return _invalid(model, args[0], args[1])
    if name == "clear" and model.in_group and not model.config.rules.rejects_misuse:
        return None  # SGLang's clear keeps an open group's prefetched slots (specs/sglang.md)
    return op


def _invalid(model: HybridModel, kind: int, sel: int) -> Op:
    options = [Op("invalid", ("free-mamba-twice",), expect_error=True),
               Op("invalid", ("free-reserved",), expect_error=True),
               Op("invalid", ("release-waiting-as-running",), expect_error=True),
               Op("invalid", ("copy-out-of-range",), expect_error=True)]  # fmt: skip
    held = {s for r in model.reqs.values() for s in ((r.slot,) if r.slot else ()) + r.track}
    free = sorted(set(range(1, (model.config.mamba_slots or 1) + 1)) - held - set(model.tree))
    if free and not model.in_group:
        options.append(Op("invalid", ("free-free-slot", _pick(free, sel)[0]), expect_error=True))
    cowing = [rid for rid in model.waiting() if model.reqs[rid].slot is not None]
    if cowing:
        rid = _pick(cowing, sel)[0]
        own = model.reqs[rid].slot
        options.append(Op("invalid", ("cow-own-slot", rid, own), expect_error=True))
    return options[kind % len(options)]


__all__ = ["draw_hybrid_op", "materialize_hybrid"]
