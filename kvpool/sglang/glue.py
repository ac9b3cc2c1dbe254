"""Stand-ins for SGLang's scheduler ``Req`` and ``ScheduleBatch``, as SGLang 0.5.23's memory
glue reads and writes them, and a counter of the glue functions that ran.

SGLang's scheduler decides what to allocate, keep and free through the functions of
``mem_cache/allocation.py`` (``alloc_for_extend``, ``alloc_for_decode``, ``alloc_req_slots``,
the paged helpers) and ``mem_cache/common.py`` (``release_kv_cache``, ``checkpoint_kv_cache``,
``free_kv_row_segments``...). :class:`~kvpool.sglang.glue_manager.SGLangGlueManager` calls
them with:

- :class:`GlueReq`: a kvpool request with exactly the fields those functions read and write
  (SGLang's names, on top of :class:`~kvpool.sglang.cache_req.CacheReq`, which the tree already
  sees); reading or writing any other attribute raises AttributeError, so a field a later
  release starts to use shows up as a crash, not as a silent default;
- :class:`GlueKv`: its ``req.kv`` (``ReqKvInfo``);
- :class:`GlueBatch`: the batch fields (``__slots__``: an unknown attribute is an error).

Which fields map where (SGLang name: kvpool field):

=====================================  ===================================================
``kv.req_pool_idx`` (read / write)     ``req_pool_idx``
``kv.holds_kv``, ``kv.is_kv_released`` a row is held / not
``kv.kv_allocated_len`` (read / write) ``kv_allocated_len``
``kv.kv_committed_len`` (read / write) ``kv_committed_len`` (a write is kept aside and
                                       checked: kvpool's lifecycle sets the value right
                                       after, ``check_committed``)
``kv.mark_kv_released()``              noted (:attr:`GlueReq.released`) and checked after
                                       the release (``check_released``); kvpool forgets the
                                       fields itself
``lock`` (write None)                  noted (:attr:`GlueReq.lock_dropped`), checked after
                                       the release
``kv.holds_mamba``,                    False / None: no hybrid model on this path
``kv.mamba_ping_pong_track_buffer``
``prefix_len`` (read / write)          the tree prefix of a waiting request, else its
                                       committed length; a write is kept for the call (a
                                       chunk boundary's is checked: ``check_resume``)
``extend_end``                         ``len(fill_ids)``
``owned_kv_len()``,                    SGLang's own (:mod:`kvpool.sglang.req_methods`),
``output_ids_through_stop``            bound by the release (unbound: AttributeError)
``refresh_fill_ids()``                 nothing (kvpool's fill ids are its tokens)
``finished_len``                       ``finished_len`` (``finish``'s ``finished_lens``)
``skip_radix_cache_insert``            set at a finish when SGLang's own
                                       ``_mamba_can_cache_finished_req`` says no
=====================================  ===================================================
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Sequence
from typing import Any

import torch

from kvpool.errors import InvariantViolation
from kvpool.sglang.cache_req import CacheReq, CacheReqKv


def _mapped(obj: object, name: str) -> property:
    prop = getattr(type(obj), name, None)
    if not isinstance(prop, property) or prop.fset is None:
        raise AttributeError(f"SGLang wrote {name!r}, which kvpool's request does not map")
    return prop


class GlueKv(CacheReqKv):
    """``req.kv`` of a :class:`GlueReq` (see the module docstring)."""

    __slots__ = ()

    def __setattr__(self, name: str, value: Any) -> None:
        _mapped(self, name).fset(self, value)  # type: ignore[misc]

    @property
    def req_pool_idx(self) -> int | None:
        return self._owner.req_pool_idx

    @req_pool_idx.setter
    def req_pool_idx(self, value: int | None) -> None:
        self._owner.req.req_pool_idx = None if value is None else int(value)

    @property
    def holds_kv(self) -> bool:
        return self._owner.req.req_pool_idx is not None

    @property
    def is_kv_released(self) -> bool:
        return self._owner.req.req_pool_idx is None

    def mark_kv_released(self) -> None:
        """Noted (:attr:`GlueReq.released`): kvpool's lifecycle forgets the request's pool
        fields next, and the release is checked to have marked the record
        (:func:`check_released`)."""
        object.__setattr__(self._owner, "released", True)

    @property
    def holds_mamba(self) -> bool:
        return False

    @property
    def mamba_ping_pong_track_buffer(self) -> None:
        return None

    @property
    def kv_allocated_len(self) -> int:
        return int(self._owner.req.kv_allocated_len)

    @kv_allocated_len.setter
    def kv_allocated_len(self, value: int) -> None:
        self._owner.req.kv_allocated_len = int(value)

    @property
    def kv_committed_len(self) -> int:
        return int(self._owner.req.kv_committed_len)

    @kv_committed_len.setter
    def kv_committed_len(self, value: int) -> None:
        """Kept aside (:attr:`GlueReq.committed_written`), not written: kvpool's lifecycle
        owns the step that computes the KV and sets the committed length right after, and the
        glue manager checks that SGLang wrote that same length (:func:`check_committed`)."""
        object.__setattr__(self._owner, "committed_written", int(value))


class GlueReq(CacheReq):
    """A kvpool request as SGLang 0.5.23's memory glue sees it (see the module docstring)."""

    __slots__ = ("_skip", "_stops", "committed_written", "lock_dropped", "matched", "released")
    committed_written: int | None
    """The committed length (tokens) SGLang's glue last wrote into ``req.kv`` (None: none
    yet); :func:`check_committed` compares it with the step's."""
    released: bool
    """Whether SGLang's glue called ``req.kv.mark_kv_released()`` (:func:`check_released`)."""
    lock_dropped: bool
    """Whether SGLang's glue wrote ``req.lock = None`` (:func:`check_released`)."""
    matched: dict[str, Any]
    """What ``match_kv_cache`` wrote: ``prefix_len`` and the host / branching fields."""
    _stops: Any
    """SGLang's own stop members (:meth:`bind_stops`), None until the release binds them."""
    _skip: bool
    """``skip_radix_cache_insert``, as the scheduler marked it (:meth:`skip_insert`)."""

    SINKS = frozenset({
        "last_host_node", "best_match_node", "host_hit_length", "swa_host_hit_length",
        "mamba_host_hit_length", "num_matched_prefix_tokens", "swa_branching_seqlen",
        "mamba_branching_seqlen",
    })  # fmt: skip
    """Fields ``match_kv_cache`` writes that kvpool's lifecycle does not use (no host tier, no
    sliding window, no hybrid model on this path): kept in :attr:`matched`, readable back."""

    def __init__(self, req: Any, *args: Any, **kwargs: Any) -> None:
        super().__init__(req, *args, **kwargs)
        object.__setattr__(self, "matched", {})
        object.__setattr__(self, "_stops", None)
        object.__setattr__(self, "_skip", False)
        object.__setattr__(self, "committed_written", None)
        object.__setattr__(self, "released", False)
        object.__setattr__(self, "lock_dropped", False)

    @property
    def skip_radix_cache_insert(self) -> bool:
        """Whether the release must not cache the request (its scheduler's mark)."""
        return self._skip

    def skip_insert(self) -> None:
        """Mark the request ``skip_radix_cache_insert``, as SGLang's scheduler does."""
        object.__setattr__(self, "_skip", True)

    def bind_stops(self, methods: Any) -> None:
        """Answer ``owned_kv_len()`` and ``output_ids_through_stop`` with SGLang's own
        (:class:`~kvpool.sglang.req_methods.StopMethods`): the release binds them."""
        object.__setattr__(self, "_stops", methods)

    def _stop_methods(self) -> Any:
        if self._stops is None:
            raise AttributeError("SGLang read the request's stop before the release bound it")
        return self._stops

    def __setattr__(self, name: str, value: Any) -> None:
        if name in self.SINKS:
            self.matched[name] = value
        else:
            _mapped(self, name).fset(self, value)  # type: ignore[misc]

    def __getattr__(self, name: str) -> Any:
        if name in GlueReq.SINKS and name in self.matched:
            return self.matched[name]
        raise AttributeError(f"SGLang read {name!r}, which kvpool's request does not map")

    def _compute_max_prefix_len(self, input_len: int) -> int:
        """At most ``input_len - 1`` tokens (the last one computes the logits; kvpool's
        requests ask for no logprobs)."""
        return max(input_len - 1, 0)

    @property
    def kv(self) -> GlueKv:
        return GlueKv(self)

    @property
    def lock(self) -> Any:
        """The request's ``TreeLock`` (:attr:`CacheReq.lock`)."""
        return CacheReq.lock.fget(self)  # type: ignore[attr-defined]

    @lock.setter
    def lock(self, value: Any) -> None:
        """As :attr:`CacheReq.lock`; a None (the release's drop of its handle) is noted in
        :attr:`lock_dropped`."""
        if value is None:
            object.__setattr__(self, "lock_dropped", True)
        CacheReq.lock.fset(self, value)  # type: ignore[attr-defined]

    @property
    def prefix_len(self) -> int:
        if "prefix_len" in self.matched:
            return int(self.matched["prefix_len"])
        if self.req.req_pool_idx is not None:
            return int(self.req.kv_committed_len)
        return len(self.req.prefix_indices)

    @prefix_len.setter
    def prefix_len(self, value: int) -> None:
        """``match_kv_cache``'s hit (read back by ``prefix_device_indices``); after a chunk,
        SGLang's note of where the next extend resumes, which kvpool's state also says."""
        self.matched["prefix_len"] = int(value)

    @property
    def extend_end(self) -> int:
        return len(self.req.fill_ids)

    def owned_kv_len(self) -> int:
        return int(self._stop_methods().owned_kv_len(self))

    @property
    def output_ids_through_stop(self) -> Any:
        return self._stop_methods().output_ids_through_stop(self)

    def refresh_fill_ids(self) -> None:
        """kvpool's fill ids are its tokens: nothing lags."""

    @property
    def finished_len(self) -> int | None:
        stop: int | None = self.req.finished_len
        return stop


