"""Host-side helpers of the optimized allocators: page counts and checked-mode preconditions.

Page counts are computed from the HOST copies of the lengths (``*_cpu``: a CPU tensor or a list
of ints), so an allocation never waits for the device. The ``check_*`` functions are the
vectorised form of the reference's precondition checks (:mod:`kvpool.reference.pools.paged_ops` and
the reference allocator): a handful of tensor operations and one device-to-host read, raising
the error type the reference raises for the same input (the first offending request decides, and
for that request the first failing check, in the reference's order). They run in checked mode
only; the "always on" helpers (``check_extend_host``, ``check_decode_host``, dtypes, the shape of
a free-list state) read no device value and run in both modes. Units: lengths are tokens, pages
are page ids, slots are slot ids.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import numpy.typing as npt
import torch

from kvpool.constants import NO_LAST_LOC, RESERVED_INDEX
from kvpool.errors import (
    AlignmentError,
    DoubleFreeError,
    IndexOutOfRangeError,
    InvalidArgumentError,
    KVPoolError,
    ReservedIndexError,
)
from kvpool.host_checks import int_list
from kvpool.kernels.host import HostLens, Int64Array, host_array
from kvpool.optimized.index_args import any_outside, has_repeats
from kvpool.optimized.key_match import is_integer_dtype

PageIds = torch.Tensor | Sequence[int]
"""A free list as a caller hands it back: a 1-D integer tensor or a sequence of page ids."""


_SMALL_BATCH = 64
"""Up to this many requests host checks run on lists: NumPy's fixed cost per operation
exceeds a Python loop's at such sizes (the results are the same int64 arithmetic)."""


def _host(values: HostLens | Int64Array) -> Int64Array:
    return values if isinstance(values, np.ndarray) else host_array(values)


def extend_new_pages_host(
    prefix_lens_cpu: HostLens | Int64Array, seq_lens_cpu: HostLens | Int64Array, page_size: int
) -> int:
    """``sum(ceil(S/ps) - ceil(P/ps))`` from host copies (pages); no device work."""
    shift, mask = page_size.bit_length() - 1, page_size - 1  # page_size is a power of two
    s, p = _host(seq_lens_cpu), _host(prefix_lens_cpu)
    if s.size <= _SMALL_BATCH and p.size <= _SMALL_BATCH:  # lists: cheaper than NumPy here
        ends = _int64_sum([_wrap64(x + mask) >> shift for x in s.tolist()])
        return _wrap64(ends - _int64_sum([_wrap64(x + mask) >> shift for x in p.tolist()]))
    return int(((s + mask) >> shift).sum() - ((p + mask) >> shift).sum())


def decode_new_pages_host(seq_lens_cpu: HostLens | Int64Array, page_size: int) -> int:
    """Requests whose new token (position ``S - 1``) opens a page, from host copies (pages)."""
    return int(np.count_nonzero(((_host(seq_lens_cpu) - 1) & (page_size - 1)) == 0))


def pages_to_slots(pages: torch.Tensor, offsets: torch.Tensor) -> torch.Tensor:
    """Slots of ``pages`` page by page: ``page * ps + offsets`` flattened (``offsets`` is
    ``arange(ps)`` on the pages' device)."""
    return (pages.unsqueeze(1) * offsets.numel() + offsets).reshape(-1)


# --------------------------------------------------------------------------- always on


def check_integer_tensors(**tensors: torch.Tensor) -> None:
    """InvalidArgumentError unless every non-empty tensor has an integer dtype (metadata only;
    ``torch.tensor([])`` is float32 and holds nothing to misread)."""
    for name, t in tensors.items():
        if not is_integer_dtype(t.dtype) and t.numel():
            raise InvalidArgumentError(f"{name} must hold integers, got dtype {t.dtype}")


def host_ints(name: str, values: HostLens) -> Int64Array:
    """A host copy of lengths as a 1-D int64 array; InvalidArgumentError unless it is a 1-D
    integer tensor or array or a sequence of integers (a float, bool, ``None`` or nested item,
    a 2-D array, a number: refused, never truncated or flattened)."""
    if (
        type(values) is torch.Tensor
        and values.dtype is torch.int64
        and values.is_cpu
        and values.dim() == 1
    ):
        return values.numpy()  # the common case (an engine's host copy): a view, no checks due
    if isinstance(values, torch.Tensor):
        check_integer_tensors(**{name: values})
        if values.dim() != 1 or values.dtype == torch.bool:
            raise InvalidArgumentError(
                f"{name} must be a 1-D integer tensor, got dtype {values.dtype} and shape "
                f"{tuple(values.shape)}"
            )
        return host_array(values)
    if isinstance(values, np.ndarray):
        if values.ndim != 1 or (values.size and values.dtype.kind not in "iu"):
            raise InvalidArgumentError(
                f"{name} must be a 1-D integer array, got dtype {values.dtype} and shape "
                f"{values.shape}"
            )
        return values.astype(np.int64, copy=False)
    return np.asarray(int_list(name, values), dtype=np.int64)


