"""The Mamba radix-cache machine's model, operations and coverage tags.

The model (from side A's outcomes) knows which slots hold the tree's states and the tag each had
when the tree took it, and each request's slot and the state it must hold; symbolic operations
draw short token sequences over a small alphabet (so prefixes are shared and nodes split) and are
materialized against it.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from kvpool.config import PoolConfig
from kvpool.snapshot import MambaTreeSnapshot
from kvpool.tags import mamba_state_tag
from kvpool.testing.machines.base import Outcome
from kvpool.testing.machines.coverage import outcome_tag
from kvpool.testing.swarm import Chooser, Op

EXTRA_KEYS = (None, None, None, "ns")


@dataclass
class TreeReq:
    """A matched request: its slot, whether its copy is due (of a state tagged ``src_tag``, in
    slot ``src_slot`` of node ``src_node``), the state its slot must hold and the token history
    behind it."""

    slot: int | None
    pending: bool
    expected_tag: int | None
    history: tuple[int, ...] | None
    src_tag: int | None = None
    src_slot: int | None = None
    src_node: int | None = None


@dataclass
class TreeModel:
    config: PoolConfig
    reqs: dict[int, TreeReq] = field(default_factory=dict)
    ckpt_tags: dict[int, int] = field(default_factory=dict)
    """State slot -> the tag it had when the tree took it."""
    ckpt_history: dict[int, tuple[int, ...]] = field(default_factory=dict)
    tree_slots: set[int] = field(default_factory=set)
    tree: MambaTreeSnapshot | None = None
    next_req: int = 0
    free_mamba: int | None = None
    """Free Mamba slots after the last step (None: all of them)."""

    def cow_may_assert(self) -> bool:
        """Whether a copy-on-write match could find no slot even after evicting one state: none
        free, and fewer than two unlocked states (the matched node is locked meanwhile)."""
        if self.free_mamba is None or self.free_mamba > 0 or self.tree is None:
            return False
        unlocked = [n for n in self.tree.nodes[1:]
                    if n.mamba_value is not None and n.mamba_lock_ref == 0]  # fmt: skip
        return len(unlocked) < 2


def _tokens(c: Chooser) -> list[int]:
    return [c.integer(1, 3) for _ in range(c.integer(1, 6))]


def draw_tree_op(c: Chooser, rejects_misuse: bool) -> Op:
    """The next symbolic op; one in fifteen is invalid when the candidate rejects misuse."""
    if rejects_misuse and c.integer(0, 14) == 0:
        return Op("invalid", (c.integer(0, 2), c.integer(0, 7)), expect_error=True)
    kind = c.choice(("insert", "insert", "insert", "match", "match", "forward", "forward",
                     "release", "evict"))  # fmt: skip
    if kind in ("insert", "match"):
        return Op(kind, (_tokens(c), c.choice(EXTRA_KEYS), c.integer(0, 3) > 0))
    if kind == "evict":
        return Op("evict", (c.choice((0, 0, 1, 4)), c.choice((0, 1, 1, 2))))
    return Op(kind, (c.integer(0, 7), c.integer(1, 3)))


def materialize_tree(model: TreeModel, op: Op) -> Op | None:
    """The concrete call for symbolic ``op`` (None: not applicable now)."""
    if op.name == "insert":
        tokens, extra, _ = op.args
        return Op("insert", (tokens, extra, mamba_state_tag(tokens, extra)))
    if op.name == "match":
        tokens, extra, cow = op.args
        if model.config.rules.mamba_slot_shortage == "assert" and model.cow_may_assert():
            cow = False  # the implementation asserts there (Rules.mamba_slot_shortage)
        return Op("match", (model.next_req, tokens, extra, cow))
    held = sorted(model.reqs)
    if op.name == "forward":  # the batch's copy first, when due; then forwards
        due = [r for r in held if model.reqs[r].pending and model.reqs[r].slot is not None]
        if due:
            return Op("copy", (due[op.args[0] % len(due)],))
        ready = [r for r in held if model.reqs[r].slot is not None]
        if not ready:
            return None
        rid = ready[op.args[0] % len(ready)]
        history = model.reqs[rid].history
        x = op.args[1]
        tag = mamba_state_tag((*history, x)) if history is not None else 1 + x
        return Op("forward", (rid, tag, x))
    if op.name == "release":
        return Op("release", (held[op.args[0] % len(held)],)) if held else None
    if op.name == "invalid":
        unlocked = [n.node_id for n in (model.tree.nodes[1:] if model.tree else ())
                    if n.full_lock_ref == 0]  # fmt: skip
        options = [Op("invalid", ("insert-mismatch",), expect_error=True),
                   Op("invalid", ("evict-negative",), expect_error=True)]  # fmt: skip
        if unlocked:
            node = unlocked[op.args[1] % len(unlocked)]
            options.append(Op("invalid", ("dec-unlocked", node), expect_error=True))
        chosen: Op = options[op.args[0] % len(options)]
        return chosen
    return op


def observe_tree(model: TreeModel, op: Op, out: Outcome) -> None:
    """Update the model from side A's outcome of ``op``."""
    tree: MambaTreeSnapshot = out.after.tree
    model.tree = tree
    model.free_mamba = len(out.after.pool.mamba_allocator.free_slots)
    if out.error is not None or op.expect_error:
        return
    name, args, result = op.name, op.args, out.result
    if name == "insert" and result is not None and not result[1]:
        model.ckpt_tags[result[2][0]] = args[2]
        model.ckpt_history[result[2][0]] = tuple(args[0])
    elif name == "match":
        model.next_req = args[0] + 1
        _, node_id, staged, slot = result
        node = next(n for n in tree.nodes if n.node_id == node_id)
        if args[3] and node_id != 0:
            src = node.mamba_value
            history = model.ckpt_history.get(src) if src is not None and staged else None
            src_tag = model.ckpt_tags.get(src) if src is not None and staged else None
            model.reqs[args[0]] = TreeReq(slot, staged, None, history, src_tag, src, node_id)
    elif name == "copy":
        req = model.reqs[args[0]]
        req.pending, req.expected_tag = False, req.src_tag
        if _source_unlocked_and_lost(out.before.tree, req):
            req.expected_tag, req.history = None, None
    elif name == "forward":
        req = model.reqs[args[0]]
        req.history = None if req.history is None else (*req.history, args[2])
        req.expected_tag = args[1] if req.history is not None else None
    elif name == "release":
        del model.reqs[args[0]]
    model.tree_slots = {n.mamba_value for n in tree.nodes if n.mamba_value is not None}
    model.ckpt_tags = {s: t for s, t in model.ckpt_tags.items() if s in model.tree_slots}


