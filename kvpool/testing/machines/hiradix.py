"""The hierarchical-cache machine: a ``HiRadixCache`` with its host pool, against the reference.

Operations (token keys from a few shared prefixes, reused from earlier inserts half the time):

- ``insert(tokens)``: what a finishing request does: fresh device slots for the page-aligned
  tokens, their KV (tags) written, ``insert``, the duplicates freed; under write-through this
  issues writes to host whose acknowledgements arrive later;
- ``match_prefix(tokens)``: the matched device node becomes a lock handle (``inc_lock_ref`` /
  ``dec_lock_ref``: a running request);
- ``load_back(tokens)``: a request hitting in host memory: ``match_prefix``, ``init_load_back``
  of its ``last_host_node``, then the loads are issued (``ready_to_load_host_cache``);
- ``writing_check(k)`` / ``loading_check(k)``: the first ``k`` write / load acknowledgements
  arrive (0 to all);
- ``evict(n)``, ``evict_host(n)``;
- storage prefetches (``config.hicache_storage``): ``prefetch(rid, tokens)`` (match, then
  ``prefetch_from_storage`` of the unmatched tokens below ``last_host_node``),
  ``storage_hit(rid, n)``, ``prefetch_io(rid, pages)`` (the worker), ``check_prefetch_progress``
  (the request is scheduled), ``release_aborted_request`` (abort), ``drain`` (released host
  slots freed);
- ``reset`` (the tree, host pool and allocator cleared together), and invalid calls.

Acknowledgements, worker steps and prefetch completions are operations, so the swarm explores
their interleavings with eviction, inserts (finishing requests) and aborts.

Under EAGLE's bigram keys (``PoolConfig.is_eagle``, drawn for one page count in three without
storage prefetches when the candidate's trees say ``radix_models_eagle``) an insert takes the
slots its bigrams keep and a handle names its node with one token more, as on the radix machine
(:func:`~kvpool.testing.machines.radix.insert_span`, :func:`~kvpool.testing.machines.radix.
handle_tokens`).

Checked after every step: the ``"host"`` invariants (:mod:`kvpool.invariants.host`), the device
allocator's invariants against the on-device nodes' pages, and ``INV-TREE-SHAPE`` /
``INV-LOCKS`` on the tree's on-device part with the machine's handles, the writes in flight
(write-through locks) and the loads in flight as lock holders.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field
from typing import Any

from kvpool.config import PoolConfig
from kvpool.constants import EVICTION_POLICIES
from kvpool.invariants.allocator import check_allocator
from kvpool.invariants.host import check_host_tier
from kvpool.invariants.tree import check_locks, check_tree_shape, device_view
from kvpool.records import replaced
from kvpool.snapshot import (
    HostTierSnapshot,
    NodeSnapshot,
    PoolSnapshot,
    ReqSnapshot,
    ReqToTokenSnapshot,
    TreeSnapshot,
)
from kvpool.tags import kv_tags
from kvpool.testing.bundle import Implementation
from kvpool.testing.machines.base import Outcome
from kvpool.testing.machines.coverage import outcome_tag
from kvpool.testing.machines.radix import _node_at, eagle_pages, handle_tokens, insert_span
from kvpool.testing.swarm import ALPHABET, Chooser, Op, draw_length, shared_prefix

Handle = tuple[tuple[int, ...], str | None]
RIDS = ("r0", "r1", "r2")


@dataclass
class HiSide:
    pool: Any
    alloc: Any
    tree: Any
    key: Any
    index: Any
    nodes: dict[Handle, Any] = field(default_factory=dict)
    coarse: bool = False
    """Compare trees as 0.5.23's unified cache reports them (:func:`coarse_host_tier`)."""
    eagle: bool = False
    """The configuration's ``is_eagle``: inserts and handles spell bigram keys."""


