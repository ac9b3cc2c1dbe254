"""What a campaign on a Ray cluster carries to its nodes: the candidates' own files and SGLang.

A campaign names its sides by spec strings (:func:`kvpool.testing.implementations.
resolve_implementation`). Some name files of the driver's machine, which a node of a remote
cluster does not have:

- ``path/to/file.py:NAME``: the file is copied to ``impl/<side>/<file>.py`` and the spec
  rewritten to that relative path (only the file: a module it imports from beside it must be
  installed on the nodes or be named by a dotted spec);
- ``dotted.module:NAME`` found outside the installed packages (a user's project, kvpool's own
  ``tests``): the ``.py`` files of its top-level package are copied under their own name, where
  :func:`~kvpool.testing.factories.import_user_module` finds them (it searches the current
  directory first);
- ``NAME:ARGS`` of an implementation plug-in (:mod:`kvpool.testing.plugins`): what the plug-in
  stages, as ``sglang:VERSION[+...]`` ships that release's wheel (:mod:`kvpool.sglang.plugin`).

:func:`stage` puts them in a fresh folder, which the campaign's actors get as Ray's
``working_dir`` (Ray uploads it once and unpacks it on every node; its default package limit
is 512 MiB, far above a wheel). A spec naming nothing of the driver's machine (``reference``,
``optimized[...]``, an installed module) ships nothing. kvpool itself, and torch, must be
installed on every node, as for any Ray job.
"""

from __future__ import annotations

import importlib.util
import shutil
import sys
import sysconfig
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from kvpool.testing.implementations import builtin_spec
from kvpool.testing.plugins import find_plugin
from kvpool.testing.workers import CampaignSpec

SHIPPED_PATH_VARIABLES = frozenset({"KVPOOL_SGLANG_CACHE"})
"""Environment variables whose relative value is a path inside the shipped folder (made
absolute by each actor, which starts there)."""

_SKIP = shutil.ignore_patterns("__pycache__", "*.pyc", ".*")


@dataclass(frozen=True)
class Shipment:
    """A staged folder and the campaign spec whose file paths are relative to it."""

    folder: Path
    spec: CampaignSpec
    shipped: tuple[str, ...]
    """What was shipped, one entry per file or folder (``impl/b/mine.py``, ``sglang/...``)."""

    def runtime_env(self) -> dict[str, Any]:
        """Ray's runtime environment for the campaign's actors."""
        return {"working_dir": str(self.folder)}


def stage(spec: CampaignSpec, folder: Path) -> Shipment | None:
    """Copy what ``spec``'s sides name on this machine into ``folder`` (created; see the
    module docstring); None when they name nothing to ship. ValueError when a named file is
    missing (the campaign would fail on every node)."""
    shipped: list[str] = []
    env = dict(spec.env)
    sides = []
    for side, impl in (("a", spec.impl_a), ("b", spec.impl_b)):
        sides.append(_stage_side(impl, side, folder, shipped, env))
    if not shipped:
        return None
    staged = replace(spec, impl_a=sides[0], impl_b=sides[1], env=tuple(sorted(env.items())))
    return Shipment(folder, staged, tuple(shipped))


def _stage_side(impl: str, side: str, folder: Path, shipped: list[str], env: dict[str, str]) -> str:
    if builtin_spec(impl):
        return impl
    plugin = find_plugin(impl.partition(":")[0])
    if plugin is not None:
        return plugin.stage(impl, folder, shipped, env)
    module, sep, name = impl.rpartition(":")
    if not sep or not module:
        return impl  # malformed: resolving it reports the error, as locally
    if module.endswith(".py"):
        source = Path(module)
        if not source.is_file():
            raise ValueError(f"no such file: {module}")
        relative = Path("impl") / side / source.name
        copy_into(source, folder / relative)
        shipped.append(relative.as_posix())
        return f"{relative.as_posix()}:{name}"
    top = _user_package(module.split(".")[0])
    if top is not None and top.name not in shipped:
        copy_into(top, folder / top.name)
        shipped.append(top.name)
    return impl


def _user_package(top: str) -> Path | None:
    """The folder (or file) of top-level module ``top`` when it is a user's (found from the
    current directory, not among the installed packages); None otherwise."""
    here = str(Path.cwd())
    added = here not in sys.path
    if added:
        sys.path.insert(0, here)
    try:
        found = importlib.util.find_spec(top)
    except (ImportError, ValueError):
        found = None
    finally:
        if added:
            sys.path.remove(here)
    if found is None or found.origin is None:
        return None
    origin = Path(found.origin).resolve()
    installed = [Path(sysconfig.get_paths()[k]).resolve() for k in ("purelib", "platlib", "stdlib")]
    if any(origin.is_relative_to(p) for p in installed) or top == "kvpool":
        return None
    return origin.parent if found.submodule_search_locations else origin


def copy_into(source: Path, target: Path) -> None:
    """Copy file or folder ``source`` to ``target`` (parents created; caches and dot files
    left out)."""
    target.parent.mkdir(parents=True, exist_ok=True)
    if source.is_dir():
        shutil.copytree(source, target, ignore=_SKIP, dirs_exist_ok=True)
    else:
        shutil.copy2(source, target)


__all__ = ["SHIPPED_PATH_VARIABLES", "Shipment", "copy_into", "stage"]
