"""SGLang's own scheduler pool checks, run over a glue manager after every lifecycle step.

SGLang 0.5.23's scheduler ships the checks behind the field's most reported crash ("Full Pool
Mem Leak Detected!", "req_to_token_pool memory leak detected!"):
``managers/scheduler_components/invariant_checker.py``'s ``SchedulerInvariantChecker`` over
``pool_stats_observer.py``'s ``SchedulerPoolStatsObserver``. :class:`SchedulerChecks` builds
both, SGLang's own code loaded from the wheel, over the components a glue manager
(:class:`~kvpool.sglang.glue_manager.SGLangGlueManager`) drives, and runs, at every step:

- the busy check (``self_check_during_busy``: per pool, ``available + evictable + protected +
  session_held + uncached == total``, the uncached part counted from the requests that own rows);
- the KV page check (``_check_kv_page_invariants``, off by default in a server:
  ``SGLANG_CHECK_KV_PAGE_INVARIANTS``): no owned page is free, no page is free twice;
- when no request holds anything (a row, a matched prefix's lock, a Mamba slot its match
  copied into: SGLang's scheduler gives such a slot back when the request is not admitted),
  the idle checks (what ``on_idle`` runs): every pool's equation with nothing uncached
  (``_check_all_pools``), the request-row pool (``_check_req_pool``) and, when no session holds
  a row either, the tree's own sanity check (``_check_tree_cache``, on in SGLang's CI: leaf
  sets, LRU lists, sizes, locks; run for a FULL tree too, see :meth:`SchedulerChecks._check_tree`).

What the scheduler would hand the checker, kvpool's lifecycle hands it: the batch is every
request holding a row (SGLang's ``req.kv`` view of each: :mod:`kvpool.sglang.glue`), and the
tree's ``session_records()`` are kvpool's sessions that hold a finished turn's row (kvpool's
lifecycle, not SGLang's tree, keeps sessions on this path).

A check that fails raises :class:`~kvpool.errors.InvariantViolation` ``SGL-SCHEDULER-CHECK``
with SGLang's message. The lockstep driver runs it after kvpool's own invariants
(``run_own_checks``): a state kvpool's invariants pass but SGLang's checker rejects is either a
check kvpool lacks or a false alarm of SGLang's.
"""

from __future__ import annotations

