"""Source transforms the loader applies to SGLang's files before executing them.

- :func:`rewrite_imports`: every absolute import of ``sglang...`` is redirected to the private
  package ``PREFIX.sglang...`` (so SGLang's modules never enter ``sys.modules`` under their
  real names), and every import of a third-party package other than :data:`REAL_THIRD_PARTY` to
  a stub under ``PREFIX._external`` (so loading never imports sgl_kernel, flashinfer, vllm,
  transformers...). Standard-library imports and relative imports are left as they are.
- :func:`extract_definitions`: the top-level definitions of a few names of a big module (a class
  of ``memory_pool.py``, three helpers of ``utils/common.py``) together with the module-level
  imports, constants and functions they reach, so that the rest of the module never runs.
"""

from __future__ import annotations

import ast
import importlib.util
import sys
from collections.abc import Iterable

REAL_THIRD_PARTY = frozenset(
    {"torch", "triton", "numpy"}
    | ({"msgspec"} if importlib.util.find_spec("msgspec") is not None else set())
)
"""Third-party packages imported for real: the allocators' tensors and kernels need them, and
SGLang 0.5.23's unified radix cache builds its parameter and action records on ``msgspec``
(real when installed: ``pip install 'kvpool[sglang]'``; a stub otherwise, and the unified cache
then refuses to load, see :mod:`kvpool.sglang.tree_core`)."""

_STDLIB = frozenset(sys.stdlib_module_names)


def _redirect(module: str, prefix: str) -> str | None:
    """The private name to import instead of absolute module ``module``; None: unchanged."""
    top = module.partition(".")[0]
    if top == "sglang":
        return f"{prefix}.{module}"
    if top in _STDLIB or top in REAL_THIRD_PARTY or top == "__future__":
        return None
    return f"{prefix}._external.{module}"


class _ImportRewriter(ast.NodeTransformer):
    def __init__(self, prefix: str) -> None:
        self.prefix = prefix

    def visit_ImportFrom(self, node: ast.ImportFrom) -> ast.AST:
        if node.level == 0 and node.module:
            target = _redirect(node.module, self.prefix)
            if target is not None:
                node.module = target
        return node

    def visit_Import(self, node: ast.Import) -> ast.AST | list[ast.stmt]:
        out: list[ast.stmt] = []
        for alias in node.names:
            target = _redirect(alias.name, self.prefix)
            if target is None:
                out.append(ast.Import(names=[alias]))
            elif alias.asname:
                out.append(ast.Import(names=[ast.alias(target, alias.asname)]))
            else:
                # ``import sglang.a.b`` binds ``sglang``: bind it to the private package instead.
                top = alias.name.partition(".")[0]
                out.append(ast.Import(names=[ast.alias(target)]))
                private_top = target[: len(target) - len(alias.name) + len(top)]
                value = ast.parse(private_top, mode="eval").body
                out.append(ast.Assign(targets=[ast.Name(top, ast.Store())], value=value))
        for stmt in out:
            ast.copy_location(stmt, node)
        return out


def rewrite_imports(tree: ast.Module, prefix: str) -> ast.Module:
    """``tree`` with its imports redirected (see the module docstring); fixed locations."""
    rewritten: ast.Module = _ImportRewriter(prefix).visit(tree)
    return ast.fix_missing_locations(rewritten)


def _defined(node: ast.stmt) -> set[str]:
    if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
        return {node.name}
    if isinstance(node, ast.Assign):
        return {n.id for t in node.targets for n in ast.walk(t) if isinstance(n, ast.Name)}
    if isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name):
        return {node.target.id}
    if isinstance(node, ast.Import):
        return {(a.asname or a.name).partition(".")[0] for a in node.names}
    if isinstance(node, ast.ImportFrom):
        return {a.asname or a.name for a in node.names if a.name != "*"}
    return set()


def extract_definitions(tree: ast.Module, names: Iterable[str]) -> ast.Module:
    """The statements of ``tree`` that define ``names`` plus, transitively, the top-level
    statements defining every name they use, in source order (``from __future__`` first).
    A name ending in ``?`` is optional (taken when the module defines it: a definition only
    some releases have). Raises KeyError naming any other of ``names`` the module does not
    define at top level."""
    by_name: dict[str, list[int]] = {}
    for i, node in enumerate(tree.body):
        for name in _defined(node):
            by_name.setdefault(name, []).append(i)
    wanted = {n for n in names if not n.endswith("?")}
    wanted |= {n[:-1] for n in names if n.endswith("?") and n[:-1] in by_name}
    missing = wanted - set(by_name)
    if missing:
        raise KeyError(sorted(missing))
    chosen: set[int] = set()
    todo = list(wanted)
    while todo:
        for i in by_name.get(todo.pop(), ()):
            if i in chosen:
                continue
            chosen.add(i)
            used = {n.id for n in ast.walk(tree.body[i]) if isinstance(n, ast.Name)}
            todo.extend(used - {"__future__"})
    future = [n for n in tree.body if isinstance(n, ast.ImportFrom) and n.module == "__future__"]
    body = future + [n for i, n in enumerate(tree.body) if i in chosen and n not in future]
    return ast.Module(body=body, type_ignores=[])


__all__ = ["REAL_THIRD_PARTY", "extract_definitions", "rewrite_imports"]
