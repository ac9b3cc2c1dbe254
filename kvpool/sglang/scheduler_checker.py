"""SGLang's own scheduler pool checks, run at every step over SGLang's components.

SGLang 0.5.23's scheduler ships the checks behind the field's most reported crash ("Full Pool
Mem Leak Detected!", "req_to_token_pool memory leak detected!"):
``managers/scheduler_components/invariant_checker.py``'s ``SchedulerInvariantChecker`` over
``pool_stats_observer.py``'s ``SchedulerPoolStatsObserver``. :class:`SchedulerChecks` builds
both, SGLang's own code loaded from the wheel, over SGLang's tree, allocator and request-row
pool, and runs:

- the busy check (``self_check_during_busy``: per pool, ``available + evictable + protected +
  session_held + uncached == total``, the uncached part counted from the requests that own rows);
- the KV page check (``_check_kv_page_invariants``, off by default in a server:
  ``SGLANG_CHECK_KV_PAGE_INVARIANTS``): no owned page is free, no page is free twice;
- when no request holds anything, the idle checks (what ``on_idle`` runs): every pool's
  equation with nothing uncached (``_check_all_pools``), the request-row pool
  (``_check_req_pool``) and, when no session holds a row either, the tree's own sanity check
  (``_check_tree_cache``, on in SGLang's CI: leaf sets, LRU lists, sizes, locks; run for a FULL
  tree too, see :meth:`SchedulerChecks._check_tree`).

What the scheduler would hand its checker (the batch, the sessions, whether it is idle) the
caller hands it (:class:`SchedulerState`): kvpool's lifecycle for a glue manager
(:func:`glue_checks`; the lockstep driver runs them after kvpool's own invariants, as the
manager's ``run_own_checks``), the session player for SGLang's own streaming sessions
(:mod:`kvpool.sglang.session_plans`).

A check that fails raises :class:`~kvpool.errors.InvariantViolation` ``SGL-SCHEDULER-CHECK``
with SGLang's message. A state kvpool's invariants pass but SGLang's checker rejects is either a
check kvpool lacks or a false alarm of SGLang's.
"""

from __future__ import annotations

import traceback
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch

from kvpool.errors import InvariantViolation
from kvpool.sglang.loader import SGLangModules

CHECKER_MODULE = "sglang.srt.managers.scheduler_components.invariant_checker"
OBSERVER_MODULE = "sglang.srt.managers.scheduler_components.pool_stats_observer"

INVARIANT_ID = "SGL-SCHEDULER-CHECK"
"""The detector of a failed check of SGLang's scheduler checker."""


@dataclass(frozen=True)
class SessionKv:
    """A kvpool session holding a finished turn's row, as SGLang's ``ReqKvInfo`` reads for
    pool accounting (tokens; ``req_pool_idx`` a row). ``swa_evicted`` is the tokens of the
    sliding window already freed (0 off SWA)."""

    req_pool_idx: int
    kv_committed_len: int
    kv_allocated_len: int
    cache_protected_len: int
    swa_evicted: int = 0
    mamba_slot: int | None = None
    """A hybrid model's Mamba slot the session keeps (None: none)."""
    track: tuple[int, ...] | None = None
    """Its speculative track buffer (-1: an empty entry; None: no buffer)."""

    @property
    def holds_kv(self) -> bool:
        return True

    @property
    def holds_mamba(self) -> bool:
        return self.mamba_slot is not None

    @property
    def mamba_pool_idx(self) -> torch.Tensor:
        # SGLang reads it only when holds_mamba; -1 is no slot
        return torch.tensor([-1 if self.mamba_slot is None else self.mamba_slot])

    @property
    def mamba_ping_pong_track_buffer(self) -> tuple[int, ...] | None:
        return self.track

    @property
    def mamba_ping_pong_empty(self) -> list[bool]:
        return [slot == -1 for slot in self.track or ()]

    def get_evicted_seqlen(self, component_type: Any) -> int:
        return self.swa_evicted

    def swa_dead_lo(self, page_size: int) -> int:
        """SGLang's ``max(cache_protected_len, swa_evict_floor)``: a session keeps no
        prefill shield (floor 0), as the glue's own records (:mod:`kvpool.sglang.glue_swa`)."""
        return self.cache_protected_len


@dataclass(frozen=True)
class _Owner:
    """A request that owns a row, as the checker reads it (``rid``, ``req.kv``; no beam
    search on these paths)."""

    rid: str
    kv: Any
    beam_group: None = None


@dataclass(frozen=True)
class _Batch:
    reqs: list[_Owner]