class GlueBatch:
    """The ``ScheduleBatch`` fields SGLang's allocation glue reads (an unknown one raises)."""

    __slots__ = (
        "device",
        "extend_lens",
        "extend_num_tokens",
        "model_config",
        "prefix_lens",
        "req_pool_indices",
        "req_pool_indices_cpu",
        "req_to_token_pool",
        "reqs",
        "seq_lens",
        "seq_lens_cpu",
        "tree_cache",
    )

    def __init__(self, reqs: list[GlueReq], req_to_token_pool: Any, tree_cache: Any) -> None:
        self.reqs = reqs
        self.req_to_token_pool = req_to_token_pool
        self.tree_cache = tree_cache
        self.device = "cpu"
        self.model_config = _ModelConfig()

    def maybe_evict_swa(self) -> None:
        """No sliding window on this path."""

    def is_dllm(self) -> bool:
        return False

    @property
    def hisparse_coordinator(self) -> None:
        return None

    def for_extend(self, prefix_lens: list[int], seq_lens: list[int]) -> GlueBatch:
        """The prefill batch's lengths (tokens), as ``ScheduleBatch.prepare_for_extend``."""
        self.prefix_lens = list(prefix_lens)
        self.extend_lens = [s - p for p, s in zip(prefix_lens, seq_lens, strict=True)]
        self.extend_num_tokens = sum(self.extend_lens)
        self.seq_lens = torch.tensor(seq_lens, dtype=torch.int64)
        self.seq_lens_cpu = self.seq_lens.clone()
        return self

    def for_decode(self, rows: list[int], seq_lens: list[int]) -> GlueBatch:
        """The decode batch: each request's row and length before its new token."""
        self.req_pool_indices = torch.tensor(rows, dtype=torch.int64)
        self.req_pool_indices_cpu = self.req_pool_indices.clone()
        self.seq_lens = torch.tensor(seq_lens, dtype=torch.int64)
        self.seq_lens_cpu = self.seq_lens.clone()
        return self


