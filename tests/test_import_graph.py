"""kvpool's modules import each other along the floors and without a circle.

Every import counts, annotation-only imports (under ``if TYPE_CHECKING:``) and imports inside
functions included: a lazy import runs later, but a circle through it still ties the modules
together, and an import against the floors is one however late it runs.

The floors, bottom up: the shared types at ``kvpool/``'s root; the reference and the invariants;
the kernels; the optimized twin; the harness (``testing``, then the replay modules); the SGLang
adapters; the command line on top. A module imports from lower floors and from its own package
only.
Inside each twin the wings have floors of their own, as DEVELOPERS.md draws them
(:func:`tests.test_developers_map.wing_floors`); the twin may import the reference's pure helpers
on the same terms. A component that needs its caller's type names a Protocol of what it uses
instead (``SpecDecodeHost``, ``SnapshotHost``, ``TreeViewHost``), and a harness that needs an
implementation above it finds it as a plug-in (:mod:`kvpool.testing.plugins`)."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

import kvpool
from tests.test_developers_map import wing_floors

ROOT = Path(kvpool.__file__).parent

SHARED = frozenset(
    {"kvpool", "kvpool.errors", "kvpool.constants", "kvpool.config", "kvpool.rules",
     "kvpool.snapshot", "kvpool.tags", "kvpool.protocols", "kvpool.injection",
     "kvpool.host_checks", "kvpool.field_types", "kvpool.traces", "kvpool.records"}
)  # fmt: skip
PACKAGE_FLOORS = {
    "reference": 1,
    "invariants": 1,
    "kernels": 2,
    "optimized": 3,
    "testing": 4,
    "replay_stepper": 5,
    "replay": 6,
    "sglang": 7,
    "cli": 8,
    "__main__": 9,
}
"""Floor of each package (or top-level module) under ``kvpool``; the shared types are floor 0."""


def _module_name(path: Path) -> str:
    parts = path.relative_to(ROOT.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _imports(tree: ast.Module, lazy: bool = True) -> list[str]:
    """Modules named by the imports of ``tree``: every import when ``lazy``, else only those at
    module level (inside ``if`` / ``try`` blocks too)."""
    out: list[str] = []
    nodes = ast.walk(tree) if lazy else _module_level(tree)
    for node in nodes:
        if isinstance(node, ast.Import):
            out.extend(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            out.append(node.module)
            out.extend(f"{node.module}.{alias.name}" for alias in node.names)
    return out


def _module_level(tree: ast.Module) -> list[ast.stmt]:
    out: list[ast.stmt] = []
    stack: list[ast.stmt] = list(tree.body)
    while stack:
        node = stack.pop()
        out.append(node)
        if isinstance(node, (ast.If, ast.Try)):
            stack.extend(node.body)
            stack.extend(node.orelse)
            if isinstance(node, ast.Try):
                stack.extend(node.finalbody)
                for handler in node.handlers:
                    stack.extend(handler.body)
    return out


def import_graph(lazy: bool = True) -> dict[str, set[str]]:
    """kvpool module -> the kvpool modules it imports (``lazy``: inside functions too)."""
    paths = {_module_name(p): p for p in ROOT.rglob("*.py")}
    graph: dict[str, set[str]] = {}
    for name, path in paths.items():
        tree = ast.parse(path.read_text(encoding="utf-8"))
        graph[name] = {m for m in _imports(tree, lazy) if m in paths and m != name}
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


def place(module: str, wings: dict[str, int]) -> tuple[str, int, str, int]:
    """(package, its floor, wing, the wing's floor) of a kvpool module (wing ``""`` and floor
    0 outside the twins and at a twin's root)."""
    if module in SHARED or module.startswith("kvpool.protocols"):
        return ("shared", 0, "", 0)
    parts = module.split(".")
    package = parts[1]
    if package not in PACKAGE_FLOORS:
        raise AssertionError(f"{module} is on no floor: add it to SHARED or PACKAGE_FLOORS")
    wing = ""
    if package in ("reference", "optimized"):
        if len(parts) == 2:  # the twin's own __init__: its export surface, above every wing
            return (package, PACKAGE_FLOORS[package], "(exports)", max(wings.values()) + 1)
        if len(parts) > 3 or parts[2] in wings:
            wing = parts[2]
    return (package, PACKAGE_FLOORS[package], wing, wings.get(wing, 0))


def against_floors(graph: dict[str, set[str]], wings: dict[str, int]) -> list[str]:
    """Every import ``a -> b`` that runs up a floor, as ``"a -> b"``."""
    bad = []
    for a, targets in sorted(graph.items()):
        pa, fa, wa, wfa = place(a, wings)
        for b in sorted(targets):
            pb, fb, wb, wfb = place(b, wings)
            if pa == pb or fb < fa:
                twins = {pa, pb} <= {"reference", "optimized"}
                if twins and wa != wb and wfb >= wfa:
                    bad.append(f"{a} -> {b}")
            else:
                bad.append(f"{a} -> {b}")
    return bad


def test_cycle_finder_finds_a_circle() -> None:
    assert find_cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}}) == ["a", "b", "c", "a"]
    assert find_cycle({"a": {"b"}, "b": set()}) == []


def test_annotation_only_and_lazy_imports_are_edges() -> None:
    source = "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from kvpool.x import Y\n"
    assert "kvpool.x" in _imports(ast.parse(source), lazy=False)
    lazy = "def f():\n    from kvpool.x import Y\n"
    assert _imports(ast.parse(lazy), lazy=False) == []
    assert "kvpool.x" in _imports(ast.parse(lazy))


def test_floor_check_finds_an_import_up() -> None:
    wings = {"pools": 1, "lifecycle": 6, "": 0}
    graph = {
        "kvpool.reference.pools.allocator": {"kvpool.reference.lifecycle.memory_manager"},
        "kvpool.reference.lifecycle.memory_manager": {"kvpool.reference.pools.allocator"},
        "kvpool.testing.runs": {"kvpool.sglang.glue"},
        "kvpool.optimized.pools.allocator": {"kvpool.reference.pools.paged_ops"},
        "kvpool.invariants.swa": {"kvpool.reference.req"},
    }
    assert against_floors(graph, wings) == [
        "kvpool.invariants.swa -> kvpool.reference.req",
        "kvpool.reference.pools.allocator -> kvpool.reference.lifecycle.memory_manager",
        "kvpool.testing.runs -> kvpool.sglang.glue",
    ]


@pytest.mark.slow
def test_graph_covers_the_twins() -> None:
    graph = import_graph()
    lifecycle = "kvpool.optimized.lifecycle"
    assert f"{lifecycle}.spec_decode" in graph[f"{lifecycle}.memory_manager"]
    assert (
        "kvpool.reference.lifecycle.pool_snapshot"
        in graph["kvpool.reference.lifecycle.memory_manager"]
    )


@pytest.mark.slow
def test_no_import_circle() -> None:
    assert find_cycle(import_graph()) == []


@pytest.mark.slow
def test_no_import_against_the_floors() -> None:
    assert against_floors(import_graph(), wing_floors()) == []
