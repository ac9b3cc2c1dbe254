"""Opt-in (``--run-sglang-wheel``): SGLang 0.5.23's own streaming session, over its own unified
cache (FULL and MAMBA components, both tree cores), its ``HybridReqToTokenPool`` and its token
allocator, driven as its scheduler drives a hybrid (Mamba) model's streaming session under
speculative decoding: finding 10 of specs/sglang_findings.md (also run on SGLang 0.5.16's
``StreamingSession`` around its ``MambaRadixCache``). With the FULL component alone, the
same hand-over is checked against kvpool's session rule (the over-allocation freed at the
hand-over). Generated multi-turn sessions (stops inside a run, reserves, aborts, retractions)
check kvpool's rules on SGLang's state after every turn: no KV slot, row or Mamba state leaked
or freed twice, a kept turn holding exactly its tokens through the stop.

kvpool's lifecycle campaigns run their own session code on both sides (kvpool refuses a hybrid
session turn that stops early, ``ConfigError``). Here SGLang's code runs instead:

- admission: the cache's ``match_prefix`` (the session's ``try_match_prefix`` first), ``lock``,
  the pool's ``alloc`` (a row and a Mamba state slot), ``maybe_hand_to_session`` (``take``);
- the finish: the scheduler's ``_mamba_can_cache_finished_req`` (compiled alone from
  ``batch_result_processor.py``, :mod:`kvpool.sglang.req_methods`), then
  ``common.release_kv_cache`` (``claim_kv_row``, the session's ``try_cache_finished_req`` and
  ``_trim_overshoot``; without a session the tree's path);
- the next turn: ``match_prefix`` again (the session lends its record) and the pool's
  ``alloc``.

What the model forward would do between those calls (write KV into the row, update the live
Mamba state through every accepted token, clear a fresh slot) is set on the record by hand, as
the scheduler's accept step leaves it. The request is :class:`TurnReq`: SGLang's own
``ReqKvInfo`` record (compiled from the release's ``schedule_batch.py``), SGLang's own
``owned_kv_len`` / ``output_ids_through_stop``, and the fields the called code reads. Its session
is :class:`StreamingSessionStandIn`, the two entries of ``Session`` the cache calls.
"""

from __future__ import annotations
import __future__

import ast
import contextlib
import dataclasses
from array import array
from collections.abc import Iterator
from typing import Any, Optional

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from kvpool.config import PoolConfig
from kvpool.constants import ceil_align
from kvpool.reference.lifecycle.memory_manager import MemoryManager
from kvpool.sglang import implementation, load_sglang
from kvpool.sglang.cache_req import token_array
from kvpool.sglang.mamba_radix import SGLangMambaRadixCache as SGLangMambaRadixCache16
from kvpool.sglang.radix import to_sglang_key
from kvpool.sglang.req_methods import StopMethods, stop_methods
from kvpool.sglang.unified_mamba_radix import SGLangUnifiedMambaRadixCache
from kvpool.sglang.unified_radix import SGLangUnifiedRadixCache

pytestmark = pytest.mark.sglang_wheel

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
"""The classes of the release's ``schedule_batch.py`` the test compiles."""


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


def build(core: str, hybrid: bool = True, page_size: int = 1) -> World:
    """SGLang's cache over its pools: FULL and MAMBA components over its
    ``HybridReqToTokenPool`` (``hybrid``; page size 1), else FULL alone over its
    ``ReqToTokenPool`` (its paged allocator above page size 1)."""
    impl = implementation(VERSION, tree_core=core)
    assert impl.hybrid_req_to_token_pool and impl.req_to_token_pool and impl.allocator
    assert impl.radix_key and (page_size == 1 or not hybrid)
    config = PoolConfig(size=64, page_size=page_size, req_pool_size=4, max_context_len=32,
                        mamba_slots=4 if hybrid else None,
                        rules=impl.rules_or_default())  # fmt: skip
    pool = (impl.hybrid_req_to_token_pool if hybrid else impl.req_to_token_pool)(config)
    allocator = impl.allocator(config)
    modules = load_sglang(VERSION)
    stops = stop_methods(modules)
    assert stops is not None
    tree: Any = (
        SGLangUnifiedMambaRadixCache(modules, pool, allocator, 1, tree_core=core)
        if hybrid
        else SGLangUnifiedRadixCache(modules, pool, allocator, page_size, tree_core=core)
    )
    classes = schedule_batch_classes(modules)
    return World(modules, tree, pool, allocator, classes, stops, impl.radix_key)


