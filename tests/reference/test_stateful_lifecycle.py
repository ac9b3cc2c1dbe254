"""Stateful test of the reference lifecycle: random request traffic, every invariant every step.

Requests share prefixes (tokens from a three-letter alphabet, prompts starting with one of a few
shared prefixes), use two namespaces, prefill in chunks, decode, take speculative steps with
random acceptance, finish with or without insert, abort, retract, run as session turns, and
compete for a small pool so that eviction and out-of-memory happen. After every step the whole
snapshot goes through :func:`kvpool.invariants.check_all` (with the previous snapshot); a step
that raises OutOfMemoryError or ContextOverflowError must have changed no pool.
"""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, precondition, rule

from kvpool.config import PoolConfig
from kvpool.constants import EVICTION_POLICIES, SUPPORTED_PAGE_SIZES_TESTED
from kvpool.errors import ContextOverflowError, OutOfMemoryError
from kvpool.invariants import check_all
from kvpool.reference.lifecycle.memory_manager import MemoryManager
from kvpool.snapshot import PoolSnapshot

ALPHABET = st.integers(min_value=1, max_value=3)


def _pools(snap: PoolSnapshot) -> tuple[Any, ...]:
    """What an out-of-memory failure must leave unchanged (tree splits/times may remain)."""
    t = snap.tree
    return (
        snap.allocator,
        snap.req_to_token,
        snap.reqs,
        snap.sessions,
        t.evictable_size,
        t.protected_size,
        sum(n.lock_ref * len(n.key) for n in t.nodes),  # lock weight: unchanged by splits
    )


