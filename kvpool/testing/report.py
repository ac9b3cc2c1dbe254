"""Failure reports of the lockstep harness: readable steps, the failed check, the tree, a page map.

A report is plain text built from :mod:`kvpool.snapshot` values (and, when available, each
twin's own ``tree_cache.pretty_print()``), so it needs neither twin's internals:

- the trace as numbered steps, one line each:
  ``step 3: extend(['r1', 'r2'], chunk_sizes=[None, 8]) -> [5, 6, 7, ...]``;
- the detector that fired (an invariant id, ``lockstep-diff``, ``unchanged-on-error``,
  ``invalid-accepted`` or ``crash``) after which step, with its message and offending indices;
- the radix tree of each implementation;
- a page map: for every page (slot when ``page_size == 1``) who owns it: ``node N`` (tree),
  ``req RID``, ``session SID``, ``free``, ``pending`` (buffered by a free group); a page with no
  owner is marked ``LEAKED`` and one with two owners ``SHARED``.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from typing import Any

from kvpool.snapshot import PoolSnapshot, TreeSnapshot

MAX_SHOWN = 12
"""Result lists longer than this print their first items and ``...``."""


def short(value: Any, limit: int = MAX_SHOWN) -> str:
    """``repr`` with long lists cut after ``limit`` items."""
    if isinstance(value, list) and len(value) > limit:
        return "[" + ", ".join(repr(v) for v in value[:limit]) + ", ...]"
    return repr(value)


_PLAIN = frozenset({type(None), bool, int, float, str})
"""Result items already in plain form (exact types: a NumPy scalar is converted)."""


def normalize(value: Any) -> Any:
    """Plain Python form of a result: tensors via ``.tolist()``, tuples as lists, recursively."""
    if value is None or isinstance(value, (bool, int, float, str)):
        return value
    if hasattr(value, "tolist"):
        return normalize(value.tolist())
    if isinstance(value, (list, tuple)):
        if set(map(type, value)) <= _PLAIN:  # a flat list of slots: no call per item
            return list(value)
        return [normalize(v) for v in value]
    return repr(value)


def format_step(number: int, call: str, outcome: str) -> str:
    """``step N: call -> outcome``."""
    return f"step {number}: {call} -> {outcome}"


def render_tree(tree: TreeSnapshot) -> str:
    """Indented radix tree from a snapshot: id, key (cut), value (cut), lock, access time."""
    if tree.disabled:
        return "(radix cache disabled)"
    by_id = {n.node_id: n for n in tree.nodes}
    lines = [f"evictable={tree.evictable_size} protected={tree.protected_size}"]

    def walk(node_id: int, depth: int) -> None:
        n = by_id[node_id]
        ns = f" ns={n.extra_key}" if n.extra_key else ""
        lines.append(
            f"{'  ' * depth}node {n.node_id}{ns} key={short(list(n.key), 8)} "
            f"value={short(list(n.value), 8)} lock={n.lock_ref} t={n.last_access_time:g}"
        )
        for child in n.child_ids:
            if child in by_id:
                walk(child, depth + 1)

    if tree.nodes:
        walk(tree.nodes[0].node_id, 0)
    return "\n".join(lines)


def page_owners(snap: PoolSnapshot) -> dict[int, list[str]]:
    """Owners of every allocatable page ``1..num_pages`` (see the module docstring)."""
    ps = snap.allocator.page_size
    owners: dict[int, list[str]] = {p: [] for p in range(1, snap.allocator.num_pages + 1)}

    def claim(slots: Sequence[int], who: str) -> None:
        for page in sorted({s // ps for s in slots}):
            names = owners.setdefault(page, [])
            if who not in names:
                names.append(who)

    for node in snap.tree.nodes:
        claim(node.value, f"node {node.node_id}")
    for r in snap.reqs:
        if r.req_pool_idx is not None and r.row:
            claim(r.row[r.cache_protected_len : r.kv_allocated_len], f"req {r.rid}")
    for s in snap.sessions:
        if s.req_pool_idx is not None and s.row:
            claim(s.row[s.cache_protected_len : s.kv_allocated_len], f"session {s.session_id}")
    for page in snap.allocator.free_pages + snap.allocator.release_pages:
        owners.setdefault(page, []).append("free")
    claim(snap.allocator.pending_free, "pending")
    return owners


def render_page_map(snap: PoolSnapshot) -> str:
    """One line per page: ``page P (slots a-b): owners``, flagging leaks and shared pages."""
    ps = snap.allocator.page_size
    lines = []
    for page, names in sorted(page_owners(snap).items()):
        flag = ""
        if not names:
            flag = "LEAKED"
        elif len(names) > 1 and not all(n.startswith("node") for n in names):
            flag = "SHARED: "
        span = (
            f"slot {page}" if ps == 1 else f"page {page} (slots {page * ps}-{page * ps + ps - 1})"
        )
        lines.append(f"{span}: {flag}{', '.join(names)}")
    return "\n".join(lines)


def render_requests(snap: PoolSnapshot) -> str:
    """One line per request and session with its lengths and row."""
    lines = []
    for r in snap.reqs:
        lines.append(
            f"req {r.rid} {r.state} row={r.req_pool_idx} committed={r.kv_committed_len} "
            f"allocated={r.kv_allocated_len} protected={r.cache_protected_len} "
            f"chunked={r.is_chunked} node={r.last_node_id} slots={short(list(r.row), 16)}"
        )
    for s in snap.sessions:
        lines.append(
            f"session {s.session_id} row={s.req_pool_idx} committed={s.kv_committed_len} "
            f"allocated={s.kv_allocated_len} protected={s.cache_protected_len} "
            f"node={s.last_node_id} busy_with={s.busy_with}"
        )
    return "\n".join(lines) or "(no requests)"


def first_difference(a: Any, b: Any, path: str = "snapshot") -> tuple[str, Any, Any] | None:
    """Path and values of the first field where two snapshots differ (None if equal). Tuples of
    records are followed element by element; tuples of plain values are shown whole."""
    if dataclasses.is_dataclass(a) and dataclasses.is_dataclass(b) and type(a) is type(b):
        for f in dataclasses.fields(a):
            if not f.compare:
                continue
            found = first_difference(getattr(a, f.name), getattr(b, f.name), f"{path}.{f.name}")
            if found:
                return found
        return None
    if (
        isinstance(a, tuple)
        and isinstance(b, tuple)
        and len(a) == len(b)
        and any(isinstance(x, tuple) or dataclasses.is_dataclass(x) for x in a[:1])
    ):
        for i, (x, y) in enumerate(zip(a, b, strict=False)):
            found = first_difference(x, y, f"{path}[{i}]")
            if found:
                return found
        return None
    return None if a == b else (path, a, b)


def build_report(
    title: str,
    steps: Sequence[str],
    detail: str,
    snapshots: Sequence[tuple[str, PoolSnapshot | None, str | None]],
    config: Any = None,
) -> str:
    """The whole report. ``snapshots`` lists ``(label, snapshot, pretty_print text or None)``."""
    out = [f"=== kvpool lockstep failure: {title} ==="]
    if config is not None:
        out.append(f"config: {config}")
    out.append(f"minimal trace ({len(steps)} steps):")
    out.extend("  " + s for s in steps)
    # Every detector fires right after the last step run (before any step: construction).
    where = f"after step {len(steps)}" if steps else "before the first step"
    out.append(f"failed {where}: {detail}")
    for label, snap, pretty in snapshots:
        if snap is None:
            continue
        out.append(f"--- {label}: radix tree ---")
        out.append(pretty if pretty else render_tree(snap.tree))
        out.append(f"--- {label}: requests ---")
        out.append(render_requests(snap))
        out.append(f"--- {label}: page map ---")
        out.append(render_page_map(snap))
    return "\n".join(out)
