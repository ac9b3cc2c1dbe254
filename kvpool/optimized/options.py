"""TwinOptions: how one optimized twin runs (device, checked mode, kernel backend).

One frozen value is the one route for these three settings: it is built once, at the public
edge, and handed down unchanged (``options=``) to every component the edge creates, so that a
whole twin shares one device, one checked mode and one kernel backend. The edges are the
lifecycle's entry points, :class:`~kvpool.optimized.lifecycle.memory_manager.MemoryManager` and
:class:`~kvpool.optimized.lifecycle.swa_memory_manager.SWAMemoryManager`, which keep the
user-facing shorthand ``device=`` / ``checked=`` / ``kernel_backend=`` and build the value from it
(:func:`edge_options`); the harness (:mod:`kvpool.testing.implementations`) builds one per
implementation. Every other component takes ``options: TwinOptions | None = None`` only (None:
``TwinOptions.make()``: the CPU, checked mode by ``$KVPOOL_CHECKED``, else on), resolved by
:func:`twin_options`. A tree built alone over collaborators (SGLang's constructor shape: an
allocator and a table) takes, when given no options, its allocator's (:func:`options_of`).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from kvpool.errors import ConfigError
from kvpool.kernels.dispatch import BACKENDS, is_kernel_backend, triton_installed
from kvpool.optimized.checked import resolve_checked


@dataclass(frozen=True)
class TwinOptions:
    """``device``: where every tensor of the twin lives. ``checked``: the checks that need a
    device-to-host read (:mod:`kvpool.optimized.checked`). ``backend``: the allocation kernels'
    backend (``None``: triton on CUDA tensors, else ``$KVPOOL_KERNEL_BACKEND``, else torch)."""

    device: torch.device
    checked: bool
    backend: str | None = None

    def __post_init__(self) -> None:
        if not isinstance(self.device, torch.device):
            raise ConfigError(f"device must be a torch.device, got {self.device!r}")
        if not isinstance(self.checked, bool):
            raise ConfigError(f"checked must be a bool, got {self.checked!r}")
        if self.backend is not None and not isinstance(self.backend, str):
            raise ConfigError(f"backend must be a name or None, got {self.backend!r}")
        if self.backend is not None and not (
            self.backend in BACKENDS or is_kernel_backend(self.backend)
        ):  # here, not at the first allocation (which would raise after taking pages)
            raise ConfigError(
                f"unknown kernel backend {self.backend!r}; known: {BACKENDS} and registered ones"
            )
        if self.backend in ("triton", "interpret") and not triton_installed():
            raise ConfigError(f"backend {self.backend!r} needs the triton package")
        if self.backend == "triton" and self.device.type != "cuda":
            raise ConfigError(
                f"backend 'triton' compiles for CUDA tensors, not {self.device}; "
                "'interpret' runs the same kernels on the host"
            )

    @classmethod
    def make(
        cls,
        device: str | torch.device | None = None,
        checked: bool | None = None,
        backend: str | None = None,
    ) -> TwinOptions:
        """Options from loose values: ``device`` (a str, a ``torch.device`` or None) defaults to
        the CPU, ``checked=None`` resolves by :func:`kvpool.optimized.checked.resolve_checked`
        for that device. ConfigError for a device of another type (an int would name a CUDA
        device by accident) or a name torch does not know."""
        if device is not None and not isinstance(device, str | torch.device):
            raise ConfigError(f"device must be a str, a torch.device or None, got {device!r}")
        try:
            dev = torch.device("cpu" if device is None else device)
        except (RuntimeError, TypeError) as exc:
            raise ConfigError(f"bad device {device!r}: {exc}") from None
        return cls(dev, resolve_checked(checked, dev), backend)


def twin_options(options: TwinOptions | None = None) -> TwinOptions:
    """``options`` when given (ConfigError when it is not a TwinOptions), else the defaults
    :meth:`TwinOptions.make` gives (the CPU; checked mode by ``$KVPOOL_CHECKED``, else on)."""
    if options is None:
        return TwinOptions.make()
    if not isinstance(options, TwinOptions):
        raise ConfigError(f"options must be a TwinOptions, got {options!r}")
    return options


def edge_options(
    options: TwinOptions | None = None,
    device: str | torch.device | None = None,
    checked: bool | None = None,
    kernel_backend: str | None = None,
) -> TwinOptions:
    """The one options value of a public edge (a memory manager) from what its caller gave:
    ``options`` (then the shorthand must be left out: ConfigError otherwise), else
    :meth:`TwinOptions.make` of the shorthand ``device`` / ``checked`` / ``kernel_backend``."""
    if options is None:
        return TwinOptions.make(device, checked, kernel_backend)
    if device is not None or checked is not None or kernel_backend is not None:
        raise ConfigError("pass either options or device/checked/kernel_backend, not both")
    return twin_options(options)


def options_of(component: object) -> TwinOptions:
    """The options a component was built with: the default of a tree built alone over
    collaborators and given no ``options`` (it runs as its allocator does). A collaborator that
    is not a twin component, such as a test's stub allocator or SGLang's: the defaults on its
    ``device``, the CPU when it has none."""
    found = getattr(component, "options", None)
    if isinstance(found, TwinOptions):
        return found
    return TwinOptions.make(getattr(component, "device", None))


__all__ = ["TwinOptions", "edge_options", "options_of", "twin_options"]
