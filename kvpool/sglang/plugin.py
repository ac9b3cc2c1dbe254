"""``sglang`` as an implementation plug-in of the harness (:mod:`kvpool.testing.plugins`).

Spec ``sglang`` or ``sglang:SOURCE[+OPTION...]`` resolves through :func:`kvpool.sglang.from_spec`.
Staged for a Ray cluster: ``sglang:VERSION[+...]`` ships the wheel of that release (fetched into
the driver's cache as ``kvpool verify --sglang`` does) under ``sglang/`` with
``KVPOOL_SGLANG_CACHE`` pointing there; ``sglang:path/to/a.whl`` or ``sglang:path/to/checkout``
ships that file or folder and the spec names its copy.
"""

from __future__ import annotations

import re
from pathlib import Path

from kvpool.sglang.implementation import from_spec
from kvpool.sglang.source import default_cache_dir, download_wheel
from kvpool.testing.bundle import Implementation
from kvpool.testing.ray_ship import copy_into

_VERSION = re.compile(r"^\d+\.\d+\.\d+([.+-]?[0-9A-Za-z.]+)?$")
_SOURCE_OPTION = re.compile(r"(\+[a-z-]+)*$")


class SGLangPlugin:
    """The ``sglang`` plug-in (registered in ``pyproject.toml``)."""

    def resolve(self, args: str) -> Implementation:
        """:func:`kvpool.sglang.from_spec` of ``args`` (the text after ``sglang:``)."""
        built: Implementation = from_spec(args)
        return built

    def stage(self, spec: str, folder: Path, shipped: list[str], env: dict[str, str]) -> str:
        """Ship the wheel or source ``spec`` names (see the module docstring). ValueError for
        a source path that does not exist."""
        after = spec.partition(":")[2]
        options = _SOURCE_OPTION.search(after)
        suffix = options.group(0) if options else ""
        source = after[: len(after) - len(suffix)] or "0.5.16"
        target = Path("sglang")
        if _VERSION.match(source):
            wheel = download_wheel(source, env.get("KVPOOL_SGLANG_CACHE") or default_cache_dir())
            if (target / wheel.name).as_posix() not in shipped:
                copy_into(wheel, folder / target / wheel.name)
                shipped.append((target / wheel.name).as_posix())
            env["KVPOOL_SGLANG_CACHE"] = target.as_posix()
            return spec
        path = Path(source)
        if not path.exists():
            raise ValueError(f"no such SGLang source: {source}")
        relative = target / path.name
        copy_into(path, folder / relative)
        shipped.append(relative.as_posix())
        return f"sglang:{relative.as_posix()}{suffix}"


PLUGIN = SGLangPlugin()
"""The registered instance."""

__all__ = ["PLUGIN", "SGLangPlugin"]
