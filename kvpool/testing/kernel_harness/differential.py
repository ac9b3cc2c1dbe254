"""The kernel differential harness: check any candidate kernel against kvpool's reference.

``check_kernel(candidate, "alloc_extend")`` draws valid inputs with hypothesis
(:mod:`~kvpool.testing.kernel_harness.inputs`), runs the candidate on tensors
(:mod:`~kvpool.testing.kernel_harness.ops`), compares every output with the pure-Python
reference, and returns a :class:`KernelReport`. On a difference hypothesis shrinks the input,
then every request whose removal keeps the same kind of failure is dropped (:func:`drop_request`;
hypothesis' shrinker may stop at a batch that still carries requests irrelevant to the bug), so
the report shows the SMALLEST failing input it found, printed per request (row, P, S,
last_loc, the free pages), with the first differing position, expected against got, and for the
allocation ops the free-list effect (which free-list positions the candidate's pages came from,
and pages that are not the request's own). ``assert_kernel_matches`` is the pytest form.

Contract checked per input:

- enough free pages: outputs equal the reference's; nothing written past an output; no input
  modified; no exception;
- not enough free pages (allocation ops, ``short_free_lists`` not ``"off"``): the caller must
  check capacity first and discard the output, so the output's content is free and raising (a
  host-side refusal) is allowed, but the candidate must still write nowhere else and modify no
  input. ``"lenient"`` (default) keeps at least one free page and backs ``free_pages`` with
  poison padding, so reading past its end is tolerated; ``"strict"`` passes the exact tensor
  (an empty one has a null pointer) so that, with ``checked=True``, such a read is an
  out-of-bounds access, as it would be on a GPU;
- ``checked=True``: every call runs inside
  :func:`~kvpool.testing.kernel_harness.interpreter.checked_interpreter` (with
  ``shuffle_seeds`` to test program order), so out-of-bounds accesses, failed device asserts
  and order dependence are failures too. The candidate must launch its Triton kernels through
  the interpreter (``backend="interpret"`` for kvpool's own kernels).
"""

from __future__ import annotations

import contextlib
import dataclasses
from collections import Counter
from collections.abc import Callable, Sequence
from typing import Any

from hypothesis import HealthCheck, given, seed, settings
from hypothesis.reporting import with_reporter

from kvpool.constants import (
    SHORT_FREE_LIST_MODES,
    SUPPORTED_PAGE_SIZES_TESTED,
    ceil_align,
    ceil_div,
)
from kvpool.errors import InvalidArgumentError
from kvpool.reference.pools.paged_ops import extend_new_pages
from kvpool.testing.kernel_harness.inputs import (
    ALLOC_OPS,
    INDEX_OPS,
    OPS,
    KernelCase,
    kernel_cases,
)
from kvpool.testing.kernel_harness.interpreter import KernelCheckFailure, checked_interpreter
from kvpool.testing.kernel_harness.ops import Candidate, Run, expected_outputs, run_candidate

SHORT_MODES: tuple[str, ...] = SHORT_FREE_LIST_MODES
"""Values of ``short_free_lists`` (see the module docstring)."""

_SHOWN = 16  # list elements printed before eliding


def _short(values: Sequence[int]) -> str:
    if len(values) <= _SHOWN:
        return str(list(values))
    return f"{list(values[:_SHOWN])[:-1]} ... ({len(values)} in all, last {values[-1]})"


def describe_case(case: KernelCase) -> str:
    """A readable multi-line rendering of ``case``."""
    ps = case.page_size
    lines = [f"op={case.op} page_size={ps} batch={case.batch_size} pool pages={case.num_pages}"]
    if case.op in (*ALLOC_OPS, "write_req_to_token"):
        lines.append(
            f"free_pages ({len(case.free_pages)}, {case.pages_needed} needed): "
            f"{_short(case.free_pages)}"
        )
    lasts = case.last_loc if case.op in (*ALLOC_OPS, "write_req_to_token") else None
    for b, (row, held) in enumerate(zip(case.rows, case.held, strict=True)):
        parts = [f"  req {b}: row {row}, holds {len(held)} tokens"]
        if case.prefix_lens:
            parts.append(f"P={case.prefix_lens[b]}")
        if case.seq_lens:
            parts.append(f"S={case.seq_lens[b]}")
        if lasts is not None:
            parts.append(f"last_loc={lasts[b]}")
        if case.kv_lens:
            start = 0 if case.kv_start is None else case.kv_start[b]
            parts.append(f"kv_start={start} len={case.kv_lens[b]}")
        lines.append(" ".join(parts) + f" (pages {_short(sorted({s // ps for s in held}))})")
    if case.op in INDEX_OPS:
        lines.append(f"kv_start_idx={'None' if case.kv_start is None else 'given'}")
    if case.v2p is not None:
        lines.append(f"v2p ({len(case.v2p)} virtual pages): {_short(case.v2p)}")
    return "\n".join(lines)


