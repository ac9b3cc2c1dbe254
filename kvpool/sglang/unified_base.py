"""What every adapter of SGLang 0.5.23's ``UnifiedRadixCache`` shares, whatever its component
set (FULL: :mod:`kvpool.sglang.unified_radix`; FULL+SWA: :mod:`kvpool.sglang.unified_swa_radix`;
FULL+MAMBA: :mod:`kvpool.sglang.unified_mamba_radix`).

- **Building** SGLang's cache from ``CacheInitParams(tree_components=..., tree_core_backend=
  CORE)`` over either tree core (:data:`~kvpool.sglang.tree_core.TREE_CORES`), and refusing
  with :class:`~kvpool.errors.ConfigError` a core that is not one, or that SGLang's fallback
  policy did not build.
- **Node numbering.** Both cores mint node ids from a counter that a reset does not restart
  (the Python core's reset also mints its LRU lists' sentinel nodes); kvpool numbers the root
  0 and the first node minted after a reset 1 (:meth:`UnifiedTreeBase.snapshot_id`). Nodes
  are handed out as :class:`UnifiedNodeRef`, an int (as SGLang takes it) that also answers
  kvpool's ``node_id``.
- **This cache's node counter.** The Python core's counter is the class attribute
  ``UnifiedTreeNode.counter``, shared by every cache of the process: every way into the tree
  that can mint a node (the adapter's calls, and SGLang's own glue calling the cache directly:
  ``insert``, ``match_prefix``, ``touch_prefix``, ``checkpoint``, ``reset``) runs in
  :meth:`UnifiedTreeBase._call`, which loads this cache's counter and saves it after
  (re-entrant: only the outermost call does).
- **Lock receipts.** An unlock must hand back the receipt (``DecLockRefParams``) its lock
  returned; the adapter keeps the receipts of each node's open locks, SGLang's own included,
  newest last.
- **What each slot holds.** The Rust core cannot report a node's token ids: every insert's
  slots are recorded with the token (and namespace) they were inserted with; a slot the tree
  holds was inserted with exactly that token.
- **The Rust core's tree** (:meth:`UnifiedTreeBase.rust_nodes`): node ids and FULL lock counts
  from ``pretty_print`` (Rust writes it to file descriptor 1: :func:`capture_fd1`), parents
  from ``collect_path_info``, FULL values from ``get_component_device_value``.
"""

from __future__ import annotations

import contextlib
import os
import re
import sys
import tempfile
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

from kvpool.errors import ConfigError
from kvpool.sglang.radix import key_codes
from kvpool.sglang.tree_core import TREE_CORES, UnifiedModules, load_unified

BASE = "sglang.srt.mem_cache.base_prefix_cache"
_CORE = "sglang.srt.mem_cache.unified_cache.unified_tree_core"
_PARAMS = "sglang.srt.mem_cache.cache_init_params"
_LINE = re.compile(r"^( *)\[(\d+)\] (\d+) full_lock=(-?\d+)")
_MINTING = ("insert", "match_prefix", "touch_prefix", "checkpoint", "reset")


_SINK: tuple[int, int] | None = None
"""(process id, descriptor) of :func:`capture_fd1`'s sink, reused by every capture of the
process: a snapshot of the Rust core captures once a step, and a temporary file made for each
capture cost four times what a capture costs now. Keyed by the process id: a forked child (a
sandbox's replay) must not share its parent's file offset."""


def _sink() -> int:
    global _SINK
    pid = os.getpid()
    if _SINK is None or _SINK[0] != pid:
        make = getattr(os, "memfd_create", None)
        if make is not None:  # Linux
            fd = make("kvpool-fd1", os.MFD_CLOEXEC)
        else:  # elsewhere an unnamed temporary file, kept open through a duplicate
            with tempfile.TemporaryFile() as file:
                fd = os.dup(file.fileno())
        _SINK = (pid, fd)
    return _SINK[1]


def capture_fd1(fn: Callable[[], object]) -> str:
    """What ``fn()`` writes to file descriptor 1 (where Rust's ``println!`` goes). Not
    re-entrant, as redirecting a process's descriptor 1 cannot be: ``fn`` must not capture."""
    sys.stdout.flush()
    sink = _sink()
    os.ftruncate(sink, 0)
    os.lseek(sink, 0, os.SEEK_SET)
    saved = os.dup(1)
    os.dup2(sink, 1)
    try:
        fn()
    finally:
        sys.stdout.flush()
        os.dup2(saved, 1)
        os.close(saved)
    os.lseek(sink, 0, os.SEEK_SET)  # truncated before the call: its end is the call's output
    chunks = iter(lambda: os.read(sink, 1 << 16), b"")
    return b"".join(chunks).decode("utf-8", "replace")


