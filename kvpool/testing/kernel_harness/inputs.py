"""Valid kernel inputs, drawn with hypothesis from a consistent paged pool state.

A :class:`KernelCase` is one batch over one pool: pages ``1..num_pages`` exist (page 0 is
:data:`~kvpool.constants.RESERVED_INDEX`), request ``b`` holds the slots of its first
``len(held[b])`` tokens in pages of its own (so ``last_loc`` is consistent with its prefix), and
``free_pages`` lists free pages in free-list order. Op-specific fields say what the kernel is asked
(``prefix_lens``/``seq_lens`` in tokens, ``kv_start``/``kv_lens`` in tokens). Draws are biased to
the edges that broke real kernels: empty prefixes, prefixes ending mid-page, extensions that fit in
the prefix's partial page or end on a page boundary, extends of thousands of tokens, batch size 1
and large batches, and (for the allocation ops, when asked) fewer free pages than needed.
"""

from __future__ import annotations

import dataclasses
import functools
import random

from hypothesis import strategies as st

from kvpool.constants import KERNEL_OPS, NO_LAST_LOC, RESERVED_INDEX, ceil_div
from kvpool.reference.pools.paged_ops import alloc_extend_slots, extend_new_pages

OPS: tuple[str, ...] = KERNEL_OPS
"""The kernel ops the harness knows, by their :mod:`kvpool.kernels` function names."""

ALLOC_OPS: tuple[str, ...] = ("alloc_extend", "alloc_decode")
MLA_OPS: tuple[str, ...] = ("create_flashmla_kv_indices", "create_flashmla_kv_indices_v2p")
INDEX_OPS: tuple[str, ...] = ("create_flashinfer_kv_indices", *MLA_OPS)


@dataclasses.dataclass(frozen=True)
class KernelCase:
    """One valid kernel input (plain Python, no tensors). Units in the module docstring."""

    op: str
    page_size: int
    num_pages: int
    rows: tuple[int, ...]  # request-table row of each request (never RESERVED_INDEX)
    held: tuple[tuple[int, ...], ...]  # slots of tokens [0, len) each request already holds
    free_pages: tuple[int, ...]
    prefix_lens: tuple[int, ...] = ()
    seq_lens: tuple[int, ...] = ()
    kv_start: tuple[int, ...] | None = None  # index ops: first column read, None = from 0
    kv_lens: tuple[int, ...] = ()  # index ops: tokens read per request
    width: int = 1  # request-table columns (max_context_len)
    num_rows: int = 2  # request-table rows, row 0 reserved
    mla_width: int = 1  # FlashMLA block-table columns (pages)
    v2p: tuple[int, ...] | None = None  # FlashMLA v2p op: virtual page -> physical page (or -1)

    @property
    def batch_size(self) -> int:
        return len(self.rows)

    @property
    def last_loc(self) -> tuple[int, ...]:
        """Slot of token ``P - 1`` of each request (alloc ops: ``P = S - 1`` for decode)."""
        lens = self.prefix_lens if self.op != "alloc_decode" else [s - 1 for s in self.seq_lens]
        return tuple(
            h[p - 1] if p > 0 else NO_LAST_LOC for h, p in zip(self.held, lens, strict=True)
        )

    @property
    def pages_needed(self) -> int:
        """New pages the batch needs (alloc ops and the table writer; 0 for index ops)."""
        if self.op == "alloc_decode":
            return sum(1 for s in self.seq_lens if (s - 1) % self.page_size == 0)
        if self.op in ("alloc_extend", "write_req_to_token"):
            ps = self.page_size
            return sum(
                extend_new_pages(p, s, ps)
                for p, s in zip(self.prefix_lens, self.seq_lens, strict=True)
            )
        return 0

    @property
    def short(self) -> bool:
        """True when ``free_pages`` holds fewer pages than the batch needs."""
        return len(self.free_pages) < self.pages_needed

    def new_slots(self) -> list[int]:
        """Reference slots of the extension (the table writer's ``out_cache_loc``)."""
        return alloc_extend_slots(
            self.prefix_lens, self.seq_lens, self.last_loc, self.free_pages, self.page_size
        )

    def edges(self) -> set[str]:
        """Names of the edge conditions this input exercises (for coverage counts)."""
        ps = self.page_size
        found = {"batch size 1"} if self.batch_size == 1 else set()
        if self.batch_size >= 16:
            found.add("large batch")
        if self.short:
            found.add("not enough free pages")
        prefix = self.prefix_lens
        if self.op == "alloc_decode":
            prefix = tuple(s - 1 for s in self.seq_lens)
            if any(p % ps == 0 for p in prefix):
                found.add("decode opens a page")
        seqs = self.seq_lens if self.seq_lens else prefix
        for p, s in zip(prefix, seqs, strict=True):
            if p == 0:
                found.add("empty prefix")
            elif p % ps:
                found.add("prefix ends mid-page")
            if s > p and p % ps and s <= ceil_div(p, ps) * ps:
                found.add("extension fits in the partial page")
            if s > p and s % ps == 0:
                found.add("ends on a page boundary")
            if s - p >= 1000:
                found.add("extend of 1000+ tokens")
        if self.kv_lens:
            if any(n >= 1000 for n in self.kv_lens):
                found.add("index window of 1000+ tokens")
            if any(n == 0 for n in self.kv_lens):
                found.add("empty index window")
            if any(n % ps for n in self.kv_lens):
                found.add("window ends mid-page")
            if self.kv_start is not None and any(self.kv_start):
                found.add("kv_start_idx past 0")
        if self.v2p is not None:
            if -1 in self.v2p[1:]:
                found.add("freed v2p entry")
            if any(s < 0 for h in self.held for s in h):
                found.add("-1 slot translated")
        return found