def coarse_host_tier(snap: HostTierSnapshot) -> HostTierSnapshot:
    """``snap`` as the machine compares a unified-cache host tier (``Rules.hicache_host_tier
    == "unified"``): children in id order, no access times, hit counts, priorities, host pins
    or policy name (SGLang 0.5.23's cores do not report them; the orders they decide show in
    the slots an eviction frees, which the allocator and host pool snapshots compare). A node
    that storage prefetches hang below keeps its pins up to their number, so
    ``INV-HOST-PINNED`` still sees whether each of them pins it."""
    tree = snap.tree
    by_id = {n.node_id: n for n in tree.nodes}
    anchors = Counter(p.last_host_node_id for p in snap.prefetches)
    rows: list[NodeSnapshot] = []
    queue = [tree.nodes[0]] if tree.nodes else []
    while queue:
        node = queue.pop(0)
        order = sorted(range(len(node.child_ids)), key=lambda i: node.child_ids[i])
        queue.extend(by_id[node.child_ids[i]] for i in order)
        rows.append(replaced(
            node, child_ids=tuple(node.child_ids[i] for i in order),
            child_keys=tuple(node.child_keys[i] for i in order), last_access_time=0.0,
            hit_count=0, priority=0,
            host_ref_counter=min(node.host_ref_counter, anchors[node.node_id]),
        ))  # fmt: skip
    tree = replaced(tree, nodes=tuple(rows), eviction_policy="")
    return replaced(snap, tree=tree)


@dataclass
class HiModel:
    config: PoolConfig
    locks: dict[Handle, int] = field(default_factory=dict)
    matched: dict[Handle, int] = field(default_factory=dict)
    keys: list[Handle] = field(default_factory=list)
    """Keys inserted so far (reused so that matches and load-backs hit)."""
    snap: HostTierSnapshot | None = None