def check_extend_host(
    prefix_lens: torch.Tensor,
    prefix_lens_cpu: HostLens,
    seq_lens: torch.Tensor,
    seq_lens_cpu: HostLens,
    last_loc: torch.Tensor,
    extend_num_tokens: object,
    checked: bool = False,
) -> tuple[Int64Array, Int64Array]:
    """The preconditions of ``alloc_extend`` that need no device read, done in both modes:
    integer dtypes, one length for the five arrays, ``0 <= P <= S`` and
    ``extend_num_tokens == sum(S - P)`` on the host copies (InvalidArgumentError, as the
    reference). Returns the host copies as int64 arrays. ``checked``: the caller made these
    checks already (:func:`check_host_copy` on both copies, then :func:`check_extend_batch`,
    which test the same conditions): the copies are only read."""
    if not checked:
        check_integer_tensors(prefix_lens=prefix_lens, seq_lens=seq_lens, last_loc=last_loc)
    p, s = host_ints("prefix_lens_cpu", prefix_lens_cpu), host_ints("seq_lens_cpu", seq_lens_cpu)
    if checked:
        return p, s
    sizes = (prefix_lens.numel(), p.size, seq_lens.numel(), s.size, last_loc.numel())
    if len(set(sizes)) != 1:
        raise InvalidArgumentError(
            f"batch arrays differ in length (prefix_lens, prefix_lens_cpu, seq_lens, "
            f"seq_lens_cpu, last_loc): {sizes}"
        )
    if p.size <= _SMALL_BATCH:  # the same int64 arithmetic on lists (cheaper at batch sizes)
        pl = p.tolist()
        gaps = [_wrap64(b - a) for a, b in zip(pl, s.tolist(), strict=True)]
        if pl and (min(pl) < 0 or min(gaps) < 0):
            raise InvalidArgumentError(
                f"need 0 <= prefix_len <= seq_len, got {p.tolist()}, {s.tolist()}"
            )
        expected = _int64_sum(gaps)
    else:
        new = s - p  # tokens to allocate per request
        if p.size and (p.min() < 0 or new.min() < 0):
            raise InvalidArgumentError(
                f"need 0 <= prefix_len <= seq_len, got {p.tolist()}, {s.tolist()}"
            )
        expected = int(new.sum())
    if not isinstance(extend_num_tokens, int) or extend_num_tokens != expected:
        raise InvalidArgumentError(
            f"extend_num_tokens={extend_num_tokens!r} but sum(seq_lens - prefix_lens)={expected}"
        )
    return p, s


def check_decode_host(
    seq_lens: torch.Tensor, seq_lens_cpu: HostLens, last_loc: torch.Tensor
) -> Int64Array:
    """``alloc_decode``'s preconditions that need no device read, done in both modes: integer
    dtypes, one length for the three arrays, every host ``S >= 1`` (InvalidArgumentError)."""
    if not (is_integer_dtype(seq_lens.dtype) and is_integer_dtype(last_loc.dtype)):
        check_integer_tensors(seq_lens=seq_lens, last_loc=last_loc)  # raises for a non-empty one
    s = host_ints("seq_lens_cpu", seq_lens_cpu)
    n = s.size
    if seq_lens.numel() != n or last_loc.numel() != n:
        sizes = (seq_lens.numel(), n, last_loc.numel())
        raise InvalidArgumentError(
            f"batch arrays differ in length (seq_lens, seq_lens_cpu, last_loc): {sizes}"
        )
    if n and s[s.argmin()] < 1:  # argmin: a fraction of min()'s fixed cost on small arrays
        raise InvalidArgumentError(f"alloc_decode needs every seq_len >= 1, got {s.tolist()}")
    return s


# --------------------------------------------------------------------------- checked mode
def _host_view(t: torch.Tensor) -> npt.NDArray[np.generic]:
    """``t``'s values on the host: a view of a CPU tensor (no copy), else one device read."""
    return t.numpy() if t.device.type == "cpu" else t.cpu().numpy()


