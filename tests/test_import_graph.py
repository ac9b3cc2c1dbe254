"""kvpool's modules import each other without a circle, annotation-only imports included: the
module-level imports (those under ``if TYPE_CHECKING:`` too) of every ``kvpool/**/*.py`` form an
acyclic graph. Imports inside functions (the command line's lazy imports) are not edges: they run
after every module involved has loaded. A component that needs its caller's type names a
Protocol of what it uses instead (``SpecDecodeHost``, ``SnapshotHost``, ``TreeViewHost``)."""

from __future__ import annotations

import ast
from pathlib import Path

import kvpool

ROOT = Path(kvpool.__file__).parent


def _module_name(path: Path) -> str:
    parts = path.relative_to(ROOT.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _top_level_imports(tree: ast.Module) -> list[str]:
    """Modules named by imports at module level, inside ``if`` / ``try`` blocks too."""
    out: list[str] = []
    stack: list[ast.stmt] = list(tree.body)
    while stack:
        node = stack.pop()
        if isinstance(node, ast.Import):
            out.extend(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            out.append(node.module)
            out.extend(f"{node.module}.{alias.name}" for alias in node.names)
        elif isinstance(node, (ast.If, ast.Try)):
            stack.extend(node.body)
            stack.extend(node.orelse)
            if isinstance(node, ast.Try):
                stack.extend(node.finalbody)
                for handler in node.handlers:
                    stack.extend(handler.body)
    return out


def import_graph() -> dict[str, set[str]]:
    """kvpool module -> the kvpool modules it imports at module level."""
    paths = {_module_name(p): p for p in ROOT.rglob("*.py")}
    graph: dict[str, set[str]] = {}
    for name, path in paths.items():
        tree = ast.parse(path.read_text(encoding="utf-8"))
        graph[name] = {m for m in _top_level_imports(tree) if m in paths and m != name}
    return graph


def find_cycle(graph: dict[str, set[str]]) -> list[str]:
    """One import circle as a path ``[a, b, ..., a]``, or ``[]`` when there is none."""
    state: dict[str, int] = {}  # 1: on the current path, 2: done
    path: list[str] = []

    def visit(node: str) -> list[str]:
        state[node] = 1
        path.append(node)
        for nxt in sorted(graph[node]):
            if state.get(nxt) == 1:
                return [*path[path.index(nxt) :], nxt]
            if nxt not in state and (cycle := visit(nxt)):
                return cycle
        path.pop()
        state[node] = 2
        return []

    for start in sorted(graph):
        if start not in state and (cycle := visit(start)):
            return cycle
    return []


def test_cycle_finder_finds_a_circle() -> None:
    assert find_cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}}) == ["a", "b", "c", "a"]
    assert find_cycle({"a": {"b"}, "b": set()}) == []


def test_annotation_only_imports_are_edges() -> None:
    source = "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from kvpool.x import Y\n"
    assert "kvpool.x" in _top_level_imports(ast.parse(source))
    lazy = "def f():\n    from kvpool.x import Y\n"
    assert _top_level_imports(ast.parse(lazy)) == []


def test_graph_covers_the_twins() -> None:
    graph = import_graph()
    assert (
        "kvpool.optimized.lifecycle.spec_decode"
        in graph["kvpool.optimized.lifecycle.memory_manager"]
    )
    assert (
        "kvpool.reference.lifecycle.pool_snapshot"
        in graph["kvpool.reference.lifecycle.memory_manager"]
    )


def test_no_import_circle() -> None:
    assert find_cycle(import_graph()) == []