class LifecycleMachine(RuleBasedStateMachine):
    mm: MemoryManager
    prefixes: list[list[int]]

    def __init__(self) -> None:
        super().__init__()
        self.counter = 0
        self.prev: PoolSnapshot | None = None

    PAGE_SIZES: tuple[int, ...] = SUPPORTED_PAGE_SIZES_TESTED

    @initialize(
        pages=st.integers(min_value=4, max_value=12),
        policy=st.sampled_from(EVICTION_POLICIES),
        disable=st.sampled_from([False, False, True]),  # the radix cache on, mostly
        need_sort=st.booleans(),
        layout=st.sampled_from(["mha", "mla"]),
        data=st.data(),
    )
    def setup(
        self,
        pages: int,
        policy: str,
        disable: bool,
        need_sort: bool,
        layout: str,
        data: st.DataObject,
    ) -> None:
        ps = self.ps = data.draw(st.sampled_from(self.PAGE_SIZES))
        self.max_len = 3 * ps + 12
        self.mm = MemoryManager(
            PoolConfig(
                size=pages * ps,
                page_size=ps,
                req_pool_size=4,
                max_context_len=self.max_len,
                need_sort=need_sort,
                disable_radix_cache=disable,
                eviction_policy=policy,
                kv_layout=layout,
            )
        )
        self.prefixes = [
            data.draw(st.lists(ALPHABET, min_size=ps, max_size=2 * ps + 2)) for _ in range(2)
        ]

    # ----------------------------------------------------------------- helpers
    def _rids(self, *states: str, full: bool = False) -> list[str]:
        return [
            r.rid
            for r in self.mm.reqs.values()
            if r.state in states and not (full and r.is_chunked)
        ]

    def _batch(self, data: st.DataObject, rids: list[str]) -> list[str]:
        return data.draw(st.lists(st.sampled_from(rids), min_size=1, max_size=3, unique=True))

    def _attempt(self, fn: Any, *args: Any) -> Any:
        before = _pools(self.mm.snapshot())
        try:
            return fn(*args)
        except (OutOfMemoryError, ContextOverflowError):
            assert _pools(self.mm.snapshot()) == before, "a failed operation changed the pools"
            return None

    # ----------------------------------------------------------------- rules
    @precondition(lambda self: len(self.mm.reqs) < 6)
    @rule(
        data=st.data(),
        ns=st.sampled_from([None, "a"]),
        use_session=st.booleans(),
        admit=st.booleans(),
    )
    def new_req(self, data: st.DataObject, ns: str | None, use_session: bool, admit: bool) -> None:
        free_sessions = [s for s, v in self.mm.sessions.items() if v.busy_with is None]
        session = (
            data.draw(st.sampled_from(free_sessions)) if use_session and free_sessions else None
        )
        if session is not None:
            tokens = data.draw(st.lists(ALPHABET, min_size=1, max_size=self.ps + 2))
            held = len(self.mm.sessions[session].tokens)
            if held + len(tokens) > self.max_len:
                return
            ns = None
        else:
            # Shared prefixes, or a live request's tokens (a match ending inside its locked path).
            live = [r.all_token_ids for r in self.mm.reqs.values()]
            prefix = data.draw(st.sampled_from(self.prefixes + live))
            cut = data.draw(st.integers(0, len(prefix)))
            tail = data.draw(st.lists(ALPHABET, min_size=1, max_size=self.ps + 3))
            tokens = (prefix[:cut] + tail)[: self.max_len - 4]
        self.counter += 1
        rid = f"r{self.counter}"
        self.mm.new_req(rid, tokens, extra_key=ns, session_id=session)
        if admit:  # the common path: admitted at once, maybe chunked
            chunk = data.draw(st.one_of(st.none(), st.integers(1, 2 * self.ps + 1)))
            self._attempt(self.mm.extend, [rid], [chunk])

    @precondition(lambda self: any(r.state == "waiting" for r in self.mm.reqs.values()))
    @rule(data=st.data())
    def match_prefix(self, data: st.DataObject) -> None:
        rid = data.draw(st.sampled_from(self._rids("waiting")))
        n = self.mm.match_prefix(rid)
        assert 0 <= n < self.mm.reqs[rid].seq_len()

    def _free_sessions(self) -> list[str]:
        return [s for s, v in self.mm.sessions.items() if v.busy_with is None]

    @precondition(lambda self: bool(self._free_sessions()))
    @rule(data=st.data(), reserve=st.integers(0, 3), finish=st.booleans())
    def session_turn(self, data: st.DataObject, reserve: int, finish: bool) -> None:
        """A whole session turn at once: admit, maybe one speculative step (over-allocation the
        session inherits), maybe finish (the session takes the row, KV and lock)."""
        sid = data.draw(st.sampled_from(self._free_sessions()))
        tokens = data.draw(st.lists(ALPHABET, min_size=1, max_size=self.ps + 2))
        if len(self.mm.sessions[sid].tokens) + len(tokens) + 2 * reserve > self.max_len:
            return
        self.counter += 1
        rid = f"r{self.counter}"
        self.mm.new_req(rid, tokens, session_id=sid)
        if self._attempt(self.mm.extend, [rid], [None]) is None:
            return
        if reserve:
            accepted = data.draw(st.lists(ALPHABET, max_size=2 * reserve))
            self._attempt(self.mm.spec_step, [rid], [accepted], reserve)
        if finish:
            self.mm.finish([rid])

    def _extendable(self) -> list[str]:
        return [r.rid for r in self.mm.reqs.values() if r.state == "waiting" or r.is_chunked]

    @precondition(lambda self: bool(self._extendable()))
    @rule(data=st.data())
    def extend(self, data: st.DataObject) -> None:
        batch = self._batch(data, self._extendable())
        chunks = [data.draw(st.one_of(st.none(), st.integers(1, 2 * self.ps + 1))) for _ in batch]
        out = self._attempt(self.mm.extend, batch, chunks)
        if out is not None:
            assert len(set(out)) == len(out)

    @precondition(lambda self: len(self.mm.reqs) < 5)
    @rule(data=st.data(), ns=st.sampled_from([None, "a"]))
    def admit_pair(self, data: st.DataObject, ns: str | None) -> None:
        """Two requests with one prompt, prefilled together in chunks: the second one's chunk
        insert finds the first one's tokens, frees its duplicates and must rewrite its row."""
        prefix = data.draw(st.sampled_from(self.prefixes))
        tail = data.draw(st.lists(ALPHABET, min_size=1, max_size=self.ps + 3))
        tokens = (prefix + tail)[: self.max_len - 4]
        rids = []
        for _ in range(2):
            self.counter += 1
            rids.append(f"r{self.counter}")
            self.mm.new_req(rids[-1], tokens, extra_key=ns)
        chunk = data.draw(st.integers(1, max(1, len(tokens) - 1)))
        self._attempt(self.mm.extend, rids, [chunk, chunk])

    @precondition(lambda self: bool(self._rids("running", full=True)))
    @rule(data=st.data())
    def decode(self, data: st.DataObject) -> None:
        ready = self._rids("running", full=True)
        if ready:
            batch = self._batch(data, ready)
            self._attempt(self.mm.decode, batch, [data.draw(ALPHABET) for _ in batch])
            if data.draw(st.booleans()):  # requests often finish right after a step
                self.mm.finish(batch, data.draw(st.booleans()))

    @precondition(lambda self: bool(self._rids("running", full=True)))
    @rule(data=st.data(), reserve=st.integers(1, 3))
    def spec_step(self, data: st.DataObject, reserve: int) -> None:
        ready = self._rids("running", full=True)
        if ready:
            batch = self._batch(data, ready)
            accepted = [data.draw(st.lists(ALPHABET, max_size=2 * reserve)) for _ in batch]
            self._attempt(self.mm.spec_step, batch, accepted, reserve)
            if data.draw(st.booleans()):
                self.mm.finish(batch, data.draw(st.booleans()))

    @precondition(lambda self: bool(self._rids("running", full=True)))
    @rule(data=st.data(), num_draft=st.integers(1, 4))
    def spec_draft_v1(self, data: st.DataObject, num_draft: int) -> None:
        ready = self._rids("running", full=True)
        if ready:
            self._attempt(self.mm.spec_draft_v1, self._batch(data, ready), num_draft)

    @precondition(lambda self: bool(self._rids("running", full=True)))
    @rule(data=st.data(), is_insert=st.booleans())
    def finish(self, data: st.DataObject, is_insert: bool) -> None:
        ready = self._rids("running", full=True)
        if ready:
            self.mm.finish(self._batch(data, ready), is_insert)

    @precondition(lambda self: bool(self.mm.reqs))
    @rule(data=st.data(), retract=st.booleans())
    def abort_or_retract(self, data: st.DataObject, retract: bool) -> None:
        running = self._rids("running")
        if retract and running:
            self.mm.retract(data.draw(st.sampled_from(running)))
        else:
            self.mm.abort(data.draw(st.sampled_from(self._rids("waiting", "running"))))

    @rule(data=st.data(), what=st.sampled_from(["session", "evict"]))
    def misc(self, data: st.DataObject, what: str) -> None:
        """Open a session (at most two) or close an idle one; or evict from the tree."""
        if what == "evict":
            n = data.draw(st.integers(0, 4 * self.ps))
            before = self.mm.tree_cache.evictable_size()
            freed = self.mm.evict(n)
            assert freed == before - self.mm.tree_cache.evictable_size()
            assert freed >= n or freed == before
            return
        idle = [s for s, v in self.mm.sessions.items() if v.busy_with is None]
        if idle and (len(self.mm.sessions) >= 2 or data.draw(st.booleans())):
            self.mm.close_session(data.draw(st.sampled_from(idle)))
        elif len(self.mm.sessions) < 2:
            self.counter += 1
            self.mm.open_session(f"s{self.counter}")

    # ----------------------------------------------------------------- checks
    @invariant()
    def every_invariant(self) -> None:
        if not hasattr(self, "mm"):
            return
        snap = self.mm.snapshot()
        check_all(snap, self.prev)
        self.prev = snap

    def teardown(self) -> None:
        if not hasattr(self, "mm"):
            return
        # Drain: everything released, then only the tree holds slots.
        for rid in list(self.mm.reqs):
            self.mm.abort(rid)
        for sid in list(self.mm.sessions):
            self.mm.close_session(sid)
        snap = self.mm.snapshot()
        check_all(snap, self.prev)
        alloc = self.mm.token_to_kv_pool_allocator
        assert snap.tree.protected_size == 0
        assert alloc.available_size() + snap.tree.evictable_size == alloc.size
        assert self.mm.req_to_token_pool.available_size() == self.mm.req_to_token_pool.size


class SmallPages(LifecycleMachine):
    PAGE_SIZES = (1, 2)


class MediumPages(LifecycleMachine):
    PAGE_SIZES = (4, 16)


class LargePages(LifecycleMachine):
    PAGE_SIZES = (64,)


# One test per page-size group (each gets the profile's examples), with longer runs than the
# profile's default: each step is cheap and the bugs worth finding need a few turns of traffic.
TestSmallPages = SmallPages.TestCase
TestSmallPages = pytest.mark.slow(TestSmallPages)
TestMediumPages = MediumPages.TestCase
TestMediumPages = pytest.mark.slow(TestMediumPages)
TestLargePages = LargePages.TestCase
TestLargePages = pytest.mark.slow(TestLargePages)
_LONGER = settings(stateful_step_count=max(100, settings().stateful_step_count))
TestSmallPages.settings = TestMediumPages.settings = TestLargePages.settings = _LONGER