def _host_rows(*tensors: torch.Tensor) -> list[list[int]]:
    """Equal-length 1-D integer tensors as host lists of ints: free views of CPU tensors, else
    ONE device read for all of them (stacked as int64 first)."""
    if all(t.device.type == "cpu" for t in tensors):
        return [t.tolist() for t in tensors]
    stacked = torch.stack([t.reshape(-1).to(torch.int64) for t in tensors])
    rows: list[list[int]] = stacked.cpu().tolist()
    return rows


_INT64_WRAP = 1 << 64


def _wrap64(value: int) -> int:
    """``value`` wrapped to int64, as int64 tensor or array arithmetic wraps."""
    return (value + (1 << 63)) % _INT64_WRAP - (1 << 63)


def _int64_sum(values: Sequence[int]) -> int:
    """``sum(values)`` wrapped to int64 as a device sum of an int64 tensor wraps."""
    return _wrap64(sum(values))


def check_host_copy(name: str, device_lens: torch.Tensor, host_lens: HostLens) -> torch.Tensor:
    """The device lengths as int64, after checking they equal their host copy
    (InvalidArgumentError otherwise, as the reference). The comparison is made on the host:
    a view for CPU lengths, one device read otherwise."""
    if (
        host_lens is device_lens
        and type(device_lens) is torch.Tensor
        and device_lens.dtype is torch.int64
        and device_lens.dim() == 1
        and device_lens.is_cpu
    ):  # one CPU tensor as both (checked mode on the CPU): equal to itself, nothing to read
        return device_lens
    dev = (
        device_lens
        if device_lens.dtype is torch.int64 and device_lens.dim() == 1
        else device_lens.to(torch.int64).reshape(-1)
    )
    host = host_ints(f"{name}_cpu", host_lens)
    # lists compare faster than NumPy's array_equal at batch sizes
    if dev.shape[0] != host.shape[0] or _host_view(dev).tolist() != host.tolist():
        raise InvalidArgumentError(
            f"{name} and {name}_cpu differ: {dev.tolist()} vs {host.tolist()}"
        )
    return dev


def check_extend_args(
    prefix_lens: torch.Tensor,
    seq_lens: torch.Tensor,
    last_loc: torch.Tensor,
    extend_num_tokens: int,
    page_size: int,
) -> None:
    """:func:`kvpool.reference.pools.paged_ops.validate_extend_args` over int64 inputs on one
    device, read to the host once (a view on the CPU): equal lengths, ``0 <= P <= S``,
    ``last_loc == -1`` exactly when ``P == 0``, an allocatable ``last_loc`` when ``P > 0``,
    ``(last_loc + 1) % ps == P % ps`` mid-page, and ``extend_num_tokens == sum(S - P)`` (the
    sum wrapped to int64, as a device sum would). The first failing request, and its first
    failing check in the reference's order, decide the error."""
    if not prefix_lens.numel() == seq_lens.numel() == last_loc.numel():
        raise InvalidArgumentError(
            f"batch arrays differ in length: prefix_lens={prefix_lens.numel()}, "
            f"seq_lens={seq_lens.numel()}, last_loc={last_loc.numel()}"
        )
    p, s, loc = _host_rows(prefix_lens, seq_lens, last_loc)
    _check_extend_rows(p, s, loc, extend_num_tokens, page_size)


def _check_extend_rows(
    p: list[int], s: list[int], loc: list[int], extend_num_tokens: int, ps: int
) -> None:
    """:func:`check_extend_args` on host lists of one length."""
    for i, (pi, si, li) in enumerate(zip(p, s, loc, strict=True)):
        if pi < 0 or si < pi:
            which = 1
        elif (pi == 0) != (li == NO_LAST_LOC):
            which = 2
        elif pi > 0 and li <= RESERVED_INDEX:
            which = 3
        # (li + 1) wraps to -2**63 at INT64_MAX on the device; both are 0 modulo a power of two
        elif pi % ps != 0 and (li + 1) % ps != pi % ps:
            which = 4
        else:
            continue
        message = f"request {i}: prefix_len={pi}, seq_len={si}, last_loc={li} breaks check {which}"
        raise (AlignmentError if which == 4 else InvalidArgumentError)(message)
    expected = _int64_sum([b - a for a, b in zip(p, s, strict=True)])
    if extend_num_tokens != expected:
        raise InvalidArgumentError(
            f"extend_num_tokens={extend_num_tokens} but sum(seq_lens - prefix_lens)={expected}"
        )


