"""A checked Triton interpreter: bounds-checked memory, live device asserts, program-order shuffles.

Inside ``with checked_interpreter(shuffle_seeds=(0, 1, 2)):`` every launch that goes through
Triton's interpreter (``backend="interpret"`` in :mod:`kvpool.kernels`, :func:`interpreted`, or a
process started with ``TRITON_INTERPRET=1``) is run by :func:`_checked_launch` instead of
triton's own grid loop:

- **Bounds.** Every tensor argument is copied into a buffer with 4096 guard bytes on each side, so
  no two arguments are adjacent. Before each load, store or atomic, every lane the mask lets
  through must lie inside the element span of a tensor argument (or of a tensor passed to
  :func:`allow_access`); otherwise :class:`OutOfBoundsAccess` is raised naming the kernel, the
  program, the tensor the address is closest to and the element offset. The access never
  happens, so the process does not crash on a wild pointer.
- **Device asserts.** ``tl.device_assert`` is live (as with ``TRITON_DEBUG=1``) and a failure
  raises :class:`DeviceAssertFailure` with the program id.
- **Program order.** With ``shuffle_seeds``, a launch first runs its programs in grid order, then
  once per seed in an order permuted by that seed, from the same starting memory; any difference
  in the results raises :class:`OrderDependence`. The grid-order run also records, per address,
  which program stored or loaded it without atomics: two programs storing different values to one
  element, or one program reading what another stored, is a GPU race even when every sequential
  order happens to agree (a read-modify-write of a counter, say), and raises
  :class:`OrderDependence` too.

This replaces private parts of ``triton.runtime.interpreter`` (``GridExecutor.__call__`` and the
builder's load/store/assert hooks); it is written against triton 3.9.x and raises
:class:`kvpool.errors.KernelError` on any other version.
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import inspect
import itertools
import random
from collections.abc import Callable, Iterator, Sequence
from typing import Any

import numpy as np
import torch

from kvpool.errors import KernelError

SUPPORTED_TRITON = "3.9."
"""Prefix of the triton versions whose interpreter internals this module was written against."""

GUARD_BYTES = 4096
"""Bytes of poison placed before and after every tensor argument's storage copy."""


class KernelCheckFailure(KernelError):
    """A kernel run under :func:`checked_interpreter` did something a GPU would not forgive."""


class OutOfBoundsAccess(KernelCheckFailure):
    """A load, store or atomic reached memory outside every tensor it may touch."""


class DeviceAssertFailure(KernelCheckFailure):
    """A ``tl.device_assert`` in the kernel failed."""


class OrderDependence(KernelCheckFailure):
    """The kernel's result depends on the order in which its programs run (a race on a GPU)."""


def _triton_interpreter() -> Any:
    """The pinned private module, after checking the triton version."""
    try:
        import triton
        import triton.runtime.interpreter as interp
    except ImportError as exc:  # pragma: no cover - triton is a dependency on Linux
        raise KernelError(f"the checked interpreter needs triton {SUPPORTED_TRITON}x") from exc
    if not str(triton.__version__).startswith(SUPPORTED_TRITON):
        raise KernelError(
            f"kvpool's checked interpreter patches private internals of triton "
            f"{SUPPORTED_TRITON}x and is not validated on triton {triton.__version__}; "
            f"install triton {SUPPORTED_TRITON}x or run kernels with backend='interpret' unchecked"
        )
    return interp


@contextlib.contextmanager
def _jit_calls_interpreted() -> Iterator[None]:
    """Let interpreted kernels call ``triton.jit`` functions (``tl.cdiv``, ``tl.sum``...).

    Without ``TRITON_INTERPRET=1`` at import, triton's own library functions are compiled-mode
    ``JITFunction`` objects that refuse to be called; inside a launch they are run through the
    interpreter instead."""
    interp = _triton_interpreter()
    from triton.runtime.jit import JITFunction

    original = JITFunction.__call__
    if getattr(original, "_kvpool_interpreted", False):
        yield
        return

    def call(self: Any, *args: Any, **kwargs: Any) -> Any:
        return interp.InterpretedFunction(self.fn)(*args, **kwargs)

    call._kvpool_interpreted = True  # type: ignore[attr-defined]
    JITFunction.__call__ = call
    try:
        yield
    finally:
        JITFunction.__call__ = original


