"""Mutants of SGLang's own scheduler glue, and whether a lockstep campaign kills them.

kvpool's lifecycle campaigns against SGLang 0.5.23 (``kvpool verify --sglang 0.5.23``) run
SGLang's memory glue itself: ``allocation.py`` (``alloc_for_extend``, ``alloc_req_slots``,
``alloc_for_decode``...) and ``common.py`` (``release_kv_cache``, ``checkpoint_kv_cache``,
``free_kv_row_segments``...). The bugs the field reports live there, so the measure of a campaign
is how many small faults planted in that code it finds. This module plants them one at a time:

- :func:`mutants` lists every mutant of the glue functions: a comparison turned into its
  neighbour (``<`` and ``<=``, ``==`` and ``!=``, ``is`` and ``is not``, ``in`` and
  ``not in``: ``ROR``), ``+`` and ``-`` swapped (``AOR``), an integer constant moved by one or a
  boolean flipped (``CRP``), ``and`` and ``or`` swapped (``LCR``), an ``if`` / ``while``
  condition negated (``NEG``), and a statement deleted (``SDL``: a call made for its effect, a
  ``+=`` / ``-=``, an assignment to an attribute or item: a forgotten free, unlock, length
  update). Assertions, raises, f-strings and logging are left alone: a fault there changes a
  message, not the memory; so are Triton kernels (``@triton.jit``: compiled from the file).
- :func:`lines_reached` runs the campaign as released once under a line tracer: a mutant on a
  line the campaign never executes cannot be found by it (same seed, same steps up to the
  mutation, which is never reached) and is reported ``unreached`` without playing it.
- :func:`play` runs the campaign with one mutant in place: the mutated function compiled from
  SGLang's source into its module's namespace, and every loaded SGLang module's binding of the
  original (a ``from ... import`` took its own; a module-level dispatch table, such as the
  device table ``alloc_for_decode`` looks its function up in, holds one too) pointed at it.
  Run it in a forked child (:class:`~kvpool.testing.sandbox.Sandbox`, :func:`play_quietly`):
  a mutant may hang or kill its process.

``benchmarks/bench_glue_mutants.py`` plays them all and prints the table; specs/sglang.md
("Mutants of SGLang's scheduler glue") gives the figures and what the survivors are.
"""

from __future__ import annotations
import __future__

import ast
import copy
import logging
import os
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from types import FrameType, FunctionType, ModuleType
from typing import Any

GLUE_FILES = {
    "allocation": "sglang.srt.mem_cache.allocation",
    "common": "sglang.srt.mem_cache.common",
}
"""The glue modules mutated (short name -> SGLang module)."""

_ROR = {
    ast.Lt: ast.LtE, ast.LtE: ast.Lt, ast.Gt: ast.GtE, ast.GtE: ast.Gt, ast.Eq: ast.NotEq,
    ast.NotEq: ast.Eq, ast.Is: ast.IsNot, ast.IsNot: ast.Is, ast.In: ast.NotIn,
    ast.NotIn: ast.In,
}  # fmt: skip
_SYMBOL: dict[type[ast.AST], str] = {
    ast.Lt: "<", ast.LtE: "<=", ast.Gt: ">", ast.GtE: ">=", ast.Eq: "==", ast.NotEq: "!=",
    ast.Is: "is", ast.IsNot: "is not", ast.In: "in", ast.NotIn: "not in", ast.Add: "+",
    ast.Sub: "-", ast.And: "and", ast.Or: "or",
}  # fmt: skip
_QUIET_ROOTS = frozenset({"logger", "logging", "print", "warnings"})
"""Calls whose deletion changes only what is printed."""


@dataclass(frozen=True)
class Mutant:
    """One fault: the ``variant``-th change at the ``site``-th mutable node of ``function`` in
    glue module ``module`` (site order: a pre-order walk of the function's syntax tree).
    ``line`` is the line of the statement holding the site (what the line tracer sees)."""

    module: str
    function: str
    site: int
    variant: int
    operator: str
    line: int
    change: str

    @property
    def name(self) -> str:
        return f"{self.module}.{self.function}:{self.line} {self.operator} {self.change}"


