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
from functools import lru_cache
from itertools import chain

import kvpool.invariants.derived as derived
from kvpool.errors import InvariantViolation
from kvpool.invariants.allocator import all_pages
from kvpool.invariants.derived import page_of
from kvpool.invariants.failure import fail
from kvpool.invariants.registry import invariant, run_scope
from kvpool.snapshot import HostPoolSnapshot, HostTierSnapshot, NodeSnapshot, TreeSnapshot
from kvpool.tags import continue_tags, namespace_seed


def _nodes(tree: TreeSnapshot) -> list[NodeSnapshot]:
    """Every node but the root."""
    return list(tree.nodes[1:])


def host_holders(snap: HostTierSnapshot) -> Counter[int]:
    """How many holders (tree nodes, ongoing prefetches, workers, the release queue) name each
    host slot."""
    held: Counter[int] = Counter(
        chain.from_iterable(node.host_value or () for node in snap.tree.nodes[1:])
    )
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
    host = snap.host
    free = _free_slots_in_range(host)[0]
    if len(free) < len(host.free_slots) + len(host.release_slots):  # a repeat: name the slots
        counts = Counter(chain(host.free_slots, host.release_slots))
        fail(
            "INV-HOST-DOUBLE-FREE", "host slots free twice", [s for s, c in counts.items() if c > 1]
        )
    if not snap.release_queue:
        return  # nothing queued: the checks below name nothing
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
    # The common verdict without a Counter or a loop per slot: the holders' and free lists'
    # slots are size entries covering exactly 0..size-1, so each slot is named once.
    held: list[int] = []
    for n in snap.tree.nodes[1:]:  # (a loop: a generator costs more for a few nodes)
        if n.host_value:
            held += n.host_value
    for p in snap.prefetches:
        held += p.host_indices[: p.completed_tokens]
    held += snap.worker_held
    held += snap.release_queue
    if len(held) + len(host.free_slots) + len(host.release_slots) == host.size:
        # The slots named (held, then free-listed) are exactly 0..size-1 when the free ones
        # (shared with INV-HOST-DOUBLE-FREE) and the held ones all lie in range and together
        # count size distinct slots: a subset of 0..size-1 as large as it is that range.
        free, free_in_range = _free_slots_in_range(host)
        held_set = set(held)
        if (
            free_in_range
            and _host_slots(host.size).issuperset(held_set)
            and len(free) + len(held_set.difference(free)) == host.size
        ):
            return
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


_FREE_SETS: dict[tuple[int, tuple[int, ...], tuple[int, ...]], tuple[frozenset[int], bool]] = {}
"""``(size, free_slots, release_slots)`` -> :func:`_free_slots_in_range`'s answer: a host pool's
free lists mostly stay the same between steps (and two checks ask), so each is decided once."""


def _free_slots_in_range(host: HostPoolSnapshot) -> tuple[frozenset[int], bool]:
    """The host slots on the free or the release list, and whether all lie in 0..size-1
    (remembered by value for tuple lists: a pure function of them and the size)."""
    free_slots, release_slots = host.free_slots, host.release_slots
    if type(free_slots) is not tuple or type(release_slots) is not tuple:
        free = frozenset(chain(free_slots, release_slots))
        return free, free <= _host_slots(host.size)
    key = (host.size, free_slots, release_slots)
    found = _FREE_SETS.get(key)
    if found is None:
        free = frozenset(chain(free_slots, release_slots))
        found = (free, free <= _host_slots(host.size))
        if len(_FREE_SETS) >= 64:
            _FREE_SETS.clear()
        _FREE_SETS[key] = found
    return found


@lru_cache(maxsize=64)
def _host_slots(size: int) -> frozenset[int]:
    """Host slots ``0..size-1`` (built once per pool size)."""
    return frozenset(range(size))


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
    if w_host or l_dev:  # (no transfer in flight: nothing written or loaded)
        fail(
            "INV-HOST-PINNED",
            "nodes written or loaded while neither locked nor pinned",
            [
                n.node_id
                for n in nodes
                if n.lock_ref <= 0
                and n.host_ref_counter <= 0
                and (not w_host.isdisjoint(n.host_value or ()) or not l_dev.isdisjoint(n.value))
            ],
        )
    if w_host or l_host:
        tree_hosts = set(chain.from_iterable(n.host_value or () for n in nodes))
        fail(
            "INV-HOST-PINNED",
            "host slots of a transfer in flight held by no tree node",
            (w_host | l_host) - tree_hosts,
        )
    if not snap.prefetches:
        return
    by_id = derived.by_id(snap.tree)
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
        incomplete = host is None or len(host) != len(n.key) or not w_host.isdisjoint(host)
        if (
            incomplete
            or n.write_pending
            or n.lock_ref != 0
            or n.value
            or any(c in by_id and not by_id[c].evicted for c in n.child_ids)
        ):
            bad.append(n.node_id)
    if bad:
        fail("INV-HOST-BACKUP-DONE", "host-only nodes whose backup is not complete", bad)