def check_prefix_pages_held(
    prefix_lens: torch.Tensor,
    last_loc: torch.Tensor,
    free_mask: torch.Tensor,
    page_size: int,
) -> None:
    """A prefix ending mid-page continues in ``last_loc``'s page, which must exist
    (IndexOutOfRangeError), not be page 0 (ReservedIndexError) and not be free
    (InvalidArgumentError). ``free_mask[page]`` is True for free pages (length num_pages + 1).
    Checked on the host: the lengths read once, the mask at the mid-page requests' pages."""
    p, loc = _host_rows(prefix_lens, last_loc)
    _check_pages_held_rows(p, loc, free_mask, page_size)


def check_extend_batch(
    prefix_lens: torch.Tensor,
    seq_lens: torch.Tensor,
    last_loc: torch.Tensor,
    extend_num_tokens: int,
    free_mask: torch.Tensor | None,
    page_size: int,
) -> None:
    """:func:`check_extend_args`, then (with a free mask) :func:`check_prefix_pages_held`, on
    one host read of the three arrays."""
    if not prefix_lens.numel() == seq_lens.numel() == last_loc.numel():
        check_extend_args(prefix_lens, seq_lens, last_loc, extend_num_tokens, page_size)
    p, s, loc = _host_rows(prefix_lens, seq_lens, last_loc)
    _check_extend_rows(p, s, loc, extend_num_tokens, page_size)
    if free_mask is not None:
        _check_pages_held_rows(p, loc, free_mask, page_size)


def check_decode_args(
    seq_lens: torch.Tensor,
    last_loc: torch.Tensor,
    free_mask: torch.Tensor | None,
    page_size: int,
) -> None:
    """``alloc_decode``'s value checks on int64 inputs of one device, read to the host once:
    every ``S >= 1`` (InvalidArgumentError), then :func:`check_extend_args` and (with a free
    mask) :func:`check_prefix_pages_held` for prefix ``S - 1``, one token each."""
    if seq_lens.numel() != last_loc.numel():
        (s,) = _host_rows(seq_lens)
        _check_decode_lens(s)
        # check_extend_args' length check raises (its prefix_lens, S - 1, has S's length)
        check_extend_args(seq_lens, seq_lens, last_loc, seq_lens.numel(), page_size)
    s, loc = _host_rows(seq_lens, last_loc)
    _check_decode_lens(s)
    p = [x - 1 for x in s]
    _check_extend_rows(p, s, loc, len(s), page_size)
    if free_mask is not None:
        _check_pages_held_rows(p, loc, free_mask, page_size)


def _check_decode_lens(s: list[int]) -> None:
    if any(x < 1 for x in s):
        raise InvalidArgumentError(f"alloc_decode needs every seq_len >= 1, got {s}")


