"""The lockstep driver: two memory managers driven through the same lifecycle, step by step.

:class:`Lockstep` runs one :class:`~kvpool.testing.swarm.Op` on implementation A (the reference)
and B (the candidate) and stops at the first of (in this order, so that a named invariant wins
over a bare difference when both fire):

1. ``crash``: an implementation raised something that is not a :class:`~kvpool.errors.KVPoolError`
   (or its ``snapshot()`` failed); an invariant id: a call raised
   :class:`~kvpool.errors.InvariantViolation` (an adapter's own check of the code it wraps,
   e.g. :func:`kvpool.sglang.glue.check_committed`);
2. an invariant id: :func:`kvpool.invariants.check_all` on B's then A's snapshot (with the
   previous snapshot, so monotonicity and KV integrity are checked too); under layer-wise
   loading (``PoolConfig.layerwise_loading``) first ``INV-LAYER-LOADED`` and the counters'
   equality (:mod:`kvpool.testing.layer_ops`, whose steps this driver runs);
   then each implementation's own checks, where it has them (``run_own_checks()``, e.g.
   SGLang's scheduler checker over its components: :mod:`kvpool.sglang.scheduler_checker`),
   whose :class:`~kvpool.errors.InvariantViolation` is reported under its id;
3. ``lockstep-diff``: different error classes, or different returned indices / sizes / matches
   (tensors compared after ``.tolist()``);
4. ``invalid-accepted``: a deliberately invalid call was accepted by both;
5. ``unchanged-on-error``: a refused call changed the state (``OutOfMemoryError`` may leave a
   match's split or access-time refresh, so the tree nodes are not compared there);
6. ``lockstep-diff``: the two snapshots differ (path of the first differing field is reported).

Failures raise :class:`LockstepFailure` whose message is the full report of
:mod:`kvpool.testing.report`.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from kvpool.config import PoolConfig
from kvpool.errors import InvariantViolation, KVPoolError, OutOfMemoryError
from kvpool.invariants import check_all
from kvpool.snapshot import PoolSnapshot
from kvpool.testing import report
from kvpool.testing.layer_ops import LAYER_OPS, LayerLoads
from kvpool.testing.swarm import Chooser, Op, View, advance_counters, make_view

Factory = Callable[[PoolConfig], Any]
"""Builds a memory manager (:class:`kvpool.protocols.MemoryManagerProtocol`) for a config."""

ConfigDrawer = Callable[[Chooser], PoolConfig]


class LockstepFailure(AssertionError):
    """The two implementations disagreed or one broke an invariant.

    ``detector`` is an invariant id or one of ``crash``, ``lockstep-diff``, ``invalid-accepted``,
    ``unchanged-on-error``; ``step`` is the 1-based failing step; ``indices`` the offending ones."""

    def __init__(self, detector: str, step: int, text: str, indices: tuple[int, ...] = ()) -> None:
        self.detector = detector
        self.step = step
        self.indices = indices
        super().__init__(text)


def _progress_view(s: PoolSnapshot) -> tuple[Any, ...]:
    """What a refused OOM call must leave unchanged: pools, sizes, requests and sessions."""
    return (
        s.allocator,
        s.req_to_token,
        s.tree.evictable_size,
        s.tree.protected_size,
        s.sessions,
        tuple(
            (
                r.rid,
                r.state,
                r.req_pool_idx,
                r.kv_committed_len,
                r.kv_allocated_len,
                r.is_chunked,
                r.row,
            )
            for r in s.reqs
        ),
    )


class Lockstep:
    """Implementations A and B built from one config, stepped together."""

    def __init__(
        self,
        factory_a: Factory,
        factory_b: Factory,
        config: PoolConfig,
        labels: tuple[str, str] = ("reference", "candidate"),
        check_every: int = 1,
        normalize: Callable[[PoolSnapshot], PoolSnapshot] | None = None,
    ) -> None:
        self.config = config
        self.normalize = normalize
        """Applied to both snapshots before they are compared (None: compared as they are);
        invariants always read the snapshots themselves."""
        self.labels = labels
        self.check_every = max(check_every, 1)
        """Snapshots, invariants and the snapshot comparison run every ``check_every`` steps
        (results and error classes are compared at every step). 1 for the harness; trace
        replays of long prompts may space them out."""
        self.a = factory_a(config)
        self.b = factory_b(config)
        self.layers = LayerLoads(self.a, self.b) if config.layerwise_loading else None
        """The layer steps' state (:mod:`kvpool.testing.layer_ops`) under layer-wise loading."""
        self.outcomes: list[tuple[Any, BaseException | None]] = []
        """A's result or error at each step: the trace's lines are rendered from them and
        :attr:`ops` only when a report needs them (:attr:`lines`)."""
        self.ops: list[Op] = []
        self.checks = 0
        self.next_rid = 1
        self.next_sid = 1
        self.prompts: dict[str, tuple[list[int], str | None]] = {}
        self.gone: list[str] = []
        """Requests that left A's table (finished or aborted): targets for invalid calls."""
        self.own_checks = [
            (label, check)
            for label, manager in ((labels[1], self.b), (labels[0], self.a))
            if callable(check := getattr(manager, "run_own_checks", None))
        ]
        """Each implementation's own checks (``run_own_checks()``: nothing, or
        InvariantViolation), run after kvpool's invariants at every checked step (B's first)."""
        self.snap_a: PoolSnapshot = self.a.snapshot()
        self.snap_b: PoolSnapshot = self.b.snapshot()
        self._were_equal = False
        """Whether :attr:`snap_a` equals :attr:`snap_b` as they are (False: not known)."""
        self._check(None, None)

    @property
    def lines(self) -> list[str]:
        """The trace so far, one line per step: the call and A's outcome."""
        return [
            report.format_step(i, op.render(), f"raises {type(err).__name__}" if err else
                               report.short(out))
            for i, (op, (out, err)) in enumerate(zip(self.ops, self.outcomes, strict=True), 1)
        ]  # fmt: skip

    def _comparable(self, snap: PoolSnapshot) -> PoolSnapshot:
        return snap if self.normalize is None else self.normalize(snap)

    def view(self) -> View:
        """The generator's view of the current state (from A's snapshot)."""
        view = make_view(self.config, self.snap_a, self.next_rid, self.next_sid)
        view.done.extend(self.gone[-4:])
        view.prompts = {
            r: self.prompts[r] for r in view.waiting + view.chunked if r in self.prompts
        }
        view.layers = self.layers
        return view

    def fail(self, detector: str, detail: str, indices: tuple[int, ...] = ()) -> LockstepFailure:
        """A :class:`LockstepFailure` carrying the full report."""
        snaps = [
            (label, self._fresh(manager, cached), self._pretty(manager))
            for label, manager, cached in (
                (self.labels[0], self.a, self.snap_a),
                (self.labels[1], self.b, self.snap_b),
            )
        ]
        text = report.build_report(detector, self.lines, detail, snaps, self.config)
        return LockstepFailure(detector, len(self.outcomes), text, indices)

    @staticmethod
    def _fresh(manager: Any, cached: PoolSnapshot) -> PoolSnapshot:
        """The state right now (the step may have changed it before failing)."""
        try:
            snap: PoolSnapshot = manager.snapshot()
        except Exception:  # a broken implementation: show the last good snapshot
            return cached
        return snap

    @staticmethod
    def _pretty(manager: Any) -> str | None:
        try:
            return str(manager.tree_cache.pretty_print())
        except Exception:  # the report must not fail on a broken tree
            return None

    def _check(
        self, prev_a: PoolSnapshot | None, prev_b: PoolSnapshot | None, same: bool = False
    ) -> None:
        """Invariants on B, then on A unless ``same`` (A's snapshot equals B's; the previous ones
        were equal or the last step would have failed): the checks are pure functions of
        (snapshot, previous), so equal inputs give the same verdict at half the cost."""
        sides = [(self.labels[1], self.snap_b, prev_b), (self.labels[0], self.snap_a, prev_a)]
        if same:
            sides = sides[:1]
        for label, snap, prev in sides:
            try:
                self.checks += check_all(snap, prev)
            except InvariantViolation as exc:
                raise self.fail(exc.invariant_id, f"{label}: {exc}", exc.indices) from exc
        self._run_own_checks()

    def _run_own_checks(self) -> None:
        for label, check in self.own_checks:
            try:
                check()
            except InvariantViolation as exc:
                raise self.fail(exc.invariant_id, f"{label}: {exc}", exc.indices) from exc
            except Exception as exc:  # its checks broke: a crash of that implementation
                raise self.fail("crash", f"{label}.run_own_checks() raised {exc!r}") from exc
            self.checks += 1

    def run(self, op: Op) -> Any:
        """Execute ``op`` on both, compare everything, check every invariant; returns A's result
        (normalized) or A's error instance (a refusal, a ``KVPoolError``, without its
        traceback: :func:`without_frames`)."""
        self.ops.append(op)
        out_a, err_a = self._call(op, self.a)
        out_b, err_b = self._call(op, self.b)
        self.outcomes.append((out_a, err_a))
        self.next_rid, self.next_sid = advance_counters(op, self.next_rid, self.next_sid)
        if op.name == "new_req" and err_a is None and not dict(op.kwargs).get("session_id"):
            self.prompts[op.args[0]] = (list(op.args[1]), dict(op.kwargs).get("extra_key"))
        for label, err in ((self.labels[0], err_a), (self.labels[1], err_b)):
            if err is not None and not isinstance(err, KVPoolError):
                raise self.fail("crash", f"{label} raised {type(err).__name__}: {err}") from err
            if isinstance(err, InvariantViolation):  # its own check (an adapter's) failed
                raise self.fail(err.invariant_id, f"{label}: {err}", err.indices) from err
        layer_problem = self.layers.check(self.labels) if self.layers is not None else None
        if layer_problem is not None:  # before the outcomes: a read that ran ahead is named
            raise self.fail(*layer_problem)
        if len(self.outcomes) % self.check_every:
            self._compare_outcomes(out_a, err_a, out_b, err_b)
            return err_a if err_a is not None else out_a
        prev_a, prev_b = self.snap_a, self.snap_b
        self.snap_a, self.snap_b = self._snapshot(self.a, 0), self._snapshot(self.b, 1)
        same = self._comparable(self.snap_a) == self._comparable(self.snap_b)
        # A step that changed nothing (a refused call, an empty eviction) keeps a state whose
        # invariants were checked at the previous step: skip re-checking it.
        kept = same and self.snap_b == prev_b
        if not kept:
            self._check(prev_a, prev_b, same)
        elif self.own_checks:  # what they read may lie outside the snapshot
            self._run_own_checks()
        # Both unchanged, without comparing A's two: A's now equals B's now, which equals B's
        # before, which equalled A's before (snapshots compared as they are).
        both_kept = kept and self._were_equal
        self._were_equal = same and self.normalize is None
        self._compare_outcomes(out_a, err_a, out_b, err_b)
        if op.expect_error and err_a is None:
            raise self.fail("invalid-accepted", "an invalid call was accepted by both")
        if len(self.snap_a.reqs) < len(prev_a.reqs) + (op.name == "new_req"):
            now = {r.rid for r in self.snap_a.reqs}
            self.gone.extend(r.rid for r in prev_a.reqs if r.rid not in now)
        if err_a is not None and not both_kept:
            self._check_unchanged(err_a, prev_a, prev_b)
        if not same:
            found = report.first_difference(
                self._comparable(self.snap_a), self._comparable(self.snap_b)
            )
            where = "?"
            if found is not None:
                path, va, vb = found
                where = f"{path}: {self.labels[0]}={va!r} {self.labels[1]}={vb!r}"
            raise self.fail("lockstep-diff", f"snapshots differ at {where}")
        return err_a if err_a is not None else out_a

    def _compare_outcomes(
        self, out_a: Any, err_a: BaseException | None, out_b: Any, err_b: BaseException | None
    ) -> None:
        """Same error class, same normalized result, else ``lockstep-diff``."""
        if type(err_a) is not type(err_b):
            raise self.fail(
                "lockstep-diff",
                f"{self.labels[0]} -> {type(err_a).__name__}: "
                f"{err_a}; {self.labels[1]} -> {type(err_b).__name__}: {err_b}",
            )
        if out_a != out_b:
            raise self.fail(
                "lockstep-diff",
                f"results differ: {self.labels[0]} -> "
                f"{report.short(out_a, 64)}; {self.labels[1]} -> "
                f"{report.short(out_b, 64)}",
                _differing(out_a, out_b),
            )

    def _snapshot(self, manager: Any, side: int) -> PoolSnapshot:
        try:
            snap: PoolSnapshot = manager.snapshot()
        except Exception as exc:
            raise self.fail("crash", f"{self.labels[side]}.snapshot() raised {exc!r}") from exc
        return snap

    def _call(self, op: Op, manager: Any) -> tuple[Any, BaseException | None]:
        try:
            if self.layers is not None and op.name in LAYER_OPS:
                return report.normalize(self.layers.call(op, manager)), None
            return report.normalize(op.call(manager)), None
        except KVPoolError as exc:
            return None, without_frames(exc)
        except Exception as exc:  # a crash: its traceback goes into the report
            return None, exc

    def _check_unchanged(
        self, err: BaseException, prev_a: PoolSnapshot, prev_b: PoolSnapshot
    ) -> None:
        oom = isinstance(err, OutOfMemoryError)
        for label, prev, now in (
            (self.labels[1], prev_b, self.snap_b),
            (self.labels[0], prev_a, self.snap_a),
        ):
            same = _progress_view(prev) == _progress_view(now) if oom else prev == now
            if not same:
                found = report.first_difference(prev, now)
                where = f" at {found[0]}: {found[1]!r} -> {found[2]!r}" if found else ""
                raise self.fail(
                    "unchanged-on-error",
                    f"{label} changed state while raising {type(err).__name__}{where}",
                )


def without_frames(exc: KVPoolError) -> KVPoolError:
    """``exc`` (and the exceptions chained to it) without tracebacks. A refusal is compared by
    class and message only, and its traceback holds the raising frames, this driver's among
    them, which hold the exception again: a reference cycle per refused step that kept the
    whole run alive until the cyclic collector walked it."""
    seen: BaseException | None = exc
    while seen is not None and seen.__traceback__ is not None:
        seen.__traceback__ = None
        seen = seen.__cause__ or seen.__context__
    return exc


def _differing(a: Any, b: Any) -> tuple[int, ...]:
    """Positions where two flat result lists differ (empty when not comparable)."""
    if isinstance(a, list) and isinstance(b, list):
        return tuple(i for i, (x, y) in enumerate(zip(a, b, strict=False)) if x != y)
    return ()