@invariant(
    "INV-HOST-DEVICE-ACCOUNTING",
    "device accounting with backed-up nodes: allocated device pages are exactly the pages of "
    "the on-device nodes' values; evictable/protected sizes count on-device tokens only",
    scope="host",
)
def check_device_accounting(snap: HostTierSnapshot, previous: HostTierSnapshot | None) -> None:
    alloc, ps = snap.device, snap.device.page_size
    free = derived.free_pages(alloc)
    # one pass over the nodes gathers what the checks below report, in their order
    values: list[int] = []
    stray: list[int] = []  # host-only nodes holding device slots
    evictable = protected = 0  # on-device tokens
    for n in snap.tree.nodes[1:]:
        if n.evicted:
            if n.value:
                stray.append(n.node_id)
            continue
        values += n.value
        if n.lock_ref == 0:
            evictable += len(n.key)
        elif n.lock_ref > 0:
            protected += len(n.key)
    held = set(page_of(values, ps))
    if not held.isdisjoint(free):  # (decided in C; the intersection names the pages)
        fail("INV-HOST-DEVICE-ACCOUNTING", "device pages of nodes that are free", held & free)
    # the lifecycle's requests and sessions hold snap.device_held
    fail("INV-HOST-DEVICE-ACCOUNTING", "device pages neither free nor held (leaked)",
          all_pages(alloc.num_pages).difference(free, held, snap.device_held))  # fmt: skip
    if stray:
        fail("INV-HOST-DEVICE-ACCOUNTING", "host-only nodes holding device slots", stray)
    if (evictable, protected) != (snap.tree.evictable_size, snap.tree.protected_size):
        raise InvariantViolation(
            "INV-HOST-DEVICE-ACCOUNTING",
            f"sizes (evictable {snap.tree.evictable_size}, protected {snap.tree.protected_size})"
            f" != on-device sums ({evictable}, {protected})",
        )


@lru_cache(maxsize=4096)
def _tags_after(state: int, key: tuple[int, ...]) -> tuple[int, ...]:
    """:func:`~kvpool.tags.continue_tags` remembered: a node's tokens and its path's state
    rarely change between two snapshots."""
    return tuple(continue_tags(state, key))


_namespace_seed = lru_cache(maxsize=256)(namespace_seed)
""":func:`~kvpool.tags.namespace_seed` remembered (a loop per character of the namespace)."""


def _key_tokens(key: tuple[int, ...], bigram: bool) -> tuple[int, ...]:
    """The tokens whose slots a node key's elements stand for: the key itself, or each bigram
    code's first token (``code >> 31``: :func:`kvpool.reference.radix_key.bigram_codes`)."""
    return tuple(code >> 31 for code in key) if bigram else key


def _path_tags(snap: HostTierSnapshot) -> dict[int, tuple[int, ...]]:
    """Node id -> the tags its tokens must hold (from the whole root path, in its namespace):
    ``kv_tags(path tokens, n.extra_key)`` over the node's own tokens, continued from the hash
    state after its parent's path (:func:`kvpool.tags.continue_tags`), each ancestor's state
    computed once per namespace."""
    by_id = derived.by_id(snap.tree)
    get = by_id.get
    # (node id, namespace) -> hash state after the tokens of the path root -> that node
    states: dict[tuple[int, str | None], int] = {}
    out: dict[int, tuple[int, ...]] = {}
    for n in snap.tree.nodes[1:]:
        if n.parent_id is None:  # (a root-like node: its path contributes no token)
            out[n.node_id] = ()
            continue
        namespace = n.extra_key
        # the hash state after the keys of the parent's path (as the walk up finds it)
        node = get(n.parent_id)
        chain_up: list[NodeSnapshot] = []
        state: int | None = None
        while node is not None and node.parent_id is not None:
            state = states.get((node.node_id, namespace))
            if state is not None:
                break
            chain_up.append(node)
            node = get(node.parent_id)
        if state is None:
            state = _namespace_seed(namespace)
        for above in reversed(chain_up):
            tags = _tags_after(state, _key_tokens(above.key, snap.bigram_keys))
            state = tags[-1] - 1 if tags else state
            states[(above.node_id, namespace)] = state
        out[n.node_id] = _tags_after(state, _key_tokens(n.key, snap.bigram_keys))
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
    host_tag, device_tags = snap.host.tags.__getitem__, snap.device_tags
    device_tag = device_tags.__getitem__
    bad = []
    for n in _nodes(snap.tree):
        want = expected[n.node_id]
        hosts = n.host_value
        if hosts is not None and not n.write_pending and tuple(map(host_tag, hosts)) != want:
            bad.append(n.node_id)
        device_read = device_tags and not n.evicted and l_dev.isdisjoint(n.value)
        if device_read and tuple(map(device_tag, n.value)) != want:
            bad.append(n.node_id)
    if bad:
        fail("INV-HOST-KV-INTEGRITY", "nodes whose host or device copy holds other tokens' KV", bad)


def check_host_tier(snap: HostTierSnapshot, previous: HostTierSnapshot | None = None) -> int:
    """Every ``"host"`` invariant on ``snap``; returns the number of checks run."""
    return run_scope("host", snap, previous)


__all__ = ["check_host_tier", "host_holders"]
