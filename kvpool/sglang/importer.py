"""The private import system that serves SGLang's modules under a private top-level name.

:class:`PrivateSGLang` is a ``sys.meta_path`` finder and loader for the names
``PREFIX`` and ``PREFIX.*`` only (``PREFIX`` is unique per source, e.g.
``_kvpool_sglang_0_5_16_1a2b3c4d``). ``PREFIX.sglang.X`` is

- SGLang's real module ``sglang.X`` when ``X`` is in the *real* set: its file is read from the
  source, its imports rewritten (:func:`kvpool.sglang.rewrite.rewrite_imports`) and executed;
- a *partial* module when ``X`` is in the partial map: the named definitions extracted from the
  given file (:func:`kvpool.sglang.rewrite.extract_definitions`) over a stub module;
- a stub (:class:`kvpool.sglang.stubs.StubModule`) otherwise, as is every ``PREFIX._external.*``.

Because every name is private, the user's own ``sys.modules["sglang"]`` (an installed SGLang) is
never read nor replaced, two SGLang versions load side by side in one process, and imports that
SGLang's functions run lazily still resolve to the same private modules.
"""

from __future__ import annotations

import ast
import importlib
import importlib.abc
import importlib.machinery
import linecache
import sys
import types
from collections.abc import Mapping, Sequence
from typing import Any

from kvpool.errors import SGLangLoadError
from kvpool.sglang.rewrite import extract_definitions, rewrite_imports
from kvpool.sglang.source import SGLangSource
from kvpool.sglang.stubs import StubModule


class _PrivateStub(StubModule):
    """A stub that still hands out the real or partial submodules the finder serves."""

    def __getattr__(self, name: str) -> Any:
        served: frozenset[str] = self.__dict__.get("_kvpool_served", frozenset())
        if f"{self.__name__}.{name}" in served:
            return importlib.import_module(f"{self.__name__}.{name}")
        return super().__getattr__(name)


class PrivateSGLang(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    """Serves ``prefix.sglang.*`` from ``source`` (see the module docstring).

    ``real`` lists dotted SGLang module names executed for real; ``partial`` maps a dotted
    module name to ``(file, names)``: the definitions of ``names`` taken from ``file`` (a path
    inside the distribution)."""

    def __init__(
        self,
        source: SGLangSource,
        prefix: str,
        real: Sequence[str],
        partial: Mapping[str, tuple[str, Sequence[str]]],
    ) -> None:
        self.source = source
        self.prefix = prefix
        self.real = frozenset(real)
        self.partial = dict(partial)
        self.served = frozenset(f"{prefix}.{m}" for m in (*self.real, *self.partial))

    # ------------------------------------------------------------------ finder
    def find_spec(
        self, fullname: str, path: Sequence[str] | None = None, target: Any = None
    ) -> importlib.machinery.ModuleSpec | None:
        if fullname != self.prefix and not fullname.startswith(self.prefix + "."):
            return None
        dotted = fullname[len(self.prefix) + 1 :]
        is_package = dotted not in self.real or self._file(dotted).endswith("__init__.py")
        spec = importlib.machinery.ModuleSpec(fullname, self, is_package=is_package)
        if dotted in self.real:
            spec.origin = self.source.filename(self._file(dotted))
            spec.has_location = True
        return spec

    def _file(self, dotted: str) -> str:
        """The distribution path of module ``dotted`` (``a/b.py`` or ``a/b/__init__.py``)."""
        base = dotted.replace(".", "/")
        if self.source.read(f"{base}/__init__.py") is not None:
            return f"{base}/__init__.py"
        return f"{base}.py"  # named in the error if it is missing too

    # ------------------------------------------------------------------ loader
    def create_module(self, spec: importlib.machinery.ModuleSpec) -> types.ModuleType | None:
        dotted = spec.name[len(self.prefix) + 1 :]
        if dotted in self.real:
            return None  # an ordinary module
        module = _PrivateStub(spec.name)
        module.__dict__["_kvpool_served"] = self.served
        return module

    def exec_module(self, module: types.ModuleType) -> None:
        dotted = module.__name__[len(self.prefix) + 1 :]
        if dotted in self.real:
            relpath = self._file(dotted)
            self._run(module, relpath, self._parse(relpath))
        elif dotted in self.partial:
            relpath, names = self.partial[dotted]
            tree = self._parse(relpath)
            try:
                wanted = extract_definitions(tree, names)
            except KeyError as exc:
                raise SGLangLoadError(f"{relpath} of {self.source.origin} lacks {exc}") from None
            self._run(module, relpath, wanted)
        else:
            module.__dict__.setdefault("__all__", [])  # ``from stub import *`` binds nothing

    def _parse(self, relpath: str) -> ast.Module:
        text = self.source.read(relpath)
        if text is None:
            raise SGLangLoadError(f"{self.source.origin} has no {relpath}")
        return ast.parse(text, filename=self.source.filename(relpath))

    def _run(self, module: types.ModuleType, relpath: str, tree: ast.Module) -> None:
        filename = self.source.filename(relpath)
        text = self.source.read(relpath) or ""
        # Tracebacks show SGLang's lines (the rewrite keeps line numbers).
        linecache.cache[filename] = (len(text), None, text.splitlines(True), filename)
        code = compile(rewrite_imports(tree, self.prefix), filename, "exec")
        module.__dict__.setdefault("__file__", filename)
        exec(code, module.__dict__)

    # ------------------------------------------------------------------ lifetime
    def install(self) -> None:
        """Put this finder first on ``sys.meta_path`` (idempotent)."""
        if self not in sys.meta_path:
            sys.meta_path.insert(0, self)

    def uninstall(self) -> None:
        """Remove this finder and every module it loaded (a failed load leaves nothing)."""
        if self in sys.meta_path:
            sys.meta_path.remove(self)
        for name in [m for m in sys.modules if m == self.prefix or m.startswith(self.prefix + ".")]:
            del sys.modules[name]

    def import_module(self, dotted: str) -> types.ModuleType:
        """``PREFIX.dotted`` (e.g. ``sglang.srt.mem_cache.radix_cache``), loading it if needed."""
        return importlib.import_module(f"{self.prefix}.{dotted}")


__all__ = ["PrivateSGLang"]
