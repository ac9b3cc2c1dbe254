"""Fixed scenarios run step by step on kvpool's reference and on an SGLang adapter.

Each scenario drives one component through the calls an engine makes, choosing every argument
from that component's own earlier results, and returns a trace: one ``(step, result, snapshot)``
per call, results as plain lists. Two implementations agree when their traces are equal.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from kvpool.config import PoolConfig

Trace = list[tuple[str, Any, Any]]


def plain(value: Any) -> Any:
    """``value`` as plain Python: tensors and sequences as lists of ints, None as None."""
    if value is None:
        return None
    if hasattr(value, "tolist"):
        return [int(x) for x in value.tolist()]
    if isinstance(value, (list, tuple)):
        return [int(x) for x in value]
    return value


def build_reference(cls: type, config: PoolConfig, *args: Any, **kwargs: Any) -> Any:
    """``cls(*args, **kwargs)``, passing ``rules=config.rules`` when the reference takes it."""
    if "rules" in inspect.signature(cls).parameters:
        kwargs["rules"] = config.rules
    return cls(*args, **kwargs)


class Recorder:
    """Calls methods of ``component`` and records results and snapshots."""

    def __init__(self, component: Any) -> None:
        self.component = component
        self.trace: Trace = []

    def __call__(self, name: str, *args: Any) -> Any:
        return self.note(f"{name}{args!r}", plain(getattr(self.component, name)(*args)))

    def note(self, label: str, result: Any) -> Any:
        """Record ``result`` of a call made directly on the component."""
        self.trace.append((label, result, self.snap()))
        return result

    def snap(self) -> Any:
        """What is compared after each step (the component's snapshot)."""
        return self.component.snapshot()


def token_allocator_steps(a: Recorder) -> None:
    """Page size 1, 16 slots: FIFO reuse, a free group, backup/restore, a merge on a short
    allocation (fits after merging) and a clear."""
    x = a("alloc", 4)
    y = a("alloc", 3)
    a("free", x[1:3])
    z = a("alloc", 2)
    a("free_group_begin")
    a("free", y)
    a("free", z[:1])
    a("free_group_end")
    a("alloc", 5)
    state = a.component.backup_state()
    a("alloc", 2)
    a.component.restore_state(state)
    a("available_size")
    a("alloc", 4)  # short of free_pages under need_sort: merge, then allocate
    a("merge_and_sort_free")
    a("alloc", 1)
    a("clear")
    a("alloc", 16)


def token_allocator_refused_steps(a: Recorder) -> None:
    """A refused allocation with release pages waiting (need_sort: SGLang merges anyway)."""
    x = a("alloc", 12)
    a("free", x[:6])
    a("alloc", 8)  # 4 free + 6 released: merge, then allocate
    a("free", [x[7]])
    a("alloc", 9)  # 2 free + 1 released: refused


def paged_allocator_steps(a: Recorder) -> None:
    """Page size 4, 16 pages: alloc, alloc_extend (mid-page prefix), alloc_decode across a page
    boundary, frees (whole pages, LIFO), a free group with one page named twice,
    backup/restore, merge, refusals of extend and decode, clear."""
    x = a("alloc", 8)
    # request 0: fresh, 5 tokens; request 1: prefix of 3 tokens in x's first page, grows to 9.
    e = a("alloc_extend", [0, 3], [0, 3], [5, 9], [5, 9], [-1, x[2]], 11)
    d = a("alloc_decode", [6, 10], [6, 10], [e[4], e[-1]])
    a("alloc_decode", [7, 11], [7, 11], [d[0], d[1]])
    a("free", e[:4])
    a("free_group_begin")
    a("free", x[4:])
    a("free", [x[5], e[5]])
    a("free_group_end")
    state = a.component.backup_state()
    a("alloc", 16)
    a.component.restore_state(state)
    a("available_size")
    a("merge_and_sort_free")
    a("alloc_extend", [0, 0], [0, 0], [4, 1], [4, 1], [-1, -1], 5)
    a("alloc_extend", [0], [0], [200], [200], [-1], 200)  # 50 pages: refused
    a("alloc", a.component.available_size())
    a("alloc_decode", [5], [5], [e[3]])  # needs a new page: none left
    a("clear")
    a("alloc_extend", [0], [0], [64], [64], [-1], 64)


@dataclass
class PlainReq:
    """What ``ReqToTokenPool.alloc`` reads of a request (kvpool's ``ReqLike``)."""

    req_pool_idx: int | None = None
    is_chunked: int = 0
    kv_committed_len: int = 0


def req_to_token_steps(p: Recorder) -> list[PlainReq]:
    """4 rows of 8 columns: a batch, a free, a batch with a chunked request keeping its row,
    writes and reads, a refusal, a clear."""
    reqs = [PlainReq() for _ in range(3)]
    p("alloc", reqs)
    p("write", (reqs[1].req_pool_idx, slice(0, 3)), [11, 12, 13])
    p("read", reqs[1].req_pool_idx, 0, 4)
    p("free", reqs[1])
    reqs[0].is_chunked = 1
    more = [reqs[0], PlainReq(), PlainReq()]
    p("alloc", more)
    p("alloc", [PlainReq()])  # no row left: refused
    p("available_size")
    p("free", more[2])
    p("clear")
    p("alloc", [PlainReq()])
    return reqs + more


def radix_steps(c: Recorder, alloc: Any, key: Callable[[list[int]], Any], ps: int) -> None:
    """Inserts that share prefixes (a split), a match ending mid-node (a split), locks, and an
    eviction that must skip the locked path. Values are slots from ``alloc``."""

    def insert(tokens: list[int]) -> Any:
        slots = plain(alloc.alloc(len(tokens)))
        return c("insert", key(tokens), slots)

    unit = [[t] * ps for t in range(1, 9)]  # page-sized runs of one token id
    insert(unit[0] + unit[1] + unit[2])
    insert(unit[0] + unit[1] + unit[3] + unit[4])
    insert(unit[5] + unit[6])
    match = c.component.match_prefix(key(unit[0] + unit[1] + unit[3] + unit[7]))
    c.note("match_prefix", plain(match.device_indices))
    c("inc_lock_ref", match.last_device_node)
    c("evictable_size")
    c("protected_size")
    c("evict", 1)
    c("evict", 100)
    c("total_size")
    c("dec_lock_ref", match.last_device_node)
    c("evict", 1)
    c("reset")