@dataclass
class SchedulerState:
    """What the scheduler hands its checker at one step."""

    owners: list[tuple[str, Any]]
    """``(rid, req.kv)`` of every running request that holds a row."""
    idle: bool
    """No request holds anything: no batch would run, the idle checks apply."""
    sessions: dict[str, Any] | None = None
    """The session records, by session id, where the caller keeps sessions itself (kvpool's
    lifecycle); None: the tree's own ``session_records()`` (SGLang's streaming sessions)."""


class _SchedulerTree:
    """SGLang's tree cache as the checker reads it: its ``session_records()`` the caller's when
    it keeps sessions itself, its sanity check counted; every other attribute the tree's own."""

    def __init__(self, tree: Any, counts: Counter[str]) -> None:
        self._tree = tree
        self._counts = counts
        self.sessions: dict[str, Any] | None = None

    def session_records(self) -> dict[str, Any]:
        if self.sessions is None:
            records: dict[str, Any] = self._tree.session_records()
            return records
        return dict(self.sessions)

    def sanity_check(self) -> None:
        """The tree's own sanity check (counted as ``scheduler_checker.tree`` once passed)."""
        self._tree.sanity_check()
        self._counts["scheduler_checker.tree"] += 1

    def __getattr__(self, name: str) -> Any:
        return getattr(self._tree, name)


def ships_checker(modules: SGLangModules) -> bool:
    """Whether kvpool loads the scheduler checker of the release in ``modules`` for real: a
    release with 0.5.23's unified cache (:data:`kvpool.sglang.loader.UNIFIED_MODULES`). 0.5.16
    ships an earlier checker that reads the scheduler's requests, not their ``req.kv``
    records; it is not run."""
    return CHECKER_MODULE in modules.importer.real


class SchedulerChecks:
    """SGLang's scheduler checker over SGLang's ``tree`` (its own object), ``allocator`` and
    ``pool`` (module docstring), of ``page_size`` tokens a page, a sliding-window (``swa``) or
    hybrid Mamba (``mamba``) model's, or neither. ``state`` tells the scheduler's state at each
    :meth:`run`. ``modules``: a release that ships the checker (:func:`ships_checker`)."""

    def __init__(
        self,
        modules: SGLangModules,
        *,
        tree: Any,
        allocator: Any,
        pool: Any,
        page_size: int,
        swa: bool,
        mamba: bool,
        state: Callable[[], SchedulerState],
    ) -> None:
        self.state = state
        self.counts: Counter[str] = Counter()
        """Checks passed so far: ``scheduler_checker.busy``, ``.kv_pages``, ``.idle`` and
        ``.tree`` (a glue manager's coverage counters, reported as ``sglang:`` tags)."""
        envs = modules.module("sglang.srt.environ").envs
        self._sanity = envs.SGLANG_ENABLE_TREE_CACHE_SANITY_CHECK
        """The switch of the tree's sanity check (on in SGLang's CI, off in a server), turned
        on for each idle check."""
        self._owners: list[_Owner] = []
        self._view = _SchedulerTree(tree, self.counts)
        full = swa_size = None
        if swa:
            full, swa_size = allocator.size_full, allocator.size_swa
        self.observer = modules.module(OBSERVER_MODULE).SchedulerPoolStatsObserver(
            tree_cache=self._view, token_to_kv_pool_allocator=allocator, req_to_token_pool=pool,
            session_controller=None, hisparse_coordinator=None, is_hybrid_swa=swa,
            is_hybrid_ssm=mamba, enable_hisparse=False, full_tokens_per_layer=full,
            swa_tokens_per_layer=swa_size, max_total_num_tokens=allocator.size,
        )  # fmt: skip
        self.checker = modules.module(CHECKER_MODULE).SchedulerInvariantChecker(
            is_hybrid_swa=swa, is_hybrid_ssm=mamba, disaggregation_mode=None,
            page_size=page_size, full_tokens_per_layer=full, swa_tokens_per_layer=swa_size,
            max_total_num_tokens=allocator.size, tree_cache=self._view,
            token_to_kv_pool_allocator=allocator, req_to_token_pool=pool,
            pool_stats_observer=self.observer, get_last_batch=lambda: _Batch(self._owners),
            get_running_batch=lambda: None, scheduler_stage_metrics=None,
        )  # fmt: skip

    def run(self) -> None:
        """Every check (module docstring) on the state now, each counted in :attr:`counts`
        once passed. InvariantViolation ``SGL-SCHEDULER-CHECK`` with SGLang's message when one
        fails."""
        now = self.state()
        self._owners[:] = [_Owner(rid, kv) for rid, kv in now.owners]
        self._view.sessions = now.sessions
        checker, counts = self.checker, self.counts
        try:
            checker.self_check_during_busy()
            counts["scheduler_checker.busy"] += 1
            checker._check_kv_page_invariants()
            counts["scheduler_checker.kv_pages"] += 1
            if now.idle:
                leak, messages = checker._check_all_pools(self.observer.get_pool_stats())
                if leak:
                    checker._report_leak("pool", "\n".join(messages))
                checker._check_req_pool()
                counts["scheduler_checker.idle"] += 1
                # the tree's own sanity check asserts that no node is locked at idle, which a
                # session holding its prefix breaks by design (SGLang skips it then too)
                if not any(kv.holds_kv for kv in self._view.session_records().values()):
                    self._check_tree()
        except (AssertionError, ValueError) as exc:
            said = f"SGLang's scheduler checker: {_said(exc)}"
            raise InvariantViolation(INVARIANT_ID, said) from exc

    def _check_tree(self) -> None:
        """The tree's sanity check: through the scheduler's ``_check_tree_cache`` (a hybrid
        tree's), else directly (the scheduler leaves a FULL tree's out; its invariants hold for
        any tree that shares prefixes). A tree without one (the legacy ``RadixCache``) is
        skipped."""
        view = self._view
        before = self.counts["scheduler_checker.tree"]
        with self._sanity.override(True):
            self.checker._check_tree_cache()
        if self.counts["scheduler_checker.tree"] > before:
            return
        if hasattr(view._tree, "sanity_check") and view.supports_prefix_sharing():
            view.sanity_check()


