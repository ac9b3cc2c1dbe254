"""Bad inputs to the token-slot allocators of both twins (page size 1, paged, SWA, pure SWA) and
the Mamba slot allocator: the typed error or documented answer, nothing changed, twins equal."""

from __future__ import annotations

from collections.abc import Callable
from types import SimpleNamespace
from typing import Any

import pytest

from kvpool.errors import (
    AlignmentError,
    ConfigError,
    DoubleFreeError,
    IndexOutOfRangeError,
    InvalidArgumentError,
    PageSizeError,
    ReservedIndexError,
)
from tests.bad_inputs.harness import Case, Twin, fixture, modes_of, params, run_case

# --------------------------------------------------------------------------- fixtures
# ps1: 8 slots, slots 1..3 held (4..8 free).  ps4: 4 pages of 4, slots 4..9 held (pages 1-2).


def ps1(tw: Twin) -> SimpleNamespace:
    a = tw.new("TokenToKVPoolAllocator", 8)
    assert list(a.alloc(3)) == [1, 2, 3]
    return fixture(a)


def ps4(tw: Twin) -> SimpleNamespace:
    a = tw.new("PagedTokenToKVPoolAllocator", 16, 4)
    got = a.alloc_extend(tw.idx([0]), [0], tw.idx([6]), [6], tw.idx([-1]), 6)
    assert list(got) == [4, 5, 6, 7, 8, 9]
    return fixture(a)


def in_group(build: Callable[[Twin], SimpleNamespace], slot: int) -> Any:
    """``build``'s allocator inside an open free group that already buffered ``slot``."""

    def make(tw: Twin) -> SimpleNamespace:
        fx = build(tw)
        fx.target.free_group_begin()
        fx.target.free(tw.idx([slot]))
        return fx

    return make


def free(slots: list[int]) -> Any:
    return lambda tw, fx: fx.target.free(tw.idx(slots))


def alloc(n: object) -> Any:
    return lambda tw, fx: fx.target.alloc(n)


def extend(p: list[int], s: list[int], loc: list[int], n: int, p_cpu: Any = None) -> Any:
    """``alloc_extend`` with host copies equal to the device arrays unless ``p_cpu`` is given."""
    return lambda tw, fx: fx.target.alloc_extend(
        tw.idx(p), p if p_cpu is None else p_cpu, tw.idx(s), s, tw.idx(loc), n
    )


def decode(s: list[int], loc: list[int], s_cpu: Any = None) -> Any:
    return lambda tw, fx: fx.target.alloc_decode(
        tw.idx(s), s if s_cpu is None else s_cpu, tw.idx(loc)
    )