class _ModelConfig:
    __slots__ = ()
    is_encoder_decoder = False


_COUNTS = "__kvpool_glue_calls__"


def count_calls(module: Any, short: str) -> Counter[str]:
    """The calls made so far of each function defined in SGLang's loaded ``module``, as
    ``SHORT.NAME`` -> count. Every such function is wrapped once (the counter lives on the
    module, shared by every manager of the process); calls between them, made through the
    module's globals, are counted too. Each call wraps again what is not wrapped: a function
    that was put back unwrapped (a test's monkeypatch undone after it had been patched over
    the original before the first wrap) is counted from then on."""
    counts: Counter[str] | None = vars(module).get(_COUNTS)
    if counts is None:
        counts = Counter()
        setattr(module, _COUNTS, counts)
    for name, fn in list(vars(module).items()):
        if isinstance(fn, _FUNCTION) and fn.__module__ == module.__name__:
            setattr(module, name, _counted(counts, f"{short}.{name}", fn))
    return counts


def check_committed(glues: Sequence[GlueReq], expected: Sequence[int], call: str) -> None:
    """Each request's committed length (tokens) as SGLang's glue ``call`` wrote it into the
    record must be ``expected`` (the length the step commits, which kvpool's lifecycle sets):
    a glue that forgets or miscounts it leaves the scheduler's record wrong, which later
    releases and matches read. Raises :class:`~kvpool.errors.InvariantViolation`
    ``INV-LENGTHS`` naming each request, what was written and what the step commits."""
    wrong = [
        (g.req.rid, g.committed_written, e)
        for g, e in zip(glues, expected, strict=True)
        if g.committed_written != e
    ]
    if wrong:
        raise InvariantViolation(
            "INV-LENGTHS",
            f"SGLang's {call} wrote kv_committed_len (rid, written, the step's): {wrong}",
        )