def glue_checks(manager: Any, modules: SGLangModules) -> SchedulerChecks:
    """The checks over a glue manager's SGLang components
    (:class:`~kvpool.sglang.glue_manager.SGLangGlueManager`), the scheduler's state read from
    kvpool's lifecycle at each run: the batch is every request holding a row (SGLang's
    ``req.kv`` view of each, :mod:`kvpool.sglang.glue`); the session records are kvpool's
    sessions that hold a finished turn's row (:class:`SessionKv`; on this path kvpool's
    lifecycle keeps the sessions, not SGLang's tree); idle means no request holds a row, a
    matched prefix's lock or a Mamba slot its match copied into."""
    config = manager.config
    tree: Any = manager.tree_cache.impl
    component_type = modules.attr(
        "sglang.srt.mem_cache.unified_cache.component_type", "ComponentType"
    )
    swa_type = component_type.SWA

    def state() -> SchedulerState:
        reqs = list(manager.reqs.values())
        # an SWA glue manager keeps each session's SGLang window cursor (SWAReqState)
        cursors = getattr(manager, "_session_swa", {})
        sessions: dict[str, Any] = {}
        for sid, s in manager.sessions.items():
            if s.req_pool_idx is not None:
                cursor = cursors.get(sid)
                evicted = 0 if cursor is None else int(cursor.evicted.get(swa_type, 0))
                track = s.mamba_ping_pong_track_buffer
                sessions[sid] = SessionKv(
                    s.req_pool_idx, s.kv_committed_len, s.kv_allocated_len,
                    s.cache_protected_len, evicted, s.mamba_pool_idx,
                    None if track is None else tuple(track),
                )  # fmt: skip
        return SchedulerState(
            owners=[(r.rid, manager._glue(r).kv) for r in reqs if r.req_pool_idx is not None],
            idle=not any(
                r.req_pool_idx is not None or r.matched or r.mamba_pool_idx is not None
                for r in reqs
            ),
            sessions=sessions,
        )

    return SchedulerChecks(
        modules, tree=tree, allocator=tree.token_to_kv_pool_allocator,
        pool=tree.req_to_token_pool, page_size=config.page_size,
        swa=config.sliding_window is not None, mamba=config.mamba_slots is not None,
        state=state,
    )  # fmt: skip


def _said(exc: BaseException) -> str:
    """The check's message, or for a bare ``assert`` the failing line of SGLang's source."""
    text = str(exc)
    if text:
        return f"{type(exc).__name__}: {text}"
    frames = traceback.extract_tb(exc.__traceback__)
    line = frames[-1].line if frames else ""
    return f"{type(exc).__name__} at {line!r}"


__all__ = [
    "CHECKER_MODULE",
    "INVARIANT_ID",
    "OBSERVER_MODULE",
    "SchedulerChecks",
    "SchedulerState",
    "SessionKv",
    "glue_checks",
    "ships_checker",
]