@functools.lru_cache(maxsize=256)  # strategies are immutable; building them per draw is slow
def _token_count(ps: int, max_tokens: int) -> st.SearchStrategy[int]:
    """A length in tokens: zero, a few pages, page-aligned, mid-page, or thousands."""
    return st.one_of(
        st.just(0),
        st.integers(1, 3 * ps + 1),
        st.integers(0, 4).map(lambda k: k * ps),
        st.integers(max(1, max_tokens // 2), max(1, max_tokens)),
    )


def _extension(ps: int, p: int, max_tokens: int) -> st.SearchStrategy[int]:
    """Tokens to add after a prefix of ``p``: within its partial page, up to a page boundary,
    a few pages, or thousands."""
    return _extension_from_room(ps, ceil_div(p, ps) * ps - p, max_tokens)


@functools.lru_cache(maxsize=1024)
def _upto(n: int) -> st.SearchStrategy[int]:
    """``n`` itself or anything in ``[0, n]`` (whole windows are the common case)."""
    return st.one_of(st.just(n), st.integers(0, n))


_ORDER_KINDS = st.sampled_from(("ascending", "shuffled", "descending"))
"""Free-list orders: shrinks towards ascending page ids."""


@functools.lru_cache(maxsize=64)
def _one_of_values(values: tuple[int, ...]) -> st.SearchStrategy[int]:
    return st.sampled_from(values)


@functools.lru_cache(maxsize=64)
def _batch_size(max_batch: int) -> st.SearchStrategy[int]:
    return st.one_of(st.just(1), st.integers(1, 4), st.integers(1, max_batch))


@functools.lru_cache(maxsize=64)
def _row_order(num_rows: int) -> st.SearchStrategy[list[int]]:
    return st.permutations(range(RESERVED_INDEX + 1, num_rows))


@functools.lru_cache(maxsize=1024)
def _extension_from_room(ps: int, room: int, max_tokens: int) -> st.SearchStrategy[int]:
    return st.one_of(
        st.integers(0, room),
        st.integers(0, 4).map(lambda k: room + k * ps),
        st.integers(1, 3 * ps + 1),
        st.integers(max(1, max_tokens // 2), max(1, max_tokens)),
    )


@st.composite
def kernel_cases(
    draw: st.DrawFn,
    op: str,
    page_sizes: tuple[int, ...],
    max_batch: int = 32,
    max_tokens: int = 4096,
    short_free_lists: str = "lenient",
) -> KernelCase:
    """A valid :class:`KernelCase` for ``op``; the whole batch holds at most ``2 * max_tokens``
    tokens beyond its prefixes (later requests get small lengths once that budget is spent).

    ``short_free_lists``: ``"off"`` never draws too few free pages; ``"lenient"`` sometimes does
    but keeps at least one (an empty tensor has a null data pointer, which no padding can back);
    ``"strict"`` may also draw an empty free list."""
    ps = draw(_one_of_values(page_sizes))
    bs = draw(_batch_size(max_batch))
    budget = 2 * max_tokens
    held_lens: list[int] = []
    for _ in range(bs):
        n = min(draw(_token_count(ps, max_tokens)), budget)
        budget -= n
        held_lens.append(max(n, 1) if op == "alloc_decode" else n)
    prefix_lens: list[int] = []
    seq_lens: list[int] = []
    if op in ("alloc_extend", "write_req_to_token"):
        for p in held_lens:
            e = min(draw(_extension(ps, p, max_tokens)), max(budget, 0))
            budget -= e
            prefix_lens.append(p)
            seq_lens.append(p + e)
    elif op == "alloc_decode":
        seq_lens = [n + 1 for n in held_lens]
    elif op == "get_last_loc":
        prefix_lens = [draw(_upto(n)) for n in held_lens]

    probe = KernelCase(op, ps, 0, (), (), (), tuple(prefix_lens), tuple(seq_lens))
    needed = probe.pages_needed
    n_free = needed + draw(st.integers(0, 6))
    keep = 1 if short_free_lists == "lenient" else 0
    short_ok = short_free_lists != "off" and op in ALLOC_OPS and needed > keep
    if short_ok and draw(st.integers(0, 7)) == 0:
        n_free = needed - draw(st.integers(1, needed - keep))
    prefix_pages = [ceil_div(n, ps) for n in held_lens]
    num_pages = sum(prefix_pages) + n_free + draw(st.integers(0, 3))
    order = list(range(RESERVED_INDEX + 1, num_pages + 1))
    kind = draw(_ORDER_KINDS)
    if kind == "descending":
        order.reverse()
    elif kind == "shuffled":
        random.Random(draw(st.integers(0, 2**16))).shuffle(order)
    held: list[tuple[int, ...]] = []
    cursor = 0
    for n, k in zip(held_lens, prefix_pages, strict=True):
        pages = order[cursor : cursor + k]
        cursor += k
        held.append(tuple(pages[t // ps] * ps + t % ps for t in range(n)))
    free_pages = tuple(order[cursor : cursor + n_free])

    num_rows = bs + 1 + draw(st.integers(0, 4))
    rows = tuple(draw(_row_order(num_rows))[:bs])
    longest = max([*held_lens, *seq_lens, 1])
    case = KernelCase(
        op, ps, num_pages, rows, tuple(held), free_pages, tuple(prefix_lens), tuple(seq_lens),
        width=longest + draw(st.integers(0, 3)), num_rows=num_rows,
    )  # fmt: skip
    if op in INDEX_OPS:
        case = _with_index_window(draw, case, held_lens)
    if op == "create_flashmla_kv_indices_v2p":
        case = _with_v2p(draw, case)
    return case


def _with_v2p(draw: st.DrawFn, case: KernelCase) -> KernelCase:
    """Draw a virtual-to-physical page map (entry 0 stays 0, some entries freed to -1, the rest
    a shuffled set of physical pages) and mark a few held pages' first slot -1."""
    ps = case.page_size
    size = case.num_pages + 1 + draw(st.integers(0, 3))
    physical = list(range(1, size + draw(st.integers(0, 8))))
    random.Random(draw(st.integers(0, 2**16))).shuffle(physical)
    freed = draw(st.sampled_from((0.0, 0.1, 0.5)))
    rng = random.Random(draw(st.integers(0, 2**16)))
    v2p = [0] + [-1 if rng.random() < freed else physical[v] for v in range(size - 1)]
    held = case.held
    if draw(st.booleans()):
        held = tuple(
            tuple(-1 if t % ps == 0 and rng.random() < 0.2 else s for t, s in enumerate(h))
            for h in case.held
        )
    return dataclasses.replace(case, v2p=tuple(v2p), held=held)


def _with_index_window(draw: st.DrawFn, case: KernelCase, held_lens: list[int]) -> KernelCase:
    """Draw ``kv_start`` (None, or per request; page-aligned for FlashMLA) and ``kv_lens``."""
    ps = case.page_size
    mla = case.op in MLA_OPS
    starts: list[int] = []
    lens: list[int] = []
    use_start = draw(st.booleans())
    for n in held_lens:
        s = 0
        if use_start:
            s = draw(st.integers(0, n // ps)) * ps if mla else draw(st.integers(0, n))
        starts.append(s)
        lens.append(draw(_upto(n - s)))
    mla_width = max([ceil_div(n, ps) for n in lens] + [1]) + draw(st.integers(0, 2))
    return dataclasses.replace(
        case,
        kv_start=tuple(starts) if use_start else None,
        kv_lens=tuple(lens),
        mla_width=mla_width,
    )
