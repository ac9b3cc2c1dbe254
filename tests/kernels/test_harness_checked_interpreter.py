"""The checked Triton interpreter catches out-of-bounds accesses, failed device asserts and
program-order dependence on tiny purpose-written kernels, and passes correct kernels."""

from __future__ import annotations

from functools import partial
from typing import Any

import pytest
import torch
import triton
import triton.language as tl
import triton.runtime.interpreter as interp

from kvpool import kernels
from kvpool.errors import KernelError
from kvpool.testing.kernel_harness.differential import check_kernel
from kvpool.testing.kernel_harness.inputs import OPS
from kvpool.testing.kernel_harness.interpreted import interpreted
from kvpool.testing.kernel_harness.interpreter import (
    DeviceAssertFailure,
    OrderDependence,
    OutOfBoundsAccess,
    allow_access,
    checked_interpreter,
    run_checked,
)
from tests.kernels import candidates as C


def _fill(x, n, BLOCK: tl.constexpr, SLACK: tl.constexpr):  # type: ignore[no-untyped-def]
    offs = tl.arange(0, BLOCK)
    tl.store(x + offs, offs * 2, mask=offs < n + SLACK)  # SLACK = 1: off-by-one past the end


def _check_positive(x):  # type: ignore[no-untyped-def]
    v = tl.load(x + tl.program_id(0))
    tl.device_assert(v > 0, "value must be positive")


def _last_writer_wins(x):  # type: ignore[no-untyped-def]
    tl.store(x, tl.program_id(0))


def _bump(x):  # type: ignore[no-untyped-def]
    v = tl.load(x)  # non-atomic read-modify-write: a race between programs
    tl.store(x, v + 1)


def _bump_atomic(x):  # type: ignore[no-untyped-def]
    tl.atomic_add(x, 1)


def _wild_load(x, out, OFFSET: tl.constexpr):  # type: ignore[no-untyped-def]
    tl.store(out, tl.load(x + OFFSET))


def _gather(x, out):  # type: ignore[no-untyped-def]
    # x holds an address loaded from memory: memory the arguments do not cover.
    ptr = tl.load(x).to(tl.pointer_type(tl.int64))
    tl.store(out, tl.load(ptr + 1))


def test_off_by_one_store_is_reported_not_written() -> None:
    x = torch.zeros(5, dtype=torch.int32)
    with (
        pytest.raises(
            OutOfBoundsAccess, match=r"store of element 5 of 'x' \(valid elements: 0..4\)"
        ),
        checked_interpreter(),
    ):
        interpreted(_fill)[(1,)](x, 5, BLOCK=8, SLACK=1)
    assert x.tolist() == [0] * 5  # the launch was abandoned: its copy never came back


def test_correct_masked_kernel_passes_and_writes_back() -> None:
    x = torch.zeros(5, dtype=torch.int32)
    with checked_interpreter(shuffle_seeds=(0, 1)):
        interpreted(_fill)[(1,)](x, 5, BLOCK=8, SLACK=0)
    assert x.tolist() == [0, 2, 4, 6, 8]


def test_wild_pointer_is_reported_without_crashing() -> None:
    x = torch.zeros(4, dtype=torch.int64)
    out = torch.zeros(1, dtype=torch.int64)
    with pytest.raises(OutOfBoundsAccess, match="load of"):
        run_checked(interpreted(_wild_load)[(1,)], x, out, OFFSET=1 << 40)


def test_device_assert_fails_with_the_program() -> None:
    x = torch.tensor([3, 1, -2, 5], dtype=torch.int64)
    failed = pytest.raises(DeviceAssertFailure, match=r"program \(2, 0, 0\).*must be positive")
    with failed, checked_interpreter():
        interpreted(_check_positive)[(4,)](x)
    with checked_interpreter():
        interpreted(_check_positive)[(4,)](torch.tensor([3, 1, 2, 5], dtype=torch.int64))


def test_order_dependence_is_caught_by_shuffling() -> None:
    x = torch.zeros(1, dtype=torch.int64)
    shuffled = checked_interpreter(shuffle_seeds=(0, 1, 2), check_races=False)
    with pytest.raises(OrderDependence, match="shuffle seed"), shuffled:
        interpreted(_last_writer_wins)[(8,)](x)
    with pytest.raises(OrderDependence, match="store different values"), checked_interpreter():
        interpreted(_last_writer_wins)[(8,)](x)


def test_read_modify_write_race_is_caught_though_every_order_agrees() -> None:
    x = torch.zeros(1, dtype=torch.int64)
    with checked_interpreter(shuffle_seeds=(0, 1, 2), check_races=False):
        interpreted(_bump)[(4,)](x)  # sequential orders all give 4: shuffling alone is blind
    assert x.item() == 4
    with pytest.raises(OrderDependence, match="non-atomic read/write race"), checked_interpreter():
        interpreted(_bump)[(4,)](x)
    x.zero_()
    with checked_interpreter(shuffle_seeds=(0, 1)):
        interpreted(_bump_atomic)[(4,)](x)  # atomics are the fix
    assert x.item() == 4


