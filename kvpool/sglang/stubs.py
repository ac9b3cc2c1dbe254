"""Placeholders that stand in for the SGLang modules (and third-party packages) the loader does
not load for real.

A stub module answers every attribute with either an explicit :data:`OVERRIDES` value (platform
probes and environment switches, whose real answers on a CPU-only machine without SGLang's
environment are the same constants) or a *placeholder*: a class made on the fly that

- can be subclassed (real classes may list it as a base; its metaclass derives from
  ``abc.ABCMeta`` so it mixes with ABCs), and a subclass behaves as an ordinary class;
- called, acts as a decorator when given one callable (returns it unchanged), else returns
  :data:`NOTHING`;
- is falsy, a no-op context manager, and its attributes are further placeholders.

:data:`NOTHING` (what calls return) is falsy, callable the same way, a no-op context manager,
an empty iterable and has placeholder attributes. Code under test that *depends* on a stubbed
value would therefore see "feature off"; the loader lists which modules are real so that the
behaviour under test never goes through a stub (specs/sglang.md).
"""

from __future__ import annotations

import abc
import types
from collections.abc import Iterator
from typing import Any


def _false(*args: Any, **kwargs: Any) -> bool:
    return False


def _none(*args: Any, **kwargs: Any) -> None:
    return None


OVERRIDES: dict[str, Any] = {
    # Platform probes: this is a CPU run (no ROCm, NPU, XPU, CUDA build of SGLang's kernels).
    **{
        name: _false
        for name in (
            "is_hip",
            "is_npu",
            "is_cuda",
            "is_cuda_alike",
            "is_xpu",
            "is_cpu",
            "is_musa",
            "is_hpu",
            "is_flashinfer_available",
        )
    },
    # Environment switches (SGLANG_DEBUG_MEMORY_POOL...): unset means off, as in SGLang.
    "get_bool_env_var": _false,
    # The int8 Mamba checkpoint pool exists only with --enable-int8-mamba-checkpoint; SGLang's
    # builder returns None without it (the radix cache then keeps states in the Mamba pool).
    "maybe_init_int8_mamba_checkpoint_pool": _none,
}
"""Stub attributes with a fixed value instead of a placeholder."""


class _Nothing:
    """The falsy value stubbed calls return."""

    def __bool__(self) -> bool:
        return False

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        return _decorated_or_nothing(args, kwargs)

    def __getattr__(self, name: str) -> Any:
        if name.startswith("__"):
            raise AttributeError(name)
        return self

    def __enter__(self) -> _Nothing:
        return self

    def __exit__(self, *exc: object) -> None:
        return None

    def __iter__(self) -> Iterator[Any]:
        return iter(())

    def __repr__(self) -> str:
        return "<kvpool.sglang stub value>"


NOTHING = _Nothing()


def _decorated_or_nothing(args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
    if len(args) == 1 and not kwargs and callable(args[0]) and not is_placeholder(args[0]):
        return args[0]  # used as a decorator: leave the decorated function as it is
    return NOTHING


class _PlaceholderMeta(abc.ABCMeta):
    """Metaclass of placeholders; a real subclass of a placeholder is an ordinary class."""

    def __call__(cls, *args: Any, **kwargs: Any) -> Any:
        if cls.__dict__.get("_kvpool_placeholder"):
            return _decorated_or_nothing(args, kwargs)
        return super().__call__(*args, **kwargs)

    def __getattr__(cls, name: str) -> Any:
        if name.startswith("__") or not cls.__dict__.get("_kvpool_placeholder"):
            raise AttributeError(name)
        child = placeholder(f"{cls.__qualname__}.{name}", cls.__module__)
        type.__setattr__(cls, name, child)
        return child

    def __bool__(cls) -> bool:
        return not cls.__dict__.get("_kvpool_placeholder")

    def __enter__(cls) -> Any:
        return cls

    def __exit__(cls, *exc: object) -> None:
        return None


def placeholder(name: str, module: str) -> type:
    """A new placeholder class called ``name`` in module ``module`` (see the module docstring)."""
    cls = _PlaceholderMeta(name.rpartition(".")[2], (), {"_kvpool_placeholder": True})
    cls.__qualname__ = name
    cls.__module__ = module
    return cls


class StubModule(types.ModuleType):
    """A module whose missing attributes are :data:`OVERRIDES` values or placeholders (cached)."""

    def __getattr__(self, name: str) -> Any:
        if name.startswith("__") and name.endswith("__"):
            raise AttributeError(name)
        value = OVERRIDES.get(name) or placeholder(name, self.__name__)
        setattr(self, name, value)
        return value


def is_placeholder(value: object) -> bool:
    """Whether ``value`` came from a stub (a placeholder class or :data:`NOTHING`)."""
    return value is NOTHING or bool(
        isinstance(value, type) and value.__dict__.get("_kvpool_placeholder")
    )


__all__ = ["NOTHING", "OVERRIDES", "StubModule", "is_placeholder", "placeholder"]
