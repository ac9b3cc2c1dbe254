"""Checked mode of the optimized twin: the switch, every misuse raising the reference's error
type with nothing changed, and the unchecked hot paths doing no checking work at all."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
import torch
from torch.overrides import TorchFunctionMode

from kvpool.config import PoolConfig
from kvpool.errors import (
    AlignmentError,
    ConfigError,
    ContextOverflowError,
    DoubleFreeError,
    IndexOutOfRangeError,
    InvalidArgumentError,
    KVPoolError,
    ReservedIndexError,
    RowReuseError,
)
from kvpool.optimized import (
    CHECKED_ENV_VAR,
    HybridReqToTokenPool,
    MemoryManager,
    MHATokenToKVPool,
    PagedTokenToKVPoolAllocator,
    ReqToTokenPool,
    TokenToKVPoolAllocator,
    TwinOptions,
    resolve_checked,
)
from kvpool.optimized.lifecycle.swa_memory_manager import SWAMemoryManager
from tests.optimized.test_diff_req_to_token_pool import Req

CHECKED = TwinOptions.make(checked=True)
UNCHECKED = TwinOptions.make(checked=False)

T = torch.tensor


def test_switch_reads_argument_then_environment_then_device(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.delenv(CHECKED_ENV_VAR, raising=False)
    assert resolve_checked(None) is True  # CPU tensors: on by default
    assert resolve_checked(None, "cuda") is False  # other devices: off by default
    assert resolve_checked(None, torch.device("meta")) is False
    assert resolve_checked(True, "cuda") is True
    assert PagedTokenToKVPoolAllocator(8, 2).checked is True
    monkeypatch.setenv(CHECKED_ENV_VAR, "1")
    assert resolve_checked(None) is True
    assert resolve_checked(False) is False
    assert PagedTokenToKVPoolAllocator(8, 2).checked is True
    assert resolve_checked(None, "cuda") is True
    monkeypatch.setenv(CHECKED_ENV_VAR, "0")
    assert ReqToTokenPool(2, 2).checked is False
    monkeypatch.setenv(CHECKED_ENV_VAR, "yes")
    with pytest.raises(ConfigError):
        resolve_checked(None)


def test_one_options_object_goes_down_the_twin() -> None:
    """A memory manager's options reach every pool it builds, unchanged (one object)."""
    opts = TwinOptions.make("cpu", checked=False, backend="python")
    mm = MemoryManager(PoolConfig(size=16, page_size=4), options=opts)
    parts = (mm.req_to_token_pool, mm.token_to_kv_pool_allocator, mm.tree_cache, mm.kv_cache)
    assert all(p.options is opts for p in parts)
    assert mm.token_to_kv_pool_allocator.kernel_backend == "python"
    assert mm.kernel_backend == "python"  # the manager's own table kernels too
    assert not mm.token_to_kv_pool_allocator.checked
    hybrid = MemoryManager(PoolConfig(mamba_slots=2, disable_radix_cache=True), options=opts)
    pool = hybrid.req_to_token_pool
    assert isinstance(pool, HybridReqToTokenPool)
    assert pool.mamba_pool.options is opts and pool.mamba_allocator.options is opts
    swa_config = PoolConfig(size=16, page_size=4, sliding_window=4, disable_radix_cache=True)
    swa = SWAMemoryManager(swa_config, options=opts)
    alloc: Any = swa.token_to_kv_pool_allocator  # the SWA allocator and pools
    kv: Any = swa.kv_cache
    sides = (alloc, alloc.full_attn_allocator, alloc.swa_attn_allocator, kv, kv.swa_kv_pool)
    assert all(p.options is opts for p in sides)
    with pytest.raises(ConfigError):  # options or the shorthand keywords, never both
        MemoryManager(PoolConfig(), options=opts, checked=True)
    with pytest.raises(ConfigError):
        TwinOptions.make("no-such-device")


def refused(error: type[KVPoolError], call: Callable[[], Any], snapshot: Callable[[], Any]) -> None:
    """``call`` raises exactly ``error`` and ``snapshot()`` is unchanged."""
    before = snapshot()
    with pytest.raises(KVPoolError) as info:
        call()
    assert type(info.value) is error, f"{type(info.value).__name__} instead of {error.__name__}"
    assert snapshot() == before


