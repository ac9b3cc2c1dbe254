"""SGLang's own streaming session as its scheduler drives it: SGLang 0.5.23's unified cache
(FULL, FULL and MAMBA, or FULL and SWA components, either tree core), its
``HybridReqToTokenPool`` or ``ReqToTokenPool``, its token or SWA allocator and its glue modules
(:class:`World`, :func:`build`, :func:`build_swa`), the request stand-in :class:`TurnReq` and
the session stand-in :class:`StreamingSessionStandIn`. :mod:`kvpool.sglang.session_plans` runs
generated sessions over these worlds; ``kvpool sessions`` and the opt-in session tests use them.

The calls are SGLang's:

- admission (:func:`admit`): the cache's ``match_prefix`` (the session's ``try_match_prefix``
  first), ``lock``, the scheduler's ``alloc_req_slots`` (``ensure_mamba_capacity``: the tree
  evicts states when too few are free; then the pool's ``alloc`` of a row and a Mamba state
  slot), ``maybe_hand_to_session`` (``take``);
- the checkpoint after a prefill that did not finish the request (:meth:`World.checkpoint`):
  ``common.checkpoint_kv_cache``, whose ``try_checkpoint`` has a session's first turn publish
  its prompt into the tree (``checkpoint_into_tree``, the session's lock moving onto the
  prompt's node; on a hybrid model a copy of the state goes with it);
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
from kvpool.errors import ConfigError, InvariantViolation
from kvpool.sglang.cache_req import token_array
from kvpool.sglang.debug_pool import debug_asserts
from kvpool.sglang.glue_swa import SGLangSWAGlueTree
from kvpool.sglang.implementation import implementation
from kvpool.sglang.loader import load_sglang
from kvpool.sglang.radix import to_sglang_key
from kvpool.sglang.req_methods import StopMethods, stop_methods
from kvpool.sglang.req_to_token import SGLangReqToTokenPool
from kvpool.sglang.swa import SGLangSWAAllocator
from kvpool.sglang.tree_core import has_unified_cache
from kvpool.sglang.unified_mamba_radix import SGLangUnifiedMambaRadixCache
from kvpool.sglang.unified_radix import SGLangUnifiedRadixCache

VERSION = "0.5.23"
"""The release whose streaming session these worlds drive by default (the first with the
unified cache's session)."""
CORES = ("rust", "python")
"""0.5.23's unified-cache tree cores: its compiled TreeCore (the default) and its Python one."""
SCHEDULE_BATCH = "sglang/srt/managers/schedule_batch.py"
MODEL = "session-model"
"""The detector of a step where SGLang did not do what the driver's model of its scheduler
expects (a lent record longer than the match, no free row or slot for a turn that fits)."""


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
        self.extend_end = 0
        """Where the last extend ended (tokens): what a checkpoint publishes up to."""
        self.prefix_len = 0

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
        ``alloc_for_extend`` does: the tree evicts what the allocation lacks
        (``common.evict_from_tree_cache``, a page's worth more at page size above 1), then
        ``alloc`` at page size 1, else the paged ``alloc_extend`` after the row's last slot."""
        start = req.kv.kv_allocated_len
        row = req.kv.req_pool_idx
        need = end - start + (self.tree.page_size if self.tree.page_size > 1 else 0)
        self.modules.module("sglang.srt.mem_cache.common").evict_from_tree_cache(self.cache, need)
        if self.tree.page_size == 1:
            slots = self.allocator.impl.alloc(end - start)
        else:
            last = int(self.pool.impl.req_to_token[row, start - 1]) if start else -1
            slots = self.allocator.alloc_extend([start], [start], [end], [end], [last], end - start)
        require(slots is not None, MODEL, f"{req.rid}: no {end - start} free KV slots")
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

    def checkpoint(self, req: TurnReq, up_to: int) -> None:
        """The scheduler's checkpoint after a prefill that did not finish the request
        (``common.checkpoint_kv_cache`` up to ``up_to`` tokens): a session's first turn
        publishes its prompt into the tree (``try_checkpoint``), later turns publish nothing."""
        req.extend_end = up_to
        self.modules.module("sglang.srt.mem_cache.common").checkpoint_kv_cache(req, self.cache)

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
def _release(
    source: str, core: str, triton: bool = False
) -> tuple[Any, Any, StopMethods, dict[str, type]]:
    """SGLang ``source``'s implementation for ``core`` (its paged allocator on its Triton
    kernels when ``triton``, else on its torch path), its modules, stop methods and compiled
    classes: loaded once per process (every world builds fresh pools and trees). Raises
    :class:`~kvpool.errors.SGLangLoadError` when the source does not load and
    :class:`~kvpool.errors.ConfigError` when it has no unified cache's streaming session."""
    impl = implementation(source, tree_core=core, naive_extend=not triton)
    modules = load_sglang(source)
    stops = stop_methods(modules)
    if stops is None or not has_unified_cache(modules):
        raise ConfigError(
            f"SGLang {modules.version} has no unified cache's streaming session (0.5.23 has)"
        )
    return impl, modules, stops, schedule_batch_classes(modules)


def build(
    core: str,
    hybrid: bool = True,
    page_size: int = 1,
    source: str = VERSION,
    states: int = 4,
    eagle: bool = False,
    triton: bool = False,
) -> World:
    """SGLang ``source``'s cache over its pools (64 KV slots, 4 rows of 32 columns): FULL and
    MAMBA components over its ``HybridReqToTokenPool`` (``hybrid``; page size 1; ``states``
    Mamba states), else FULL alone over its ``ReqToTokenPool`` (its paged allocator above page
    size 1: on its Triton kernels, run by Triton's interpreter, when ``triton``, else on its
    torch path, ``use_triton_kernels = False``; built with its memory-pool debug asserts on,
    :mod:`kvpool.sglang.debug_pool`). ``core``: one of :data:`CORES`; ``eagle``: EAGLE's tree
    (bigram keys; FULL alone)."""
    impl, modules, stops, classes = _release(source, core, triton)
    assert impl.hybrid_req_to_token_pool and impl.req_to_token_pool and impl.allocator
    assert impl.radix_key and (page_size == 1 or not hybrid) and not (eagle and hybrid)
    config = PoolConfig(size=64, page_size=page_size, req_pool_size=4, max_context_len=32,
                        mamba_slots=states if hybrid else None,
                        rules=impl.rules_or_default())  # fmt: skip
    pool = (impl.hybrid_req_to_token_pool if hybrid else impl.req_to_token_pool)(config)
    with debug_asserts(modules):  # the scheduler's calls: SGLang's debug asserts on
        allocator = impl.allocator(config)
    tree: Any = (
        SGLangUnifiedMambaRadixCache(modules, pool, allocator, 1, tree_core=core)
        if hybrid
        else SGLangUnifiedRadixCache(
            modules, pool, allocator, page_size, tree_core=core, is_eagle=eagle
        )
    )
    return World(modules, tree, pool, allocator, classes, stops, impl.radix_key)


WINDOW = 4
"""The sliding window (tokens) of :func:`build_swa`'s worlds."""


def build_swa(
    core: str, page_size: int = 1, source: str = VERSION, eagle: bool = False, triton: bool = False
) -> World:
    """SGLang's cache with the FULL and SWA components (a window of :data:`WINDOW` tokens) over
    its ``ReqToTokenPool`` and ``SWATokenToKVPoolAllocator`` (64 full and 64 SWA slots), as
    0.5.23's registry builds it for a hybrid sliding-window model; ``eagle``: EAGLE's tree
    (bigram keys); ``triton``: the allocators' Triton kernels; the debug asserts on (as
    :func:`build`)."""
    impl, modules, stops, classes = _release(source, core, triton)
    assert impl.radix_key
    with debug_asserts(modules):
        allocator = SGLangSWAAllocator(modules, 64, 64, page_size, naive_extend=not triton)
    pool = SGLangReqToTokenPool(modules, 4, 32)
    tree = SGLangSWAGlueTree(modules, pool, allocator, page_size, WINDOW, False, "lru", core,
                             eagle)  # fmt: skip
    return World(modules, tree, pool, allocator, classes, stops, impl.radix_key)


def admit(world: World, req: TurnReq, tokens: int) -> int:
    """The scheduler's admission of ``req`` over its first ``tokens`` tokens (its fill ids):
    the prefix match (a session lends its record), the lock of a request that borrows none, the
    row and state slot, the matched prefix's slots written into a new row (what
    ``alloc_for_extend`` does for a match in the tree), the session taking a first turn's
    record. Returns the prefix length."""
    match = world.match(req, tokens)
    lent = world.cache.session.borrowed_slot(req) is not None
    if req.lock is None and not lent:
        req.lock = world.cache.lock(match.last_device_node)
        req.last_node = match.last_device_node
    # the scheduler's alloc_req_slots: ensure_mamba_capacity (the tree evicts states when too
    # few are free), then the pool's alloc
    allocation = world.modules.module("sglang.srt.mem_cache.allocation")
    allocation.alloc_req_slots(world.pool.impl, [req], world.cache)
    prefix = int(match.device_prefix_len)
    # as the scheduler's init_next_round_input: the match's protected length, else the prefix
    protected = match.cache_protected_len
    req.kv.cache_protected_len = prefix if protected is None else int(protected)
    if not lent and prefix:
        path = world.cache.path_device_indices(match.last_device_node)[:prefix]
        world.pool.impl.req_to_token[req.kv.req_pool_idx, :prefix] = path
        req.kv.kv_allocated_len = req.kv.kv_committed_len = prefix
    world.cache.maybe_hand_to_session(req)
    allocated = int(req.kv.kv_allocated_len)
    require(allocated == prefix, MODEL,  # a lent record holds the session's tokens
            f"{req.rid} resumes at {prefix} tokens over a record of {allocated}")  # fmt: skip
    return prefix


def require(ok: bool, detector: str, message: str) -> None:
    """Raise :class:`~kvpool.errors.InvariantViolation` ``detector`` unless ``ok``: a check on
    SGLang's state (an invariant id) or on the driver's model of its scheduler
    (:data:`MODEL`)."""
    if not ok:
        raise InvariantViolation(detector, message)
