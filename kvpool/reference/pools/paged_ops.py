"""Pure functions behind the paged allocator's batch operations (no state, no torch).

These are the readable statement of ``alloc_extend`` and ``alloc_decode``: the reference allocator
calls them, and :mod:`kvpool.kernels` uses them as the pure-Python reference of its Triton kernels.
Units: lengths are tokens, ``free_pages`` are page ids, results are slot ids.
"""

from __future__ import annotations

from collections.abc import Sequence

from kvpool.constants import NO_LAST_LOC, RESERVED_INDEX, ceil_div, floor_align
from kvpool.errors import AlignmentError, InvalidArgumentError
from kvpool.rules import Rules


def extend_new_pages(prefix_len: int, seq_len: int, page_size: int) -> int:
    """Pages request needs beyond its prefix's pages: ``ceil(S/ps) - ceil(P/ps)``."""
    return ceil_div(seq_len, page_size) - ceil_div(prefix_len, page_size)


def decode_new_pages(seq_lens: Sequence[int], page_size: int) -> int:
    """Requests whose new token (position ``S - 1``) opens a page: ``(S - 1) % ps == 0``."""
    return sum(1 for s in seq_lens if (s - 1) % page_size == 0)


def validate_extend_args(
    prefix_lens: Sequence[int],
    seq_lens: Sequence[int],
    last_loc: Sequence[int],
    extend_num_tokens: int,
    page_size: int,
) -> None:
    """Raise :class:`InvalidArgumentError` / :class:`AlignmentError` if the batch breaks
    ``alloc_extend``'s preconditions: equal lengths, ``0 <= P <= S``, ``last_loc == -1`` exactly
    when ``P == 0``, ``(last_loc + 1) % ps == P % ps`` when the prefix ends mid-page, and
    ``extend_num_tokens == sum(S - P)``."""
    if not len(prefix_lens) == len(seq_lens) == len(last_loc):
        raise InvalidArgumentError(
            f"batch arrays differ in length: prefix_lens={len(prefix_lens)}, "
            f"seq_lens={len(seq_lens)}, last_loc={len(last_loc)}"
        )
    for i, (p, s, loc) in enumerate(zip(prefix_lens, seq_lens, last_loc, strict=True)):
        if p < 0 or s < p:
            raise InvalidArgumentError(
                f"request {i}: need 0 <= prefix_len <= seq_len, got {p}, {s}"
            )
        if (p == 0) != (loc == NO_LAST_LOC):
            raise InvalidArgumentError(
                f"request {i}: last_loc must be {NO_LAST_LOC} exactly when prefix_len is 0 "
                f"(prefix_len={p}, last_loc={loc})"
            )
        if p > 0 and loc <= RESERVED_INDEX:
            raise InvalidArgumentError(f"request {i}: last_loc {loc} is not an allocatable slot")
        if p % page_size and (loc + 1) % page_size != p % page_size:
            raise AlignmentError(
                f"request {i}: prefix ends mid-page but last_loc {loc} is not at offset "
                f"{p % page_size - 1} of its page (page_size={page_size})"
            )
    expected = sum(s - p for p, s in zip(prefix_lens, seq_lens, strict=True))
    if extend_num_tokens != expected:
        raise InvalidArgumentError(
            f"extend_num_tokens={extend_num_tokens} but sum(seq_lens - prefix_lens)={expected}"
        )


def alloc_extend_slots(
    prefix_lens: Sequence[int],
    seq_lens: Sequence[int],
    last_loc: Sequence[int],
    free_pages: Sequence[int],
    page_size: int,
) -> list[int]:
    """Slots for tokens ``[P, S)`` of every request, in batch order, taking new pages from the
    head of ``free_pages`` in batch order. Precondition: inputs valid and enough free pages.

    For request ``i`` (P, S, last_loc): part 1 finishes the prefix's partial page with
    ``last_loc + 1, ...``; part 2 fills whole new pages; part 3 puts the tail at the start of the
    request's last new page.
    """
    out: list[int] = []
    page_cursor = 0
    for p, s, loc in zip(prefix_lens, seq_lens, last_loc, strict=True):
        prefix_pages_end = ceil_div(p, page_size) * page_size  # first slot column past P's pages
        n_new = extend_new_pages(p, s, page_size)
        pages = list(free_pages[page_cursor : page_cursor + n_new])
        page_cursor += n_new
        # Part 1: the rest of the prefix's partial page.
        n1 = min(s, prefix_pages_end) - p
        out.extend(loc + 1 + k for k in range(n1))
        if p + n1 == s:
            continue
        # Part 2: whole new pages.
        n2_pages = (floor_align(s, page_size) - prefix_pages_end) // page_size
        for page in pages[:n2_pages]:
            out.extend(range(page * page_size, (page + 1) * page_size))
        # Part 3: the tail, at the start of the last new page.
        n3 = s - floor_align(s, page_size)
        if n3:
            out.extend(range(pages[-1] * page_size, pages[-1] * page_size + n3))
    return out


def alloc_decode_slots(
    seq_lens: Sequence[int], last_loc: Sequence[int], free_pages: Sequence[int], page_size: int
) -> list[int]:
    """One slot per request for token ``S - 1``: the first slot of the next free page (taken in
    batch order) when ``(S - 1) % ps == 0``, else ``last_loc + 1``. Precondition: enough pages."""
    out: list[int] = []
    page_cursor = 0
    for s, loc in zip(seq_lens, last_loc, strict=True):
        if (s - 1) % page_size == 0:
            out.append(free_pages[page_cursor] * page_size)
            page_cursor += 1
        else:
            out.append(loc + 1)
    return out


def eviction_target(
    rules: Rules,
    needed: int,
    new_tokens: int,
    batch_size: int,
    page_size: int,
    available: int,
) -> int:
    """Tokens the lifecycle evicts before an extend (``new_tokens`` > 0) or a decode
    (``new_tokens == 0``) of ``batch_size`` requests that needs ``needed`` tokens of new pages
    with ``available`` free: the demand is ``needed`` (``rules.eviction_demand == "exact"``)
    or SGLang's bound (paged extend ``new_tokens + batch_size * page_size``, paged decode
    ``batch_size * page_size``); nothing is evicted while the demand fits, else the shortfall
    (``eviction_amount == "shortfall"``) or the whole demand (``"demand"``)."""
    demand = needed
    if rules.eviction_demand == "bound" and page_size > 1:
        demand = new_tokens + batch_size * page_size
    if demand <= available:
        return 0
    return demand - available if rules.eviction_amount == "shortfall" else demand