# --------------------------------------------------------------------------- the table
def token_allocator_cases(name: str, build: Any, held: int, free_slot: int, ps: int) -> list[Case]:
    """The same misuse on a page-size-1 or a paged allocator. ``held``: a held slot at a page
    start; ``free_slot``: a slot of a free page; ``ps``: the page size."""
    limit = 16 + ps if ps > 1 else 9  # (num_pages + 1) * page_size
    cases = [
        # frees: reserved, negative, past the pool, non-integer, already free
        Case("free-slot-0", build, free([0]), ReservedIndexError, host=False),
        Case("free-negative", build, free([-1]), IndexOutOfRangeError, host=False),
        Case("free-past-pool", build, free([limit]), IndexOutOfRangeError, host=False),
        Case(
            "free-floats",
            build,
            lambda tw, fx: fx.target.free(tw.floats([held])),
            InvalidArgumentError,  # a type, not a range: refused in both modes
        ),
        Case("double-free", build, free([free_slot]), DoubleFreeError, host=False),
        Case(
            "free-mixed-valid-and-free", build, free([held, free_slot]), DoubleFreeError, host=False
        ),
        Case(
            "double-free-in-group",
            in_group(build, held),
            free([free_slot]),
            DoubleFreeError,
            host=False,
        ),
        Case(
            "group-end-without-begin",
            build,
            lambda tw, fx: fx.target.free_group_end(),
            InvalidArgumentError,
        ),
        Case(
            "group-begin-twice",
            in_group(build, held),
            lambda tw, fx: fx.target.free_group_begin(),
            InvalidArgumentError,
        ),
        # alloc: negative, non-integer, zero, too big
        Case("alloc-negative", build, alloc(-ps), InvalidArgumentError),
        Case("alloc-float", build, alloc(float(ps)), InvalidArgumentError),
        Case("alloc-string", build, alloc(str(ps)), InvalidArgumentError),
        Case("alloc-huge", build, alloc(10**9 * ps), None),
        Case("alloc-one-too-many", build, alloc(16 + ps), None),
        # alloc_extend: arrays of different lengths, host copies, P > S, lengths, last_loc
        Case("extend-mismatched-arrays", build, extend([0, 0], [2], [-1], 2), InvalidArgumentError),
        Case(
            "extend-mismatched-last-loc", build, extend([0], [2], [-1, -1], 2), InvalidArgumentError
        ),
        Case(
            "extend-host-copy-shorter",
            build,
            extend([0, 0], [2, 2], [-1, -1], 4, p_cpu=[0]),
            InvalidArgumentError,
        ),
        Case(
            "extend-host-copy-differs",
            build,
            extend([0], [2], [-1], 2, p_cpu=[1]),
            InvalidArgumentError,
            host=False,
        ),
        Case(
            "extend-seq-shorter-than-prefix",
            build,
            extend([ps], [ps - 1], [held + ps - 1], -1),
            InvalidArgumentError,
        ),
        Case("extend-negative-prefix", build, extend([-1], [2], [-1], 3), InvalidArgumentError),
        Case("extend-wrong-token-count", build, extend([0], [2], [-1], 3), InvalidArgumentError),
        Case(
            "extend-float-lengths",
            build,
            lambda tw, fx: fx.target.alloc_extend(
                tw.idx([0]), [0], tw.floats([2]), [2.0], tw.idx([-1]), 2
            ),
            InvalidArgumentError,
        ),
        Case("extend-huge", build, extend([0], [4096 * ps], [-1], 4096 * ps), None),
        Case(
            "extend-last-loc-0",
            build,
            extend([ps], [ps + 1], [0], 1),
            InvalidArgumentError,
            host=False,
        ),
        Case(
            "extend-last-loc-missing",
            build,
            extend([ps], [ps + 1], [-1], 1),
            InvalidArgumentError,
            host=False,
        ),
        Case(
            "extend-last-loc-given-for-no-prefix",
            build,
            extend([0], [1], [held], 1),
            InvalidArgumentError,
            host=False,
        ),
        # alloc_decode: a zero length, mismatched arrays, huge
        Case("decode-seq-len-0", build, decode([0], [-1]), InvalidArgumentError),
        Case("decode-mismatched-arrays", build, decode([2, 2], [held]), InvalidArgumentError),
        Case(
            "decode-host-copy-shorter",
            build,
            decode([2, 2], [held, held], s_cpu=[2]),
            InvalidArgumentError,
        ),
        Case("decode-last-loc-missing", build, decode([2], [-1]), InvalidArgumentError, host=False),
        # restore_state: not a state, repeated pages
        Case(
            "restore-float-pages",
            build,
            lambda tw, fx: fx.target.restore_state((tw.floats([1]), tw.idx([]))),
            InvalidArgumentError,
        ),
        Case(
            "restore-not-a-state",
            build,
            lambda tw, fx: fx.target.restore_state([1, 2]),
            InvalidArgumentError,
        ),
        Case(
            "restore-repeated-pages",
            build,
            lambda tw, fx: fx.target.restore_state((tw.idx([1, 1]), tw.idx([]))),
            InvalidArgumentError,
            host=False,
        ),
    ]
    if ps > 1:
        cases += [
            Case("alloc-unaligned", build, alloc(ps - 1), AlignmentError),
            Case(
                "extend-last-loc-misaligned",
                build,
                extend([ps + 2], [ps + 3], [held + 2], 1),
                AlignmentError,
                host=False,
            ),
            Case(
                "extend-last-loc-in-free-page",
                build,
                extend([ps + 2], [ps + 3], [free_slot + 1], 1),
                InvalidArgumentError,
                host=False,
            ),
            Case(
                "extend-last-loc-past-pool",
                build,
                extend([ps + 2], [ps + 3], [limit + 1], 1),
                IndexOutOfRangeError,
                host=False,
            ),
        ]
    else:
        cases += [
            Case("free-slot-twice-in-call", build, free([held, held]), DoubleFreeError, host=False)
        ]
    return [Case(f"{name}-{c.id}", c.build, c.call, c.expect, c.host) for c in cases]


