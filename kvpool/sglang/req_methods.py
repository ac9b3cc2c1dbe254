"""SGLang's own ``Req.owned_kv_len``, ``Req.output_ids_through_stop`` and the scheduler's
``_mamba_can_cache_finished_req``, for the glue's requests.

SGLang 0.5.23's ``release_kv_cache`` asks the scheduler's request how many of its committed
tokens are its to keep (``req.owned_kv_len()``): a speculative verify step commits its whole
accepted run, so a stop token may lie before the last committed token, and the tokens past the
stop (the client never receives them) must not enter the tree. A hybrid (Mamba) request without
track buffers that stopped so is not cached at all: its scheduler marks it
``skip_radix_cache_insert`` when ``_mamba_can_cache_finished_req`` says no (the live state holds
every committed token). The two ``Req`` members live in ``managers/schedule_batch.py``, the
scheduler's method in ``managers/scheduler_components/batch_result_processor.py``, modules
kvpool's loader does not load (they import SGLang's whole runtime). :class:`StopMethods`
compiles the three definitions alone from the release's source, in a namespace holding what
they read (``get_serving``, looked up in the loaded ``runtime_context`` at each call, so the
glue's stand-in answers), and runs them on a :class:`~kvpool.sglang.glue.GlueReq`; each call
counts as ``schedule_batch.Req.NAME`` or ``batch_result_processor.NAME``.
"""

from __future__ import annotations

import ast
from array import array
from collections import Counter
from typing import Any

from kvpool.errors import ConfigError
from kvpool.sglang.loader import SGLangModules

SCHEDULE_BATCH = "sglang/srt/managers/schedule_batch.py"
STOP_METHODS = ("owned_kv_len", "output_ids_through_stop")
"""The ``Req`` members compiled (a method and a property)."""
BATCH_RESULT = "sglang/srt/managers/scheduler_components/batch_result_processor.py"
CAN_CACHE = "_mamba_can_cache_finished_req"
"""The scheduler's method compiled (``SchedulerBatchResultProcessor``)."""


class _SpecResult:
    """The ``GenerationBatchResult`` fields ``_mamba_can_cache_finished_req`` reads, for one
    request of a speculative verify (kvpool's requests ask for no grammar)."""

    num_correct_drafts_per_req_cpu = (0,)
    num_non_draft_tokens_per_req = 1
    grammar_retained_tokens = None


class _Processor:
    """The ``SchedulerBatchResultProcessor`` fields that method reads."""

    def __init__(self, tree_cache: Any) -> None:
        self.tree_cache = tree_cache


def _members(modules: SGLangModules, path: str, cls: str, names: tuple[str, ...]) -> Any:
    """``names`` of class ``cls`` of ``path`` as bare definitions (ConfigError when missing)."""
    text = modules.source.read(path)
    if text is None:
        raise ConfigError(f"SGLang {modules.version} has no {path}")
    body = [n for c in ast.parse(text).body if isinstance(c, ast.ClassDef)
            and c.name == cls for n in c.body]  # fmt: skip
    defs = [n for n in body if isinstance(n, ast.FunctionDef) and n.name in names]
    if {d.name for d in defs} != set(names):
        raise ConfigError(f"SGLang {modules.version}'s {cls} has no {names}")
    return compile(ast.Module(body=list(defs), type_ignores=[]), modules.source.filename(path),
                   "exec")  # fmt: skip


class StopMethods:
    """The release's ``Req.owned_kv_len`` and ``Req.output_ids_through_stop`` (module
    docstring). ConfigError when the release's ``Req`` defines neither (an older release)."""

    def __init__(self, modules: SGLangModules) -> None:
        context = modules.module("sglang.srt.runtime_context")
        namespace: dict[str, Any] = {
            "get_serving": lambda: context.get_serving(),
            "array": array,  # the return annotation of output_ids_through_stop
            "__name__": "sglang.srt.managers.schedule_batch",
        }
        exec(_members(modules, SCHEDULE_BATCH, "Req", STOP_METHODS), namespace)
        self._owned = namespace["owned_kv_len"]
        self._through_stop = namespace["output_ids_through_stop"]
        scheduler: dict[str, Any] = {"__name__": "sglang.srt.managers.scheduler_components"}
        exec(_members(modules, BATCH_RESULT, "SchedulerBatchResultProcessor", (CAN_CACHE,)),
             scheduler)  # fmt: skip
        self._can_cache = scheduler[CAN_CACHE]
        self.counts: Counter[str] = Counter()
        """Calls of each member so far (``schedule_batch.Req.NAME``,
        ``batch_result_processor.NAME``)."""

    def owned_kv_len(self, req: Any) -> int:
        """SGLang's ``req.owned_kv_len()`` (tokens)."""
        self.counts["schedule_batch.Req.owned_kv_len"] += 1
        return int(self._owned(req))

    def output_ids_through_stop(self, req: Any) -> Any:
        """SGLang's ``req.output_ids_through_stop`` (the output ids through the stop)."""
        self.counts["schedule_batch.Req.output_ids_through_stop"] += 1
        return self._through_stop.fget(req)

    def mamba_can_cache_finished_req(self, req: Any, tree_cache: Any) -> bool:
        """The scheduler's ``_mamba_can_cache_finished_req(req, result, 0)`` for a finished
        request of a speculative verify step (False: SGLang marks it
        ``skip_radix_cache_insert``)."""
        self.counts[f"batch_result_processor.{CAN_CACHE}"] += 1
        return bool(self._can_cache(_Processor(tree_cache), req, _SpecResult(), 0))


_COMPILED: dict[int, StopMethods | None] = {}


def stop_methods(modules: SGLangModules) -> StopMethods | None:
    """The compiled members of ``modules``' release (once per process and release); None for
    a release whose ``Req`` has no ``owned_kv_len`` (0.5.16: its release keeps every committed
    token and never asks)."""
    if id(modules) not in _COMPILED:
        try:
            _COMPILED[id(modules)] = StopMethods(modules)
        except ConfigError:
            _COMPILED[id(modules)] = None
    return _COMPILED[id(modules)]


__all__ = ["STOP_METHODS", "StopMethods", "stop_methods"]
