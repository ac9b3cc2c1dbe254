"""SGLang's own streaming session as its scheduler drives it, for the opt-in session tests
(:mod:`tests.sglang.test_sglang_streaming_session`, :mod:`tests.sglang.test_sglang_session_retract`
and :mod:`tests.sglang.test_sglang_session_bonus`): SGLang 0.5.23's unified cache (FULL, FULL
and MAMBA, or FULL and SWA components, either tree core), its ``HybridReqToTokenPool`` or
``ReqToTokenPool``, its token or SWA allocator and its glue modules (:class:`World`,
:func:`build`, :func:`build_swa`); 0.5.16's ``StreamingSession`` around its
``MambaRadixCache`` (:class:`World16`, :func:`build16`); the request stand-ins
:class:`TurnReq` (0.5.23) and :class:`TurnReq16` (0.5.16) and the session stand-in
:class:`StreamingSessionStandIn`.

The calls are SGLang's:

- admission (:func:`admit`): the cache's ``match_prefix`` (the session's ``try_match_prefix``
  first), ``lock``, the pool's ``alloc`` (a row and a Mamba state slot),
  ``maybe_hand_to_session`` (``take``);
- the finish (:meth:`World.finish`): the scheduler's ``_mamba_can_cache_finished_req``
  (compiled alone from ``batch_result_processor.py``, :mod:`kvpool.sglang.req_methods`), then
  ``common.release_kv_cache`` (``claim_kv_row``, the session's ``try_cache_finished_req`` and
  ``_trim_overshoot``; without a session the tree's path);
- the retraction (:meth:`World.retract`): ``release_kv_cache(checkpoint=False)`` and the fields
  ``reset_for_retract`` clears;
- the next turn: ``match_prefix`` again (the session lends its record) and the pool's
  ``alloc``.

What the model forward would do between those calls (write KV into the row, update the live
Mamba state through every token it computes, clear a fresh slot) is set on the record by hand,
as the scheduler leaves it. :class:`TurnReq` carries SGLang's own ``ReqKvInfo`` record
(compiled from the release's ``schedule_batch.py``), SGLang's own ``owned_kv_len`` /
``output_ids_through_stop``, and the fields the called code reads. Its session is
:class:`StreamingSessionStandIn`, the two entries of ``Session`` the cache calls.
"""

from __future__ import annotations
import __future__

import ast
import contextlib
import dataclasses
import functools
from array import array
from collections.abc import Iterator
from typing import Any, Optional

import torch

from kvpool.config import PoolConfig
from kvpool.sglang import implementation, load_sglang
from kvpool.sglang.cache_req import token_array
from kvpool.sglang.glue_swa import SGLangSWAGlueTree
from kvpool.sglang.mamba_radix import SGLangMambaRadixCache as SGLangMambaRadixCache16
from kvpool.sglang.radix import to_sglang_key
from kvpool.sglang.req_methods import StopMethods, stop_methods
from kvpool.sglang.req_to_token import SGLangReqToTokenPool
from kvpool.sglang.swa import SGLangSWAAllocator
from kvpool.sglang.unified_mamba_radix import SGLangUnifiedMambaRadixCache
from kvpool.sglang.unified_radix import SGLangUnifiedRadixCache

VERSION = "0.5.23"
CORES = ("rust", "python")
PROMPT = [11, 12, 13, 14, 15, 16, 17, 18]
"""Turn 1's prompt (8 tokens)."""
OUTPUT = [21, 22, 23, 24, 25, 26]
"""Turn 1's committed output: two verify steps of three accepted tokens each."""
RESERVE = 3
"""Slots the last verify step reserved past the committed tokens (the over-allocation)."""
NEXT = [31, 32, 33, 34]
"""Turn 2's new input, after turn 1's output through its stop."""
SCHEDULE_BATCH = "sglang/srt/managers/schedule_batch.py"


SCHEDULE_BATCH_CLASSES = ("ReqKvInfo", "BaseFinishReason", "FINISH_MATCHED_TOKEN", "FINISH_ABORT")
"""The classes of the release's ``schedule_batch.py`` :func:`schedule_batch_classes` compiles."""


