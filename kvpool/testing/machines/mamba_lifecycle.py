"""Coverage tags of the lifecycle's Mamba radix cache (hybrid managers with the radix cache on).

Each tag names an event of a lifecycle step read off the snapshots before and after it:

- ``mamba-radix:cow``: a prefix match gave a waiting request a slot of its own (copy-on-write).
- ``mamba-radix:abort-cow``: an aborted waiting request returned its copy-on-write slot.
- ``mamba-radix:donated``: a finish put a request's state slot into the tree as a checkpoint.
- ``mamba-radix:chunk-copy``: a prefill chunk cached a copy of the request's state.
- ``mamba-radix:evicted``: a step evicted cached states (admission, copy-on-write, KV eviction).
- ``mamba-radix:refused``: an extend was refused (OutOfMemoryError) by a Mamba manager.
- ``mamba-radix:extend-cow``: an extend admitted a waiting request from a cached prefix (its
  state copied into its own slot).
"""

from __future__ import annotations

from kvpool.errors import OutOfMemoryError
from kvpool.snapshot import PoolSnapshot


def _checkpoints(snap: PoolSnapshot) -> set[int]:
    tree = snap.mamba.tree if snap.mamba is not None else None
    return set() if tree is None else {n.mamba_value for n in tree.nodes if n.mamba_value}


def mamba_radix_tags(
    name: str, error: BaseException | None, before: PoolSnapshot, after: PoolSnapshot
) -> list[str]:
    """Tags of one step named ``name`` (see the module docstring); none for other managers."""
    if before.mamba is None or after.mamba is None or after.mamba.tree is None:
        return []
    if isinstance(error, OutOfMemoryError):
        return ["mamba-radix:refused"] if name == "extend" else []
    if error is not None:
        return []
    tags: list[str] = []
    held_before = {r.rid: r for r in before.mamba.reqs}
    if name == "match_prefix" and any(
        r.row is None and r.slot is not None and held_before.get(r.rid) is None
        for r in after.mamba.reqs
    ):
        tags.append("mamba-radix:cow")
    still = {r.rid for r in after.mamba.reqs}
    if name == "abort" and any(
        r.row is None and r.slot is not None and r.rid not in still for r in before.mamba.reqs
    ):
        tags.append("mamba-radix:abort-cow")
    old, new = _checkpoints(before), _checkpoints(after)
    req_slots = {r.slot for r in before.mamba.reqs if r.slot is not None}
    if name == "finish" and (new - old) & req_slots:
        tags.append("mamba-radix:donated")
    if name == "extend" and new - old:
        tags.append("mamba-radix:chunk-copy")
    waiting = {r.rid for r in before.reqs if r.state == "waiting"}
    if name == "extend" and any(
        r.rid in waiting and r.state == "running" and not r.is_chunked and r.cache_protected_len
        for r in after.reqs
    ):
        tags.append("mamba-radix:extend-cow")
    if old - new - req_slots and name != "finish":
        tags.append("mamba-radix:evicted")
    return tags


__all__ = ["mamba_radix_tags"]