class HiRadixTarget:
    """:class:`~kvpool.testing.machines.base.Target` of the hierarchical-cache machine."""

    name = "hiradix_cache"

    def draw_config(self, c: Chooser, impl: Implementation) -> PoolConfig:
        ps = c.choice((1, 2, 4))
        pages = c.integer(4, 16) if ps <= 2 else c.integer(3, 8)
        policy = c.choice(("write_through", "write_through", "write_through_selective",
                           "write_back"))  # fmt: skip
        eviction = c.choice(EVICTION_POLICIES)
        ratio = c.choice((0.5, 1.0, 2.0))
        load_back = c.choice((0, ps, 3 * ps))
        prefetch = c.choice((ps, 2 * ps))
        storage = impl.hiradix_storage and c.choice((False, True, True))
        return PoolConfig(
            size=pages * ps,
            page_size=ps,
            eviction_policy=eviction,
            rules=impl.rules_or_default(),
            hicache_ratio=ratio,
            hicache_write_policy=policy,
            hicache_load_back_threshold=load_back,
            hicache_prefetch_threshold=prefetch,
            hicache_storage=storage,
            is_eagle=not storage and eagle_pages(impl, pages),  # not modelled with storage
        )

    def build(self, impl: Implementation, config: PoolConfig) -> HiSide:
        assert impl.hiradix_cache and impl.allocator and impl.req_to_token_pool and impl.radix_key
        pool, alloc = impl.req_to_token_pool(config), impl.allocator(config)
        tree = impl.hiradix_cache(config, pool, alloc)
        coarse = config.rules.hicache_host_tier == "unified"
        return HiSide(pool, alloc, tree, impl.radix_key, impl.index, coarse=coarse,
                      eagle=config.is_eagle)  # fmt: skip

    def snapshot(self, side: HiSide) -> HostTierSnapshot:
        snap: HostTierSnapshot = side.tree.host_snapshot()
        return coarse_host_tier(snap) if side.coarse else snap

    def new_model(self, config: PoolConfig) -> HiModel:
        return HiModel(config)

    def pretty(self, snap: Any) -> str:
        from kvpool.testing.report import render_tree

        return (f"device {snap.device}\nhost {snap.host}\ntransfers {snap.transfers}\n"
                f"prefetches {snap.prefetches}\nrelease queue {snap.release_queue}\n"
                f"{render_tree(snap.tree)}")  # fmt: skip

    # ---------------------------------------------------------------- drawing
    def _key(self, c: Chooser, model: HiModel, reuse: bool | None) -> tuple[list[int], str | None]:
        ps = model.config.page_size
        if model.keys and reuse is not None and (reuse or c.integer(0, 1)):
            tokens, extra = model.keys[c.integer(0, len(model.keys) - 1)]
            cut = c.choice((len(tokens), len(tokens), max(ps, len(tokens) // 2)))
            return list(tokens[:cut]) + [c.choice(ALPHABET) for _ in range(c.integer(0, ps))], extra
        n = draw_length(c, ps, 4 * ps + 3) if reuse is not None else c.integer(2, 5) * ps
        head = shared_prefix(c.integer(0, 2), c.integer(0, n))
        return head + [c.choice(ALPHABET) for _ in range(n - len(head))], c.choice((None, "a"))

    def draw_op(self, c: Chooser, model: HiModel, rejects_misuse: bool) -> Op:
        cfg = model.config
        kinds = ["insert"] * 4 + ["match", "match", "lock", "lock", "unlock", "unlock", "evict",
                 "evict", "evict_host",
                 "load_back", "load_back", "load_back", "wcheck", "wcheck", "lcheck", "lcheck",
                 "reset", "invalid"]  # fmt: skip
        if cfg.hicache_storage and cfg.rules.hicache_host_tier == "unified":
            # a transfer's tokens count once a drain applies its acknowledgements, which
            # completes the prefetch: drains come as often as admission checks
            kinds += ["prefetch", "prefetch", "hit", "hit", "hit", "io", "io", "io", "drain",
                      "drain", "progress", "abort"]  # fmt: skip
        elif cfg.hicache_storage:
            kinds += ["prefetch", "prefetch", "hit", "hit", "io", "io", "io", "progress",
                      "progress", "abort", "drain"]  # fmt: skip
        kind = c.choice(kinds)
        if kind == "reset" and c.integer(0, 3):
            kind = "evict"  # a flush is rare: most runs keep their tree
        if kind in ("insert", "match", "load_back", "prefetch"):
            reuse = None if kind == "prefetch" else kind == "load_back"
            tokens, extra = self._key(c, model, reuse)
            name = {"match": "match_prefix"}.get(kind, kind)
            rid = (c.integer(0, len(RIDS) - 1),) if kind == "prefetch" else ()
            return Op(name, (*rid, tokens), (("extra_key", extra),))
        if kind in ("lock", "unlock"):
            return Op("inc_lock_ref" if kind == "lock" else "dec_lock_ref", (c.integer(0, 7),))
        if kind in ("evict", "evict_host"):
            return Op(kind, (c.integer(0, cfg.size // 2 + cfg.page_size),))
        if kind in ("wcheck", "lcheck"):
            name = "writing_check" if kind == "wcheck" else "loading_check"
            return Op(name, (c.choice((0, 1, 1, 2, 8)),))
        if kind == "hit":
            return Op("storage_hit", (c.integer(0, 2), c.choice((0, 1, 2, 3, 5)) * cfg.page_size))
        if kind == "io":
            return Op("prefetch_io", (c.integer(0, 8), c.integer(0, 3)))
        if kind in ("progress", "abort"):
            name = "check_prefetch_progress" if kind == "progress" else "release_aborted_request"
            return Op(name, (c.integer(0, 2),))
        if kind == "drain":
            return Op("drain_storage_control_queues")
        if kind == "reset":
            return Op("reset")
        if rejects_misuse:
            return Op("invalid", (c.integer(0, 7),), expect_error=True)
        return Op("evict", (cfg.page_size,))

    def materialize(self, model: HiModel, op: Op) -> Op | None:
        snap = model.snap
        handles = sorted(model.matched, key=lambda h: (h[0], h[1] or ""))
        if op.name == "inc_lock_ref":
            eagle = model.config.is_eagle
            live = [h for h in handles if snap is None or _on_device(snap.tree, h, eagle)]
            return Op("inc_lock_ref", (live[op.args[0] % len(live)],)) if live else None
        if op.name == "dec_lock_ref":
            locked = [h for h in handles if model.locks.get(h)]
            return Op("dec_lock_ref", (locked[op.args[0] % len(locked)],)) if locked else None
        if op.name == "reset":
            return None if any(model.locks.values()) else op
        ongoing = [] if snap is None else [p.rid for p in snap.prefetches]
        if op.name == "prefetch":
            idle = [r for r in RIDS if r not in ongoing]
            return (
                Op("prefetch", (idle[op.args[0] % len(idle)], op.args[1]), op.kwargs)
                if idle
                else None
            )
        if op.name in ("storage_hit", "check_prefetch_progress", "release_aborted_request"):
            # an ongoing prefetch when there is one (else a request that has none)
            rids = ongoing or list(RIDS)
            return Op(op.name, (rids[op.args[0] % len(rids)], *op.args[1:]))
        if op.name == "prefetch_io":  # workers outlive their prefetch: any request
            rids = ongoing * 2 + list(RIDS)
            return Op(op.name, (rids[op.args[0] % len(rids)], *op.args[1:]))
        if op.name == "invalid":
            eagle = model.config.is_eagle
            unlocked = [h for h in handles if snap is not None and _unlocked(snap.tree, h, eagle)]
            if unlocked and op.args[0] % 3 == 1:
                return Op("dec_lock_ref", (unlocked[op.args[0] % len(unlocked)],),
                          expect_error=True)  # fmt: skip
            name = "evict_host" if op.args[0] % 3 == 2 else "evict"
            return Op(name, (-1 - op.args[0],), expect_error=True)
        if op.name in ("evict", "load_back") and _eviction_asserts(model):
            return None  # the implementation asserts there (Rules.prefetch_refill "attach")
        return op

    # ---------------------------------------------------------------- calling
    def call(self, side: HiSide, op: Op) -> Any:
        tree = side.tree
        kw = dict(op.kwargs)
        if op.name == "insert":
            tokens, extra = op.args[0], kw["extra_key"]
            n, key_tokens = insert_span(tokens, tree.page_size, side.eagle)
            slots = side.alloc.alloc(n)
            if slots is None:
                return None
            tree.cache_controller.mem_pool_device.write_tags(slots, kv_tags(tokens[:n], extra))
            cached = tree.insert(side.key(key_tokens, extra), slots)
            if cached and not getattr(tree, "frees_duplicates", False):
                side.alloc.free(slots[:cached])  # the caller frees its duplicates
            return [slots, cached]
        if op.name == "match_prefix":
            tokens, extra = op.args[0], kw["extra_key"]
            m = tree.match_prefix(side.key(tokens, extra))
            got = m.device_indices
            side.nodes[(handle_tokens(tokens, len(got), side.eagle), extra)] = m.last_device_node
            return [got, m.host_hit_length]
        if op.name == "load_back":
            tokens, extra = op.args[0], kw["extra_key"]
            m = tree.match_prefix(side.key(tokens, extra))
            loaded, _ = tree.init_load_back(m.last_host_node)
            tree.ready_to_load_host_cache()
            return [m.host_hit_length, loaded]
        if op.name == "prefetch":
            rid, tokens, extra = op.args[0], op.args[1], kw["extra_key"]
            if rid in tree.ongoing_prefetch:
                return None
            m = tree.match_prefix(side.key(tokens, extra))
            start = len(m.device_indices) + m.host_hit_length
            return tree.prefetch_from_storage(rid, m.last_host_node, list(tokens[start:]), extra)
        if op.name in ("inc_lock_ref", "dec_lock_ref"):
            return getattr(tree, op.name)(side.nodes[op.args[0]])
        if op.name == "reset":
            side.nodes.clear()
            tree.reset()
            side.alloc.clear()
            return side.pool.clear()
        return getattr(tree, op.name)(*op.args)

    def observe(self, model: HiModel, op: Op, out: Outcome) -> None:
        model.snap = out.after
        if out.error is not None or op.expect_error:
            return
        kw = dict(op.kwargs)
        if op.name == "insert" and out.result is not None:
            key = (tuple(op.args[0]), kw["extra_key"])
            if key not in model.keys:
                model.keys = [*model.keys, key][-8:]
        if op.name == "match_prefix":
            n = len(out.result[0])
            handle = handle_tokens(op.args[0], n, model.config.is_eagle)
            model.matched[(handle, kw["extra_key"])] = n
        elif op.name == "inc_lock_ref":
            model.locks[op.args[0]] = model.locks.get(op.args[0], 0) + 1
        elif op.name == "dec_lock_ref":
            model.locks[op.args[0]] -= 1
        elif op.name == "reset":
            model.locks.clear()
            model.matched.clear()
        if op.name in ("evict", "reset", "load_back"):
            model.matched = {h: n for h, n in model.matched.items() if model.locks.get(h)}

    # ---------------------------------------------------------------- checks
    def check(self, model: HiModel, snap: HostTierSnapshot, previous: Any) -> int:
        count = check_host_tier(snap, previous)
        ps = snap.device.page_size
        held = {s // ps for n in snap.tree.nodes if not n.evicted for s in n.value}
        count += check_allocator(snap.device, held)
        view = device_view(snap.tree)
        holders = [
            node
            for h, times in sorted(model.locks.items(), key=repr)
            for node in [_node_at(view, h[0], h[1], eagle=model.config.is_eagle)] * times
            if node is not None
        ]
        holders += [i for t in snap.transfers for i in t.node_ids
                    if t.kind == "load" or snap.write_policy != "write_back"]  # fmt: skip
        reqs = tuple(ReqSnapshot(f"lock{i}", "waiting", None, 0, 0, 0, 0, 0, 0, 0, node, None,
                                 None) for i, node in enumerate(holders))  # fmt: skip
        table = ReqToTokenSnapshot(1, 1, (), (0, 0))
        pool = PoolSnapshot(snap.device, table, view, reqs)
        prev = None
        if previous is not None:
            prev = PoolSnapshot(previous.device, table, device_view(previous.tree))
        check_tree_shape(pool, prev)
        check_locks(pool, None)
        return count + 2

    def refusal_must_not_change(self, config: PoolConfig, op: Op, out: Outcome) -> bool:
        if out.error is not None:
            return True
        return op.name == "insert" and out.result is None and config.rules.refused_alloc_unchanged

    def coverage(self, model: HiModel, op: Op, out: Outcome) -> list[str]:
        tag = outcome_tag(op, out.result, out.error)
        if out.error is not None or op.expect_error:
            return [tag]
        before, after = out.before, out.after
        if op.name == "match_prefix":
            return ["match_prefix:host-hit" if out.result[1] else
                    "match_prefix:hit" if out.result[0] else "match_prefix:miss"]  # fmt: skip
        if op.name == "load_back":
            return ["load_back:loaded" if out.result[1] else
                    "load_back:skipped" if out.result[0] else "load_back:no-host-hit"]  # fmt: skip
        if op.name in ("writing_check", "loading_check"):
            return [f"{op.name}:{'acked' if out.result else 'nothing'}"]
        if op.name == "evict":
            host_only = sum(n.evicted for n in after.tree.nodes) > sum(
                n.evicted for n in before.tree.nodes
            )
            tag = "evict:to-host" if host_only else "evict:freed" if out.result else "evict:nothing"
            return [tag, *_reclaimed(before.tree, after.tree)]
        if op.name == "evict_host":
            tag = "evict_host:freed" if out.result else "evict_host:nothing"
            return [tag, *_reclaimed(before.tree, after.tree)]
        if op.name == "insert" and out.result is not None:
            pending = len(after.transfers) > len(before.transfers)
            return ["insert:write-issued" if pending else "insert:ok"]
        if op.name == "check_prefetch_progress":
            grew = len(after.tree.nodes) > len(before.tree.nodes)
            return ["prefetch:inserted" if grew else "prefetch:ended"]
        return [tag]


def _reclaimed(before: TreeSnapshot, after: TreeSnapshot) -> list[str]:
    """``["host:duplicate-reclaimed"]`` when a node kept its device copy and lost its host copy
    (the unified write-back reclaim of host duplicates), else ``[]``."""
    had = {n.node_id for n in before.nodes if not n.evicted and n.host_value and n.parent_id}
    lost = [n for n in after.nodes if n.node_id in had and not n.evicted and n.host_value is None]
    return ["host:duplicate-reclaimed"] if lost else []


def _eviction_asserts(model: HiModel) -> bool:
    """Whether a device eviction now (``evict``, or a load-back short of device slots) could
    reach a device node without a host copy whose children are host-only, which write-through
    eviction deletes asserting a leaf: a prefetch attached them under
    ``Rules.prefetch_refill == "attach"`` (SGLang 0.5.16). A node with a host-only child is
    enough: evicting its other children promotes it."""
    cfg, snap = model.config, model.snap
    if cfg.rules.prefetch_refill != "attach" or cfg.hicache_write_policy == "write_back":
        return False
    if snap is None:
        return False
    by_id = {n.node_id: n for n in snap.tree.nodes}
    return any(
        n.parent_id is not None
        and not n.evicted
        and n.host_value is None
        and any(by_id[c].evicted for c in n.child_ids)
        for n in snap.tree.nodes
    )


def _on_device(tree: TreeSnapshot, handle: Handle, eagle: bool) -> bool:
    node_id = _node_at(tree, *handle, eagle=eagle)
    return node_id is not None and not {n.node_id: n for n in tree.nodes}[node_id].evicted


def _unlocked(tree: TreeSnapshot, handle: Handle, eagle: bool) -> bool:
    node_id = _node_at(tree, *handle, eagle=eagle)
    by_id = {n.node_id: n for n in tree.nodes}
    return node_id is not None and not by_id[node_id].evicted and by_id[node_id].lock_ref == 0


__all__ = ["HiModel", "HiRadixTarget", "HiSide", "coarse_host_tier"]