def schedule_batch_classes(modules: Any) -> dict[str, type]:
    """SGLang's ``ReqKvInfo`` record and finish reasons (:data:`SCHEDULE_BATCH_CLASSES`),
    compiled alone from the release's ``schedule_batch.py`` (kvpool's loader stubs that module:
    it imports the whole runtime) in a namespace holding what they read."""
    text = modules.source.read(SCHEDULE_BATCH)
    body: list[ast.stmt] = [n for n in ast.parse(text).body if isinstance(n, ast.ClassDef)
                            and n.name in SCHEDULE_BATCH_CLASSES]  # fmt: skip
    assert len(body) == len(SCHEDULE_BATCH_CLASSES), "the release defines each class once"
    namespace: dict[str, Any] = {
        "dataclasses": dataclasses,
        "Optional": Optional,
        "torch": torch,
        "ComponentType": _component_type(modules),
        "ceil_align": modules.attr("sglang.srt.utils", "ceil_align"),
        "__name__": __name__,  # dataclasses resolves string annotations in a loaded module
    }
    # the module's own `from __future__ import annotations`: its annotations stay strings
    lazy = __future__.annotations.compiler_flag
    where = modules.source.filename(SCHEDULE_BATCH)
    code = compile(ast.Module(body=body, type_ignores=[]), where, "exec", flags=lazy,
                   dont_inherit=True)  # fmt: skip
    exec(code, namespace)
    return {name: namespace[name] for name in SCHEDULE_BATCH_CLASSES}


@contextlib.contextmanager
def real_finish_abort(modules: Any, classes: dict[str, type]) -> Iterator[None]:
    """While inside, the stubbed ``schedule_batch`` module answers ``FINISH_ABORT`` with the
    compiled class: the session imports it at each call to tell an abort (a stub's class has no
    instances)."""
    stub = modules.module("sglang.srt.managers.schedule_batch").__dict__
    saved = stub.get("FINISH_ABORT")
    stub["FINISH_ABORT"] = classes["FINISH_ABORT"]
    try:
        yield
    finally:
        if saved is None:
            del stub["FINISH_ABORT"]
        else:
            stub["FINISH_ABORT"] = saved


def _component_type(modules: Any) -> Any:
    """0.5.23's ``ComponentType`` (None for a release without the unified cache's components:
    only annotations of 0.5.16's record name it)."""
    try:
        return modules.attr("sglang.srt.mem_cache.unified_cache.component_type", "ComponentType")
    except Exception:  # the release has no such module
        return None


class StreamingSessionStandIn:
    """The entries of SGLang's ``Session`` (``session_controller.py``) that the cache's
    streaming session calls, for a streaming session."""

    streaming = True

    def __init__(self, session_id: str) -> None:
        self.session_id = session_id
        self.finished: list[str] = []
        self.aborted = 0

    def finish_req(self, req: Any) -> None:
        self.finished.append(req.rid)

    def abort_req(self) -> None:
        self.aborted += 1


class TurnReq:
    """A scheduler request as the called code reads it (module docstring)."""

    extra_key = None
    cache_salt = None
    kv_rotation_base = None
    priority = 0

    def __init__(self, world: World, rid: str, tokens: list[int],
                 session: StreamingSessionStandIn | None) -> None:  # fmt: skip
        self._world = world
        self.rid = rid
        self.session = session
        self.origin_input_ids = token_array(tokens)
        self.output_ids = token_array([])
        self.kv = world.record()
        self.lock: Any = None
        self.last_node: Any = None
        self.to_finish: Any = None
        self.finished_reason: Any = None
        self.finished_len: int | None = None
        self.swa_branching_seqlen: Any = None
        self.skip_radix_cache_insert = False

    def finished(self) -> bool:
        return self.finished_reason is not None

    def detach_kv(self) -> Any:
        # SGLang's Req.detach_kv: the record goes to its new holder, the request keeps a
        # fresh empty one
        kv, self.kv = self.kv, self._world.record()
        return kv

    def owned_kv_len(self) -> int:
        return self._world.stops.owned_kv_len(self)

    @property
    def output_ids_through_stop(self) -> Any:
        return self._world.stops.output_ids_through_stop(self)

    @property
    def session_id(self) -> str | None:
        return None if self.session is None else self.session.session_id

    @property
    def full_untruncated_fill_ids(self) -> array[int]:
        """The request's tokens (its prompt and its output) as SGLang's ``RadixKey`` holds
        them."""
        return self.origin_input_ids + self.output_ids

    def get_fill_ids(self) -> array[int]:
        return self.full_untruncated_fill_ids

    def release_mm_inputs_on_abort(self) -> None:
        """No multimodal inputs to release."""

    def refresh_fill_ids(self) -> None:
        """The fill ids are the request's tokens (no lagging array here)."""


