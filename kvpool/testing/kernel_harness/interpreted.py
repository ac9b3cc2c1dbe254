"""Triton kernels launched through Triton's interpreter, whatever ``TRITON_INTERPRET`` says.

:func:`interpreted` wraps a ``triton.jit`` kernel so that it runs on the CPU through
``triton.runtime.interpreter`` and may call ``triton.jit`` library functions (``tl.cdiv``...).
Those internals are private: this module is written against triton 3.9.x
(:data:`SUPPORTED_TRITON`) and raises :class:`kvpool.errors.KernelError` on any other version.
The checked interpreter (:mod:`kvpool.testing.kernel_harness.interpreter`) runs on top of it.
"""

from __future__ import annotations

import contextlib
import functools
from collections.abc import Iterator
from typing import Any

from kvpool.errors import KernelError

SUPPORTED_TRITON = "3.9."
"""Prefix of the triton versions whose interpreter internals this module was written against."""


def triton_interpreter() -> Any:
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
def jit_calls_interpreted() -> Iterator[None]:
    """Let interpreted kernels call ``triton.jit`` functions (``tl.cdiv``, ``tl.sum``...).

    Without ``TRITON_INTERPRET=1`` at import, triton's own library functions are compiled-mode
    ``JITFunction`` objects that refuse to be called; inside a launch they are run through the
    interpreter instead, as ``InterpretedFunction.__call__`` runs a device function: patch
    ``triton.language`` for the function's module, run its rewritten body, wrap what it raises
    in ``InterpreterError``. The patch is made once per function per launch (this context):
    triton's device call repeats it at every call and never undoes it (the launch's own scope
    restores what the two share), and it walks every member of ``triton.language`` (about half
    a millisecond; a launch's grid calls ``tl.cdiv`` once per program)."""
    interp = triton_interpreter()
    from triton.runtime.jit import JITFunction

    original = JITFunction.__call__
    if getattr(original, "_kvpool_interpreted", False):
        yield
        return
    bodies: dict[Any, Any] = {}
    """A device function's Python function -> its rewritten body, patched in this launch."""

    def call(self: Any, *args: Any, **kwargs: Any) -> Any:
        body = bodies.get(self.fn)
        if body is None:
            interp._patch_lang(self.fn)
            body = bodies[self.fn] = interp.InterpretedFunction(self.fn).rewrite()
        try:
            return body(*args, **kwargs)
        except Exception as exc:  # as InterpretedFunction.__call__ reports a device call's error
            raise interp.InterpreterError(repr(exc)) from exc

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
    cls = _interpreted_class()
    if isinstance(kernel, cls):
        return kernel
    # A plain InterpretedFunction (its module was decorated under TRITON_INTERPRET=1) is
    # unwrapped too: triton's library functions may still be compiled-mode objects that only
    # our launch lets it call.
    return cls(getattr(kernel, "fn", kernel))


@functools.lru_cache(maxsize=1)
def _interpreted_class() -> Any:
    """``InterpretedFunction`` whose launches may call ``triton.jit`` library functions."""
    interp = triton_interpreter()

    class _Interpreted(interp.InterpretedFunction):  # type: ignore[misc, name-defined]
        def run(self, *args: Any, **kwargs: Any) -> Any:
            with jit_calls_interpreted():
                return super().run(*args, **kwargs)

    return _Interpreted


__all__ = ["SUPPORTED_TRITON", "interpreted", "jit_calls_interpreted", "triton_interpreter"]