class UnifiedNodeRef(int):
    """A unified-cache ``NodeId`` (an int, as SGLang takes it) that also answers kvpool's
    ``node_id``: the id kvpool's snapshot gives the node."""

    cache: UnifiedTreeBase

    def __new__(cls, raw: int, cache: UnifiedTreeBase) -> UnifiedNodeRef:
        ref = super().__new__(cls, raw)
        ref.cache = cache
        return ref

    @property
    def node_id(self) -> int:
        return self.cache.snapshot_id(int(self))


@dataclass(frozen=True)
class RustNode:
    """One node of the Rust core's tree, as its binding reports it (SGLang's raw ids)."""

    raw: int
    parent: int | None
    full_lock: int
    children: tuple[int, ...]
    """In id order (the Rust core keeps no insertion order)."""
    value: tuple[int, ...]
    """FULL slots (empty for the root)."""


class UnifiedTreeBase:
    """The shared part of the unified-cache adapters (see the module docstring). A subclass
    calls :meth:`_build` from its constructor; ``impl`` is SGLang's object."""

    modules: Any
    tree_core: str
    impl: Any
    _unified: UnifiedModules

    def _build(self, modules: Any, tree_core: str, components: tuple[str, ...],
               **params: Any) -> None:  # fmt: skip
        """Build SGLang's cache with ``components`` (``("full", "swa")``...) and ``params``
        (the other ``CacheInitParams`` fields) over ``tree_core``."""
        if tree_core not in TREE_CORES:
            raise ConfigError(f"tree_core must be one of {TREE_CORES}, got {tree_core!r}")
        self.modules = modules
        self.tree_core = tree_core
        self._unified = load_unified(modules)
        self._full = self._unified.component_type.FULL
        self._node_cls = modules.attr(_CORE, "UnifiedTreeNode")
        self._next_id = 0
        self._depth = 0
        self._receipts: dict[int, list[Any]] = {}
        """Node -> receipts of its open locks (SGLang's own calls included), newest last."""
        self._slot_token: dict[int, tuple[int, str | None]] = {}
        init = modules.attr(_PARAMS, "CacheInitParams")(
            tree_components=self._unified.components(components),
            tree_core_backend=tree_core,
            **params,
        )
        with self._call():
            self.impl = self._unified.cache_module.UnifiedRadixCache(init)
        self._after_reset()
        chosen = type(self.impl.tree_core).__name__
        if ("Rust" in chosen) != (tree_core == "rust"):
            raise ConfigError(f"asked for the {tree_core} tree core, SGLang built {chosen}")
        self.impl.insert = self._recording(self.impl.insert)
        for name in _MINTING:
            setattr(self.impl, name, self._counting(getattr(self.impl, name)))
        self.impl.inc_lock_ref = self._keeping(self.impl.inc_lock_ref)
        self.impl.dec_lock_ref = self._dropping(self.impl.dec_lock_ref)

    def _after_reset(self) -> None:
        """Numbering restarts: the next node minted is kvpool's 1; receipts are gone."""
        self._first_id = self._next_id
        self._root_id = int(self.impl.tree_core.root_node_handle())
        self._receipts.clear()

    # ------------------------------------------------------------------ the node counter
    @contextlib.contextmanager
    def _call(self) -> Iterator[None]:
        """One SGLang call with this cache's node counter (re-entrant)."""
        self._depth += 1
        if self._depth == 1:
            self._node_cls.counter = self._next_id
        try:
            yield
        finally:
            self._depth -= 1
            if self._depth == 0:
                self._next_id = self._node_cls.counter

    def _counting(self, method: Any) -> Any:
        """SGLang's bound ``method`` run inside :meth:`_call`."""

        def call(*args: Any, **kwargs: Any) -> Any:
            with self._call():
                return method(*args, **kwargs)

        return call

    def _recording(self, method: Any) -> Any:
        """SGLang's bound ``insert`` recording the token each inserted slot stands for."""

        def call(params: Any) -> Any:
            value = params.value
            if value is not None:
                extra = params.key.extra_key
                # bigram codes under EAGLE (a key the tree has not viewed so yet included)
                tokens = key_codes(params.key, bool(self.impl.tree_core.is_eagle))
                for slot, token in zip(value.tolist(), tokens, strict=False):
                    self._slot_token[int(slot)] = (int(token), extra)
            return method(params)

        return call

    def slot_token(self, slot: int) -> tuple[int, str | None]:
        """The token (and namespace) slot ``slot`` was last inserted with; ``(-1, None)``
        for a slot never inserted."""
        return self._slot_token.get(int(slot), (-1, None))

    # ------------------------------------------------------------------ receipts
    def _keeping(self, method: Any) -> Any:
        """SGLang's bound ``inc_lock_ref`` keeping each lock's receipt."""

        def call(node_id: Any, *args: Any, **kwargs: Any) -> Any:
            result = method(node_id, *args, **kwargs)
            self._receipts.setdefault(int(node_id), []).append(result.to_dec_params())
            return result

        return call

    def _dropping(self, method: Any) -> Any:
        """SGLang's bound ``dec_lock_ref`` dropping the receipt it hands back."""

        def call(node_id: Any, params: Any, *args: Any, **kwargs: Any) -> Any:
            result = method(node_id, params, *args, **kwargs)
            held = self._receipts.get(int(node_id))
            if held:
                found = next((i for i, r in enumerate(held) if r is params), len(held) - 1)
                held.pop(found)
            return result

        return call

    def newest_receipt(self, node: Any) -> Any:
        """The receipt of ``node``'s newest open lock (an empty one if it has none, as a caller
        that lost it would pass)."""
        held = self._receipts.get(int(node))
        return held[-1] if held else self.modules.attr(BASE, "DecLockRefParams")()

    def open_locks(self, node: Any) -> int:
        """How many locks of ``node`` are open (receipts kept)."""
        return len(self._receipts.get(int(node), ()))

    # ------------------------------------------------------------------ numbering
    def snapshot_id(self, raw: int) -> int:
        """kvpool's number of SGLang's node ``raw`` (see the module docstring)."""
        if raw == self._root_id:
            return 0
        if self.tree_core == "python":
            return raw - self._first_id + 1
        return raw - self._root_id

    def raw_id(self, node_id: int) -> int:
        """SGLang's id of the node kvpool numbers ``node_id`` (the inverse of
        :meth:`snapshot_id`)."""
        if node_id == 0:
            return self._root_id
        if self.tree_core == "python":
            return node_id + self._first_id - 1
        return node_id + self._root_id

    def node_ref(self, node: Any) -> UnifiedNodeRef:
        """``node`` (a ``NodeId``) as a :class:`UnifiedNodeRef` of this cache."""
        return node if isinstance(node, UnifiedNodeRef) else UnifiedNodeRef(int(node), self)

    # ------------------------------------------------------------------ reading the tree
    def pretty_print(self) -> str:
        """What SGLang's ``pretty_print`` prints (the Rust core prints from Rust)."""
        return capture_fd1(self.impl.pretty_print)

    def python_nodes(self) -> list[tuple[Any, list[Any]]]:
        """The Python core's tree: ``(node, children in id order)``, breadth-first."""
        out: list[tuple[Any, list[Any]]] = []
        queue = [self.impl.tree_core.root_node]
        while queue:
            node = queue.pop(0)
            children = sorted(node.children.values(), key=lambda n: int(n.id))
            queue.extend(children)
            out.append((node, children))
        return out

    def rust_nodes(self) -> list[RustNode]:
        """The Rust core's tree, breadth-first from the root, children in id order."""
        lines = [m for m in map(_LINE.match, self.pretty_print().splitlines()) if m]
        if not lines:
            return []
        core = self.impl.tree_core
        root = int(lines[0].group(2))
        locks = {int(m.group(2)): int(m.group(4)) for m in lines}
        parent: dict[int, int | None] = {root: None}
        for path in core.collect_path_info(list(locks)):
            for info in path:
                parent[int(info.node_id)] = int(info.parent_id)
        children: dict[int, list[int]] = {i: [] for i in locks}
        for node_id in locks:
            up = parent.get(node_id)
            if up is not None:
                children[up].append(node_id)
        out: list[RustNode] = []
        order = [root]
        while order:
            node_id = order.pop(0)
            kids = tuple(sorted(children[node_id]))
            order.extend(kids)
            got = core.get_component_device_value(node_id, self._full)
            value = () if got is None else tuple(int(v) for v in got.tolist())
            out.append(RustNode(node_id, parent.get(node_id), locks[node_id], kids, value))
        return out


__all__ = ["BASE", "RustNode", "UnifiedNodeRef", "UnifiedTreeBase", "capture_fd1"]