def interpreted(kernel: Any) -> Any:
    """An interpreter-launchable version of ``kernel`` (a ``triton.jit`` object, an
    ``InterpretedFunction`` or the plain function), independent of ``TRITON_INTERPRET``; it may
    call ``triton.jit`` library functions."""
    interp = _triton_interpreter()
    if isinstance(kernel, interp.InterpretedFunction):
        return kernel
    return _interpreted_class()(getattr(kernel, "fn", kernel))


@functools.lru_cache(maxsize=1)
def _interpreted_class() -> Any:
    """``InterpretedFunction`` whose launches may call ``triton.jit`` library functions."""
    interp = _triton_interpreter()

    class _Interpreted(interp.InterpretedFunction):  # type: ignore[misc, name-defined]
        def run(self, *args: Any, **kwargs: Any) -> Any:
            with _jit_calls_interpreted():
                return super().run(*args, **kwargs)

    return _Interpreted


@dataclasses.dataclass(frozen=True)
class _Region:
    """Bytes ``[start, end)`` a kernel may touch, named for messages; ``zone`` is the guarded
    buffer around it (used only to say which tensor a stray address was closest to)."""

    name: str
    start: int
    end: int
    zone_start: int
    zone_end: int
    itemsize: int


def _span(t: torch.Tensor) -> tuple[int, int]:
    """First and one-past-last byte of the elements of ``t``."""
    if t.numel() == 0:
        return t.data_ptr(), t.data_ptr()
    last = sum((n - 1) * s for n, s in zip(t.shape, t.stride(), strict=True))
    return t.data_ptr(), t.data_ptr() + (last + 1) * t.element_size()


def _region_of(name: str, t: torch.Tensor, zone: tuple[int, int] | None = None) -> _Region:
    start, end = _span(t)
    zs, ze = zone if zone is not None else (start, end)
    return _Region(name, start, end, zs, ze, t.element_size())


class _Guarded:
    """Guarded host copies of a launch's tensor arguments (one copy per distinct storage)."""

    def __init__(self, call_args: dict[str, Any]) -> None:
        self.args: dict[str, Any] = {}
        self.regions: list[_Region] = []
        self._copies: list[tuple[torch.Tensor, torch.Tensor]] = []  # (original bytes, guarded)
        self._moves: list[tuple[int, int, int]] = []  # original [start, end) -> copy start
        by_storage: dict[int, torch.Tensor] = {}
        for name, arg in call_args.items():
            if not isinstance(arg, torch.Tensor):
                self.args[name] = arg
                continue
            storage = arg.untyped_storage()
            key = storage.data_ptr()
            if key not in by_storage:
                original = torch.empty(0, dtype=torch.uint8).set_(storage)
                buf = torch.full((2 * GUARD_BYTES + storage.nbytes(),), 0xA5, dtype=torch.uint8)
                buf[GUARD_BYTES : GUARD_BYTES + storage.nbytes()].copy_(original)
                by_storage[key] = buf
                self._copies.append((original, buf))
                self._moves.append((key, key + storage.nbytes(), buf.data_ptr() + GUARD_BYTES))
            buf = by_storage[key]
            item = arg.element_size()
            view = torch.empty(0, dtype=arg.dtype).set_(
                buf.untyped_storage(),
                GUARD_BYTES // item + arg.storage_offset(),
                arg.shape,
                arg.stride(),
            )
            zone = (buf.data_ptr(), buf.data_ptr() + buf.numel())
            self.args[name] = view
            self.regions.append(_region_of(name, view, zone))

    def translate(self, region: _Region) -> _Region:
        """``region`` moved into the guarded copy when it lies in a copied storage."""
        for start, end, new in self._moves:
            if start <= region.start and region.end <= end:
                shift = new - start
                return dataclasses.replace(
                    region,
                    start=region.start + shift,
                    end=region.end + shift,
                    zone_start=region.zone_start + shift,
                    zone_end=region.zone_end + shift,
                )
        return region

    def snapshot(self) -> list[torch.Tensor]:
        return [buf.clone() for _, buf in self._copies]

    def restore(self, snap: list[torch.Tensor]) -> None:
        for (_, buf), saved in zip(self._copies, snap, strict=True):
            buf.copy_(saved)

    def copy_back(self) -> None:
        for original, buf in self._copies:
            original.copy_(buf[GUARD_BYTES : GUARD_BYTES + original.numel()])

    def first_difference(self, expected: list[torch.Tensor]) -> str | None:
        """Where the current memory differs from ``expected`` (a snapshot), by argument."""
        current = self.snapshot()
        for name, arg in self.args.items():
            if not isinstance(arg, torch.Tensor) or arg.numel() == 0:
                continue
            now = arg.reshape(-1).clone()
            self.restore(expected)
            then = arg.reshape(-1).clone()
            self.restore(current)
            diff = (now != then).nonzero()
            if diff.numel():
                k = int(diff[0, 0])
                return f"{name}[{k}] is {now[k].item()} instead of {then[k].item()}"
        return None