def _check_pages_held_rows(
    p: list[int], loc: list[int], free_mask: torch.Tensor, page_size: int
) -> None:
    """:func:`check_prefix_pages_held` on host lists of one length."""
    num_pages = free_mask.numel() - 1
    mid = [i for i, pi in enumerate(p) if pi % page_size != 0]
    if not mid:
        return
    pages = [loc[i] // page_size for i in mid]
    held = [min(max(page, 0), num_pages) for page in pages]
    if free_mask.device.type == "cpu":
        is_free = free_mask.numpy()[held].tolist()
    else:
        is_free = free_mask[torch.tensor(held, device=free_mask.device)].tolist()
    for i, page, free in zip(mid, pages, is_free, strict=True):
        error: type[KVPoolError]
        if page > num_pages:
            error = IndexOutOfRangeError
        elif page == RESERVED_INDEX:
            error = ReservedIndexError
        elif free:
            error = InvalidArgumentError
        else:
            continue
        raise error(f"request {i}: last_loc {loc[i]} is not in an allocated page")


def check_free_slots(
    slots: torch.Tensor,
    free_mask: torch.Tensor,
    page_size: int,
    no_duplicates: bool = False,
    pending_mask: torch.Tensor | None = None,
) -> None:
    """The reference's free checks, in its precedence, over the whole call: every slot in
    ``[0, (num_pages + 1) * ps)`` (IndexOutOfRangeError; non-integer tensors too), no slot of page
    0 (ReservedIndexError), no page already free (DoubleFreeError). With ``no_duplicates`` (page
    size 1) a slot named twice in the call, or marked in ``pending_mask`` (slots buffered by the
    open free group), is a DoubleFreeError as well."""
    pages = check_slot_range(slots, free_mask.numel() - 1, page_size)
    if (
        slots.device.type == "cpu"
        and free_mask.device.type == "cpu"
        and slots.dtype in _HOST_INDEX_DTYPES
    ):  # the same checks on NumPy views: no tensor operation, no device read
        _check_free_slots_host(slots, pages, free_mask, no_duplicates, pending_mask)
        return
    already_free = free_mask[pages]
    if bool(already_free.any()):
        pages_free = torch.unique(pages[already_free]).tolist()
        raise DoubleFreeError("freeing pages that are already free", pages_free)
    if not no_duplicates:
        return
    twice = torch.unique(slots).numel() != slots.numel()
    if pending_mask is not None:
        twice = twice or bool(pending_mask[slots].any())
    if twice:
        raise DoubleFreeError("slots freed twice in one call or free group")


_HOST_INDEX_DTYPES = (torch.int64, torch.int32)
"""Slot dtypes the checks read through NumPy views (others take the tensor path)."""


def _check_free_slots_host(
    slots: torch.Tensor,
    pages: torch.Tensor,
    free_mask: torch.Tensor,
    no_duplicates: bool,
    pending_mask: torch.Tensor | None,
) -> None:
    """The rest of :func:`check_free_slots` for CPU tensors (the same errors, read through
    NumPy views), after :func:`check_slot_range` passed."""
    if free_mask.numpy()[pages.numpy()].any():
        already_free = free_mask[pages]
        pages_free = torch.unique(pages[already_free]).tolist()
        raise DoubleFreeError("freeing pages that are already free", pages_free)
    if not no_duplicates:
        return
    host = slots.numpy()
    twice = has_repeats(host)
    if pending_mask is not None and pending_mask.device.type == "cpu":
        twice = twice or bool(pending_mask.numpy()[host].any())
    elif pending_mask is not None:
        twice = twice or bool(pending_mask[slots].any())
    if twice:
        raise DoubleFreeError("slots freed twice in one call or free group")


def check_slot_range(slots: torch.Tensor, num_pages: int, page_size: int) -> torch.Tensor:
    """The first two of the reference's free checks (values only, no free list): every slot in
    ``[0, (num_pages + 1) * ps)`` (IndexOutOfRangeError; non-integer tensors too), no slot of
    page 0 (ReservedIndexError). Returns the slots' pages. Checked mode runs it on tensors; both
    modes on slots a caller gave as host values (a list: reading them is no device read)."""
    limit = (num_pages + 1) * page_size
    if slots.dtype.is_floating_point or slots.dtype.is_complex or slots.dtype == torch.bool:
        raise IndexOutOfRangeError(f"slots must be integers, got dtype {slots.dtype}")
    # On the CPU both checks at once, on the extremes read through a view: every slot in
    # [page_size, limit) is in range and off page 0; else the checks below name the error.
    if (
        slots.device.type == "cpu"
        and slots.dtype in _HOST_INDEX_DTYPES
        and not any_outside(slots, page_size, limit)
    ):
        return torch.from_numpy(slots.numpy() // page_size)  # no tensor operation either
    out_of_range = (slots < 0) | (slots >= limit)
    if bool(out_of_range.any()):
        raise IndexOutOfRangeError(
            f"slots out of range [0, {limit}): {slots[out_of_range].tolist()}"
        )
    pages = slots // page_size
    reserved = pages == RESERVED_INDEX
    if bool(reserved.any()):
        raise ReservedIndexError(
            f"slots of reserved page {RESERVED_INDEX}: {slots[reserved].tolist()}"
        )
    return pages


def check_segment_runs(slots: torch.Tensor, page_size: int) -> None:
    """Checked mode (a device read): every run ``slots[k * ps : (k + 1) * ps]`` lies in the page
    of its first slot, as the reference's ``free_segment`` (InvalidArgumentError), so that one
    page per run frees every page the segment names."""
    if page_size == 1 or slots.numel() == 0:
        return
    pages = slots // page_size
    heads = pages[::page_size].repeat_interleave(page_size)[: pages.numel()]
    off = torch.nonzero(pages != heads)
    if off.numel():
        i = int(off[0, 0].item())
        raise InvalidArgumentError(
            f"free_index: slot {int(slots[i])} at position {i} is not in the page of its run's "
            f"first slot {int(slots[i - i % page_size])} (page_size={page_size})"
        )


def check_free_list_shape(state: object) -> tuple[PageIds, PageIds]:
    """Always on (no device read): a pair whose tensors are 1-D and integer (a list of pages is
    checked for integers); InvalidArgumentError otherwise. Returns the pair."""
    if not (isinstance(state, tuple) and len(state) == 2):
        raise InvalidArgumentError("state must be the (free_pages, release_pages) tuple")
    for part in state:
        if isinstance(part, torch.Tensor):
            if part.dim() != 1 or (part.numel() and not is_integer_dtype(part.dtype)):
                raise InvalidArgumentError("state must hold two 1-D integer tensors of page ids")
        else:
            int_list("page ids", part)
    return state[0], state[1]


def check_free_list_state(state: object, num_pages: int) -> tuple[torch.Tensor, torch.Tensor]:
    """A ``backup_state`` value: two 1-D integer tensors of distinct page ids in
    ``1..num_pages`` (InvalidArgumentError otherwise, as the reference)."""
    if not (isinstance(state, tuple) and len(state) == 2):
        raise InvalidArgumentError("state must be the (free_pages, release_pages) tuple")
    free_pages, release_pages = state
    if not all(
        isinstance(t, torch.Tensor) and t.dim() == 1 and not t.dtype.is_floating_point
        for t in (free_pages, release_pages)
    ):
        raise InvalidArgumentError("state must hold two 1-D integer tensors of page ids")
    if all(t.is_cpu and t.dtype in _HOST_INDEX_DTYPES for t in (free_pages, release_pages)):
        # the same checks on NumPy views (no tensor operation): extremes, then repeats
        host = np.concatenate((free_pages.numpy(), release_pages.numpy())).astype(np.int64)
        if host.size and (int(host.min()) < 1 or int(host.max()) > num_pages or has_repeats(host)):
            raise InvalidArgumentError(f"state holds bad or repeated page ids: {host.tolist()}")
        return free_pages, release_pages
    every = torch.cat((free_pages.to(torch.int64), release_pages.to(torch.int64)))
    if every.numel() and (
        bool(((every < 1) | (every > num_pages)).any())
        or torch.unique(every).numel() != every.numel()
    ):
        raise InvalidArgumentError(f"state holds bad or repeated page ids: {every.tolist()}")
    return free_pages, release_pages


def decode_host_fast(
    seq_lens: torch.Tensor,
    seq_lens_cpu: HostLens,
    last_loc: torch.Tensor,
    device: torch.device,
    on_cpu: bool,
) -> Int64Array | None:
    """``alloc_decode``'s unchecked fast path: for the arguments an engine passes
    (``seq_lens`` and ``last_loc`` 1-D int64 tensors on ``device``, ``seq_lens_cpu`` a 1-D int64
    CPU tensor, one length per request, every ``S >= 1``), the host copy as a numpy view, after
    the same always-on checks as :func:`check_decode_host`, inline (their calls cost more than
    the checks at decode sizes). None otherwise: the general path checks again and raises where
    it must. ``on_cpu``: ``device`` is the CPU (any CPU tensor is on it)."""
    if not isinstance(seq_lens_cpu, torch.Tensor):
        return None
    try:  # a list has no dtype (a numpy array has none of torch's): the general path
        if not (
            seq_lens.dtype is torch.int64
            and last_loc.dtype is torch.int64
            and seq_lens_cpu.dtype is torch.int64
            and seq_lens.ndim == 1
            and last_loc.ndim == 1
            and seq_lens_cpu.is_cpu
        ):
            return None
    except AttributeError:
        return None
    if on_cpu:
        if not (seq_lens.is_cpu and last_loc.is_cpu):
            return None
    elif seq_lens.device != device or last_loc.device != device:
        return None
    host_s: Int64Array = seq_lens_cpu.numpy()
    n = host_s.size
    if host_s.ndim != 1 or seq_lens.numel() != n or last_loc.numel() != n:
        return None
    if n and host_s[host_s.argmin()] < 1:  # argmin: a fraction of min()'s fixed cost
        return None
    return host_s


__all__ = [
    "PageIds",
    "check_decode_args",
    "check_decode_host",
    "check_extend_args",
    "check_extend_batch",
    "check_extend_host",
    "check_free_list_shape",
    "check_free_list_state",
    "check_free_slots",
    "check_host_copy",
    "check_integer_tensors",
    "check_prefix_pages_held",
    "check_segment_runs",
    "check_slot_range",
    "decode_host_fast",
    "decode_new_pages_host",
    "extend_new_pages_host",
    "host_ints",
    "pages_to_slots",
]