@dataclass(frozen=True)
class _Site:
    node: ast.AST
    statement: ast.stmt
    body: list[ast.stmt] | None
    """The list holding ``node`` when the site is a statement to delete."""


def _root_name(expr: ast.expr) -> str | None:
    while isinstance(expr, (ast.Attribute, ast.Call, ast.Subscript)):
        expr = expr.func if isinstance(expr, ast.Call) else expr.value
    return expr.id if isinstance(expr, ast.Name) else None


def _deletable(stmt: ast.stmt) -> bool:
    """A statement whose deletion is a realistic memory fault (module docstring, ``SDL``)."""
    if isinstance(stmt, ast.Expr):
        return isinstance(stmt.value, ast.Call) and _root_name(stmt.value) not in _QUIET_ROOTS
    if isinstance(stmt, ast.AugAssign):
        return True
    if isinstance(stmt, ast.Assign):
        return all(isinstance(t, (ast.Attribute, ast.Subscript)) for t in stmt.targets)
    return False


def _sites(fn: ast.FunctionDef) -> list[_Site]:
    """The mutable nodes of ``fn`` in pre-order (the same order for a deep copy)."""
    out: list[_Site] = []

    def visit(node: ast.AST, statement: ast.stmt) -> None:
        if isinstance(node, (ast.Assert, ast.Raise, ast.JoinedStr)):
            return
        for name, value in ast.iter_fields(node):
            if name in ("decorator_list", "returns", "annotation", "type_comment"):
                continue
            for child in value if isinstance(value, list) else [value]:
                if not isinstance(child, ast.AST):
                    continue
                here = child if isinstance(child, ast.stmt) else statement
                if isinstance(child, ast.stmt) and isinstance(value, list) and _deletable(child):
                    out.append(_Site(child, here, value))
                if _variants(child):
                    out.append(_Site(child, here, None))
                visit(child, here)

    visit(fn, fn)
    return out


def _variants(node: ast.AST) -> list[tuple[str, str]]:
    """``(operator, change)`` of each mutation of ``node`` (statement deletion aside)."""
    if isinstance(node, ast.Compare) and len(node.ops) == 1 and type(node.ops[0]) in _ROR:
        op = type(node.ops[0])
        return [("ROR", f"{_SYMBOL[op]} -> {_SYMBOL[_ROR[op]]}")]
    if isinstance(node, ast.BinOp) and isinstance(node.op, (ast.Add, ast.Sub)):
        swapped: type[ast.operator] = ast.Sub if isinstance(node.op, ast.Add) else ast.Add
        return [("AOR", f"{_SYMBOL[type(node.op)]} -> {_SYMBOL[swapped]}")]
    if isinstance(node, ast.Constant) and isinstance(node.value, bool):
        return [("CRP", f"{node.value} -> {not node.value}")]
    if isinstance(node, ast.Constant) and type(node.value) is int:
        return [("CRP", f"{node.value} -> {node.value + 1}"),
                ("CRP", f"{node.value} -> {node.value - 1}")]  # fmt: skip
    if isinstance(node, ast.BoolOp):
        joined: type[ast.boolop] = ast.Or if isinstance(node.op, ast.And) else ast.And
        return [("LCR", f"{_SYMBOL[type(node.op)]} -> {_SYMBOL[joined]}")]
    if isinstance(node, (ast.If, ast.While)):
        return [("NEG", f"{type(node).__name__.lower()} not (...)")]
    return []


def _mutate(site: _Site, variant: int) -> None:
    """Apply the ``variant``-th change at ``site`` in place (statement deletion: ``pass``)."""
    node = site.node
    if site.body is not None:
        site.body[site.body.index(node)] = ast.copy_location(ast.Pass(), node)  # type: ignore[arg-type]
    elif isinstance(node, ast.Compare):
        node.ops = [_ROR[type(node.ops[0])]()]
    elif isinstance(node, ast.BinOp):
        node.op = ast.Sub() if isinstance(node.op, ast.Add) else ast.Add()
    elif isinstance(node, ast.Constant) and isinstance(node.value, bool):
        node.value = not node.value
    elif isinstance(node, ast.Constant) and type(node.value) is int:
        node.value = node.value + (1 if variant == 0 else -1)
    elif isinstance(node, ast.BoolOp):
        node.op = ast.Or() if isinstance(node.op, ast.And) else ast.And()
    elif isinstance(node, (ast.If, ast.While)):
        node.test = ast.copy_location(ast.UnaryOp(op=ast.Not(), operand=node.test), node.test)