@dataclasses.dataclass
class _Launch:
    """What the load/store hooks need to know about the launch being run."""

    kernel: str
    regions: list[_Region]  # tensor arguments, then tensors passed to allow_access
    program: tuple[int, int, int] = (0, 0, 0)
    track: bool = False
    writers: dict[int, tuple[tuple[int, int, int], Any]] = dataclasses.field(default_factory=dict)
    readers: dict[int, tuple[int, int, int]] = dataclasses.field(default_factory=dict)


class _Checker:
    """State of one ``checked_interpreter`` block."""

    def __init__(self, shuffle_seeds: Sequence[int], check_races: bool) -> None:
        self.shuffle_seeds = tuple(shuffle_seeds)
        self.check_races = check_races
        self.allowed: list[_Region] = []
        self.launch: _Launch | None = None


_ACTIVE: list[_Checker] = []
_MANY = (-1, -1, -1)  # "loaded by more than one program"


def _describe(addr: int, regions: Sequence[_Region]) -> str:
    for r in regions:
        if r.zone_start <= addr < r.zone_end:
            k = (addr - r.start) // r.itemsize
            n = (r.end - r.start) // r.itemsize
            return f"element {k} of '{r.name}' (valid elements: 0..{n - 1})"
    if addr < GUARD_BYTES:
        return f"address {addr:#x} (the null pointer an empty tensor argument has)"
    return f"address {addr:#x}, outside every tensor argument"


