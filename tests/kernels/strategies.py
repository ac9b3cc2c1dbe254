"""Hypothesis strategies for valid kernel inputs (as plain lists), aimed at the edges that broke
real kernels: empty prefixes, prefixes ending mid-page, extensions inside the prefix's partial
page, exact page boundaries, batch size 1, large batches and extends of thousands of tokens."""

from __future__ import annotations

import random
from dataclasses import dataclass

from hypothesis import settings
from hypothesis import strategies as st

from kvpool.constants import NO_LAST_LOC, RESERVED_INDEX, SUPPORTED_PAGE_SIZES_TESTED, ceil_div
from kvpool.reference.pools.paged_ops import extend_new_pages

SENTINEL = -7
"""Initial value of output cells a kernel must leave untouched."""


@dataclass(frozen=True)
class ExtendBatch:
    """One valid ``alloc_extend`` call (tokens, slots, page ids)."""

    page_size: int
    prefix_lens: list[int]
    seq_lens: list[int]
    last_loc: list[int]
    free_pages: list[int]

    @property
    def num_tokens(self) -> int:
        return sum(s - p for p, s in zip(self.prefix_lens, self.seq_lens, strict=True))


@dataclass(frozen=True)
class DecodeBatch:
    """One valid ``alloc_decode`` call."""

    page_size: int
    seq_lens: list[int]
    last_loc: list[int]
    free_pages: list[int]


@dataclass(frozen=True)
class TableBatch:
    """A request table plus a batch of distinct rows with lengths and starts (tokens)."""

    page_size: int
    table: list[list[int]]
    rows: list[int]
    starts: list[int]
    lens: list[int]


def _length(draw: st.DrawFn, page_size: int, max_len: int, low: int = 0) -> int:
    """A length ``>= low`` biased to page boundaries and their neighbours."""
    pages = draw(st.integers(0, max(0, max_len // page_size)))
    shape = draw(st.sampled_from(["boundary", "mid", "any"]))
    if shape == "boundary":
        n = pages * page_size
    elif shape == "mid":
        n = pages * page_size + draw(st.integers(0, page_size - 1))
    else:
        n = draw(st.integers(0, max_len))
    return min(max(n, low), max(max_len, low))


def _free_pages(draw: st.DrawFn, needed: int, extra_max: int = 4) -> list[int]:
    """``needed`` + a few distinct page ids (never the reserved page), in a shuffled order."""
    count = needed + draw(st.integers(0, extra_max))
    rng = random.Random(draw(st.integers(0, 2**32 - 1)))
    return rng.sample(range(RESERVED_INDEX + 1, RESERVED_INDEX + 1 + 2 * count + 8), count)


@st.composite
def extend_batches(
    draw: st.DrawFn,
    max_bs: int = 8,
    max_len: int = 200,
    page_sizes: tuple[int, ...] = SUPPORTED_PAGE_SIZES_TESTED,
) -> ExtendBatch:
    ps = draw(st.sampled_from(page_sizes))
    bs = draw(st.integers(1, max_bs))
    prefix_lens: list[int] = []
    seq_lens: list[int] = []
    last_loc: list[int] = []
    for _ in range(bs):
        p = _length(draw, ps, max_len)
        kind = draw(st.sampled_from(["inside_partial_page", "to_boundary", "free"]))
        if kind == "inside_partial_page":
            s = min(p + draw(st.integers(0, ps)), ceil_div(p, ps) * ps)
        elif kind == "to_boundary":
            s = (p // ps + draw(st.integers(1, 3))) * ps
        else:
            s = p + _length(draw, ps, max_len)
        # The prefix's last page: any allocatable page; last_loc sits at offset (P - 1) % ps.
        prefix_page = draw(st.integers(RESERVED_INDEX + 1, 10_000))
        loc = NO_LAST_LOC if p == 0 else prefix_page * ps + (p - 1) % ps
        prefix_lens.append(p)
        seq_lens.append(s)
        last_loc.append(loc)
    needed = sum(extend_new_pages(p, s, ps) for p, s in zip(prefix_lens, seq_lens, strict=True))
    return ExtendBatch(ps, prefix_lens, seq_lens, last_loc, _free_pages(draw, needed))


@st.composite
def decode_batches(
    draw: st.DrawFn,
    max_bs: int = 64,
    max_len: int = 300,
    page_sizes: tuple[int, ...] = SUPPORTED_PAGE_SIZES_TESTED,
) -> DecodeBatch:
    ps = draw(st.sampled_from(page_sizes))
    bs = draw(st.integers(1, max_bs))
    seq_lens = [_length(draw, ps, max_len, low=1) for _ in range(bs)]
    # A page-opening token's last_loc is irrelevant; otherwise it sits just before S - 1.
    last_loc = [draw(st.integers(RESERVED_INDEX + 1, 10_000)) * ps + (s - 2) % ps for s in seq_lens]
    needed = sum(1 for s in seq_lens if (s - 1) % ps == 0)
    return DecodeBatch(ps, seq_lens, last_loc, _free_pages(draw, needed))


@st.composite
def table_batches(
    draw: st.DrawFn,
    max_bs: int = 8,
    max_cols: int = 160,
    page_sizes: tuple[int, ...] = SUPPORTED_PAGE_SIZES_TESTED,
    with_starts: bool = True,
) -> TableBatch:
    """A table whose rows hold whole pages (as the pool writes them) and a batch of distinct
    rows, each with a start column and a length fitting in ``cols``."""
    ps = draw(st.sampled_from(page_sizes))
    cols = ceil_div(draw(st.integers(1, max_cols)), ps) * ps
    bs = draw(st.integers(1, max_bs))
    num_rows = bs + 1 + draw(st.integers(0, 3))
    rng = random.Random(draw(st.integers(0, 2**32 - 1)))
    table = []
    for _ in range(num_rows):
        pages = [rng.randrange(RESERVED_INDEX + 1, 5_000) for _ in range(cols // ps)]
        table.append([page * ps + k for page in pages for k in range(ps)])
    rows = rng.sample(range(RESERVED_INDEX + 1, num_rows), bs)
    starts: list[int] = []
    lens: list[int] = []
    for _ in range(bs):
        start = _length(draw, ps, cols) if with_starts else 0
        if with_starts and draw(st.booleans()):
            start = start // ps * ps  # FlashMLA reads page heads: aligned starts are the norm
        lens.append(min(_length(draw, ps, cols), cols - start))
        starts.append(start)
    return TableBatch(ps, table, rows, starts, lens)


def scaled_examples(divisor: int) -> int:
    """The loaded profile's ``max_examples`` divided by ``divisor``, at least 3: the Triton
    interpreter and the long-extend tests run fewer examples than the fast backends."""
    current = settings.default
    return max(3, (current.max_examples if current is not None else 100) // divisor)