def test_allow_access_covers_memory_reached_through_loaded_pointers() -> None:
    table = torch.arange(10, 14, dtype=torch.int64)
    x = torch.tensor([table.data_ptr()], dtype=torch.int64)
    out = torch.zeros(1, dtype=torch.int64)
    with checked_interpreter():
        with pytest.raises(OutOfBoundsAccess):
            interpreted(_gather)[(1,)](x, out)
        with allow_access(table):
            interpreted(_gather)[(1,)](x, out)
    assert out.item() == 11


def test_interpreter_is_restored_after_the_block() -> None:
    original = interp.GridExecutor.__call__
    with checked_interpreter():
        assert interp.GridExecutor.__call__ is not original
    assert interp.GridExecutor.__call__ is original
    assert "create_masked_store" not in vars(interp.interpreter_builder)
    x = torch.zeros(5, dtype=torch.int32)
    interpreted(_fill)[(1,)](x, 5, BLOCK=8, SLACK=0)  # plain interpreter still works
    assert x.tolist() == [0, 2, 4, 6, 8]


def test_other_triton_versions_are_refused(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(triton, "__version__", "3.8.1")
    with pytest.raises(KernelError, match=r"triton 3\.9\.x"), checked_interpreter():
        pass


@pytest.mark.slow
def test_harness_reports_race_only_when_checked() -> None:
    # Page size 1: every decode token opens a page, so any batch of two races for the cursor.
    options: dict[str, Any] = {"max_examples": 15, "max_tokens": 32, "max_batch": 4}
    options["page_sizes"] = (1, 4)
    assert check_kernel(C.alloc_decode_racy_triton, "alloc_decode", **options).passed
    report = check_kernel(
        C.alloc_decode_racy_triton, "alloc_decode", checked=True, shuffle_seeds=(0,), **options
    )
    assert report.failure is not None and report.failure.kind == "order-dependence"
    assert report.failure.case.batch_size == 2


@pytest.mark.slow
def test_harness_reports_out_of_bounds_with_its_input() -> None:
    options: dict[str, Any] = {"max_examples": 25, "max_tokens": 64, "max_batch": 4}
    op = "create_flashinfer_kv_indices"
    report = check_kernel(C.flashinfer_off_by_one_triton, op, checked=True, **options)
    assert report.failure is not None and report.failure.kind == "out-of-bounds"
    assert "req 0:" in report.render()
    assert check_kernel(C.flashinfer_triton, op, checked=True, shuffle_seeds=(0,), **options).passed


def test_strict_short_free_lists_flag_reads_past_the_free_list() -> None:
    options: dict[str, Any] = {
        "max_examples": 40,
        "max_tokens": 64,
        "max_batch": 6,
        "checked": True,
    }
    assert check_kernel(C.alloc_decode_triton, "alloc_decode", **options).passed
    strict = check_kernel(
        C.alloc_decode_triton, "alloc_decode", short_free_lists="strict", **options
    )
    assert strict.failure is not None and strict.failure.kind == "out-of-bounds"
    assert strict.failure.case.short


@pytest.mark.parametrize("op", OPS)
def test_kvpool_kernels_pass_checked_and_shuffled(op: str) -> None:
    report = check_kernel(
        partial(getattr(kernels, op), backend="interpret"),
        op,
        max_examples=8,
        max_tokens=128,
        max_batch=6,
        checked=True,
        shuffle_seeds=(0,),
    )
    assert report.passed, report.render()


def test_element_minus_one_of_an_empty_view_is_caught_not_a_segfault() -> None:
    # An empty view of a non-empty storage (free_pages[num:] once every page is taken) has data
    # pointer 0: element -1 is address 2**64 - 8, which used to wrap around the bounds check.
    base = torch.arange(8, dtype=torch.int64)
    out = torch.zeros(1, dtype=torch.int64)
    with pytest.raises(OutOfBoundsAccess, match="before the null pointer"):
        run_checked(interpreted(_wild_load)[(1,)], base[8:], out, OFFSET=-1)


def _neighbour(a, b, out):  # type: ignore[no-untyped-def]
    tl.store(out, tl.load(b - 1) + tl.load(a))


def test_a_stray_access_into_a_neighbouring_slice_of_one_storage_is_caught() -> None:
    # Two arguments slicing one storage (the twin stacks lengths) get separate guarded copies.
    lens = torch.tensor([[1, 2], [3, 4]], dtype=torch.int64)
    out = torch.zeros(1, dtype=torch.int64)
    with pytest.raises(OutOfBoundsAccess, match="element -1 of 'b'"):
        run_checked(interpreted(_neighbour)[(1,)], lens[0], lens[1], out)
    run_checked(interpreted(_wild_load)[(1,)], lens[1], out, OFFSET=1)  # in bounds: fine
    assert out.item() == 4