@pytest.mark.parametrize("core", CORES)
def test_a_turn_stopping_inside_its_run_hands_the_next_turn_a_state_past_the_stop(
    core: str,
) -> None:
    """The finding: the session keeps the KV through the stop and the live state of every
    committed token; the next turn resumes at the stop from that state."""
    world = build(core)
    session = StreamingSessionStandIn("s")
    turn = TurnReq(world, "t1", PROMPT, session)
    state = world.run_turn(turn, stop=3)
    committed, through_stop = len(PROMPT) + len(OUTPUT), len(PROMPT) + 3
    free_before = world.allocator.impl.available_size()

    # SGLang's own rule: the live state holds all 14 committed tokens and cannot be cut back
    # to the 11 the request owns (its scheduler keeps such a request out of the tree)
    assert turn.owned_kv_len() == through_stop < committed
    assert world.finish(turn) is False

    # ... yet the streaming session keeps the record: the KV is trimmed to the stop (the
    # overshoot and the reserve are freed), the state slot is kept as it is
    slot = world.cache.session.slots["s"]
    assert session.finished == ["t1"] and not turn.kv.holds_kv
    assert slot.kv.kv_committed_len == slot.kv.kv_allocated_len == through_stop
    assert world.allocator.impl.available_size() == free_before + committed + RESERVE - through_stop
    assert slot.kv.holds_mamba and int(slot.kv.mamba_pool_idx) == state
    assert not slot.kv.mamba_needs_clear and slot.kv.mamba_ping_pong_track_buffer is None

    # the next turn continues from the stop: it borrows the record and resumes at token 11,
    # and its admission reuses the state slot that has seen 14 tokens (nothing clears it)
    nxt = TurnReq(world, "t2", PROMPT + OUTPUT[:3] + NEXT, session)
    match = world.match(nxt)
    assert nxt.kv is slot.kv
    assert match.device_prefix_len == through_stop
    assert world.pool.impl.alloc([nxt]) is not None
    assert int(nxt.kv.mamba_pool_idx) == state and not nxt.kv.mamba_needs_clear


@pytest.mark.parametrize("core", CORES)
def test_a_turn_stopping_at_its_last_token_keeps_state_and_kv_together(core: str) -> None:
    """Control: without an overshoot the session's KV and state hold the same tokens."""
    world = build(core)
    session = StreamingSessionStandIn("s")
    turn = TurnReq(world, "t1", PROMPT, session)
    state = world.run_turn(turn, stop=len(OUTPUT))
    committed = len(PROMPT) + len(OUTPUT)
    assert turn.owned_kv_len() == committed
    assert world.finish(turn) is True
    slot = world.cache.session.slots["s"]
    assert slot.kv.kv_committed_len == slot.kv.kv_allocated_len == committed
    nxt = TurnReq(world, "t2", PROMPT + OUTPUT + NEXT, session)
    assert world.match(nxt).device_prefix_len == committed
    assert int(nxt.kv.mamba_pool_idx) == state


@pytest.mark.parametrize("core", CORES)
def test_without_a_session_the_state_past_the_stop_is_freed(core: str) -> None:
    """Contrast: the same finish without a session caches nothing and frees the state, as
    SGLang's scheduler rule intends."""
    world = build(core)
    turn = TurnReq(world, "t1", PROMPT, None)
    world.run_turn(turn, stop=3)
    free_states = world.pool.impl.mamba_allocator.available_size()
    free_slots = world.allocator.impl.available_size()
    assert world.finish(turn) is False and turn.skip_radix_cache_insert
    assert world.pool.impl.mamba_allocator.available_size() == free_states + 1
    total = len(PROMPT) + len(OUTPUT) + RESERVE
    assert world.allocator.impl.available_size() == free_slots + total
    nxt = TurnReq(world, "t2", PROMPT + OUTPUT[:3] + NEXT, None)
    assert world.match(nxt).device_prefix_len == 0