def _functions(modules: Any) -> Iterator[tuple[str, ast.FunctionDef]]:
    """Every module-level function of the glue modules, as SGLang's source defines it."""
    for short, dotted in GLUE_FILES.items():
        tree = ast.parse(modules.source.read(dotted.replace(".", "/") + ".py"))
        for node in tree.body:
            if isinstance(node, ast.FunctionDef) and not _is_kernel(node):
                yield short, node


def _is_kernel(fn: ast.FunctionDef) -> bool:
    """A Triton kernel (``@triton.jit``): Triton compiles it from its source file, so a mutant
    would not run as compiled here; kvpool's kernel harness checks kernels."""
    return any("jit" in ast.unparse(d) for d in fn.decorator_list)


def mutants(modules: Any) -> list[Mutant]:
    """Every mutant of the glue functions of SGLang ``modules``
    (:class:`~kvpool.sglang.loader.SGLangModules`), in source order."""
    out: list[Mutant] = []
    for short, fn in _functions(modules):
        for i, site in enumerate(_sites(fn)):
            if site.body is not None:
                text = ast.unparse(site.node).splitlines()[0]
                change = f"delete {text[:60]}"
                out.append(Mutant(short, fn.name, i, 0, "SDL", site.statement.lineno, change))
                continue
            for v, (operator, change) in enumerate(_variants(site.node)):
                out.append(Mutant(short, fn.name, i, v, operator, site.statement.lineno, change))
    return out


def glue_module(modules: Any, short: str) -> ModuleType:
    """The loaded glue module ``short`` (a key of :data:`GLUE_FILES`)."""
    module: ModuleType = modules.module(GLUE_FILES[short])
    return module


def _original(module: ModuleType, name: str) -> FunctionType:
    """The function ``name`` of ``module`` as SGLang defined it (under kvpool's call-counting
    wrapper when one is installed)."""
    fn = vars(module)[name]
    return getattr(fn, "__wrapped__", fn)  # type: ignore[no-any-return]


def install(modules: Any, mutant: Mutant) -> FunctionType:
    """Put ``mutant`` in place in this process: its function compiled from SGLang's source
    with the change, in its module's namespace, and every binding of the original in the
    loaded SGLang modules pointed at it. Returns the mutated function."""
    module = glue_module(modules, mutant.module)
    original = _original(module, mutant.function)
    fn = next(f for short, f in _functions(modules)
              if short == mutant.module and f.name == mutant.function)  # fmt: skip
    changed = copy.deepcopy(fn)
    _mutate(_sites(changed)[mutant.site], mutant.variant)
    tree = ast.fix_missing_locations(ast.Module(body=[changed], type_ignores=[]))
    flags = __future__.annotations.compiler_flag  # as the glue modules' own future import
    code = compile(tree, original.__code__.co_filename, "exec", flags=flags, dont_inherit=True)
    namespace = vars(module)
    saved = namespace[mutant.function]
    exec(code, namespace)
    mutated: FunctionType = namespace[mutant.function]
    namespace[mutant.function] = saved  # put back, then rebound below with the others
    prefix = module.__name__.split(".", 1)[0]

    def bound(value: object) -> bool:
        return value is original or getattr(value, "__wrapped__", None) is original

    for name, loaded in list(sys.modules.items()):
        if loaded is None or not (name == prefix or name.startswith(prefix + ".")):
            continue
        for key, value in list(vars(loaded).items()):
            if bound(value):
                setattr(loaded, key, mutated)
            elif isinstance(value, dict):  # a dispatch table (0.5.23's ALLOC_FOR_DECODE_FUNCS)
                for entry, held in list(value.items()):
                    if bound(held):
                        value[entry] = mutated
    return mutated


