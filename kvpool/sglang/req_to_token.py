"""SGLang's ``ReqToTokenPool`` behind kvpool's :class:`~kvpool.protocols.ReqToTokenPoolProtocol`.

SGLang reads different request fields than kvpool's ``ReqLike`` and they changed between
releases; :class:`ReqProxy` maps them onto a kvpool request both ways, so that the row SGLang
assigns (``req_pool_idx``) is set on the kvpool request itself:

- 0.5.16 reads ``req_pool_idx``, ``inflight_middle_chunks`` (kvpool: ``is_chunked``) and
  ``kv_committed_len``;
- 0.5.23 reads ``req.kv.holds_kv`` (a row is set), ``req.kv.kv_allocated_len`` and
  ``req.kv.req_pool_idx``. A kvpool request without ``kv_allocated_len`` reports
  ``max(kv_committed_len, is_chunked)``, positive exactly when kvpool allows it to keep its row.

SGLang's misuse checks are ``assert`` statements made before any change; the adapter re-raises
them as kvpool's typed errors (RowReuseError for ``alloc``, InvalidArgumentError for ``free`` of
a request without a row). A double free is not checked by SGLang (it corrupts the stack).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch

from kvpool.errors import InvalidArgumentError, RowReuseError
from kvpool.sglang.loader import SGLangModules
from kvpool.snapshot import ReqToTokenSnapshot


class ReqProxy:
    """A kvpool request as SGLang's ``ReqToTokenPool`` reads it (see the module docstring).
    Attributes not mapped here are the kvpool request's own."""

    def __init__(self, req: Any) -> None:
        object.__setattr__(self, "req", req)

    def __getattr__(self, name: str) -> Any:
        return getattr(self.req, name)

    def __setattr__(self, name: str, value: Any) -> None:
        setattr(self.req, name, value)

    @property
    def req_pool_idx(self) -> int | None:
        value: int | None = self.req.req_pool_idx
        return value

    @req_pool_idx.setter
    def req_pool_idx(self, value: int | None) -> None:
        self.req.req_pool_idx = None if value is None else int(value)

    @property
    def inflight_middle_chunks(self) -> int:
        return int(self.req.is_chunked)

    @property
    def kv(self) -> ReqProxy:
        """0.5.23's ``ReqKvInfo`` view: the same proxy."""
        return self

    @property
    def holds_kv(self) -> bool:
        return self.req.req_pool_idx is not None

    @property
    def kv_allocated_len(self) -> int:
        own = getattr(self.req, "kv_allocated_len", None)
        if own is not None:
            return int(own)
        return max(int(self.req.kv_committed_len), int(self.req.is_chunked))


class SGLangReqToTokenPool:
    """SGLang's ``ReqToTokenPool`` of ``size`` rows and ``max_context_len`` columns on the CPU.
    ``impl`` is SGLang's object; ``free_slots`` order is SGLang's list order."""

    def __init__(self, modules: SGLangModules, size: int, max_context_len: int) -> None:
        cls = modules.attr("sglang.srt.mem_cache.memory_pool", "ReqToTokenPool")
        self.impl: Any = cls(size, max_context_len, "cpu", False)
        self.size = size
        self.max_context_len = max_context_len

    def check_alloc(self, reqs: Sequence[Any]) -> int:
        """The rows ``alloc`` would hand out, after SGLang's own reuse rule (a request keeping
        its row must be chunked or hold committed KV, else RowReuseError); changes nothing.
        kvpool's manager calls it to validate a batch before its first change."""
        fresh = 0
        for i, req in enumerate(reqs):
            if req.req_pool_idx is None:
                fresh += 1
            elif not (req.is_chunked > 0 or req.kv_committed_len > 0):
                raise RowReuseError(f"request {i} keeps row {req.req_pool_idx} illegally")
        return fresh

    def alloc(self, reqs: Sequence[Any]) -> list[int] | None:
        """SGLang's ``alloc``: every request's row in batch order, or None."""
        try:
            rows = self.impl.alloc([ReqProxy(r) for r in reqs])
        except AssertionError as exc:
            raise RowReuseError(f"SGLang refused the batch: {exc}") from None
        return None if rows is None else [int(r) for r in rows]

    def free(self, req: Any) -> None:
        try:
            self.impl.free(ReqProxy(req))
        except AssertionError as exc:
            raise InvalidArgumentError(f"SGLang refused the free: {exc}") from None

    def write(self, index: tuple[int, slice], values: Any) -> None:
        """``req_to_token[row, start:stop] = values`` through SGLang's ``write``."""
        tensor = values if isinstance(values, torch.Tensor) else torch.tensor(list(values))
        self.impl.write(index, tensor.to(torch.int32))

    def read(self, row: int, start: int, stop: int) -> torch.Tensor:
        """A copy of ``req_to_token[row, start:stop]`` (int32)."""
        table: torch.Tensor = self.impl.req_to_token
        return table[row, start:stop].clone()

    def available_size(self) -> int:
        return int(self.impl.available_size())

    def clear(self) -> None:
        self.impl.clear()

    def snapshot(self, rows: Sequence[tuple[int, int]] = ()) -> ReqToTokenSnapshot:
        """kvpool's snapshot of SGLang's ``free_slots`` (its list order), ``req_generation``
        and the first ``length`` columns of each ``(row, length)`` in ``rows``."""
        table = self.impl.req_to_token
        return ReqToTokenSnapshot(
            size=self.size,
            max_context_len=self.max_context_len,
            free_slots=tuple(int(r) for r in self.impl.free_slots),
            req_generation=tuple(int(g) for g in self.impl.req_generation.tolist()),
            rows=tuple((row, tuple(table[row, :length].tolist())) for row, length in rows),
        )


__all__ = ["ReqProxy", "SGLangReqToTokenPool"]