def check_released(glue: GlueReq, call: str) -> None:
    """After SGLang's ``release_kv_cache`` gave a request's row back (``call`` names it): the
    glue must have marked the request's record released (``req.kv.mark_kv_released()``, which
    zeroes its allocated length; a record that keeps it says it still holds KV without a row,
    which SGLang's own release asserts against: ``not holds_kv == is_kv_released``) and
    dropped its lock handle
    (``req.lock = None``; a stale handle is a second unlock waiting to happen). kvpool's
    lifecycle forgets both itself, so the glue's part is checked here. Raises
    :class:`~kvpool.errors.InvariantViolation` ``INV-LENGTHS`` / ``INV-LOCKS``."""
    rid = glue.req.rid
    if not glue.released:
        raise InvariantViolation(
            "INV-LENGTHS",
            f"SGLang's {call} left request {rid!r}'s record holding its allocated length "
            "(no mark_kv_released) after giving its row back",
        )
    if not glue.lock_dropped:
        raise InvariantViolation(
            "INV-LOCKS", f"SGLang's {call} left request {rid!r}'s lock handle set (req.lock)"
        )


def check_resume(glue: GlueReq, expected: int, call: str) -> None:
    """After SGLang's ``checkpoint_kv_cache`` (``call``): the ``prefix_len`` it wrote, where
    the request's next extend resumes (tokens), must be ``expected``, the length kvpool's
    lifecycle resumes from (``len(fill_ids)``); a glue that forgets or miscounts it makes the
    next prefill recompute or skip tokens. Raises
    :class:`~kvpool.errors.InvariantViolation` ``INV-LENGTHS``."""
    written = glue.matched.get("prefix_len")
    if written != expected:
        raise InvariantViolation(
            "INV-LENGTHS",
            f"SGLang's {call} wrote prefix_len {written} for request {glue.req.rid!r}; its next "
            f"extend resumes at {expected}",
        )


def check_allocated(glues: Sequence[GlueReq], expected: Sequence[int], call: str) -> None:
    """Each request's allocated length (tokens) as SGLang's glue ``call`` left it must be
    ``expected`` (the columns the step grew the row to). Raises
    :class:`~kvpool.errors.InvariantViolation` ``INV-LENGTHS`` naming each request."""
    wrong = [
        (g.req.rid, int(g.req.kv_allocated_len), e)
        for g, e in zip(glues, expected, strict=True)
        if int(g.req.kv_allocated_len) != e
    ]
    if wrong:
        raise InvariantViolation(
            "INV-LENGTHS",
            f"SGLang's {call} left kv_allocated_len (rid, left, the step's): {wrong}",
        )


def link_counted(modules: list[Any]) -> None:
    """Point each of ``modules``' imports of another's function at its counted wrapper (a
    ``from ... import f`` bound the original before :func:`count_calls` wrapped it)."""
    for module in modules:
        for name, value in list(vars(module).items()):
            if not isinstance(value, _FUNCTION):
                continue
            for other in modules:
                wrapped = vars(other).get(name)
                if other is not module and getattr(wrapped, "__wrapped__", None) is value:
                    setattr(module, name, wrapped)


def _counted(counts: Counter[str], label: str, fn: Callable[..., Any]) -> Callable[..., Any]:
    def call(*args: Any, **kwargs: Any) -> Any:
        counts[label] += 1
        return fn(*args, **kwargs)

    call.__wrapped__ = fn  # type: ignore[attr-defined]
    return call


def _function() -> None:
    """Its type is the type of a plain function."""


_FUNCTION = type(_function)


class _Spec:
    """``get_spec()``: the server runs speculative decoding (kvpool's lifecycle draws EAGLE
    steps, whose reserve leaves over-allocated slots that a release frees)."""

    speculative_algorithm = "EAGLE"


class _Serving:
    """``get_serving()``: thinking tokens are cached (SGLang's default)."""

    strip_thinking_cache = False


def install_stand_ins(runtime_context: Any, utils_common: Any) -> None:
    """Give the stubbed ``runtime_context`` and ``utils.common`` of a loaded SGLang the
    answers a single-process CPU server gets: no pinned memory; attention backends without a
    Triton table writer (``torch_native``: SGLang then writes rows and reads ``last_loc`` in
    torch, the same slots); speculative decoding on; thinking kept."""
    runtime_context.__dict__["attention_backends"] = lambda: ("torch_native", "torch_native")
    runtime_context.__dict__["get_spec"] = lambda: _Spec()
    runtime_context.__dict__["get_serving"] = lambda: _Serving()
    utils_common.__dict__["is_pin_memory_available"] = lambda device=None: False


__all__ = [
    "GlueBatch",
    "GlueKv",
    "GlueReq",
    "check_allocated",
    "check_committed",
    "check_released",
    "check_resume",
    "count_calls",
    "install_stand_ins",
    "link_counted",
]