def ctor(cls: str, *args: Any, **kwargs: Any) -> Any:
    """A call that builds ``cls`` (the fixture is a fresh ps-1 allocator, judged unchanged)."""
    return lambda tw, fx: tw.new(cls, *args, **kwargs)


def swa(tw: Twin) -> SimpleNamespace:
    """SWA pools: full 16 tokens, SWA 8 tokens, page size 4; a 6-token request held."""
    a = tw.new("SWATokenToKVPoolAllocator", 16, 8, 4)
    got = a.alloc_extend(tw.idx([0]), [0], tw.idx([6]), [6], tw.idx([-1]), 6)
    assert got is not None and len(list(got)) == 6
    return fixture(a, held=list(got))


def swa1(tw: Twin) -> SimpleNamespace:
    """SWA pools at page size 1: full 8, SWA 4 tokens; slots 1, 2 held."""
    a = tw.new("SWATokenToKVPoolAllocator", 8, 4, 1)
    assert list(a.alloc(2)) == [1, 2]
    return fixture(a)


def pure_swa(tw: Twin) -> SimpleNamespace:
    a = tw.new("PureSWATokenToKVPoolAllocator", 8)
    assert list(a.alloc(2)) == [1, 2]
    return fixture(a)


def mamba(tw: Twin) -> SimpleNamespace:
    a = tw.new("MambaSlotAllocator", 4)
    assert list(a.alloc(2)) == [1, 2]
    return fixture(a)


