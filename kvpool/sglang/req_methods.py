"""SGLang's own ``Req.owned_kv_len`` and ``Req.output_ids_through_stop``, for the glue's requests.

SGLang 0.5.23's ``release_kv_cache`` asks the scheduler's request how many of its committed
tokens are its to keep (``req.owned_kv_len()``): a speculative verify step commits its whole
accepted run, so a stop token may lie before the last committed token, and the tokens past the
stop (the client never receives them) must not enter the tree. Those two methods live on
SGLang's ``Req`` in ``managers/schedule_batch.py``, a module kvpool's loader stubs (the rest of it
imports SGLang's whole runtime). :class:`StopMethods` compiles the two definitions alone from the
release's source, in a namespace holding what they read (``get_serving``, looked up in the
loaded ``runtime_context`` at each call, so the glue's stand-in answers), and runs them on a
:class:`~kvpool.sglang.glue.GlueReq`; each call counts as ``schedule_batch.Req.NAME``.
"""

from __future__ import annotations

import ast
from collections import Counter
from typing import Any

from kvpool.errors import ConfigError
from kvpool.sglang.loader import SGLangModules

SCHEDULE_BATCH = "sglang/srt/managers/schedule_batch.py"
STOP_METHODS = ("owned_kv_len", "output_ids_through_stop")
"""The ``Req`` members compiled (a method and a property)."""


class StopMethods:
    """The release's ``Req.owned_kv_len`` and ``Req.output_ids_through_stop`` (module
    docstring). ConfigError when the release's ``Req`` defines neither (an older release)."""

    def __init__(self, modules: SGLangModules) -> None:
        text = modules.source.read(SCHEDULE_BATCH)
        if text is None:
            raise ConfigError(f"SGLang {modules.version} has no {SCHEDULE_BATCH}")
        body = [n for c in ast.parse(text).body if isinstance(c, ast.ClassDef)
                and c.name == "Req" for n in c.body]  # fmt: skip
        defs = [n for n in body if isinstance(n, ast.FunctionDef) and n.name in STOP_METHODS]
        if {d.name for d in defs} != set(STOP_METHODS):
            raise ConfigError(f"SGLang {modules.version}'s Req has no owned_kv_len")
        context = modules.module("sglang.srt.runtime_context")
        namespace: dict[str, Any] = {
            "get_serving": lambda: context.get_serving(),
            "array": __import__("array").array,
            "__name__": "sglang.srt.managers.schedule_batch",
        }
        exec(compile(ast.Module(body=list(defs), type_ignores=[]),
                     modules.source.filename(SCHEDULE_BATCH), "exec"), namespace)  # fmt: skip
        self._owned = namespace["owned_kv_len"]
        self._through_stop = namespace["output_ids_through_stop"]
        self.counts: Counter[str] = Counter()
        """Calls of each member so far (``schedule_batch.Req.NAME``)."""

    def owned_kv_len(self, req: Any) -> int:
        """SGLang's ``req.owned_kv_len()`` (tokens)."""
        self.counts["schedule_batch.Req.owned_kv_len"] += 1
        return int(self._owned(req))

    def output_ids_through_stop(self, req: Any) -> Any:
        """SGLang's ``req.output_ids_through_stop`` (the output ids through the stop)."""
        self.counts["schedule_batch.Req.output_ids_through_stop"] += 1
        return self._through_stop.fget(req)


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
