"""Implementations that live above the harness, found by name rather than imported.

A spec ``NAME`` or ``NAME:ARGS`` (``kvpool verify --impl``, a campaign's sides) whose ``NAME`` is
registered under the entry-point group :data:`GROUP` is resolved by that plug-in. kvpool's own
``sglang`` (:mod:`kvpool.sglang.plugin`) is one, registered in ``pyproject.toml``; a package of a
user's registers its own the same way, and ``kvpool verify --impl NAME:ARGS`` then reaches it on
every worker and Ray node where the package is installed. The harness names no plug-in, so the
floors hold: a plug-in imports the harness, never the other way.
"""

from __future__ import annotations

import importlib.metadata
from pathlib import Path
from typing import Protocol, runtime_checkable

from kvpool.testing.bundle import Implementation

GROUP = "kvpool.implementations"
"""The entry-point group of implementation plug-ins."""


@runtime_checkable
class ImplementationPlugin(Protocol):
    """What a plug-in gives: the implementation a spec names, and what a remote node needs."""

    def resolve(self, args: str) -> Implementation:
        """The implementation of spec ``NAME:ARGS`` (``args`` empty for a bare ``NAME``).
        ValueError for a malformed ``args``."""
        ...

    def stage(self, spec: str, folder: Path, shipped: list[str], env: dict[str, str]) -> str:
        """Copy what ``spec`` names on this machine into ``folder`` (appending each shipped
        path, relative to ``folder``, to ``shipped``; setting environment variables in ``env``)
        and return the spec to use on a node that starts inside ``folder``."""
        ...


def find_plugin(name: str) -> ImplementationPlugin | None:
    """The plug-in registered as ``name``, or None. TypeError when the registered object is
    not an :class:`ImplementationPlugin`."""
    for entry in importlib.metadata.entry_points(group=GROUP, name=name):
        plugin = entry.load()
        if not isinstance(plugin, ImplementationPlugin):
            raise TypeError(f"entry point {entry.value!r} of {GROUP!r} is not a plug-in")
        return plugin
    return None


__all__ = ["GROUP", "ImplementationPlugin", "find_plugin"]