OTHER = [
    Case("ctor-page-size-3", ps1, ctor("PagedTokenToKVPoolAllocator", 12, 3), PageSizeError),
    Case("ctor-size-not-multiple", ps1, ctor("PagedTokenToKVPoolAllocator", 10, 4), ConfigError),
    Case("ctor-size-0", ps1, ctor("TokenToKVPoolAllocator", 0), ConfigError),
    Case("swa-free-slot-0", swa, free([0]), ReservedIndexError, host=False),
    Case("swa-double-free", swa, free([12]), DoubleFreeError, host=False),
    Case("swa-free-negative", swa, free([-1]), IndexOutOfRangeError, host=False),
    Case("swa-alloc-at-page-size-4", swa, alloc(4), InvalidArgumentError),
    # non-integer slots are a type error, as for every other allocator's frees
    Case(
        "swa-free-floats", swa, lambda tw, fx: fx.target.free(tw.floats([4])), InvalidArgumentError
    ),
    Case(
        "swa-free-swa-floats",
        swa,
        lambda tw, fx: fx.target.free_swa(tw.floats([4])),
        InvalidArgumentError,
    ),
    Case(
        "swa-set-mapping-mismatched",
        swa,
        lambda tw, fx: fx.target.set_full_to_swa_mapping(tw.idx([4, 5]), tw.idx([4])),
        InvalidArgumentError,
    ),
    Case(
        "swa-translate-floats",
        swa,
        lambda tw, fx: fx.target.translate_loc_from_full_to_swa(tw.floats([4])),
        InvalidArgumentError,
    ),
    Case("swa1-alloc-negative", swa1, alloc(-1), InvalidArgumentError),
    Case("swa1-alloc-huge", swa1, alloc(9), None),
    Case("swa1-free-slot-0", swa1, free([0]), ReservedIndexError, host=False),
    Case("swa1-double-free", swa1, free([6]), DoubleFreeError, host=False),
    Case("swa1-extend-at-page-size-1", swa1, extend([0], [1], [-1], 1), InvalidArgumentError),
    Case("swa-extend-mismatched-arrays", swa, extend([0, 0], [2], [-1], 2), InvalidArgumentError),
    Case(
        "swa-extend-seq-shorter-than-prefix", swa, extend([4], [3], [7], -1), InvalidArgumentError
    ),
    Case("swa-decode-seq-len-0", swa, decode([0], [-1]), InvalidArgumentError),
    Case(
        "swa-group-end-without-begin",
        swa,
        lambda tw, fx: fx.target.free_group_end(),
        InvalidArgumentError,
    ),
    Case(
        "swa-translate-past-pool",
        swa,
        lambda tw, fx: fx.target.translate_loc_from_full_to_swa(tw.idx([40])),
        IndexOutOfRangeError,
        host=False,
    ),
    Case(
        "swa-restore-bad-swa-side",
        swa,
        lambda tw, fx: fx.target.restore_state(
            (fx.target.backup_state()[0], (tw.floats([1]), tw.idx([])), fx.target.backup_state()[2])
        ),
        InvalidArgumentError,
    ),
    Case(
        "swa-restore-not-a-state",
        swa,
        lambda tw, fx: fx.target.restore_state(None),
        InvalidArgumentError,
    ),
    Case("pure-swa-free-slot-0-is-skipped", pure_swa, free([0]), None),  # as SGLang
    Case("pure-swa-free-negative", pure_swa, free([-1]), IndexOutOfRangeError, host=False),
    Case(
        "pure-swa-translate-floats",
        pure_swa,
        lambda tw, fx: fx.target.translate_loc_from_full_to_swa(tw.floats([1])),
        InvalidArgumentError,
    ),
    Case("pure-swa-double-free", pure_swa, free([5]), DoubleFreeError, host=False),
    Case("pure-swa-alloc-negative", pure_swa, alloc(-1), InvalidArgumentError),
    Case("pure-swa-alloc-huge", pure_swa, alloc(100), None),
    Case("pure-swa-ctor-paged", pure_swa, ctor("PureSWATokenToKVPoolAllocator", 8, 2), ConfigError),
    Case("mamba-double-free", mamba, lambda tw, fx: fx.target.free([3]), DoubleFreeError),
    Case("mamba-free-twice-in-call", mamba, lambda tw, fx: fx.target.free([1, 1]), DoubleFreeError),
    Case("mamba-free-slot-0", mamba, lambda tw, fx: fx.target.free([0]), ReservedIndexError),
    Case("mamba-free-past-pool", mamba, lambda tw, fx: fx.target.free([5]), IndexOutOfRangeError),
    Case("mamba-free-negative", mamba, lambda tw, fx: fx.target.free([-1]), IndexOutOfRangeError),
    Case("mamba-alloc-negative", mamba, alloc(-1), InvalidArgumentError),
    Case("mamba-alloc-huge", mamba, alloc(5), None),
    Case(
        "mamba-group-end-without-begin-is-a-no-op",
        mamba,
        lambda tw, fx: fx.target.alloc_group_end(),
        None,
    ),
    Case("mamba-free-floats", mamba, lambda tw, fx: fx.target.free([1.0]), InvalidArgumentError),
    Case(
        "mamba-group-begin-negative",
        mamba,
        lambda tw, fx: fx.target.alloc_group_begin(-1),
        InvalidArgumentError,
    ),
    Case("mamba-ctor-size-0", mamba, ctor("MambaSlotAllocator", 0), ConfigError),
]

CASES = [
    *token_allocator_cases("ps1", ps1, held=1, free_slot=5, ps=1),
    *token_allocator_cases("ps4", ps4, held=4, free_slot=12, ps=4),
    *OTHER,
]


@pytest.mark.parametrize("case", params(CASES))
def test_bad_input_is_refused_identically(case: Case) -> None:
    run_case(case, modes_of(case))
