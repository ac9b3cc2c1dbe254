"""The controller and host pool group SGLang 0.5.23's ``UnifiedRadixCache`` is given by
:class:`~kvpool.sglang.unified_hicache.SGLangUnifiedHiCache` (its module docstring says what is
SGLang's and what is kvpool's): kvpool's twin controller with SGLang 0.5.23's call shapes, its
acknowledgements, and the one-pool host group of a FULL-only stack. The storage calls are
:mod:`kvpool.sglang.unified_storage`'s subclass."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

from kvpool.optimized.hicache.cache_controller import HiCacheAck, HiCacheController, _merge
from kvpool.sglang.allocators import as_index_tensor
from kvpool.sglang.hiradix import _TaggedHostPool


class Event:
    """A CUDA event stand-in: done once the harness or SGLang's ``synchronize`` finishes it."""

    def __init__(self, finish: Callable[[], None]) -> None:
        self.done = False
        self._finish = finish

    def query(self) -> bool:
        return self.done

    def synchronize(self) -> None:
        if not self.done:
            self.done = True
            self._finish()


class Ack:
    """SGLang's ``HiCacheAck`` shape around kvpool's acknowledgement."""

    def __init__(self, ack: HiCacheAck, controller: HiCacheController) -> None:
        self.ack = ack
        self.node_ids = ack.node_ids
        self.num_tokens = int(ack.device_indices.numel())
        self.num_tokens_by_pool: dict[str, int] | None = None
        self.num_bytes = 0
        self.timing_enabled = False
        self.start_event = Event(lambda: None)
        self.finish_event = Event(lambda: controller.complete(ack))


class _Entry:
    """The anchor entry fields the cache reads (no shared allocation domain, no evict hook)."""

    def __init__(self, host_pool: Any) -> None:
        self.host_pool = host_pool
        self.host_evict_fn = None


class HostGroup:
    """The host pool group of a FULL-only stack: one KV host pool."""

    def __init__(self, pool: _TaggedHostPool) -> None:
        self.pool = pool
        self.anchor_entry = _Entry(pool)
        self.anchor_entry.host_pool.shared_allocation_domain = None

    def alloc(self, need_size: int, **_: Any) -> torch.Tensor | None:
        return self.pool.alloc(need_size)

    def free(self, indices: Any, *, pool: Any = None) -> int:
        return self.pool.free(indices)

    def available_size(self, pool: Any = None) -> int:
        return self.pool.available_size()

    def get_pool(self, name: Any) -> Any:
        return self.pool

    def clear(self) -> None:
        self.pool.clear()

    def __getattr__(self, name: str) -> Any:
        """The rest (tags, the content copies, ``device_pool``) is the pool's."""
        return getattr(self.pool, name)


class UnifiedController(HiCacheController):
    """kvpool's twin controller with SGLang 0.5.23's controller calls (see the module
    docstring); ``d2h`` maps each device slot to the host slot its last write or load paired
    it with (the Rust core's backups are read through it)."""

    def __init__(self, allocator: Any, host: HostGroup, page_size: int, policy: str) -> None:
        super().__init__(allocator, host, page_size, policy)
        self.enable_storage = False
        self.pp_prefetch_command_group = None
        self.host_write_staged_tokens_fn = None
        self.d2h: dict[int, int] = {}
        self.host_token: dict[int, tuple[int, str | None]] = {}
        self.token_of: Callable[[int], tuple[int, str | None]] = lambda slot: (-1, None)
        self.loaded_token: Callable[[int, tuple[int, str | None]], None] = lambda s, t: None

    def reset(self) -> None:
        super().reset()
        self.d2h = {}
        self.d2h_log: list[int] = []
        """Device slots in write order (an insert tells its own writes from adoptions)."""

    def write(  # type: ignore[override]
        self, device_indices: Any, priority: Any = None, node_id: int = -1,
        extra_pools: Any = None, flush: bool = True, **_: Any,
    ) -> torch.Tensor | None:  # fmt: skip
        device = as_index_tensor(device_indices)
        host: torch.Tensor | None = self.mem_pool_host.alloc(int(device.numel()))
        if host is None:
            return None
        self.write_queue.append(HiCacheAck("write", [int(node_id)], host, device))
        for d, h in zip(device.tolist(), host.tolist(), strict=True):
            self.d2h[d] = h
            self.d2h_log.append(d)
            self.host_token[h] = self.token_of(d)
        if flush:
            self.start_writing()
        return host

    def start_writing(self) -> None:
        if self.write_queue:
            self.ack_write_queue.append(Ack(_merge("write", self.write_queue), self))  # type: ignore[arg-type]
            self.write_queue = []

    def load(  # type: ignore[override]
        self, host_indices: Any, priority: Any = None, node_id: int = -1,
        extra_pools: Any = None, **_: Any,
    ) -> torch.Tensor | None:  # fmt: skip
        got = super().load(as_index_tensor(host_indices), int(node_id))
        if got is not None:
            for d, h in zip(got.tolist(), as_index_tensor(host_indices).tolist(), strict=True):
                self.d2h[d] = h
                self.loaded_token(d, self.host_token.get(h, (-1, None)))
        return got

    def start_loading(self) -> int:
        producer = super().start_loading()
        if producer >= 0:
            self.ack_load_queue[-1] = Ack(self.ack_load_queue[-1], self)  # type: ignore[call-overload]
        return producer

    def transfers(self) -> list[HiCacheAck]:
        """The transfers holding slots: writes in flight and queued, loads in flight and
        queued (kvpool's order: acknowledged writes, queued writes, loads, queued loads)."""
        acks = self.ack_write_queue + self.write_queue + self.ack_load_queue
        return [getattr(a, "ack", a) for a in acks] + list(self.load_queue)


__all__ = ["Ack", "Event", "HostGroup", "UnifiedController"]