def _check_access(ptrs: Any, mask: Any, what: str) -> np.ndarray:
    """Masked-in addresses of ``ptrs`` after checking each lies inside an allowed region."""
    launch = _ACTIVE[-1].launch
    assert launch is not None
    addrs = np.asarray(ptrs.data, dtype=np.uint64)
    live = (
        np.broadcast_to(np.asarray(mask.data, dtype=bool), addrs.shape)
        if mask is not None
        else None
    )
    flat = addrs[live] if live is not None else addrs.reshape(-1)
    if flat.size == 0:
        return flat
    size = max(1, ptrs.get_element_ty().primitive_bitwidth // 8)
    regions = launch.regions
    ok = np.zeros(flat.shape, dtype=bool)
    for r in regions:
        ok |= (flat >= r.start) & (flat + size <= r.end)
    if not ok.all():
        bad = int(flat[~ok][0])
        raise OutOfBoundsAccess(
            f"kernel '{launch.kernel}', program {launch.program}: {what} of "
            f"{_describe(bad, launch.regions)} ({int((~ok).sum())} lane(s) out of bounds)"
        )
    return flat


def _track(flat: np.ndarray, values: Any, is_store: bool) -> None:
    """Record non-atomic accesses of the grid-order run and raise on a cross-program conflict."""
    launch = _ACTIVE[-1].launch
    assert launch is not None
    me = launch.program
    vals = np.asarray(values).reshape(-1).tolist() if values is not None else None
    for i, a in enumerate(flat.tolist()):
        if is_store:
            v = vals[i] if vals is not None else None
            reader = launch.readers.get(a)
            if reader is not None and reader != me:
                who = "other programs" if reader == _MANY else f"program {reader}"
                raise OrderDependence(
                    f"kernel '{launch.kernel}': program {me} stores {_describe(a, launch.regions)}"
                    f" which {who} loaded (non-atomic read/write race)"
                )
            prev = launch.writers.get(a)
            if prev is not None and prev[0] != me and prev[1] != v:
                raise OrderDependence(
                    f"kernel '{launch.kernel}': programs {prev[0]} and {me} store different "
                    f"values ({prev[1]} and {v}) to {_describe(a, launch.regions)}"
                )
            launch.writers[a] = (me, v)
        else:
            prev = launch.writers.get(a)
            if prev is not None and prev[0] != me:
                raise OrderDependence(
                    f"kernel '{launch.kernel}': program {me} loads {_describe(a, launch.regions)}"
                    f" which program {prev[0]} stored (non-atomic read/write race)"
                )
            first = launch.readers.get(a)
            if first is None:
                launch.readers[a] = me
            elif first != me:
                launch.readers[a] = _MANY


def _install_hooks(builder: Any, stack: contextlib.ExitStack) -> None:
    """Wrap the builder's memory and assert hooks (instance attributes, removed on exit)."""
    orig_load = builder.create_masked_load
    orig_store = builder.create_masked_store
    orig_rmw = builder.create_atomic_rmw
    orig_cas = builder.create_atomic_cas

    def load(ptrs: Any, mask: Any, other: Any, cache: Any, volatile: Any) -> Any:
        flat = _check_access(ptrs, mask, "load")
        launch = _ACTIVE[-1].launch
        if launch is not None and launch.track:
            _track(flat, None, is_store=False)
        return orig_load(ptrs, mask, other, cache, volatile)

    def store(ptrs: Any, value: Any, mask: Any, cache: Any) -> Any:
        flat = _check_access(ptrs, mask, "store")
        launch = _ACTIVE[-1].launch
        if launch is not None and launch.track:
            live = np.broadcast_to(np.asarray(mask.data, dtype=bool), np.shape(ptrs.data))
            vals = np.broadcast_to(np.asarray(value.data), np.shape(ptrs.data))[live]
            _track(flat, vals, is_store=True)
        return orig_store(ptrs, value, mask, cache)

    def rmw(op: Any, ptr: Any, val: Any, mask: Any, sem: Any, scope: Any) -> Any:
        _check_access(ptr, mask, "atomic")
        return orig_rmw(op, ptr, val, mask, sem, scope)

    def cas(ptr: Any, cmp: Any, val: Any, sem: Any, scope: Any) -> Any:
        _check_access(ptr, None, "atomic_cas")
        return orig_cas(ptr, cmp, val, sem, scope)

    def device_assert(condition: Any, message: Any) -> None:
        if not bool(np.all(condition.data)):
            launch = _ACTIVE[-1].launch
            where = f"kernel '{launch.kernel}', program {launch.program}" if launch else "kernel"
            raise DeviceAssertFailure(f"{where}: device assert failed: {message}")

    for name, fn in (
        ("create_masked_load", load),
        ("create_masked_store", store),
        ("create_atomic_rmw", rmw),
        ("create_atomic_cas", cas),
        ("create_assert", device_assert),
    ):
        setattr(builder, name, fn)
        stack.callback(delattr, builder, name)
    old_options = builder.options
    builder.options = dataclasses.replace(old_options, debug=True)
    stack.callback(setattr, builder, "options", old_options)


def _unwrap(exc: BaseException) -> BaseException:
    """The KernelCheckFailure behind triton's InterpreterError wrapping, if any."""
    seen: BaseException | None = exc
    while seen is not None:
        if isinstance(seen, KernelCheckFailure):
            return seen
        seen = seen.__cause__ or seen.__context__
    return exc


def _run_programs(fn: Any, args: dict[str, Any], programs: Sequence[tuple[int, int, int]]) -> None:
    interp = _triton_interpreter()
    launch = _ACTIVE[-1].launch
    assert launch is not None
    for program in programs:
        launch.program = program
        interp.interpreter_builder.set_grid_idx(*program)
        try:
            fn(**args)
        except Exception as exc:
            cause = _unwrap(exc)
            if cause is exc:
                raise
            raise cause from None


def _checked_launch(self: Any, *args_dev: Any, **kwargs: Any) -> None:
    """Replacement for ``GridExecutor.__call__`` (triton 3.9.x) while a checker is active."""
    interp = _triton_interpreter()
    checker = _ACTIVE[-1]
    spec = inspect.getfullargspec(self.fn)
    kwargs = {k: v for k, v in kwargs.items() if k in spec.args or k in spec.kwonlyargs}
    args_hst, kwargs_hst = self._init_args_hst(args_dev, kwargs)
    for hook in self.pre_run_hooks:
        hook(*args_hst, **kwargs_hst)
    guarded = _Guarded(inspect.getcallargs(self.fn, *args_hst, **kwargs_hst))
    scope = interp._patch_lang(self.fn)
    jit_calls = _jit_calls_interpreted()
    jit_calls.__enter__()
    previous = checker.launch
    allowed = [guarded.translate(r) for r in checker.allowed]
    checker.launch = _Launch(self.fn.__name__, guarded.regions + allowed)
    try:
        args = {
            n: a if n in self.constexprs else interp._implicit_cvt(a)
            for n, a in guarded.args.items()
        }
        grid = self.grid(args) if callable(self.grid) else self.grid
        grid = tuple(grid) + (1,) * (3 - len(grid))
        interp.interpreter_builder.set_grid_dim(*grid)
        programs = list(itertools.product(range(grid[0]), range(grid[1]), range(grid[2])))
        before = guarded.snapshot() if checker.shuffle_seeds else []
        checker.launch.track = checker.check_races and len(programs) > 1
        _run_programs(self.fn, args, programs)
        checker.launch.track = False
        in_order = guarded.snapshot() if checker.shuffle_seeds else []
        for seed in checker.shuffle_seeds:
            order = list(programs)
            random.Random(seed).shuffle(order)
            guarded.restore(before)
            _run_programs(self.fn, args, order)
            diff = guarded.first_difference(in_order)
            if diff is not None:
                raise OrderDependence(
                    f"kernel '{self.fn.__name__}': running its {len(programs)} programs in the "
                    f"order of shuffle seed {seed} (starting {order[:4]}) changes the result: "
                    f"{diff}"
                )
        if checker.shuffle_seeds:
            guarded.restore(in_order)
    finally:
        checker.launch = previous
        jit_calls.__exit__(None, None, None)
        scope.restore()
    guarded.copy_back()
    self._restore_args_dev(args_dev, args_hst, kwargs, kwargs_hst)


@contextlib.contextmanager
def checked_interpreter(
    shuffle_seeds: Sequence[int] = (), *, check_races: bool = True
) -> Iterator[_Checker]:
    """Run every interpreted Triton launch in the block checked (see the module docstring).

    ``shuffle_seeds``: one extra run per seed in a permuted program order (costs one launch
    each). ``check_races``: report cross-program non-atomic conflicts in the grid-order run.
    Raises :class:`KernelError` on an unsupported triton version. Blocks may nest; the innermost
    settings apply.
    """
    interp = _triton_interpreter()
    with contextlib.ExitStack() as stack:
        if not _ACTIVE:
            original = interp.GridExecutor.__call__
            interp.GridExecutor.__call__ = _checked_launch
            stack.callback(setattr, interp.GridExecutor, "__call__", original)
            _install_hooks(interp.interpreter_builder, stack)
        checker = _Checker(shuffle_seeds, check_races)
        if _ACTIVE:
            checker.allowed = list(_ACTIVE[-1].allowed)
        _ACTIVE.append(checker)
        stack.callback(_ACTIVE.pop)
        yield checker


@contextlib.contextmanager
def allow_access(*tensors: torch.Tensor) -> Iterator[None]:
    """Let checked kernels also touch all of ``tensors``: memory reached through pointers loaded
    from memory (a table of per-request prefix tensors, say), or the whole base of a view passed
    as an argument (an allowed tensor inside an argument's storage follows it into the guarded
    copy). No-op outside a checked block."""
    if not _ACTIVE:
        yield
        return
    checker = _ACTIVE[-1]
    added = [_region_of(f"allowed tensor {i}", t) for i, t in enumerate(tensors)]
    checker.allowed.extend(added)
    try:
        yield
    finally:
        for r in added:
            checker.allowed.remove(r)


def run_checked(
    launch: Callable[..., Any], *args: Any, shuffle_seeds: Sequence[int] = (), **kwargs: Any
) -> Any:
    """``launch(*args, **kwargs)`` inside :func:`checked_interpreter`; returns its result."""
    with checked_interpreter(shuffle_seeds):
        return launch(*args, **kwargs)
