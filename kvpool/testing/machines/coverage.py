"""Coverage tags: which operation kinds and outcomes a campaign reached.

Every step earns tags (``alloc:refused``, ``merge:on-refusal``, ``extend:part2>=1024``,
``free:shared-page``, ...). A campaign sums them; its summary and JSON report list each tag of
the target's catalogue (:data:`CATALOGUE`) with its count, so a user sees what was never
reached. Tags outside the catalogue are reported too.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from kvpool.constants import ceil_div
from kvpool.testing.swarm import Op

ALLOCATING = ("alloc", "alloc_extend", "alloc_decode")

CATALOGUE: dict[str, tuple[str, ...]] = {
    "allocator": (
        "alloc:ok", "alloc:refused", "alloc:zero", "alloc_extend:ok", "alloc_extend:refused",
        "alloc_decode:ok", "alloc_decode:refused", "alloc_decode:new-page", "merge:by-alloc",
        "merge:on-refusal", "merge:direct", "extend:ends-in-prefix-page", "extend:part1",
        "extend:part2<64", "extend:part2<1024", "extend:part2>=1024", "extend:part2>=2048",
        "extend:part3", "free:in-group", "free:shared-page", "free:in-backup-window",
        "restore_state:ok", "clear:ok", "invalid:refused",
    ),
    "req_to_token_pool": (
        "alloc:ok", "alloc:refused", "alloc:reuse", "free:ok", "write:ok", "read:ok", "clear:ok",
        "invalid:refused",
    ),
    "radix_cache": (
        "match_prefix:hit", "match_prefix:miss", "match_prefix:split", "insert:new",
        "insert:duplicate", "insert:extra-key", "evict:freed", "evict:nothing",
        "inc_lock_ref:ok", "dec_lock_ref:ok", "reset:ok", "invalid:refused",
    ),
    "unified_radix_cache": (
        "match_prefix:hit", "match_prefix:miss", "match_prefix:split", "insert:new",
        "insert:duplicate", "insert:extra-key", "evict:freed", "evict:nothing",
        "inc_lock_ref:ok", "dec_lock_ref:ok", "reset:ok", "invalid:refused",
    ),
    "swa_allocator": (
        "alloc:ok", "alloc:refused", "alloc_extend:ok", "alloc_extend:refused", "alloc_decode:ok",
        "alloc_decode:refused", "alloc_extend_swa_tail:ok", "refused:full-short",
        "refused:swa-short", "free:ok", "free:in-group", "free:unmapped-slots", "free_swa:slide",
        "free_swa:in-group", "translate_loc_from_full_to_swa:ok", "restore_state:ok", "clear:ok",
        "invalid:refused",
    ),
    "swa_radix_cache": (
        "insert:new", "insert:duplicate", "insert:window-slid", "insert:recovered",
        "insert:recovered-locked", "insert_new:refused", "lock:hit", "lock:miss",
        "lock:window-bounded", "release:leaf-tombstoned", "unlock:ok", "evict:freed",
        "evict:tombstoned", "evict:nothing", "invalid:refused",
    ),
    "swa_manager": (
        "extend:ok", "extend:oom", "extend:chunked", "decode:ok", "decode:oom",
        "decode:window-slid", "spec_step:ok", "spec_draft_v1:ok", "finish:ok", "abort:ok",
        "retract:ok", "invalid:refused", "extend:evicted", "radix:tombstoned",
        "session:restore", "session:window-carried", "finish:stop-inside", "session:stop-inside",
    ),
    "manager": (
        "extend:ok", "extend:oom", "extend:chunked", "extend:evicted", "decode:ok", "decode:oom",
        "decode:evicted", "spec_step:ok", "spec_step:evicted", "spec_draft_v1:ok", "finish:ok",
        "abort:ok", "retract:ok",
        "session:restore", "close_session:ok", "evict:ok", "merge:by-alloc", "invalid:refused",
        "session:hybrid-restore", "mamba-radix:cow", "mamba-radix:abort-cow",
        "mamba-radix:donated", "mamba-radix:chunk-copy", "mamba-radix:evicted",
        "mamba-radix:refused", "mamba-radix:extend-cow", "layer_load:ok", "layer_load:LockError",
        "layer_done:ok", "layer_read:ok", "layer_read:LayerNotLoadedError", "finish:stop-inside",
        "session:stop-inside",
    ),
    "hicache_manager": (
        "extend:ok", "extend:oom", "extend:chunked", "decode:ok", "finish:ok", "abort:ok",
        "retract:ok", "match_prefix:ok", "hicache_ack_writes:acked", "hicache_ack_loads:acked",
        "host:write-issued", "host:to-host-only", "host:load-back", "host:abort-in-flight",
        "invalid:refused",
    ),
    "mamba_manager": (
        "extend:ok", "extend:oom", "extend:chunked", "decode:ok", "finish:ok", "abort:ok",
        "retract:ok", "session:hybrid-restore", "mamba-radix:cow", "mamba-radix:abort-cow",
        "mamba-radix:donated", "mamba-radix:chunk-copy", "mamba-radix:evicted",
        "mamba-radix:refused", "mamba-radix:extend-cow", "invalid:refused",
    ),
    "hybrid_req_to_token_pool": (
        "admit:ok", "admit:refused", "admit:evicted", "admit:chunk-keeps-slot", "admit:after-cow",
        "stage_cow:ok", "stage_cow:refused", "prepare_forward:copied", "prepare_forward:cleared",
        "forward_state:ok", "cache_state:ok", "cache_state:refused", "release:free",
        "release:keep-track", "release:donate", "release:in-prefill", "release:with-track",
        "abort_waiting:freed", "abort_waiting:nothing", "evict:ok", "alloc_group_begin:ok",
        "alloc_group_end:ok", "clear:ok", "invalid:refused",
    ),
    "mamba_radix_cache": (
        "insert:ok", "insert:new-node", "insert:state-exists", "insert:revived-tombstone",
        "insert:refused", "match:hit", "match:miss", "match:split", "match:cow",
        "match:cow-evicted", "copy:copied", "forward:ok", "release:ok", "evict:leaf",
        "evict:tombstone", "invalid:refused",
    ),
    "unified_mamba_radix_cache": (
        "insert:ok", "insert:new-node", "insert:state-exists", "insert:revived-tombstone",
        "insert:refused", "insert:tombstone-leaf", "match:hit", "match:miss", "match:split",
        "match:cow", "match:cow-evicted", "copy:copied", "forward:ok", "release:ok",
        "evict:leaf", "evict:tombstone", "evict:tombstone-leaf", "evict:locked-tombstone",
        "lock_node:ok", "lock_node:tombstone", "unlock_node:ok", "unlock_node:tombstone",
        "insert:revived-locked", "insert:revived-kv-locked", "evict:kv-locked-leaf",
        "invalid:refused",
    ),
    "unified_swa_radix_cache": (
        "insert:new", "insert:duplicate", "insert:window-slid", "insert:recovered",
        "insert:recovered-locked", "insert:tombstone-leaf", "insert_new:refused", "lock:hit",
        "lock:miss", "lock:window-bounded", "release:ok", "unlock:ok", "evict:freed",
        "evict:tombstoned", "evict:tombstone-leaf", "evict:nothing", "invalid:refused",
    ),
    "hiradix_cache": (
        "insert:ok", "insert:write-issued", "match_prefix:hit", "match_prefix:host-hit",
        "match_prefix:miss", "load_back:loaded", "load_back:skipped", "writing_check:acked",
        "loading_check:acked", "evict:to-host", "evict:freed", "evict_host:freed",
        "inc_lock_ref:ok", "dec_lock_ref:ok", "prefetch:ok", "storage_hit:ok", "prefetch_io:ok",
        "prefetch:inserted", "release_aborted_request:ok", "drain_storage_control_queues:ok",
        "reset:ok", "invalid:refused",
    ),
    "kv_pool": (
        "set_kv:ok", "set_kv:KVStorageError", "write_tags:ok", "move:ok", "read_tags:ok",
        "load_start:ok", "load_start:LockError", "load_layer:ok", "read_layer:ok",
        "read_layer:LayerNotLoadedError", "load_reset:ok", "storage:mha-plain", "storage:mha-fp4",
        "storage:mha-mxfp8", "storage:mha-page_major", "storage:mha-noop", "storage:mla-plain",
        "storage:mla-fp4",
    ),
}  # fmt: skip
"""Tags each machine is expected to reach."""


def outcome_tag(op: Op, result: Any, error: BaseException | None) -> str:
    """``name:ok`` / ``name:refused`` (a None allocation) / ``invalid:refused`` /
    ``name:ErrorClass``."""
    if op.expect_error:
        return "invalid:refused" if error is not None else "invalid:accepted"
    if error is not None:
        return f"{op.name}:{type(error).__name__}"
    if op.name in ALLOCATING and result is None:
        return f"{op.name}:refused"
    return f"{op.name}:ok"


def _width(tokens: int) -> str | None:
    if tokens <= 0:
        return None
    if tokens >= 2048:
        return "extend:part2>=2048"
    if tokens >= 1024:
        return "extend:part2>=1024"
    return "extend:part2<64" if tokens < 64 else "extend:part2<1024"


def extend_parts(prefix: Sequence[int], seq: Sequence[int], ps: int) -> list[str]:
    """Which of ``alloc_extend``'s three parts each request of a batch reaches."""
    tags: list[str] = []
    for p, s in zip(prefix, seq, strict=True):
        n1 = min(s, ceil_div(p, ps) * ps) - p
        if n1:
            tags.append("extend:part1")
        if p % ps and p + n1 == s:
            tags.append("extend:ends-in-prefix-page")
            continue
        n2 = (s // ps) * ps - ceil_div(p, ps) * ps
        width = _width(n2)
        if width:
            tags.append(width)
        if s % ps and s > ceil_div(p, ps) * ps:
            tags.append("extend:part3")
    return tags


def extend_tags(op: Op, out: Any, window: bool = False) -> list[str]:
    """Tags of one allocator step (``out`` is an :class:`~.base.Outcome` of side A;
    ``window``: a backup was taken and not yet restored)."""
    tags = [outcome_tag(op, out.result, out.error)]
    if op.name == "alloc" and op.args and op.args[0] == 0 and out.error is None:
        tags.append("alloc:zero")
    before, after = out.before, out.after
    merged = before.release_pages and not after.release_pages
    if merged and op.name in ALLOCATING:
        tags.append("merge:on-refusal" if out.result is None else "merge:by-alloc")
    if merged and op.name == "merge_and_sort_free":
        tags.append("merge:direct")
    ps = before.page_size
    if op.name == "alloc_extend" and out.error is None:
        tags += extend_parts(op.args[0], op.args[2], ps)
    decoded = op.name == "alloc_decode" and out.result is not None
    if decoded and any((s - 1) % ps == 0 for s in op.args[0]):
        tags.append("alloc_decode:new-page")
    if op.name == "free" and out.error is None:
        if before.in_free_group:
            tags.append("free:in-group")
            pending = {s // ps for s in before.pending_free}
            if pending & {s // ps for s in op.args[0]}:
                tags.append("free:shared-page")
        if window:
            tags.append("free:in-backup-window")
    return tags


__all__ = ["CATALOGUE", "extend_parts", "extend_tags", "outcome_tag"]