def _first_difference(name: str, want: list[int], got: list[int]) -> str | None:
    if want == got:
        return None
    if len(want) != len(got):
        return f"{name}: expected {len(want)} elements, got {len(got)}"
    k = next(i for i, (a, b) in enumerate(zip(want, got, strict=True)) if a != b)
    lo = max(0, k - 2)
    return (
        f"{name}: first difference at position {k}: expected {want[k]}, got {got[k]}\n"
        f"  expected[{lo}:{k + 6}] = {want[lo : k + 6]}\n"
        f"  got     [{lo}:{k + 6}] = {got[lo : k + 6]}"
    )


def free_list_effect(case: KernelCase, got: list[int]) -> str:
    """For the allocation ops: where the candidate's pages came from, against the reference
    (which consumes the head ``free_pages[:pages_needed]`` in batch order)."""
    ps = case.page_size
    position = {p: i for i, p in enumerate(case.free_pages)}
    want = expected_outputs(case)["out_indices"]
    lines = [f"  reference consumes free_pages[0:{case.pages_needed}]"]
    used = sorted({position[s // ps] for s in got if s // ps in position})
    lines.append(f"  candidate's slots use free-list positions {_short(used)}")
    foreign = sorted({s // ps for s in got if s // ps not in position} - {w // ps for w in want})
    if foreign:
        lines.append(f"  and pages not in the free list: {_short(foreign)}")
    # Pages each request writes that the reference gives to no slot of that request.
    per_req = (
        [s - p for p, s in zip(case.prefix_lens, case.seq_lens, strict=True)]
        if case.prefix_lens
        else [1] * case.batch_size
    )
    at = 0
    for b, n in enumerate(per_req):
        own = {w // ps for w in want[at : at + n]}
        stray = sorted({g // ps for g in got[at : at + n]} - own)
        if stray:
            mine = _short(sorted(own))
            lines.append(f"  req {b} writes slots in pages {_short(stray)}, not its own {mine}")
        at += n
    return "\n".join(lines)


@dataclasses.dataclass(frozen=True)
class KernelFailure:
    """The smallest failing input found, and what went wrong on it."""

    kind: str  # mismatch|wrote-outside|exception|out-of-bounds|device-assert|order-dependence
    case: KernelCase
    detail: str

    def render(self) -> str:
        return f"[{self.kind}]\n{describe_case(self.case)}\n{self.detail}"


@dataclasses.dataclass(frozen=True)
class KernelReport:
    """The verdict of :func:`check_kernel`: inputs tried, edges covered, the failure if any."""

    op: str
    examples: int
    edges: dict[str, int]
    failure: KernelFailure | None

    @property
    def passed(self) -> bool:
        return self.failure is None

    def render(self) -> str:
        edges = ", ".join(f"{k} {v}" for k, v in sorted(self.edges.items()))
        if self.failure is None:
            return (
                f"PASS {self.op}: {self.examples} inputs agree with the reference\n  edges: {edges}"
            )
        return f"FAIL {self.op} (after {self.examples} inputs)\n{self.failure.render()}"


class _CaseFailed(Exception):
    def __init__(self, failure: KernelFailure) -> None:
        super().__init__(failure.render())
        self.failure = failure


def _judge(case: KernelCase, run: Run) -> KernelFailure | None:
    if run.problems:
        return KernelFailure("wrote-outside", case, "\n".join(run.problems))
    if case.short:
        return None
    for name, want in expected_outputs(case).items():
        diff = _first_difference(name, want, run.outputs.get(name, []))
        if diff is not None:
            if case.op in ALLOC_OPS:
                diff += "\nfree-list effect:\n" + free_list_effect(case, run.outputs[name])
            return KernelFailure("mismatch", case, diff)
    return None


_KINDS = {
    "OutOfBoundsAccess": "out-of-bounds",
    "DeviceAssertFailure": "device-assert",
    "OrderDependence": "order-dependence",
}


def check_case(
    candidate: Candidate,
    case: KernelCase,
    *,
    checked: bool = False,
    shuffle_seeds: Sequence[int] = (),
    device: str = "cpu",
    short_free_lists: str = "lenient",
) -> KernelFailure | None:
    """Run ``candidate`` on one input and judge it (None when it behaves)."""
    ctx = checked_interpreter(shuffle_seeds) if checked else contextlib.nullcontext()
    try:
        with ctx:
            run = run_candidate(candidate, case, device, pad_short=short_free_lists != "strict")
    except KernelCheckFailure as exc:
        kind = _KINDS.get(type(exc).__name__, "checked-interpreter")
        return KernelFailure(kind, case, f"{type(exc).__name__}: {exc}")
    except Exception as exc:
        if case.short:
            return None  # a host-side refusal of a batch that does not fit is harmless
        return KernelFailure("exception", case, f"{type(exc).__name__}: {exc}")
    return _judge(case, run)


_PER_REQUEST = ("rows", "held", "prefix_lens", "seq_lens", "kv_start", "kv_lens")
"""The :class:`KernelCase` fields with one entry per request (the others are per pool)."""


def drop_request(case: KernelCase, index: int) -> KernelCase:
    """``case`` without request ``index`` (a valid input again: the pool, its free pages and the
    other requests unchanged; the dropped request's slots stay held, by no request read here)."""
    changes: dict[str, Any] = {}
    for name in _PER_REQUEST:
        values = getattr(case, name)
        if values is not None and len(values) == case.batch_size:
            changes[name] = values[:index] + values[index + 1 :]
    return dataclasses.replace(case, **changes)


def fewer_requests(
    failure: KernelFailure, judge: Callable[[KernelCase], KernelFailure | None]
) -> KernelFailure:
    """``failure`` on the fewest requests: greedily drop each request whose removal still fails
    with the same kind (``judge`` runs the candidate on a case), last request first."""
    changed = True
    while changed and failure.case.batch_size > 1:
        changed = False
        for i in reversed(range(failure.case.batch_size)):
            found = judge(drop_request(failure.case, i))
            if found is not None and found.kind == failure.kind:
                failure, changed = found, True
                break
    return failure


def edge_examples(op: str, page_sizes: Sequence[int]) -> list[KernelCase]:
    """Hand-built inputs run first on every check of the extend-shaped ops, at the largest page
    size: a prefix ending mid-page extended over several pages plus a tail, an extension that
    fits in its prefix's partial page, and an empty prefix extended by 1200+ tokens to a page
    boundary. The free list is in descending page order."""
    if op not in ("alloc_extend", "write_req_to_token"):
        return []
    ps = max(page_sizes)
    p0 = ps // 2 + 1 if ps > 1 else 1
    p1 = 1
    s0 = ceil_align(p0, ps) + 2 * ps + 1
    s1 = min(ps, p1 + 1) if ps > 1 else p1
    s2 = ceil_align(1200, ps)
    prefix = [ceil_div(p0, ps), ceil_div(p1, ps)]
    need = sum(extend_new_pages(p, s, ps) for p, s in ((p0, s0), (p1, s1), (0, s2)))
    num_pages = sum(prefix) + need + 2
    held0 = tuple(ps + t for t in range(p0)) if ps > 1 else (1,)  # pages 1.. in order
    first1 = 1 + prefix[0]
    held1 = tuple(first1 * ps + t for t in range(p1))
    free = tuple(range(num_pages, first1, -1))
    return [
        KernelCase(op, ps, num_pages, (1, 2, 3), (held0, held1, ()), free, (p0, p1, 0),
                   (s0, s1, s2), width=s2 + 1, num_rows=4)
    ]  # fmt: skip


def check_kernel(
    candidate: Candidate,
    op: str = "alloc_extend",
    *,
    max_examples: int = 100,
    seed_value: int = 0,
    page_sizes: Sequence[int] = SUPPORTED_PAGE_SIZES_TESTED,
    max_batch: int = 32,
    max_tokens: int = 4096,
    short_free_lists: str = "lenient",
    checked: bool = False,
    shuffle_seeds: Sequence[int] = (),
    device: str = "cpu",
) -> KernelReport:
    """Check ``candidate`` (signature of ``kvpool.kernels.<op>`` minus ``backend``) on
    ``max_examples`` generated inputs (deterministic for a given ``seed_value``). Lengths are
    tokens; ``max_tokens`` bounds one request's extension. See the module docstring."""
    if op not in OPS:
        raise InvalidArgumentError(f"unknown kernel op {op!r}; known: {OPS}")
    if short_free_lists not in SHORT_MODES:
        raise InvalidArgumentError(f"short_free_lists must be one of {SHORT_MODES}")
    tried = 0
    edges: Counter[str] = Counter()
    strategy = kernel_cases(op, tuple(page_sizes), max_batch, max_tokens, short_free_lists)

    def body(case: KernelCase) -> None:
        nonlocal tried
        tried += 1
        edges.update(case.edges())
        failure = check_case(
            candidate,
            case,
            checked=checked,
            shuffle_seeds=shuffle_seeds,
            device=device,
            short_free_lists=short_free_lists,
        )
        if failure is not None:
            raise _CaseFailed(failure)

    test = settings(
        max_examples=max_examples,
        deadline=None,
        database=None,
        derandomize=False,
        report_multiple_bugs=False,
        print_blob=False,
        suppress_health_check=list(HealthCheck),
    )(seed(seed_value)(given(strategy)(body)))
    try:
        with with_reporter(lambda _msg: None):
            test()
        # The hand-built edges run after the generated inputs pass (a failure found there is
        # already small; one found by generation is shrunk first).
        for case in edge_examples(op, page_sizes):
            body(case)
    except _CaseFailed as exc:
        failure = fewer_requests(exc.failure, lambda case: check_case(
            candidate, case, checked=checked, shuffle_seeds=shuffle_seeds, device=device,
            short_free_lists=short_free_lists))  # fmt: skip
        return KernelReport(op, tried, dict(edges), failure)
    return KernelReport(op, tried, dict(edges), None)


def assert_kernel_matches(
    candidate: Candidate, op: str = "alloc_extend", **options: Any
) -> KernelReport:
    """:func:`check_kernel`, raising ``AssertionError`` with the rendered failure."""
    report = check_kernel(candidate, op, **options)
    if report.failure is not None:
        raise AssertionError(report.render())
    return report