def held_paged() -> tuple[PagedTokenToKVPoolAllocator, torch.Tensor]:
    """A checked ps-4 allocator of 4 pages with a 6-token sequence in pages 1-2 (slots 4..9)."""
    a = PagedTokenToKVPoolAllocator(16, 4, options=CHECKED)
    out = a.alloc_extend(T([0]), [0], T([6]), [6], T([-1]), 6)
    assert out is not None and out.tolist() == [4, 5, 6, 7, 8, 9]
    return a, out


def test_allocator_misuse_is_refused() -> None:
    a, _ = held_paged()
    s = a.snapshot
    refused(DoubleFreeError, lambda: a.free(T([12])), s)  # page 3 is free
    refused(ReservedIndexError, lambda: a.free(T([3])), s)
    refused(IndexOutOfRangeError, lambda: a.free(T([20])), s)
    refused(IndexOutOfRangeError, lambda: a.free(T([-1])), s)
    refused(InvalidArgumentError, lambda: a.free(T([4.0])), s)  # a type: both modes
    refused(AlignmentError, lambda: a.alloc(3), s)
    refused(InvalidArgumentError, lambda: a.alloc(-4), s)
    # Bad extend arguments: wrong token count, host copy differing, P > S, misaligned last_loc,
    # last_loc missing, last_loc in a free page, last_loc past the pool.
    refused(InvalidArgumentError, lambda: a.alloc_extend(T([6]), [6], T([8]), [8], T([9]), 3), s)
    refused(InvalidArgumentError, lambda: a.alloc_extend(T([6]), [6], T([8]), [9], T([9]), 2), s)
    refused(InvalidArgumentError, lambda: a.alloc_extend(T([6]), [6], T([5]), [5], T([9]), -1), s)
    refused(AlignmentError, lambda: a.alloc_extend(T([6]), [6], T([8]), [8], T([10]), 2), s)
    refused(InvalidArgumentError, lambda: a.alloc_extend(T([6]), [6], T([8]), [8], T([-1]), 2), s)
    refused(InvalidArgumentError, lambda: a.alloc_extend(T([6]), [6], T([8]), [8], T([13]), 2), s)
    refused(IndexOutOfRangeError, lambda: a.alloc_extend(T([6]), [6], T([8]), [8], T([21]), 2), s)
    refused(InvalidArgumentError, lambda: a.alloc_decode(T([0]), [0], T([-1])), s)
    refused(AlignmentError, lambda: a.alloc_decode(T([7]), [7], T([10])), s)
    refused(InvalidArgumentError, lambda: a.restore_state((T([1, 1]), T([]))), s)
    refused(InvalidArgumentError, lambda: a.restore_state((T([9]), T([]))), s)
    refused(InvalidArgumentError, a.free_group_end, s)
    a.free_group_begin()
    refused(InvalidArgumentError, a.free_group_begin, s)


def test_page_size_one_double_frees_in_a_call_and_a_group() -> None:
    a = TokenToKVPoolAllocator(4, options=CHECKED)
    got = a.alloc(3)
    assert got is not None and got.tolist() == [1, 2, 3]
    refused(DoubleFreeError, lambda: a.free(T([1, 1])), a.snapshot)
    a.free_group_begin()
    a.free(T([1]))
    refused(DoubleFreeError, lambda: a.free(T([1])), a.snapshot)
    a.free(T([2]))
    a.free_group_end()
    assert a.snapshot().free_pages == (4, 1, 2)


def test_stale_free_group_raises_at_end_and_stays_open() -> None:
    a, out = held_paged()
    state = a.backup_state()
    a.free_group_begin()
    a.free(out)
    a.free_group_end()
    a.free_group_begin()
    a.restore_state(state)  # pages 1-2 held again
    a.free(out)
    a.restore_state((T([1, 2, 3, 4]), T([], dtype=torch.int64)))  # now they are free
    refused(DoubleFreeError, a.free_group_end, a.snapshot)
    assert a.snapshot().in_free_group