@dataclasses.dataclass
class World:
    """SGLang's cache, pools and glue modules for one test."""

    modules: Any
    tree: Any
    """kvpool's adapter of SGLang's ``UnifiedRadixCache`` (``impl`` is SGLang's object)."""
    pool: Any
    allocator: Any
    classes: dict[str, type]
    """:func:`schedule_batch_classes`."""
    stops: StopMethods
    key: Any

    def extend_slots(self, req: TurnReq, end: int) -> None:
        """Allocate and write the row's columns ``[kv_allocated_len, end)`` as the scheduler's
        ``alloc_for_extend`` does: ``alloc`` at page size 1, else the paged ``alloc_extend``
        after the row's last slot."""
        start = req.kv.kv_allocated_len
        row = req.kv.req_pool_idx
        if self.tree.page_size == 1:
            slots = self.allocator.impl.alloc(end - start)
        else:
            last = int(self.pool.impl.req_to_token[row, start - 1]) if start else -1
            slots = self.allocator.alloc_extend([start], [start], [end], [end], [last], end - start)
        assert slots is not None, "the generated turns fit the pool"
        self.pool.impl.req_to_token[row, start:end] = slots
        req.kv.kv_allocated_len = end

    def record(self) -> Any:
        """A fresh ``ReqKvInfo``."""
        return self.classes["ReqKvInfo"]()

    def finish_reason(self, aborted: bool) -> Any:
        """``FINISH_ABORT()`` or a matched stop token's reason."""
        if aborted:
            return self.classes["FINISH_ABORT"]()
        return self.classes["FINISH_MATCHED_TOKEN"](0)

    @property
    def cache(self) -> Any:
        return self.tree.impl

    def match(self, req: TurnReq, tokens: int | None = None) -> Any:
        """The scheduler's prefix match of ``req`` over its first ``tokens`` fill ids (default:
        its prompt), the key capped at ``tokens - 1``."""
        params = self.modules.attr("sglang.srt.mem_cache.base_prefix_cache",
                                   "MatchPrefixParams")  # fmt: skip
        count = len(req.origin_input_ids) if tokens is None else tokens
        key = list(req.full_untruncated_fill_ids[: count - 1])
        return self.cache.match_prefix(
            params(key=to_sglang_key(self.modules, self.key(key, None)), req=req)
        )

    def retract(self, req: TurnReq) -> None:
        """The scheduler's retraction (``release_req``): ``release_kv_cache(checkpoint=False)``,
        then the fields ``reset_for_retract`` clears that the called code reads again."""
        with real_finish_abort(self.modules, self.classes):
            self.modules.module("sglang.srt.mem_cache.common").release_kv_cache(
                req, self.cache, checkpoint=False
            )
        req.lock = None
        req.last_node = None
        req.kv.cache_protected_len = 0
        req.kv.cache_inserted_len = 0
        req.kv.kv_committed_len = 0
        req.swa_branching_seqlen = None

    def run_turn(self, req: TurnReq, stop: int) -> int:
        """Admit ``req`` (match, lock, row and state slot, the session takes its record) and
        leave it as its last verify step does: the prompt and :data:`OUTPUT` committed, the
        reserve allocated, the state after every committed token, the stop token at output
        position ``stop`` (its ``finished_len``). Returns the state slot (-1 without one)."""
        assert admit(self, req, len(req.origin_input_ids)) == 0
        hybrid = req.kv.mamba_pool_idx is not None
        committed = len(req.origin_input_ids) + len(OUTPUT)
        self.extend_slots(req, committed + RESERVE)
        req.kv.kv_committed_len = committed
        req.kv.mamba_needs_clear = False  # the first forward cleared the fresh state slot
        req.output_ids = token_array(OUTPUT)
        req.finished_len = stop
        req.finished_reason = self.finish_reason(False)
        return int(req.kv.mamba_pool_idx) if hybrid else -1

    def finish(self, req: TurnReq) -> bool:
        """The scheduler's finish: ``_mamba_can_cache_finished_req`` (False marks the request
        ``skip_radix_cache_insert``), then ``release_kv_cache(checkpoint=True)``. Returns what
        the scheduler's check said."""
        can_cache = self.stops.mamba_can_cache_finished_req(req, self.cache)
        if not can_cache:
            req.skip_radix_cache_insert = True
        with real_finish_abort(self.modules, self.classes):
            self.modules.module("sglang.srt.mem_cache.common").release_kv_cache(
                req, self.cache, checkpoint=True
            )
        return can_cache


