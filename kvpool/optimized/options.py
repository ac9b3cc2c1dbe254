"""TwinOptions: how one optimized twin runs (device, checked mode, kernel backend).

One frozen value is built once, at the top (a :class:`~kvpool.optimized.lifecycle.memory_manager.
MemoryManager`, or any component built alone), and handed down unchanged to every component it
creates, so that a whole twin shares one device, one checked mode and one kernel backend.
Components built alone also accept the shorthand keywords ``device`` / ``checked`` /
``kernel_backend``; they resolve through :func:`twin_options`, the one path to an options value.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from kvpool.errors import ConfigError
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

    @classmethod
    def make(
        cls,
        device: str | torch.device | None = None,
        checked: bool | None = None,
        backend: str | None = None,
    ) -> TwinOptions:
        """Options from loose values: ``device`` defaults to the CPU, ``checked=None`` resolves
        by :func:`kvpool.optimized.checked.resolve_checked` for that device."""
        try:
            dev = torch.device("cpu" if device is None else device)
        except (RuntimeError, TypeError) as exc:
            raise ConfigError(f"bad device {device!r}: {exc}") from None
        return cls(dev, resolve_checked(checked, dev), backend)


def twin_options(
    options: TwinOptions | None = None,
    device: str | torch.device | None = None,
    checked: bool | None = None,
    backend: str | None = None,
) -> TwinOptions:
    """``options`` when given (then the loose values must be left out: ConfigError otherwise),
    else :meth:`TwinOptions.make` of the loose values."""
    if options is None:
        return TwinOptions.make(device, checked, backend)
    if not isinstance(options, TwinOptions):
        raise ConfigError(f"options must be a TwinOptions, got {options!r}")
    if device is not None or checked is not None or backend is not None:
        raise ConfigError("pass either options or device/checked/kernel_backend, not both")
    return options


def options_of(component: object) -> TwinOptions:
    """The options a component was built with (a collaborator that is not a twin component,
    such as a test's stub allocator: the defaults on its ``device``, CPU when it has none)."""
    found = getattr(component, "options", None)
    if isinstance(found, TwinOptions):
        return found
    return TwinOptions.make(getattr(component, "device", None))


__all__ = ["TwinOptions", "options_of", "twin_options"]
