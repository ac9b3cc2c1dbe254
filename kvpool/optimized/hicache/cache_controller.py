"""The optimized twin's ``HiCacheController``: the same queues as
:mod:`kvpool.reference.hicache.cache_controller` (see its docstring), holding int64 index tensors;
merged transfers and drained releases are one ``torch.cat`` each.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

from kvpool.errors import DoubleFreeError, InvalidArgumentError
from kvpool.host_checks import as_bool, as_count, as_int, as_str
from kvpool.optimized.hicache.args import device_slot_arg, host_slot_arg
from kvpool.optimized.index_args import index_tensor
from kvpool.protocols.hicache import HostPoolProtocol
from kvpool.protocols.pools import SegmentAllocatorProtocol
from kvpool.reference.hicache.args import check_instance
from kvpool.snapshot import HostTransferSnapshot

_EMPTY = torch.empty(0, dtype=torch.int64)


@dataclass(eq=False)
class HiCacheAck:
    """A transfer in flight (``"write"``: device -> host, ``"load"``: host -> device), slot for
    slot, for the nodes ``node_ids``."""

    kind: str
    node_ids: list[int]
    host_indices: torch.Tensor
    device_indices: torch.Tensor
    issued: bool = False
    """Set once the transfer is issued (merged from its queue into the queue of transfers in
    flight); only an issued transfer can complete."""

    def snapshot(self) -> HostTransferSnapshot:
        return HostTransferSnapshot(self.kind, tuple(self.node_ids),
                                    tuple(self.host_indices.tolist()),
                                    tuple(self.device_indices.tolist()))  # fmt: skip


@dataclass(eq=False)
class PrefetchOperation:
    """A prefetch from storage (see the reference): ``tags`` the stored content, ``host_indices``
    None until the hit is known."""

    request_id: str
    tags: torch.Tensor
    host_indices: torch.Tensor | None = None
    storage_hit_count: int = 0
    completed_tokens: int = 0
    terminated: bool = False
    extra: dict[str, object] = field(default_factory=dict)

    def increment(self, num_tokens: int) -> bool:
        """Count fetched tokens unless terminated; returns whether they were counted.
        InvalidArgumentError (nothing counted) unless ``num_tokens`` is a count."""
        num_tokens = as_count("num_tokens", num_tokens)
        if self.terminated:
            return False
        self.completed_tokens += num_tokens
        return True

    def mark_terminate(self) -> None:
        self.terminated = True


class HiCacheController:
    """The transfer queues between the device allocator's slots and ``mem_pool_host``."""

    def __init__(
        self,
        token_to_kv_pool_allocator: SegmentAllocatorProtocol[torch.Tensor],
        mem_pool_host: HostPoolProtocol[torch.Tensor],
        page_size: int,
        write_policy: str = "write_through",
    ) -> None:
        self.mem_pool_device_allocator = token_to_kv_pool_allocator
        self.mem_pool_host = mem_pool_host
        self.mem_pool_device = mem_pool_host.device_pool
        self.page_size = page_size
        self.write_policy = write_policy
        self.device = torch.device(getattr(token_to_kv_pool_allocator, "device", "cpu"))
        # device-slot ownership is a device read: checked as the allocator is, unless the tree
        # that owns this controller sets its own mode
        self.checked = bool(getattr(token_to_kv_pool_allocator, "checked", True))
        self.segment_frees = False
        self.acks_at_drain = False
        """SGLang 0.5.23's prefetch worker (see the reference)."""
        self.reset()

    def reset(self) -> None:
        """Forget every queue (frees nothing)."""
        self.write_queue: list[HiCacheAck] = []
        self.load_queue: list[HiCacheAck] = []
        self.ack_write_queue: list[HiCacheAck] = []
        self.ack_load_queue: list[HiCacheAck] = []
        self.prefetch_buffer: list[PrefetchOperation] = []
        self.ack_prefetch_queue: list[tuple[PrefetchOperation, int | None]] = []
        self.host_mem_release_queue: list[torch.Tensor] = []
        self.producer_count = 0

    def write(
        self, device_indices: torch.Tensor, node_id: int = -1, *, flush: bool = True
    ) -> torch.Tensor | None:
        """Reserve host slots for ``device_indices`` and queue the copy, issued at once unless
        ``flush`` is False; None when the host pool cannot hold them (nothing changed). Checked
        first as the reference (the slots' ownership in checked mode)."""
        node_id = as_int("node_id", node_id)
        flush = as_bool("flush", flush)
        device_indices = device_slot_arg("device_indices", device_indices,
                                         self.mem_pool_device_allocator, self.device,
                                         self.checked)  # fmt: skip
        host_indices: torch.Tensor | None = self.mem_pool_host.alloc(int(device_indices.numel()))
        if host_indices is None:
            return None
        self.write_queue.append(HiCacheAck("write", [node_id], host_indices, device_indices))
        if flush:
            self.start_writing()
        return host_indices

    def start_writing(self) -> None:
        """Merge the queued writes into one transfer in flight."""
        if not self.write_queue:
            return
        self.ack_write_queue.append(_merge("write", self.write_queue))
        self.write_queue = []

    def load(self, host_indices: torch.Tensor, node_id: int = -1) -> torch.Tensor | None:
        """Reserve device slots for ``host_indices`` and queue the copy; None when the device
        allocator cannot hand them out (nothing changed). Checked first as the reference (host
        slots: host memory, both modes)."""
        node_id = as_int("node_id", node_id)
        host_indices = host_slot_arg("host_indices", host_indices, self.mem_pool_host)
        got = self.mem_pool_device_allocator.alloc(int(host_indices.numel()))
        if got is None:
            return None
        device_indices: torch.Tensor = got.to(torch.int64)
        self.load_queue.append(HiCacheAck("load", [node_id], host_indices, device_indices))
        return device_indices

    def start_loading(self) -> int:
        """Merge the queued loads into one transfer in flight; its producer index (-1: none)."""
        if not self.load_queue:
            return -1
        self.ack_load_queue.append(_merge("load", self.load_queue))
        self.load_queue = []
        self.producer_count += 1
        return self.producer_count - 1

    def complete(self, ack: HiCacheAck) -> None:
        """The transfer has finished: copy the content in its direction (again, if called
        again: the forward may wait for a load before its acknowledgement is delivered).
        InvalidArgumentError (nothing copied) unless ``ack`` is an issued transfer
        (``start_writing`` / ``start_loading``), not one still queued or built by the caller."""
        check_instance("ack", ack, HiCacheAck)
        if not ack.issued:
            raise InvalidArgumentError(f"ack {ack.snapshot()} was never issued")
        host, device = self.mem_pool_host, self.mem_pool_device
        if ack.kind == "write":
            host.backup_from_device_all_layer(device, ack.host_indices, ack.device_indices)
        else:
            host.load_to_device_all_layer(device, ack.host_indices, ack.device_indices)

    def evict_device(self, device_indices: torch.Tensor) -> int:
        """Free device slots (``free_segment`` when ``segment_frees``); returns how many. Slots
        given as host values (a list) are range-checked here; the allocator checks the rest."""
        device_indices = device_slot_arg("device_indices", device_indices,
                                         self.mem_pool_device_allocator, self.device,
                                         False)  # fmt: skip
        if self.segment_frees:
            self.mem_pool_device_allocator.free_segment(device_indices, 0)
        else:
            self.mem_pool_device_allocator.free(device_indices)
        return int(device_indices.numel())

    def evict_host(self, host_indices: torch.Tensor) -> int:
        """Free host slots; returns how many (the host pool checks them first)."""
        return int(self.mem_pool_host.free(index_tensor("host_indices", host_indices, "cpu")))

    def prefetch(self, request_id: str, tags: torch.Tensor) -> PrefetchOperation:
        """A new prefetch operation for tokens whose stored content is ``tags`` (``>= 0``;
        checked as the reference, on host values)."""
        request_id = as_str("request_id", request_id)
        tags = index_tensor("tags", tags, "cpu")
        if tags.numel() and int(tags.min()) < 0:
            raise InvalidArgumentError(f"tags must hold values >= 0, got {tags.tolist()}")
        return PrefetchOperation(request_id, tags)

    def terminate_prefetch(self, operation: PrefetchOperation) -> int:
        """Stop ``operation``; returns the tokens fetched by then."""
        check_instance("operation", operation, PrefetchOperation)
        operation.mark_terminate()
        return operation.completed_tokens

    def append_host_mem_release(self, host_indices: torch.Tensor) -> None:
        """Queue host slots for release, one page per entry; checked first as the reference
        (held host slots, each once, none queued already)."""
        host_indices = host_slot_arg("host_indices", host_indices, self.mem_pool_host)
        if self.host_mem_release_queue and host_indices.numel():
            queued = set(torch.cat(self.host_mem_release_queue).tolist())
            again = [h for h in host_indices.tolist() if h in queued]
            if again:
                raise DoubleFreeError("host_indices: host slots already queued for release", again)
        if host_indices.numel():
            ps = self.page_size
            pages = [host_indices[k : k + ps] for k in range(0, int(host_indices.numel()), ps)]
            self.host_mem_release_queue.extend(pages)

    def drain_release(self) -> int:
        """Free every queued host slot (one free); returns how many."""
        if not self.host_mem_release_queue:
            return 0
        slots = torch.cat(self.host_mem_release_queue)
        freed = int(self.mem_pool_host.free(slots))  # the queue empties once the free went through
        self.host_mem_release_queue = []
        return freed

    def prefetch_io(self, request_id: str, num_pages: int) -> int:
        """The worker of ``request_id``'s transfer fetches up to ``num_pages`` more pages; a
        terminated or finished transfer ends, queueing its unfilled host slots for release.
        Returns the tokens fetched by this call (0: no transfer running for the request).
        Under ``acks_at_drain`` a call with ``num_pages > 0`` runs the whole transfer."""
        request_id = as_str("request_id", request_id)
        num_pages = as_count("num_pages", num_pages)
        op = next((o for o in self.prefetch_buffer if o.request_id == request_id), None)
        if op is None or op.host_indices is None:
            return 0
        if self.acks_at_drain:
            return self._read_whole(op) if num_pages else 0
        start = op.completed_tokens
        got = 0
        if not op.terminated:
            got = min(num_pages * self.page_size, op.storage_hit_count - start)
            slots = op.host_indices[start : start + got]
            self.mem_pool_host.tags[slots] = op.tags[start : start + got]
            op.increment(got)
        if op.terminated or op.completed_tokens >= op.storage_hit_count:
            self.prefetch_buffer = [o for o in self.prefetch_buffer if o is not op]
            self.append_host_mem_release(op.host_indices[op.completed_tokens :])
        return got

    def _read_whole(self, op: PrefetchOperation) -> int:
        """``acks_at_drain``: the whole transfer in one batch, acknowledged (see the
        reference)."""
        assert op.host_indices is not None
        got = 0 if op.terminated else op.storage_hit_count
        self.mem_pool_host.tags[op.host_indices[:got]] = op.tags[:got]
        self.prefetch_buffer = [o for o in self.prefetch_buffer if o is not op]
        self.ack_prefetch_queue += [(op, got), (op, None)]
        return got

    def worker_held(self) -> list[int]:
        """Host slots the running transfers reserved and have not filled (theirs to release);
        under ``acks_at_drain`` also those of transfers whose end is not acknowledged yet."""
        ended = [op for op, tokens in self.ack_prefetch_queue if tokens is None]
        parts = [op.host_indices[op.completed_tokens :] for op in self.prefetch_buffer + ended
                 if op.host_indices is not None]  # fmt: skip
        return torch.cat(parts).tolist() if parts else []


def _merge(kind: str, ops: list[HiCacheAck]) -> HiCacheAck:
    """One transfer covering ``ops`` in order (node ids concatenated), issued."""
    if len(ops) == 1:
        ops[0].issued = True
        return ops[0]
    return HiCacheAck(kind, [i for op in ops for i in op.node_ids],
                      torch.cat([op.host_indices for op in ops]),
                      torch.cat([op.device_indices for op in ops]), True)  # fmt: skip


__all__ = ["HiCacheAck", "HiCacheController", "PrefetchOperation"]
