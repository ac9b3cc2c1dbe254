"""Invariants of the host tier (scope ``"host"``): a ``HiRadixCache`` with its host pool.

A check gets a :class:`~kvpool.snapshot.HostTierSnapshot` and the previous one (None: first).
Units: host slots (``0..host.size-1``, none reserved), device slots and pages (slot //
page_size), tokens. Node states: a node is on device (``evicted`` False, ``value`` its device
slots), maybe with a backup (``host_value``), or host-only (``evicted``, ``value`` empty). The
root is excluded everywhere (its ``host_value`` is the empty backup).

Who holds a host slot: a tree node (its ``host_value``), an ongoing prefetch (the slots it has
fetched, ``host_indices[:completed_tokens]``), a prefetch worker (the slots it reserved and has
not filled, ``worker_held``), or the release queue; every other slot is free (``free_slots`` or
``release_slots``).
"""

from __future__ import annotations

from collections import Counter
from itertools import chain

from kvpool.errors import InvariantViolation
from kvpool.invariants.failure import fail
from kvpool.invariants.registry import invariant, run_scope
from kvpool.snapshot import HostTierSnapshot, NodeSnapshot, TreeSnapshot
from kvpool.tags import kv_tags


def _nodes(tree: TreeSnapshot) -> list[NodeSnapshot]:
    """Every node but the root."""
    return list(tree.nodes[1:])


def host_holders(snap: HostTierSnapshot) -> Counter[int]:
    """How many holders (tree nodes, ongoing prefetches, workers, the release queue) name each
    host slot."""
    held: Counter[int] = Counter()
    for node in _nodes(snap.tree):
        held.update(node.host_value or ())
    for p in snap.prefetches:
        held.update(p.host_indices[: p.completed_tokens])
    held.update(snap.worker_held)
    held.update(snap.release_queue)
    return held


@invariant(
    "INV-HOST-DOUBLE-FREE",
    "no host slot is free twice: none twice in free_slots + release_slots + the release queue, "
    "none queued for release while already free, none queued while a prefetch worker still "
    "holds it (it releases its slots itself)",
    scope="host",
)
def check_host_double_free(snap: HostTierSnapshot, previous: HostTierSnapshot | None) -> None:
    free = Counter(chain(snap.host.free_slots, snap.host.release_slots))  # one counting pass
    fail("INV-HOST-DOUBLE-FREE", "host slots free twice", [s for s, c in free.items() if c > 1])
    queued = Counter(snap.release_queue)
    fail(
        "INV-HOST-DOUBLE-FREE",
        "host slots queued for release twice, or queued while free",
        [s for s, c in queued.items() if c > 1 or s in free],
    )
    fail(
        "INV-HOST-DOUBLE-FREE",
        "host slots queued for release while a prefetch worker will release them too",
        set(queued) & set(snap.worker_held),
    )


@invariant(
    "INV-HOST-ACCOUNTING",
    "host accounting: free slots + slots held (tree host values, prefetches, workers, release "
    "queue) are exactly 0..size-1, each once; size is a page multiple",
    scope="host",
)
def check_host_accounting(snap: HostTierSnapshot, previous: HostTierSnapshot | None) -> None:
    host = snap.host
    if host.size <= 0 or host.size % host.page_size:
        raise InvariantViolation("INV-HOST-ACCOUNTING", f"host size {host.size} not whole pages")
    # free + held counted in place (Counter's + builds and filters a new one each time)
    everything = host_holders(snap)
    everything.update(host.free_slots)
    everything.update(host.release_slots)
    fail("INV-HOST-ACCOUNTING", "host slots out of range",
          [s for s in everything if not 0 <= s < host.size])  # fmt: skip
    fail("INV-HOST-ACCOUNTING", "host slots held twice, or held and free",
          [s for s, c in everything.items() if c > 1])  # fmt: skip
    fail("INV-HOST-ACCOUNTING", "host slots neither free nor held (leaked)",
          [s for s in range(host.size) if s not in everything])  # fmt: skip


def _in_flight(snap: HostTierSnapshot, kind: str) -> tuple[set[int], set[int]]:
    """(host slots, device slots) of the transfers of ``kind`` in flight."""
    hosts: set[int] = set()
    devices: set[int] = set()
    for t in snap.transfers:
        if t.kind == kind:
            hosts.update(t.host_indices)
            devices.update(t.device_indices)
    return hosts, devices


@invariant(
    "INV-HOST-PINNED",
    "a node being written to host or loaded back is locked or its host copy pinned; the host "
    "slots of a transfer in flight belong to tree nodes; a prefetch's node is in the tree and "
    "pinned once per prefetch naming it",
    scope="host",
)
def check_host_pinned(snap: HostTierSnapshot, previous: HostTierSnapshot | None) -> None:
    nodes = _nodes(snap.tree)
    w_host, _ = _in_flight(snap, "write")
    l_host, l_dev = _in_flight(snap, "load")
    fail(
        "INV-HOST-PINNED",
        "nodes written or loaded while neither locked nor pinned",
        [
            n.node_id
            for n in nodes
            if n.lock_ref <= 0
            and n.host_ref_counter <= 0
            and (set(n.host_value or ()) & w_host or set(n.value) & l_dev)
        ],
    )
    tree_hosts = {h for n in nodes for h in n.host_value or ()}
    fail(
        "INV-HOST-PINNED",
        "host slots of a transfer in flight held by no tree node",
        (w_host | l_host) - tree_hosts,
    )
    by_id = {n.node_id: n for n in snap.tree.nodes}
    pins = Counter(p.last_host_node_id for p in snap.prefetches)
    fail(
        "INV-HOST-PINNED",
        "prefetch nodes missing or pinned fewer times than prefetches name them",
        [
            i
            for i, c in pins.items()
            if i not in by_id or (i != snap.tree.nodes[0].node_id and by_id[i].host_ref_counter < c)
        ],
    )