def _source_unlocked_and_lost(tree: MambaTreeSnapshot, req: TreeReq) -> bool:
    """Whether the state a request's copy-on-write staged left its node before the copy while
    nothing held the node's Mamba lock. The match's lock protects it; a direct unlock can drop
    that lock first (SGLang 0.5.16's unified tree takes no Mamba lock on a tombstone, yet
    releases one once the node has a state again: ``Rules.unified_tombstone_lock="skip"``), and
    the copy then reads whatever the slot holds: no state the model can name. Lost under a
    Mamba lock, the expectation stays (an implementation bug)."""
    node = next((n for n in tree.nodes if n.node_id == req.src_node), None)
    if node is None or req.src_slot is None:
        return False
    return node.mamba_value != req.src_slot and node.mamba_lock_ref == 0


def tree_coverage(model: TreeModel, op: Op, out: Outcome) -> list[str]:
    """Tags of one step (model as it was before the step)."""
    tags = [outcome_tag(op, out.result, out.error)]
    if op.expect_error or out.error is not None:
        return tags
    before, after = out.before.tree, out.after.tree
    name, result = op.name, out.result
    if len(after.nodes) > len(before.nodes) and name in ("insert", "match"):
        tags.append(f"{name}:split" if name == "match" else "insert:new-node")
    if name == "insert":
        if result is None:
            tags = ["insert:refused"]
        elif result[1]:
            tags.append("insert:state-exists")
        elif result[0] == len(op.args[0]):
            tags.append("insert:revived-tombstone")
    if name == "match":
        tags.append("match:hit" if result[0] else "match:miss")
        if result[2]:
            tags.append("match:cow")
            if not out.before.pool.mamba_allocator.free_slots:
                tags.append("match:cow-evicted")
    if name == "evict":
        tombs = sum(1 for n in after.nodes[1:] if n.mamba_value is None)
        if tombs > sum(1 for n in before.nodes[1:] if n.mamba_value is None):
            tags.append("evict:tombstone")
        if len(after.nodes) < len(before.nodes):
            tags.append("evict:leaf")
    if name == "copy" and result[0]:
        tags.append("copy:copied")
    return tags


__all__ = ["TreeModel", "TreeReq", "draw_tree_op", "materialize_tree", "observe_tree",
           "tree_coverage"]  # fmt: skip