@dataclass(frozen=True)
class Trial:
    """One campaign for :func:`play`: ``runs`` runs of machine ``component`` seeded ``seed``,
    the reference against SGLang ``source``'s glue lifecycle (its allocators on their torch
    path: the glue is the same either way), with ``mutant`` in place (None: as released)."""

    source: str
    component: str
    seed: int
    runs: int
    mutant: Mutant | None = None

    @property
    def warm_key(self) -> tuple[str, str]:
        """What a sandbox's zygote loads once (:func:`warm`)."""
        return (self.source, self.component)


@dataclass(frozen=True)
class Outcome:
    """What :func:`play` found: ``detector`` is the first failure's (an invariant id,
    ``crash``, ``lockstep-diff``...) or None when every run passed; ``run`` and ``step`` where
    it failed (0 when none); ``steps`` the steps run. The failure is not shrunk."""

    detector: str | None
    run: int
    step: int
    steps: int


def _campaign(trial: Trial) -> Outcome:
    from kvpool.sglang.implementation import implementation
    from kvpool.testing.implementations import reference_implementation
    from kvpool.testing.runs import execute, run_config

    candidate = implementation(trial.source, naive_extend=True)
    reference = reference_implementation()
    steps = 0
    for run in range(trial.runs):
        chooser, config = run_config(trial.component, candidate, trial.seed, run)
        done = execute(trial.component, reference, candidate, config, chooser=chooser,
                       steps=60)  # fmt: skip
        steps += done.steps
        if done.failure is not None:
            return Outcome(done.failure.detector, run, done.failure.step, steps)
    return Outcome(None, 0, 0, steps)


def warm(trial: Trial) -> None:
    """Load SGLang ``trial.source`` and run one run (kvpool's call counters installed), so
    that every forked child starts warm (a :class:`~kvpool.testing.sandbox.Sandbox`'s warm)."""
    _campaign(Trial(trial.source, trial.component, trial.seed, 1))


def play(trial: Trial) -> Outcome:
    """``trial``'s campaign with its mutant installed (:func:`install`); in a forked child
    (the mutant stays in the process)."""
    if trial.mutant is not None:
        from kvpool.sglang.loader import load_sglang

        install(load_sglang(trial.source), trial.mutant)
    return _campaign(trial)


def play_quietly(trial: Trial) -> Outcome:
    """:func:`play` with this process's standard output and error sent to ``/dev/null`` (a
    mutant's refusals make SGLang log and print its tree): for a forked child whose answer
    goes back through a pipe."""
    sink = os.open(os.devnull, os.O_WRONLY)
    os.dup2(sink, 1)
    os.dup2(sink, 2)
    os.close(sink)
    logging.disable(logging.CRITICAL)
    return play(trial)


def lines_reached(modules: Any, trial: Trial) -> tuple[set[tuple[str, int]], Outcome]:
    """``(module short name, line)`` of every glue line ``trial``'s campaign (no mutant)
    executes, and what the campaign found (it must pass to judge mutants by it)."""
    files = {_code_file(glue_module(modules, short)): short for short in GLUE_FILES}
    seen: set[tuple[str, int]] = set()

    def local(frame: FrameType, event: str, arg: object) -> Any:
        if event == "line":
            seen.add((files[frame.f_code.co_filename], frame.f_lineno))
        return local

    def tracer(frame: FrameType, event: str, arg: object) -> Any:
        return local if frame.f_code.co_filename in files else None

    sys.settrace(tracer)
    try:
        outcome = _campaign(trial)
    finally:
        sys.settrace(None)
    return seen, outcome


def _code_file(module: ModuleType) -> str:
    """The file name the module's functions' code objects carry."""
    for value in vars(module).values():
        fn = getattr(value, "__wrapped__", value)
        if isinstance(fn, FunctionType) and fn.__module__ == module.__name__:
            return fn.__code__.co_filename
    raise LookupError(f"{module.__name__} defines no function")


__all__ = [
    "GLUE_FILES",
    "Mutant",
    "Outcome",
    "Trial",
    "glue_module",
    "install",
    "lines_reached",
    "mutants",
    "play",
    "play_quietly",
    "warm",
]