@invariant(
    "INV-HOST-BACKUP-DONE",
    "a host-only node's backup completed: it has host slots for every token, no write in "
    "flight, no lock and no device slot, and its children are host-only too",
    scope="host",
)
def check_backup_done(snap: HostTierSnapshot, previous: HostTierSnapshot | None) -> None:
    w_host, _ = _in_flight(snap, "write")
    by_id = {n.node_id: n for n in snap.tree.nodes}
    bad = []
    for n in _nodes(snap.tree):
        if not n.evicted:
            continue
        host = n.host_value
        incomplete = host is None or len(host) != len(n.key) or bool(set(host) & w_host)
        if (
            incomplete
            or n.write_pending
            or n.lock_ref != 0
            or n.value
            or any(c in by_id and not by_id[c].evicted for c in n.child_ids)
        ):
            bad.append(n.node_id)
    fail("INV-HOST-BACKUP-DONE", "host-only nodes whose backup is not complete", bad)


@invariant(
    "INV-HOST-DEVICE-ACCOUNTING",
    "device accounting with backed-up nodes: allocated device pages are exactly the pages of "
    "the on-device nodes' values; evictable/protected sizes count on-device tokens only",
    scope="host",
)
def check_device_accounting(snap: HostTierSnapshot, previous: HostTierSnapshot | None) -> None:
    alloc, ps = snap.device, snap.device.page_size
    free = set(alloc.free_pages) | set(alloc.release_pages)
    free |= {s // ps for s in alloc.pending_free}
    on_device = [n for n in _nodes(snap.tree) if not n.evicted]
    held = Counter(s // ps for n in on_device for s in n.value)
    pages = set(range(1, alloc.num_pages + 1))
    fail("INV-HOST-DEVICE-ACCOUNTING", "device pages of nodes that are free",
          [p for p in held if p in free])  # fmt: skip
    outside = set(snap.device_held)  # the lifecycle's requests and sessions
    fail("INV-HOST-DEVICE-ACCOUNTING", "device pages neither free nor held (leaked)",
          [p for p in pages if p not in free and p not in held and p not in outside])  # fmt: skip
    fail("INV-HOST-DEVICE-ACCOUNTING", "host-only nodes holding device slots",
          [n.node_id for n in _nodes(snap.tree) if n.evicted and n.value])  # fmt: skip
    evictable = sum(len(n.key) for n in on_device if n.lock_ref == 0)
    protected = sum(len(n.key) for n in on_device if n.lock_ref > 0)
    if (evictable, protected) != (snap.tree.evictable_size, snap.tree.protected_size):
        raise InvariantViolation(
            "INV-HOST-DEVICE-ACCOUNTING",
            f"sizes (evictable {snap.tree.evictable_size}, protected {snap.tree.protected_size})"
            f" != on-device sums ({evictable}, {protected})",
        )


def _path_tags(snap: HostTierSnapshot) -> dict[int, list[int]]:
    """Node id -> the tags its tokens must hold (from the whole root path, in its namespace)."""
    by_id = {n.node_id: n for n in snap.tree.nodes}
    out: dict[int, list[int]] = {}
    for n in _nodes(snap.tree):
        parts: list[tuple[int, ...]] = []
        cur: NodeSnapshot | None = n
        while cur is not None and cur.parent_id is not None:
            parts.append(cur.key)
            cur = by_id.get(cur.parent_id)
        tokens = [t for part in reversed(parts) for t in part]
        out[n.node_id] = kv_tags(tokens, n.extra_key)[len(tokens) - len(n.key) :]
    return out


@invariant(
    "INV-HOST-KV-INTEGRITY",
    "every completed host copy holds its tokens' tags, and every on-device node not being "
    "loaded holds them in its device slots",
    scope="host",
)
def check_host_kv_integrity(snap: HostTierSnapshot, previous: HostTierSnapshot | None) -> None:
    if not snap.host.tags:
        return
    expected = _path_tags(snap)
    _, l_dev = _in_flight(snap, "load")
    bad = []
    for n in _nodes(snap.tree):
        want = expected[n.node_id]
        hosts = n.host_value
        if hosts is not None and not n.write_pending and [snap.host.tags[h] for h in hosts] != want:
            bad.append(n.node_id)
        device_read = snap.device_tags and not n.evicted and not set(n.value) & l_dev
        if device_read and [snap.device_tags[s] for s in n.value] != want:
            bad.append(n.node_id)
    fail("INV-HOST-KV-INTEGRITY", "nodes whose host or device copy holds other tokens' KV", bad)


def check_host_tier(snap: HostTierSnapshot, previous: HostTierSnapshot | None = None) -> int:
    """Every ``"host"`` invariant on ``snap``; returns the number of checks run."""
    return run_scope("host", snap, previous)


__all__ = ["check_host_tier", "host_holders"]
