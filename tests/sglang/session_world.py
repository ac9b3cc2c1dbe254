"""The directed session tests' scenario (:data:`PROMPT`, :data:`OUTPUT`, :data:`RESERVE`,
:data:`NEXT`, :func:`run_turn`) over SGLang 0.5.23's session worlds
(:mod:`kvpool.sglang.session_world`), and SGLang 0.5.16's ``StreamingSession`` around its
``MambaRadixCache`` (:class:`World16`, :func:`build16`, the request stand-in :class:`TurnReq16`),
for :mod:`tests.sglang.test_sglang_streaming_session`,
:mod:`tests.sglang.test_sglang_session_retract` and :mod:`tests.sglang.test_sglang_session_bonus`.
"""

from __future__ import annotations

import dataclasses
from typing import Any

from kvpool.config import PoolConfig
from kvpool.sglang.cache_req import token_array
from kvpool.sglang.implementation import implementation
from kvpool.sglang.loader import load_sglang
from kvpool.sglang.mamba_radix import SGLangMambaRadixCache as SGLangMambaRadixCache16
from kvpool.sglang.radix import to_sglang_key
from kvpool.sglang.session_world import (
    StreamingSessionStandIn,
    TurnReq,
    World,
    admit,
    real_finish_abort,
    schedule_batch_classes,
)

PROMPT = [11, 12, 13, 14, 15, 16, 17, 18]
"""Turn 1's prompt (8 tokens)."""
OUTPUT = [21, 22, 23, 24, 25, 26]
"""Turn 1's committed output: two verify steps of three accepted tokens each."""
RESERVE = 3
"""Slots the last verify step reserved past the committed tokens (the over-allocation)."""
NEXT = [31, 32, 33, 34]
"""Turn 2's new input, after turn 1's output through its stop."""


def run_turn(world: World, req: TurnReq, stop: int) -> int:
    """Admit ``req`` (match, lock, row and state slot, the session takes its record) and
    leave it as its last verify step does: the prompt and :data:`OUTPUT` committed, the
    reserve allocated, the state after every committed token, the stop token at output
    position ``stop`` (its ``finished_len``). Returns the state slot (-1 without one)."""
    assert admit(world, req, len(req.origin_input_ids)) == 0
    hybrid = req.kv.mamba_pool_idx is not None
    committed = len(req.origin_input_ids) + len(OUTPUT)
    world.extend_slots(req, committed + RESERVE)
    req.kv.kv_committed_len = committed
    req.kv.mamba_needs_clear = False  # the first forward cleared the fresh state slot
    req.output_ids = token_array(OUTPUT)
    req.finished_len = stop
    req.finished_reason = world.finish_reason(False)
    return int(req.kv.mamba_pool_idx) if hybrid else -1


class TurnReq16:
    """A request as SGLang 0.5.16's release and streaming session read it: the row, lengths
    and Mamba fields on the request itself, ``kv`` the release's ``ReqKvInfo``."""

    extra_key = None
    is_chunked = 0
    inflight_middle_chunks = 0

    def __init__(self, rid: str, tokens: list[int], session: StreamingSessionStandIn) -> None:
        self.rid = rid
        self.session = session
        self.origin_input_ids = token_array(tokens)
        self.output_ids = token_array([])
        self.req_pool_idx: int | None = None
        self.kv: Any = None
        self.kv_committed_len = 0
        self.cache_protected_len = 0
        self.last_node: Any = None
        self.prefix_indices: Any = None
        self.swa_uuid_for_lock: Any = None
        self.mamba_pool_idx: Any = None
        self.mamba_ping_pong_track_buffer: Any = None
        self.mamba_next_track_idx: Any = None
        self.mamba_last_track_seqlen: Any = None
        self.mamba_branching_seqlen: Any = None
        self.mamba_cow_src_index: Any = None
        self.mamba_needs_clear = False
        self.to_finish: Any = None
        self.finished_reason: Any = None
        self.finished_len: int | None = None

    def effective_kv_committed_len(self) -> int:
        """0.5.16's release keeps every committed token (no thinking strip here)."""
        return self.kv_committed_len

    def finished(self) -> bool:
        return self.finished_reason is not None


@dataclasses.dataclass
class World16:
    """SGLang 0.5.16's ``StreamingSession`` wrapped around its ``MambaRadixCache``, over its
    ``HybridReqToTokenPool`` and token allocator (:func:`build16`)."""

    modules: Any
    pool: Any
    allocator: Any
    cache: Any
    """SGLang's ``StreamingSession`` (the tree it wraps is ``cache.inner``)."""
    classes: dict[str, type]
    radix_key: Any

    def match(self, req: TurnReq16, tokens: list[int]) -> Any:
        """The scheduler's prefix match of ``req`` over ``tokens`` (its fill ids), the key
        capped at ``len(tokens) - 1``."""
        params = self.modules.attr("sglang.srt.mem_cache.base_prefix_cache", "MatchPrefixParams")
        key = to_sglang_key(self.modules, self.radix_key(tokens[:-1], None))
        return self.cache.match_prefix(params(key=key, req=req))

    def start(self, req: TurnReq16, committed: int, allocated: int) -> int:
        """Admit a session's first turn (match, lock, row and state slot) and leave it as its
        steps do: ``allocated`` slots written to its row, ``committed`` of them computed.
        Returns its state slot."""
        first = self.match(req, list(req.origin_input_ids))
        assert len(first.device_indices) == 0
        req.last_node = first.last_device_node
        self.cache.inc_lock_ref(req.last_node)
        assert self.pool.impl.alloc([req]) is not None and req.req_pool_idx is not None
        slots = self.allocator.impl.alloc(allocated)
        self.pool.impl.req_to_token[req.req_pool_idx, :allocated] = slots
        req.kv = self.classes["ReqKvInfo"](kv_allocated_len=allocated, swa_evicted_seqlen=0)
        req.kv_committed_len = committed
        return int(req.mamba_pool_idx)

    def release(self, req: TurnReq16, is_insert: bool = True) -> None:
        """0.5.16's ``common.release_kv_cache`` (``is_insert=False``: a retraction)."""
        with real_finish_abort(self.modules, self.classes):
            common = self.modules.module("sglang.srt.mem_cache.common")
            common.release_kv_cache(req, self.cache, is_insert=is_insert)


def build16() -> World16:
    """:class:`World16` with 64 slots, 4 rows of 32 columns and 4 Mamba states."""
    impl = implementation("0.5.16")
    assert impl.hybrid_req_to_token_pool and impl.allocator and impl.radix_key
    config = PoolConfig(size=64, req_pool_size=4, max_context_len=32, mamba_slots=4,
                        rules=impl.rules_or_default())  # fmt: skip
    pool, allocator = impl.hybrid_req_to_token_pool(config), impl.allocator(config)
    modules = load_sglang("0.5.16")
    tree = SGLangMambaRadixCache16(modules, pool, allocator, 1)
    cache = modules.attr("sglang.srt.session.streaming_session", "StreamingSession")(tree.impl)
    return World16(modules, pool, allocator, cache, schedule_batch_classes(modules),
                   impl.radix_key)  # fmt: skip