@functools.cache
def _release(core: str) -> tuple[Any, Any, StopMethods, dict[str, type]]:
    """The release's implementation for ``core``, its modules, stop methods and compiled
    classes: loaded once per process (every world of a test builds fresh pools and trees)."""
    impl = implementation(VERSION, tree_core=core)
    modules = load_sglang(VERSION)
    stops = stop_methods(modules)
    assert stops is not None
    return impl, modules, stops, schedule_batch_classes(modules)


def build(core: str, hybrid: bool = True, page_size: int = 1) -> World:
    """SGLang's cache over its pools: FULL and MAMBA components over its
    ``HybridReqToTokenPool`` (``hybrid``; page size 1), else FULL alone over its
    ``ReqToTokenPool`` (its paged allocator above page size 1)."""
    impl, modules, stops, classes = _release(core)
    assert impl.hybrid_req_to_token_pool and impl.req_to_token_pool and impl.allocator
    assert impl.radix_key and (page_size == 1 or not hybrid)
    config = PoolConfig(size=64, page_size=page_size, req_pool_size=4, max_context_len=32,
                        mamba_slots=4 if hybrid else None,
                        rules=impl.rules_or_default())  # fmt: skip
    pool = (impl.hybrid_req_to_token_pool if hybrid else impl.req_to_token_pool)(config)
    allocator = impl.allocator(config)
    tree: Any = (
        SGLangUnifiedMambaRadixCache(modules, pool, allocator, 1, tree_core=core)
        if hybrid
        else SGLangUnifiedRadixCache(modules, pool, allocator, page_size, tree_core=core)
    )
    return World(modules, tree, pool, allocator, classes, stops, impl.radix_key)


WINDOW = 4
"""The sliding window (tokens) of :func:`build_swa`'s worlds."""


def build_swa(core: str, page_size: int = 1) -> World:
    """SGLang's cache with the FULL and SWA components (a window of :data:`WINDOW` tokens) over
    its ``ReqToTokenPool`` and ``SWATokenToKVPoolAllocator`` (64 full and 64 SWA slots), as
    0.5.23's registry builds it for a hybrid sliding-window model."""
    impl, modules, stops, classes = _release(core)
    assert impl.radix_key
    allocator = SGLangSWAAllocator(modules, 64, 64, page_size)
    pool = SGLangReqToTokenPool(modules, 4, 32)
    tree = SGLangSWAGlueTree(modules, pool, allocator, page_size, WINDOW, False, "lru", core)
    return World(modules, tree, pool, allocator, classes, stops, impl.radix_key)


def admit(world: World, req: TurnReq, tokens: int) -> int:
    """The scheduler's admission of ``req`` over its first ``tokens`` tokens (its fill ids):
    the prefix match (a session lends its record), the lock of a turn that borrows none, the
    row and state slot, the session taking a first turn's record. Returns the prefix length."""
    match = world.match(req, tokens)
    if req.lock is None and world.cache.session.borrowed_slot(req) is None:
        req.lock = world.cache.lock(match.last_device_node)
    assert world.pool.impl.alloc([req]) is not None
    world.cache.maybe_hand_to_session(req)
    prefix = int(match.device_prefix_len)
    assert req.kv.kv_allocated_len == prefix  # a lent record holds the session's tokens
    return prefix


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
