"""Every name is imported from the module that defines it, and no module passes on another's.

A module's ``__all__`` lists only what it defines (a package's ``__init__`` may list its
modules' public names: that is its job), and every ``from kvpool.X import NAME`` in ``kvpool/``
and ``tests/`` takes ``NAME`` from the module that defines it (or names a submodule). A name
reached through a module that merely imported it breaks when that module stops needing it, and
hides where the definition lives."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

import kvpool

ROOT = Path(kvpool.__file__).parent
TESTS = ROOT.parent / "tests"


def _module_name(path: Path) -> str:
    parts = path.relative_to(ROOT.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def defined_names(tree: ast.Module) -> set[str]:
    """Names a module binds itself at module level: functions, classes, assignments (inside
    top-level ``if`` / ``try`` blocks too), not imports."""
    names: set[str] = set()
    stack: list[ast.stmt] = list(tree.body)
    while stack:
        node = stack.pop()
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            names.add(node.name)
        elif isinstance(node, (ast.Assign, ast.AnnAssign)):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            names.update(n.id for t in targets for n in ast.walk(t) if isinstance(n, ast.Name))
        elif isinstance(node, (ast.If, ast.Try)):
            stack.extend(node.body + node.orelse)
            if isinstance(node, ast.Try):
                stack.extend(node.finalbody)
                for handler in node.handlers:
                    stack.extend(handler.body)
    return names


def _all(tree: ast.Module) -> list[str]:
    for node in tree.body:
        if isinstance(node, ast.Assign) and any(
            isinstance(t, ast.Name) and t.id == "__all__" for t in node.targets
        ):
            return [
                e.value
                for e in ast.walk(node.value)
                if isinstance(e, ast.Constant) and isinstance(e.value, str)
            ]
    return []


def _modules() -> dict[str, tuple[Path, ast.Module]]:
    return {
        _module_name(p): (p, ast.parse(p.read_text(encoding="utf-8"))) for p in ROOT.rglob("*.py")
    }


def reexports(modules: dict[str, tuple[Path, ast.Module]]) -> list[str]:
    """``module: name`` for each name a non-package module passes on without defining it:
    listed in ``__all__``, or imported in the explicit re-export form ``import X as X``."""
    out = []
    for name, (path, tree) in sorted(modules.items()):
        if path.name != "__init__.py":
            defined = defined_names(tree)
            out += [f"{name}: {n}" for n in _all(tree) if n not in defined]
            out += [
                f"{name}: {alias.name}"
                for node in ast.walk(tree)
                if isinstance(node, (ast.Import, ast.ImportFrom))
                for alias in node.names
                if alias.asname is not None and alias.asname == alias.name
            ]
    return out


def imports_through(modules: dict[str, tuple[Path, ast.Module]], files: list[Path]) -> list[str]:
    """``file: module.name`` for each import of ``files`` that takes a name from a kvpool module
    which does not define it (a package's ``__init__`` counts as the module it is)."""
    out = []
    defined = {name: defined_names(tree) for name, (_, tree) in modules.items()}
    for path in files:
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if not (isinstance(node, ast.ImportFrom) and node.level == 0):
                continue
            if node.module not in modules:
                continue
            for alias in node.names:
                if f"{node.module}.{alias.name}" in modules or alias.name in defined[node.module]:
                    continue
                if modules[node.module][0].name == "__init__.py" and path.is_relative_to(TESTS):
                    continue  # tests may use a package's public surface, as users do
                out.append(f"{path.relative_to(ROOT.parent)}: {node.module}.{alias.name}")
    return out


def test_the_checks_see_a_shim() -> None:
    shim = ast.parse("from kvpool.a import X\n__all__ = ['X', 'f']\ndef f(): pass\n")
    assert "f" in defined_names(shim) and "X" not in defined_names(shim)
    assert reexports({"kvpool.b": (Path("b.py"), shim)}) == ["kvpool.b: X"]
    alias = ast.parse("from kvpool.a import Y as Y\n")
    assert reexports({"kvpool.c": (Path("c.py"), alias)}) == ["kvpool.c: Y"]


@pytest.mark.slow
def test_no_module_passes_on_another_modules_name() -> None:
    assert reexports(_modules()) == []


@pytest.mark.slow
def test_every_name_comes_from_its_defining_module() -> None:
    files = sorted(ROOT.rglob("*.py")) + sorted(TESTS.rglob("*.py"))
    assert imports_through(_modules(), files) == []
