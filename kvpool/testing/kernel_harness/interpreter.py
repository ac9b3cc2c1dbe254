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
  (:mod:`kvpool.testing.kernel_harness.guarded_memory`)
- **Device asserts.** ``tl.device_assert`` is live (as with ``TRITON_DEBUG=1``) and a failure
  raises :class:`DeviceAssertFailure` with the program id.
- **Program order.** With ``shuffle_seeds``, a launch first runs its programs in grid order, then
  once per seed in an order permuted by that seed, from the same starting memory; any difference
  in the results raises :class:`OrderDependence`. The grid-order run also records, per address,
  which program stored or loaded it without atomics: two programs storing different values to one
  element, or one program reading what another stored, is a GPU race even when every sequential
  order happens to agree (a read-modify-write of a counter, say), and raises
  :class:`OrderDependence` too. (:mod:`kvpool.testing.kernel_harness.program_order`)

This replaces private parts of ``triton.runtime.interpreter`` (``GridExecutor.__call__`` and the
builder's load/store/assert hooks); it is written against triton 3.9.x and raises
:class:`kvpool.errors.KernelError` on any other version.
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import inspect
from collections.abc import Callable, Iterator, Sequence
from typing import Any

import numpy as np
import torch

from kvpool.errors import KernelError
from kvpool.testing.kernel_harness.guarded_memory import (
    GuardedArgs,
    Region,
    describe,
    live_lanes,
    masked_addresses,
    out_of_bounds,
    region_of,
)
from kvpool.testing.kernel_harness.interpreted import (
    jit_calls_interpreted,
    triton_interpreter,
)
from kvpool.testing.kernel_harness.program_order import (
    Program,
    RaceDetector,
    first_order_dependence,
    grid_programs,
)

__all__ = [
    "DeviceAssertFailure",
    "KernelCheckFailure",
    "OrderDependence",
    "OutOfBoundsAccess",
    "allow_access",
    "checked_interpreter",
    "run_checked",
]


class KernelCheckFailure(KernelError):
    """A kernel run under :func:`checked_interpreter` did something a GPU would not forgive."""


class OutOfBoundsAccess(KernelCheckFailure):
    """A load, store or atomic reached memory outside every tensor it may touch."""


class DeviceAssertFailure(KernelCheckFailure):
    """A ``tl.device_assert`` in the kernel failed."""


class OrderDependence(KernelCheckFailure):
    """The kernel's result depends on the order in which its programs run (a race on a GPU)."""


@dataclasses.dataclass
class _Launch:
    """What the load/store hooks need to know about the launch being run."""

    kernel: str
    regions: list[Region]  # tensor arguments, then tensors passed to allow_access
    program: Program = (0, 0, 0)
    races: RaceDetector | None = None  # set during the grid-order run of a multi-program grid

    def where(self) -> str:
        return f"kernel '{self.kernel}', program {self.program}"


class _Checker:
    """State of one ``checked_interpreter`` block."""

    def __init__(self, shuffle_seeds: Sequence[int], check_races: bool) -> None:
        self.shuffle_seeds = tuple(shuffle_seeds)
        self.check_races = check_races
        self.allowed: list[Region] = []
        self.launch: _Launch | None = None


_ACTIVE: list[_Checker] = []
"""Open ``checked_interpreter`` blocks, innermost last; the patches are installed while any is."""

_LAUNCHES = [0]


def checked_launch_count() -> int:
    """Kernel launches the checked interpreter has run in this process so far (a caller compares
    the count before and after a block to learn whether anything ran checked at all)."""
    return _LAUNCHES[0]


def _current_launch() -> _Launch:
    """The launch the innermost checker is running (the builder hooks run only inside one)."""
    launch = _ACTIVE[-1].launch
    assert launch is not None
    return launch


def _checked_addresses(
    launch: _Launch, ptrs: Any, live: np.ndarray | None, what: str
) -> np.ndarray:
    """Masked-in addresses of ``ptrs`` after checking each lies inside an allowed region."""
    flat = masked_addresses(ptrs, live)
    size = max(1, ptrs.get_element_ty().primitive_bitwidth // 8)
    bad, count = out_of_bounds(flat, size, launch.regions)
    if count:
        raise OutOfBoundsAccess(
            f"{launch.where()}: {what} of {describe(bad, launch.regions)} "
            f"({count} lane(s) out of bounds)"
        )
    return flat


def _raise_race(launch: _Launch, conflict: str | None) -> None:
    """Raise :class:`OrderDependence` for a race the detector described, if any."""
    if conflict is not None:
        raise OrderDependence(f"kernel '{launch.kernel}': {conflict}")


def _install_hooks(builder: Any, stack: contextlib.ExitStack) -> None:
    """Wrap the builder's memory and assert hooks (instance attributes, removed on exit).

    Read-modify-write atomics (``atomic_add``, ``atomic_cas``...) are bounds-checked but not
    race-tracked: concurrent atomics are well defined on a GPU."""
    orig_load = builder.create_masked_load
    orig_store = builder.create_masked_store
    orig_rmw = builder.create_atomic_rmw
    orig_cas = builder.create_atomic_cas

    def load(ptrs: Any, mask: Any, other: Any, cache: Any, volatile: Any) -> Any:
        launch = _current_launch()
        flat = _checked_addresses(launch, ptrs, live_lanes(ptrs, mask), "load")
        if launch.races is not None:
            _raise_race(launch, launch.races.load(launch.program, flat))
        return orig_load(ptrs, mask, other, cache, volatile)

    def store(ptrs: Any, value: Any, mask: Any, cache: Any) -> Any:
        launch = _current_launch()
        live = live_lanes(ptrs, mask)
        flat = _checked_addresses(launch, ptrs, live, "store")
        if launch.races is not None:
            values = np.broadcast_to(np.asarray(value.data), np.shape(ptrs.data))
            values = values[live] if live is not None else values
            _raise_race(launch, launch.races.store(launch.program, flat, values))
        return orig_store(ptrs, value, mask, cache)

    def rmw(op: Any, ptr: Any, val: Any, mask: Any, sem: Any, scope: Any) -> Any:
        _checked_addresses(_current_launch(), ptr, live_lanes(ptr, mask), "atomic")
        return orig_rmw(op, ptr, val, mask, sem, scope)

    def cas(ptr: Any, cmp: Any, val: Any, sem: Any, scope: Any) -> Any:
        _checked_addresses(_current_launch(), ptr, None, "atomic_cas")
        return orig_cas(ptr, cmp, val, sem, scope)

    def device_assert(condition: Any, message: Any) -> None:
        if not bool(np.all(condition.data)):
            launch = _ACTIVE[-1].launch
            where = launch.where() if launch is not None else "kernel"
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


def _run_programs(fn: Any, args: dict[str, Any], programs: Sequence[Program]) -> None:
    """Run ``fn`` once per program id, in the given order, on the current launch."""
    interp = triton_interpreter()
    launch = _current_launch()
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
    """Replacement for ``GridExecutor.__call__`` (triton 3.9.x) while a checker is active.

    Runs the grid on guarded copies (race-tracked when asked), replays it in the shuffled orders,
    and copies results back to the caller's tensors only when every check passed."""
    interp = triton_interpreter()
    checker = _ACTIVE[-1]
    _LAUNCHES[0] += 1
    spec = inspect.getfullargspec(self.fn)
    kwargs = {k: v for k, v in kwargs.items() if k in spec.args or k in spec.kwonlyargs}
    args_hst, kwargs_hst = self._init_args_hst(args_dev, kwargs)
    for hook in self.pre_run_hooks:
        hook(*args_hst, **kwargs_hst)
    guarded = GuardedArgs(inspect.getcallargs(self.fn, *args_hst, **kwargs_hst))
    scope = interp._patch_lang(self.fn)
    previous = checker.launch
    allowed = [guarded.translate(r) for r in checker.allowed]
    launch = checker.launch = _Launch(self.fn.__name__, guarded.regions + allowed)
    try:
        with jit_calls_interpreted():
            args = {
                n: a if n in self.constexprs else interp._implicit_cvt(a)
                for n, a in guarded.args.items()
            }
            grid = self.grid(args) if callable(self.grid) else self.grid
            grid = tuple(grid) + (1,) * (3 - len(grid))
            interp.interpreter_builder.set_grid_dim(*grid)
            programs = grid_programs(grid)
            start = guarded.snapshot() if checker.shuffle_seeds else []
            if checker.check_races and len(programs) > 1:
                launch.races = RaceDetector(launch.regions)
            _run_programs(self.fn, args, programs)
            launch.races = None
            diff = first_order_dependence(
                functools.partial(_run_programs, self.fn, args),
                guarded,
                start,
                programs,
                checker.shuffle_seeds,
            )
            if diff is not None:
                raise OrderDependence(f"kernel '{launch.kernel}': {diff}")
    finally:
        checker.launch = previous
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
    interp = triton_interpreter()
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
    added = [region_of(f"allowed tensor {i}", t) for i, t in enumerate(tensors)]
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
