"""SGLang's memory-pool debug asserts (``SGLANG_DEBUG_MEMORY_POOL``), switched per object.

SGLang's paged allocator (``allocator/paged.py``, both audited releases) reads
``get_bool_env_var("SGLANG_DEBUG_MEMORY_POOL")`` once, in its constructor, into ``debug_mode``.
With it on, SGLang checks its own contracts inside the calls, at the cost of host syncs:

- ``alloc(n)``: ``n`` is whole pages;
- ``alloc_extend`` / ``alloc_decode``: every request's last slot agrees with its length within
  its page (``(last_loc + 1) % page_size == prefix_len % page_size``, one more at decode), and
  the slots handed out are distinct;
- ``free`` (0.5.23: also ``free_page_ids`` and ``free_group_end``): no page is on the free
  list twice (the double free that SGLang's "memory leak detected" reports end in);
- 0.5.23's ``free_segment`` and the SWA allocator's page expansion and SWA-page lookup: the pages
  a fast path frees are exactly the pages the slots name.

The SWA allocator reads the flag of its own paged SWA allocator, so it follows too. A failed
check is SGLang's ``AssertionError``, which a lockstep run reports as a crash in SGLang's file.

The loader stubs ``get_bool_env_var`` (every switch off, as on a server with none set). It
installs :class:`DebugSwitch` in the paged module instead, and :func:`debug_asserts` turns
the one switch on while SGLang's constructors run. Turning it on for a scope, not for the
process, keeps an allocator built outside it exactly as SGLang builds one by default (the
benchmarks against SGLang measure that one)."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

DEBUG_SWITCH = "SGLANG_DEBUG_MEMORY_POOL"
"""The environment switch SGLang's paged allocator reads for its debug asserts."""

_PAGED = "sglang.srt.mem_cache.allocator.paged"


class DebugSwitch:
    """Stands in for ``get_bool_env_var`` in SGLang's loaded paged-allocator module: ``True``
    for :data:`DEBUG_SWITCH` while :attr:`on`, ``False`` for every other switch and otherwise
    (the stub's answer)."""

    def __init__(self) -> None:
        self.on = False

    def __call__(self, name: str, default: str = "false") -> bool:
        return self.on and name == DEBUG_SWITCH


def install_debug_switch(paged: Any) -> None:
    """Put a :class:`DebugSwitch` in the loaded ``paged`` module's ``get_bool_env_var``
    (idempotent; a module that does not read it is left alone)."""
    if "get_bool_env_var" in paged.__dict__ and not isinstance(
        paged.__dict__["get_bool_env_var"], DebugSwitch
    ):
        paged.get_bool_env_var = DebugSwitch()


@contextmanager
def debug_asserts(modules: Any, on: bool = True) -> Iterator[None]:
    """While open, SGLang's paged allocators built from ``modules`` (a loaded release) read
    :data:`DEBUG_SWITCH` as ``on``; the previous value comes back at exit, so scopes nest."""
    switch = modules.module(_PAGED).__dict__.get("get_bool_env_var")
    if not isinstance(switch, DebugSwitch):
        yield
        return
    before, switch.on = switch.on, on
    try:
        yield
    finally:
        switch.on = before


__all__ = ["DEBUG_SWITCH", "DebugSwitch", "debug_asserts", "install_debug_switch"]