@pytest.mark.parametrize("core", CORES)
def test_the_hand_over_frees_the_over_allocation_as_kvpools_sessions_do(core: str) -> None:
    """Full attention: SGLang's session frees a finished turn's over-allocation (the reserve,
    and the tokens past a stop) at the hand-over and holds ``allocated == committed``, which is
    kvpool's rule (``SessionSlot.take_from``, ``INV-SESSION-TRIMMED``): the same scenario on
    kvpool's reference frees as many slots at its finish."""
    committed = len(PROMPT) + len(OUTPUT)
    for stop in (len(OUTPUT), 3):
        world = build(core, hybrid=False)
        turn = TurnReq(world, "t1", PROMPT, StreamingSessionStandIn("s"))
        world.run_turn(turn, stop=stop)
        free_before = world.allocator.impl.available_size()
        assert world.finish(turn) is True  # no Mamba state: the scheduler's check says yes
        slot = world.cache.session.slots["s"]
        kept = len(PROMPT) + stop
        assert slot.kv.kv_committed_len == slot.kv.kv_allocated_len == kept
        sglang_freed = world.allocator.impl.available_size() - free_before
        assert sglang_freed == committed + RESERVE - kept

        mm = MemoryManager(PoolConfig(size=64, req_pool_size=4, max_context_len=32))
        mm.open_session("s")
        mm.new_req("t1", PROMPT, session_id="s")
        mm.extend(["t1"])
        mm.spec_step(["t1"], [OUTPUT[:3]], reserve=RESERVE)
        mm.spec_step(["t1"], [OUTPUT[3:]], reserve=RESERVE)
        t1 = mm.reqs["t1"]
        assert t1.kv_committed_len == committed
        over = t1.kv_allocated_len - committed  # kvpool's reserve: its own amount
        free_before = mm.token_to_kv_pool_allocator.available_size()
        mm.finish(["t1"], finished_lens=[stop])
        (held,) = mm.snapshot().sessions
        assert held.kv_committed_len == held.kv_allocated_len == kept
        kvpool_freed = mm.token_to_kv_pool_allocator.available_size() - free_before
        assert kvpool_freed == committed + over - kept  # the same rule: [kept, allocated)


Turn = tuple[int, int, int, int | None, bool, bool]
"""A generated turn: new input tokens, output tokens committed, reserve, the stop (an output
position; None: the last token), whether it is aborted, and whether it is retracted once first
(then admitted again, as a retracted request is)."""

turns = st.lists(
    st.tuples(
        st.integers(1, 3),
        st.integers(1, 4),
        st.integers(0, 3),
        st.one_of(st.none(), st.integers(1, 4)),
        st.booleans(),
        st.booleans(),
    ),
    min_size=1,
    max_size=4,
)


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


def check_held(world: World, sizes: tuple[int, int, int], where: object) -> Any:
    """Every KV slot, row and Mamba state is free, cached in the tree or the session's (its
    last partial page its own); returns the session's slot (None: it holds nothing)."""
    kv_size, rows, state_size = sizes
    slot: Any = world.cache.session.slots.get("s")
    held = 0
    if slot is not None:
        held = ceil_align(slot.kv.kv_allocated_len, world.tree.page_size)
        held -= slot.kv.cache_protected_len
    tree = world.cache.evictable_size() + world.cache.protected_size()
    assert world.allocator.impl.available_size() + held + tree == kv_size, where
    assert world.pool.impl.available_size() == rows - (slot is not None), where
    states = getattr(world.pool.impl, "mamba_allocator", None)
    if states is not None:
        holds = slot is not None and slot.kv.holds_mamba
        free = states.available_size()
        assert free + int(holds) + cached_states(world) == state_size, where
    return slot


def run_session(world: World, plan: list[Turn]) -> None:
    """Turns of one streaming session through SGLang's own code (admission, hand-over, abort,
    retraction and re-admission), then ``release_session``. After every step kvpool's rules
    hold on SGLang's state (:func:`check_held`; a kept turn holds exactly its tokens through the
    stop, ``INV-SESSION-TRIMMED``); at the end everything is free."""
    states = getattr(world.pool.impl, "mamba_allocator", None)
    sizes = (
        int(world.allocator.impl.available_size()),
        int(world.pool.impl.available_size()),
        0 if states is None else int(states.available_size()),
    )
    session = StreamingSessionStandIn("s")
    history: list[int] = []  # the session's tokens: what the next turn continues from
    token = 100
    for i, (new, outputs, reserve, stop, aborted, retracted) in enumerate(plan):
        where = plan[: i + 1]
        prompt = history + list(range(token, token + new))
        token += new
        req = TurnReq(world, f"t{i}", prompt, session)
        admit(world, req, len(prompt))
        committed = len(prompt) + outputs
        world.extend_slots(req, committed + reserve)
        req.kv.kv_committed_len = committed
        req.kv.mamba_needs_clear = False
        req.output_ids = token_array(range(token, token + outputs))
        token += outputs
        if retracted:  # the scheduler's release_req: no insert; the session keeps the record
            world.retract(req)
            slot = check_held(world, sizes, where)
            assert slot is not None and slot.kv.kv_committed_len == committed
            assert slot.kv.kv_allocated_len == committed, where  # the reserve went back
            # admitted again over its fill ids (prompt and output): the key stops a token
            # short, so the session frees that token's slot and it is computed again
            assert admit(world, req, committed) == committed - 1
            world.extend_slots(req, committed + reserve)
            req.kv.kv_committed_len = committed
        req.finished_len = None if stop is None else min(stop, outputs)
        req.finished_reason = world.finish_reason(aborted)
        world.finish(req)
        slot = check_held(world, sizes, where)
        kept = len(prompt) + (outputs if stop is None else min(stop, outputs))
        if aborted:  # the session forgets its history; the next turn starts afresh
            assert slot is None, where
            history = []
        else:
            assert slot is not None
            assert slot.kv.kv_committed_len == slot.kv.kv_allocated_len == kept, where
            history = prompt + list(req.output_ids[: kept - len(prompt)])
    world.cache.session.release_session("s")
    assert world.allocator.impl.available_size() + world.cache.evictable_size() == sizes[0]
    assert world.cache.protected_size() == 0 and world.pool.impl.available_size() == sizes[1]
    if states is not None:
        assert states.available_size() + cached_states(world) == sizes[2]