def test_request_table_misuse_is_refused() -> None:
    pool = ReqToTokenPool(2, 4, options=CHECKED)
    a = Req()
    assert pool.alloc([a]) == [2]
    s = pool.snapshot
    refused(RowReuseError, lambda: pool.alloc([a]), s)  # holds a row, neither chunked nor committed
    a.is_chunked = 1
    refused(RowReuseError, lambda: pool.alloc([a, a]), s)
    refused(RowReuseError, lambda: pool.alloc([Req(1, 1)]), s)  # row 1 is free
    refused(ReservedIndexError, lambda: pool.alloc([Req(0, 1)]), s)
    refused(IndexOutOfRangeError, lambda: pool.alloc([Req(3, 1)]), s)
    refused(DoubleFreeError, lambda: pool.free(Req(1)), s)
    refused(InvalidArgumentError, lambda: pool.free(Req()), s)
    refused(ContextOverflowError, lambda: pool.write((2, slice(3, 5)), T([1, 2])), s)
    refused(ReservedIndexError, lambda: pool.write((0, slice(0, 1)), T([1])), s)
    refused(InvalidArgumentError, lambda: pool.write((2, slice(0, 2)), T([1])), s)
    refused(InvalidArgumentError, lambda: pool.write((1, slice(0, 1)), T([1])), s)  # row 1 free


def test_kv_cache_slot_range_is_checked() -> None:
    kv = MHATokenToKVPool(8, 4, torch.float32, 1, 2, 1, options=CHECKED)
    with pytest.raises(IndexOutOfRangeError):
        kv.set_kv_buffer(0, T([12]), torch.ones(1, 1, 2), torch.ones(1, 1, 2))
    with pytest.raises(IndexOutOfRangeError):
        kv.read_tags([-1])
    assert not kv.k_buffer[0].any()


class OpLog(TorchFunctionMode):
    """Records the name of every torch function and tensor method called."""

    def __init__(self) -> None:
        super().__init__()
        self.names: list[str] = []

    def __torch_function__(
        self,
        func: Any,
        types: Any,
        args: tuple[Any, ...] = (),
        kwargs: dict[str, Any] | None = None,
    ) -> Any:
        self.names.append(getattr(func, "__name__", str(func)))
        return func(*args, **(kwargs or {}))


CHECKING_OPS = {"item", "tolist", "any", "__bool__", "nonzero", "equal", "isin"}
"""Operations that read a tensor back to the host (a device sync): only checks need them."""


def hot_path_ops(checked: bool) -> list[str]:
    a = PagedTokenToKVPoolAllocator(64, 4, options=TwinOptions.make(checked=checked))
    prefix, seq, last = T([0, 0]), T([5, 2]), T([-1, -1])
    log = OpLog()
    with log:
        out = a.alloc_extend(prefix, [0, 0], seq, [5, 2], last, 7)
        assert out is not None
        dec = a.alloc_decode(T([6, 3]), [6, 3], out[[4, 6]])
        assert dec is not None
        a.free(torch.cat((out, dec)))
        blob = a.alloc(8)
        assert blob is not None
        a.free(blob)
    return log.names


def test_unchecked_hot_paths_do_no_checking_work() -> None:
    """Off: alloc, alloc_extend, alloc_decode and free never read a tensor back to the host (no
    device sync) and keep no membership mask; on, they do both."""
    off, on = hot_path_ops(False), hot_path_ops(True)
    assert PagedTokenToKVPoolAllocator(16, 4, options=UNCHECKED)._free_mask is None
    assert not CHECKING_OPS & set(off), sorted(CHECKING_OPS & set(off))
    assert CHECKING_OPS & set(on)
    assert len(off) < len(on)


def test_unchecked_mode_skips_only_the_checks_that_read_the_device() -> None:
    """Off, a double free of a slot (a device read) goes through silently, like SGLang; a row is
    a host int, so its double free is refused in both modes."""
    a = PagedTokenToKVPoolAllocator(16, 4, options=UNCHECKED)
    a.free(T([4]))  # page 1 is already free
    assert a.snapshot().free_pages == (1, 1, 2, 3, 4)
    pool = ReqToTokenPool(2, 2, options=UNCHECKED)  # rows are host ints: checked in both modes
    with pytest.raises(DoubleFreeError):
        pool.free(Req(1))  # row 1 is already free
    assert pool.free_slots == [1, 2]
