"""kvpool's typed error hierarchy: every misuse raises a subclass of :class:`KVPoolError`.

Contract shared by both twins: an operation that raises one of these has changed nothing.
Errors that describe bad arguments also derive from :class:`ValueError` (or :class:`IndexError`)
so that callers catching the builtin still catch them.
"""

from __future__ import annotations

from collections.abc import Iterable


class KVPoolError(Exception):
    """Root of every error kvpool raises on purpose."""


class ConfigError(KVPoolError, ValueError):
    """A constructor argument is invalid (negative size, bad dtype, unknown policy...)."""


class PageSizeError(ConfigError):
    """The page size is not a positive power of two."""


class AlignmentError(KVPoolError, ValueError):
    """A paged operation got a length or slot that is not page-aligned where it must be."""


class InvalidArgumentError(KVPoolError, ValueError):
    """An operation argument breaks the operation's precondition (lengths, shapes, ranges)."""


class IndexOutOfRangeError(KVPoolError, IndexError):
    """A slot, page, row or column index lies outside the pool."""


class ReservedIndexError(KVPoolError, ValueError):
    """Slot 0, page 0 or row 0 was passed where only allocatable indices are legal.

    Index 0 is reserved for padded batches (see :data:`kvpool.constants.RESERVED_INDEX`).
    """


class DoubleFreeError(KVPoolError, ValueError):
    """An index that is not currently allocated was freed (or freed twice in one call)."""

    def __init__(self, message: str, indices: Iterable[int] = ()) -> None:
        self.indices: tuple[int, ...] = tuple(indices)
        super().__init__(f"{message}: {list(self.indices)}" if self.indices else message)


class RowReuseError(KVPoolError, ValueError):
    """A request that already holds a row asked for one, without being chunked or having
    committed KV (the only two cases in which keeping a row is legal)."""


class ContextOverflowError(KVPoolError, IndexError):
    """A write or allocation would go past ``max_context_len`` columns of a row."""


class UnknownRequestError(KVPoolError, KeyError):
    """A request or session id is not known to the memory manager (or is in the wrong state)."""


class RequestStateError(KVPoolError, RuntimeError):
    """An operation was asked of a request in a lifecycle state that does not allow it."""


class LockError(KVPoolError, RuntimeError):
    """A radix-tree lock count would go negative, or a lock was taken on a detached node."""


class OutOfMemoryError(KVPoolError, RuntimeError):
    """A lifecycle helper could not get the rows or slots it needs, even after eviction.

    Raised only after every pool has been left exactly as it was before the call.
    """


class InvariantViolation(KVPoolError, AssertionError):
    """A named invariant does not hold. ``invariant_id`` names it (for example
    ``INV-NO-DOUBLE-FREE``) and ``indices`` lists the offending slots, pages, rows or nodes."""

    def __init__(self, invariant_id: str, message: str, indices: Iterable[int] = ()) -> None:
        self.invariant_id = invariant_id
        self.indices: tuple[int, ...] = tuple(indices)
        shown = list(self.indices[:32])
        more = f" (+{len(self.indices) - 32} more)" if len(self.indices) > 32 else ""
        detail = f" offending: {shown}{more}" if self.indices else ""
        super().__init__(f"[{invariant_id}] {message}{detail}")


class KernelError(KVPoolError, RuntimeError):
    """A kernel could not run as asked (missing backend, unsupported triton version...)."""


class SGLangLoadError(KVPoolError, RuntimeError):
    """SGLang's source could not be found or loaded: a path without an ``sglang`` package, a
    version ``pip download`` cannot fetch, no installed ``sglang``, or a module the loader needs
    missing from the source."""


class KVStorageError(KVPoolError, RuntimeError):
    """A KV buffer operation the pool's storage cannot do: a write to a pool that stores no KV
    (the no-op pool), as SGLang raises there."""


class LayerNotLoadedError(KVPoolError, RuntimeError):
    """A KV layer was read before its layer-wise load completed (the layer-transfer counter's
    event for that layer has not fired)."""