def cached_states(world: World) -> int:
    """The Mamba states SGLang's tree holds (an aborted turn's release caches its prompt and
    state, as any finished request's does)."""
    snap = world.tree.snapshot()
    return sum(n.mamba_value is not None for n in snap.nodes[1:])


@pytest.mark.parametrize("core", CORES)
@pytest.mark.parametrize(("hybrid", "page_size"), [(False, 1), (False, 4), (True, 1)])
@settings(max_examples=25, deadline=None)
@given(plan=turns)
def test_generated_sessions_keep_kvpools_rules_on_sglangs_code(
    core: str, hybrid: bool, page_size: int, plan: list[Turn]
) -> None:
    """Generated multi-turn sessions (stops inside a run, reserves, aborts, retractions) on
    SGLang's own streaming session: nothing leaks, nothing is freed twice, a kept turn holds
    exactly its tokens through the stop."""
    run_session(build(core, hybrid=hybrid, page_size=page_size), plan)


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


def test_0_5_16_session_also_resumes_from_a_state_past_the_stop() -> None:
    """Finding 10 on SGLang 0.5.16: its ``StreamingSession`` wrapped around its
    ``MambaRadixCache``, its release (``common.release_kv_cache``) and its
    ``HybridReqToTokenPool``: the hand-over trims the KV to the stop and keeps the state slot,
    and the next turn resumes at the stop from it."""
    impl = implementation("0.5.16")
    assert impl.hybrid_req_to_token_pool and impl.allocator and impl.radix_key
    radix_key = impl.radix_key
    config = PoolConfig(size=64, req_pool_size=4, max_context_len=32, mamba_slots=4,
                        rules=impl.rules_or_default())  # fmt: skip
    pool, allocator = impl.hybrid_req_to_token_pool(config), impl.allocator(config)
    modules = load_sglang("0.5.16")
    tree = SGLangMambaRadixCache16(modules, pool, allocator, 1)
    session_cls = modules.attr("sglang.srt.session.streaming_session", "StreamingSession")
    cache = session_cls(tree.impl)
    classes = schedule_batch_classes(modules)
    params = modules.attr("sglang.srt.mem_cache.base_prefix_cache", "MatchPrefixParams")

    def match(req: TurnReq16) -> Any:
        key = radix_key(list(req.origin_input_ids[:-1]), None)
        return cache.match_prefix(params(key=to_sglang_key(modules, key), req=req))

    session = StreamingSessionStandIn("s")
    turn = TurnReq16("t1", PROMPT, session)
    first = match(turn)
    assert len(first.device_indices) == 0
    turn.last_node = first.last_device_node
    cache.inc_lock_ref(turn.last_node)
    assert pool.impl.alloc([turn]) is not None
    committed = len(PROMPT) + len(OUTPUT)
    slots = allocator.impl.alloc(committed + RESERVE)
    assert turn.req_pool_idx is not None
    pool.impl.req_to_token[turn.req_pool_idx, : committed + RESERVE] = slots
    turn.kv = classes["ReqKvInfo"](kv_allocated_len=committed + RESERVE, swa_evicted_seqlen=0)
    turn.kv_committed_len = committed
    turn.output_ids = token_array(OUTPUT)
    turn.finished_len = 3
    turn.finished_reason = classes["FINISH_MATCHED_TOKEN"](0)
    state = int(turn.mamba_pool_idx)
    free_before = allocator.impl.available_size()
    with real_finish_abort(modules, classes):
        modules.module("sglang.srt.mem_cache.common").release_kv_cache(turn, cache)
    through_stop = len(PROMPT) + 3
    slot = cache.slots["s"]
    assert slot.kv_committed_len == slot.kv.kv_allocated_len == through_stop
    assert allocator.impl.available_size() == free_before + committed + RESERVE - through_stop
    assert int(slot.mamba_pool_idx) == state  # the state after 14 tokens, kept

    nxt = TurnReq16("t2", PROMPT + OUTPUT[:3] + NEXT, session)
    assert len(match(nxt).device_indices) == through_stop
    assert pool.impl.alloc([nxt]) is not None
    assert int(nxt.mamba_pool_idx) == state and not nxt.mamba_needs_clear
