"""The kernel differential harness passes correct candidates and finds each seeded bug, reporting
a small input that shows it (hypothesis shrinks it)."""

from __future__ import annotations

from collections.abc import Callable
from functools import partial
from typing import Any

import pytest

from kvpool import kernels
from kvpool.errors import InvalidArgumentError
from kvpool.testing.kernel_harness.differential import (
    KernelFailure,
    KernelReport,
    assert_kernel_matches,
    check_kernel,
    fewer_requests,
)
from kvpool.testing.kernel_harness.inputs import OPS, KernelCase
from tests.kernels import candidates as C

FAST: dict[str, Any] = {"max_examples": 40, "max_tokens": 256, "max_batch": 8}


def _fails(candidate: Callable[..., Any], op: str, **options: Any) -> KernelReport:
    report = check_kernel(candidate, op, **{**FAST, **options})
    assert not report.passed, report.render()
    assert report.failure is not None
    return report


@pytest.mark.slow
@pytest.mark.parametrize("op", OPS)
def test_kvpool_torch_kernels_pass(op: str) -> None:
    report = check_kernel(partial(getattr(kernels, op), backend="torch"), op, **FAST)
    assert report.passed, report.render()
    assert report.examples >= FAST["max_examples"]


def test_correct_candidate_passes_and_covers_the_edges() -> None:
    report = assert_kernel_matches(C.alloc_extend_ok, "alloc_extend", max_examples=80)
    for edge in (
        "empty prefix",
        "prefix ends mid-page",
        "extension fits in the partial page",
        "ends on a page boundary",
        "extend of 1000+ tokens",
        "batch size 1",
        "not enough free pages",
    ):
        assert report.edges.get(edge, 0) > 0, (edge, report.edges)
    assert report.render().startswith("PASS alloc_extend")


@pytest.mark.slow
def test_tail_in_wrong_page_shrinks_to_one_request() -> None:
    failure = _fails(C.alloc_extend_tail_in_first_page, "alloc_extend").failure
    assert failure is not None and failure.kind == "mismatch"
    case = failure.case
    assert case.batch_size == 1
    # The bug needs two new pages and a tail: S just past one full page after the prefix.
    assert case.seq_lens[0] % case.page_size != 0
    assert "first difference at position" in failure.detail
    assert "free-list effect" in failure.detail


@pytest.mark.slow
def test_shared_page_cursor_is_shown_in_the_free_list_effect() -> None:
    failure = _fails(C.alloc_extend_shared_cursor, "alloc_extend").failure
    assert failure is not None and failure.kind == "mismatch"
    assert failure.case.batch_size == 2
    assert "req 1 writes slots in pages" in failure.detail
    rendered = failure.render()
    assert "req 0:" in rendered and "req 1:" in rendered and "free_pages" in rendered


def test_ignoring_the_partial_page_needs_a_mid_page_prefix() -> None:
    failure = _fails(C.alloc_extend_ignores_partial_page, "alloc_extend").failure
    assert failure is not None
    ps = failure.case.page_size
    assert any(p % ps for p in failure.case.prefix_lens)


def test_store_past_the_output_is_reported() -> None:
    failure = _fails(C.alloc_extend_past_end, "alloc_extend").failure
    assert failure is not None and failure.kind == "wrote-outside"
    assert "wrote past the end of out_indices" in failure.detail


@pytest.mark.slow
@pytest.mark.parametrize(
    ("candidate", "op"),
    [
        (C.alloc_decode_wrong_condition, "alloc_decode"),
        (C.write_req_to_token_skips_prefix, "write_req_to_token"),
        (C.get_last_loc_off_by_one, "get_last_loc"),
        (C.flashinfer_ignores_start, "create_flashinfer_kv_indices"),
        (C.flashmla_last_page_dropped, "create_flashmla_kv_indices"),
        (C.flashmla_v2p_ignored, "create_flashmla_kv_indices_v2p"),
        (C.flashmla_v2p_freed_unclamped, "create_flashmla_kv_indices_v2p"),
    ],
)
def test_each_op_bug_is_found_on_one_request(candidate: Callable[..., Any], op: str) -> None:
    failure = _fails(candidate, op).failure
    assert failure is not None and failure.kind in ("mismatch", "exception")
    assert failure.case.batch_size == 1


@pytest.mark.slow
def test_flashinfer_bug_needs_a_start_and_flashmla_bug_a_partial_page() -> None:
    fi = _fails(C.flashinfer_ignores_start, "create_flashinfer_kv_indices").failure
    assert fi is not None and fi.case.kv_start is not None and any(fi.case.kv_start)
    mla = _fails(C.flashmla_last_page_dropped, "create_flashmla_kv_indices").failure
    assert mla is not None and any(n % mla.case.page_size for n in mla.case.kv_lens)


def test_assert_kernel_matches_raises_with_the_rendered_failure() -> None:
    with pytest.raises(AssertionError, match="FAIL write_req_to_token"):
        assert_kernel_matches(C.write_req_to_token_skips_prefix, "write_req_to_token", **FAST)


def test_unknown_op_and_short_mode_are_refused() -> None:
    with pytest.raises(InvalidArgumentError):
        check_kernel(C.alloc_extend_ok, "alloc_everything")
    with pytest.raises(InvalidArgumentError):
        check_kernel(C.alloc_extend_ok, "alloc_extend", short_free_lists="sometimes")


def test_same_seed_same_verdict() -> None:
    a = check_kernel(C.get_last_loc_off_by_one, "get_last_loc", seed_value=3, **FAST)
    b = check_kernel(C.get_last_loc_off_by_one, "get_last_loc", seed_value=3, **FAST)
    assert a.failure is not None and b.failure is not None
    assert a.failure.case == b.failure.case and a.examples == b.examples


def test_fewer_requests_keeps_only_the_requests_the_failure_needs() -> None:
    case = KernelCase("create_flashinfer_kv_indices", 1, 8, rows=(1, 2, 3),
                      held=((1,), (2,), (3,)), free_pages=(), kv_lens=(1, 1, 1), width=2,
                      num_rows=4)  # fmt: skip

    def judge(c: KernelCase) -> KernelFailure | None:  # the bug needs request row 2 only
        return KernelFailure("mismatch", c, "") if 2 in c.rows else None

    out = fewer_requests(KernelFailure("mismatch", case, "found"), judge)
    assert (out.case.rows, out.case.held, out.case.kv_lens) == ((2,), ((2,),), (1,))
    assert out.case.free_pages == case.free_pages and out.case.num_pages == case.num_pages
    other_kind = fewer_requests(KernelFailure("exception", case, ""), judge)
    assert other_kind.case == case  # a drop that fails another way is not the same bug