import traceback
from collections import Counter
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
    search on this path)."""

    rid: str
    kv: Any
    beam_group: None = None


@dataclass(frozen=True)
class _Batch:
    reqs: list[_Owner]


class _SchedulerTree:
    """SGLang's tree cache as the checker reads it, with kvpool's sessions as its
    ``session_records()``; every other attribute is the tree's own."""

    def __init__(self, tree: Any, sessions: dict[str, SessionKv], counts: Counter[str]) -> None:
        self._tree = tree
        self._sessions = sessions
        self._counts = counts

    def session_records(self) -> dict[str, SessionKv]:
        return dict(self._sessions)

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
    """SGLang's scheduler checker over ``manager``'s SGLang components (module docstring).
    ``manager`` is a glue manager of a release that ships the checker (:func:`ships_checker`)."""

    def __init__(self, manager: Any, modules: SGLangModules) -> None:
        self.manager = manager
        config = manager.config
        tree: Any = manager.tree_cache.impl
        allocator = tree.token_to_kv_pool_allocator
        pool = tree.req_to_token_pool
        self.swa = config.sliding_window is not None
        self._swa_type = modules.attr(
            "sglang.srt.mem_cache.unified_cache.component_type", "ComponentType"
        ).SWA
        self.mamba = config.mamba_slots is not None
        self._sessions: dict[str, SessionKv] = {}
        self._owners: list[_Owner] = []
        self._idle = True
        envs = modules.module("sglang.srt.environ").envs
        self._sanity = envs.SGLANG_ENABLE_TREE_CACHE_SANITY_CHECK
        """The switch of the tree's sanity check (on in SGLang's CI, off in a server), turned
        on for each idle check."""
        self.counts: Counter[str] = Counter()
        """Checks passed so far: ``scheduler_checker.busy``, ``.kv_pages``, ``.idle`` and
        ``.tree`` (the glue manager's coverage counters, reported as ``sglang:`` tags)."""
        view = _SchedulerTree(tree, self._sessions, self.counts)
        full = swa = None
        if self.swa:
            full, swa = allocator.size_full, allocator.size_swa
        observer = modules.module(OBSERVER_MODULE).SchedulerPoolStatsObserver(
            tree_cache=view, token_to_kv_pool_allocator=allocator, req_to_token_pool=pool,
            session_controller=None, hisparse_coordinator=None, is_hybrid_swa=self.swa,
            is_hybrid_ssm=self.mamba, enable_hisparse=False, full_tokens_per_layer=full,
            swa_tokens_per_layer=swa, max_total_num_tokens=allocator.size,
        )  # fmt: skip
        self.observer = observer
        self.checker = modules.module(CHECKER_MODULE).SchedulerInvariantChecker(
            is_hybrid_swa=self.swa, is_hybrid_ssm=self.mamba, disaggregation_mode=None,
            page_size=config.page_size, full_tokens_per_layer=full, swa_tokens_per_layer=swa,
            max_total_num_tokens=allocator.size, tree_cache=view,
            token_to_kv_pool_allocator=allocator, req_to_token_pool=pool,
            pool_stats_observer=observer, get_last_batch=lambda: _Batch(self._owners),
            get_running_batch=lambda: None, scheduler_stage_metrics=None,
        )  # fmt: skip

    def _gather(self) -> None:
        """The batch, the session records and whether the scheduler would be idle, read from
        kvpool's lifecycle now."""
        mm = self.manager
        # the idle checks count no request's part (module docstring)
        self._idle = not any(
            r.req_pool_idx is not None or r.matched or r.mamba_pool_idx is not None
            for r in mm.reqs.values()
        )
        self._owners[:] = [
            _Owner(r.rid, mm._glue(r).kv) for r in mm.reqs.values() if r.req_pool_idx is not None
        ]
        # an SWA glue manager keeps each session's SGLang window cursor (SWAReqState)
        cursors = getattr(mm, "_session_swa", {})
        self._sessions.clear()
        for sid, s in mm.sessions.items():
            if s.req_pool_idx is not None:
                state = cursors.get(sid)
                evicted = 0 if state is None else int(state.evicted.get(self._swa_type, 0))
                track = s.mamba_ping_pong_track_buffer
                self._sessions[sid] = SessionKv(
                    s.req_pool_idx, s.kv_committed_len, s.kv_allocated_len,
                    s.cache_protected_len, evicted, s.mamba_pool_idx,
                    None if track is None else tuple(track),
                )  # fmt: skip

    def run(self) -> None:
        """Every check (module docstring) on the state now, each counted in :attr:`counts`
        once passed.
        InvariantViolation ``SGL-SCHEDULER-CHECK`` with SGLang's message when one fails."""
        self._gather()
        checker, counts = self.checker, self.counts
        try:
            checker.self_check_during_busy()
            counts["scheduler_checker.busy"] += 1
            checker._check_kv_page_invariants()
            counts["scheduler_checker.kv_pages"] += 1
            if self._idle:
                leak, messages = checker._check_all_pools(self.observer.get_pool_stats())
                if leak:
                    checker._report_leak("pool", "\n".join(messages))
                checker._check_req_pool()
                counts["scheduler_checker.idle"] += 1
                # the tree's own sanity check asserts that no node is locked at idle, which a
                # session holding its prefix breaks by design (SGLang skips it then too)
                if not self._sessions:
                    self._check_tree()
        except (AssertionError, ValueError) as exc:
            said = f"SGLang's scheduler checker: {_said(exc)}"
            raise InvariantViolation(INVARIANT_ID, said) from exc

    def _check_tree(self) -> None:
        """The tree's sanity check: through the scheduler's ``_check_tree_cache`` (a hybrid
        tree's), else directly (the scheduler leaves a FULL tree's out; its invariants hold for
        any tree that shares prefixes). A tree without one (the legacy ``RadixCache``) is
        skipped."""
        view = self.checker.tree_cache
        before = self.counts["scheduler_checker.tree"]
        with self._sanity.override(True):
            self.checker._check_tree_cache()
        if self.counts["scheduler_checker.tree"] > before:
            return
        if hasattr(view._tree, "sanity_check") and view.supports_prefix_sharing():
            view.sanity_check()


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
    "SessionKv",
    "ships_checker",
]
