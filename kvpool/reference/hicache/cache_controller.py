"""``HiCacheController``: the transfers between the device KV pool and the host pool, and their
acknowledgements (SGLang 0.5.16's ``HiCacheController``, without threads or streams).

Units: device indices are device token slots, host indices host slots; both page multiples.

- ``write(device_indices, node_id)`` reserves host slots (None when the host pool is full,
  nothing changed) and issues the copy at once: one :class:`HiCacheAck` joins
  ``ack_write_queue``. With ``flush=False`` (SGLang 0.5.23) the copy waits in ``write_queue``
  until ``start_writing`` merges every queued write into one acknowledgement. The copy itself
  (the device tags into the host pool) happens when the acknowledgement is delivered
  (:meth:`complete`): until then the transfer is in flight.
- ``load(host_indices, node_id)`` reserves device slots (None when the allocator is full) and
  queues the copy in ``load_queue``; ``start_loading`` merges the queue into one acknowledgement
  on ``ack_load_queue`` (SGLang issues it before the forward pass); delivery copies the host
  tags into the device slots.
- Acknowledgements are delivered in queue order by the cache (``writing_check`` /
  ``loading_check``); the harness decides how many have finished.
- Prefetches from storage: :class:`PrefetchOperation` s in ``prefetch_buffer`` are the transfers
  the I/O worker runs; ``prefetch_io`` moves one forward (the harness drives it). A worker that
  finds its operation terminated, or finishes it, releases the host slots it did not fill
  through ``append_host_mem_release``. ``host_mem_release_queue`` holds host slots queued for
  release, one page per entry; ``drain_release`` frees them.
- ``acks_at_drain`` (SGLang 0.5.23): the worker reads a transfer in one batch (SGLang's batches
  are 128 pages; a prefetch here is a few pages), checking the termination once, before it
  starts; what it read is not counted at once but acknowledged on ``ack_prefetch_queue`` (the
  batch's tokens, then the end), which the cache applies when it drains its queues.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

from kvpool.errors import DoubleFreeError, InvalidArgumentError
from kvpool.host_checks import as_bool, as_count, as_int, as_str, count_list, int_list
from kvpool.protocols.hicache import HostPoolProtocol
from kvpool.protocols.pools import SegmentAllocatorProtocol
from kvpool.reference.hicache.args import check_device_slots, check_host_slots, check_instance
from kvpool.snapshot import HostTransferSnapshot


@dataclass(eq=False)
class HiCacheAck:
    """A transfer in flight: ``kind`` ``"write"`` (device -> host) or ``"load"`` (host ->
    device), slot for slot, for the nodes ``node_ids`` (the ids the acknowledgement carries)."""

    kind: str
    node_ids: list[int]
    host_indices: list[int]
    device_indices: list[int]
    issued: bool = False
    """Set once the transfer is issued (merged from its queue into the queue of transfers in
    flight); only an issued transfer can complete."""

    def snapshot(self) -> HostTransferSnapshot:
        return HostTransferSnapshot(self.kind, tuple(self.node_ids), tuple(self.host_indices),
                                    tuple(self.device_indices))  # fmt: skip


@dataclass(eq=False)
class PrefetchOperation:
    """A prefetch of ``len(tags)`` tokens from storage. ``tags``: the content storage holds for
    them. ``host_indices`` is None until the storage hit is known and host slots are reserved
    for ``storage_hit_count`` tokens; ``completed_tokens`` grows as the worker fetches pages."""

    request_id: str
    tags: list[int]
    host_indices: list[int] | None = None
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
    """The transfer queues between ``token_to_kv_pool_allocator``'s device slots (content in
    ``mem_pool_host.device_pool``) and ``mem_pool_host`` (see the module docstring)."""

    def __init__(
        self,
        token_to_kv_pool_allocator: SegmentAllocatorProtocol[list[int]],
        mem_pool_host: HostPoolProtocol[list[int]],
        page_size: int,
        write_policy: str = "write_through",
    ) -> None:
        self.mem_pool_device_allocator = token_to_kv_pool_allocator
        self.mem_pool_host = mem_pool_host
        self.mem_pool_device = mem_pool_host.device_pool
        self.page_size = page_size
        self.write_policy = write_policy
        self.segment_frees = False
        self.acks_at_drain = False
        """SGLang 0.5.23's prefetch worker (see the module docstring)."""
        self.reset()

    def reset(self) -> None:
        """Forget every queue (frees nothing)."""
        self.write_queue: list[HiCacheAck] = []
        self.load_queue: list[HiCacheAck] = []
        self.ack_write_queue: list[HiCacheAck] = []
        self.ack_load_queue: list[HiCacheAck] = []
        self.prefetch_buffer: list[PrefetchOperation] = []
        self.ack_prefetch_queue: list[tuple[PrefetchOperation, int | None]] = []
        """``acks_at_drain``: ``(operation, tokens read)`` per batch, ``(operation, None)`` at its
        end, in the order the worker sent them."""
        self.host_mem_release_queue: list[list[int]] = []
        self.producer_count = 0

    # ----------------------------------------------------------------- device <-> host
    def write(
        self, device_indices: Sequence[int], node_id: int = -1, *, flush: bool = True
    ) -> list[int] | None:
        """Reserve host slots for ``device_indices`` and queue the copy, issued at once unless
        ``flush`` is False; None when the host pool cannot hold them (nothing changed).
        Checked first: device slots inside the pool, held, each once
        (:func:`~kvpool.reference.hicache.args.check_device_slots`), ``node_id`` an integer,
        ``flush`` a bool."""
        device = int_list("device_indices", device_indices)
        node_id = as_int("node_id", node_id)
        flush = as_bool("flush", flush)
        check_device_slots("device_indices", device, self.mem_pool_device_allocator)
        host_indices = self.mem_pool_host.alloc(len(device))
        if host_indices is None:
            return None
        host: list[int] = list(host_indices)
        self.write_queue.append(HiCacheAck("write", [node_id], host, device))
        if flush:
            self.start_writing()
        return host

    def start_writing(self) -> None:
        """Merge the queued writes into one transfer in flight."""
        if not self.write_queue:
            return
        self.ack_write_queue.append(_merge("write", self.write_queue))
        self.write_queue = []

    def load(self, host_indices: Sequence[int], node_id: int = -1) -> list[int] | None:
        """Reserve device slots for ``host_indices`` and queue the copy; None when the device
        allocator cannot hand them out (nothing changed). Checked first: host slots inside the
        host pool, held, each once (:func:`~kvpool.reference.hicache.args.check_host_slots`),
        ``node_id`` an integer."""
        host = int_list("host_indices", host_indices)
        node_id = as_int("node_id", node_id)
        check_host_slots("host_indices", host, self.mem_pool_host)
        device_indices = self.mem_pool_device_allocator.alloc(len(host))
        if device_indices is None:
            return None
        self.load_queue.append(HiCacheAck("load", [node_id], host, device_indices))
        return list(device_indices)

    def start_loading(self) -> int:
        """Merge the queued loads into one transfer in flight; returns its producer index (-1
        when nothing was queued)."""
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

    def evict_device(self, device_indices: Sequence[int]) -> int:
        """Free device slots (``free``, or ``free_segment`` when the cache sets
        ``segment_frees``: SGLang 0.5.23's tree frees); returns how many. The allocator checks
        the slots (held, each once) before any change."""
        slots = int_list("device_indices", device_indices)
        if self.segment_frees:
            self.mem_pool_device_allocator.free_segment(slots, 0)
        else:
            self.mem_pool_device_allocator.free(slots)
        return len(slots)

    def evict_host(self, host_indices: Sequence[int]) -> int:
        """Free host slots; returns how many (the host pool checks them first)."""
        return int(self.mem_pool_host.free(int_list("host_indices", host_indices)))

    # ----------------------------------------------------------------- storage
    def prefetch(self, request_id: str, tags: list[int]) -> PrefetchOperation:
        """A new prefetch operation for tokens whose stored content is ``tags`` (tags are
        ``>= 0``; InvalidArgumentError otherwise, or for a ``request_id`` that is not a str)."""
        return PrefetchOperation(as_str("request_id", request_id), count_list("tags", tags))

    def terminate_prefetch(self, operation: PrefetchOperation) -> int:
        """Stop ``operation``; returns the tokens fetched by then."""
        check_instance("operation", operation, PrefetchOperation)
        operation.mark_terminate()
        return operation.completed_tokens

    def append_host_mem_release(self, host_indices: Sequence[int]) -> None:
        """Queue host slots for release, one page per entry. Checked first: held host slots,
        each once, none queued already (DoubleFreeError: the drain would free it twice)."""
        ps = self.page_size
        slots = int_list("host_indices", host_indices)
        check_host_slots("host_indices", slots, self.mem_pool_host)
        queued = {s for page in self.host_mem_release_queue for s in page}
        again = [s for s in slots if s in queued]
        if again:
            raise DoubleFreeError("host_indices: host slots already queued for release", again)
        for k in range(0, len(slots), ps):
            self.host_mem_release_queue.append(slots[k : k + ps])

    def drain_release(self) -> int:
        """Free every queued host slot (one free); returns how many. The queue is emptied only
        once the free went through."""
        slots = [s for page in self.host_mem_release_queue for s in page]
        freed = int(self.mem_pool_host.free(slots)) if slots else 0
        self.host_mem_release_queue = []
        return freed

    def prefetch_io(self, request_id: str, num_pages: int) -> int:
        """The worker of ``request_id``'s transfer fetches up to ``num_pages`` more pages (their
        stored tags land in the host slots); a terminated or finished transfer ends and its
        unfilled host slots are queued for release. Returns the tokens fetched by this call
        (0 for a request with no transfer running). Under ``acks_at_drain`` a call with
        ``num_pages > 0`` runs the whole transfer instead (:meth:`_read_whole`)."""
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
            for h, tag in zip(slots, op.tags[start : start + got], strict=True):
                self.mem_pool_host.tags[int(h)] = tag
            op.increment(got)
        if op.terminated or op.completed_tokens >= op.storage_hit_count:
            self.prefetch_buffer = [o for o in self.prefetch_buffer if o is not op]
            self.append_host_mem_release(op.host_indices[op.completed_tokens :])
        return got

    def _read_whole(self, op: PrefetchOperation) -> int:
        """``acks_at_drain``: the worker reads ``op`` in one batch (nothing once terminated),
        the tags landing in its host slots, and acknowledges the batch, then the end; returns
        the tokens read."""
        assert op.host_indices is not None
        got = 0 if op.terminated else op.storage_hit_count
        for h, tag in zip(op.host_indices[:got], op.tags[:got], strict=True):
            self.mem_pool_host.tags[int(h)] = tag
        self.prefetch_buffer = [o for o in self.prefetch_buffer if o is not op]
        self.ack_prefetch_queue += [(op, got), (op, None)]
        return got

    def worker_held(self) -> list[int]:
        """Host slots the running transfers reserved and have not filled (theirs to release);
        under ``acks_at_drain`` also those of transfers whose end is not acknowledged yet (the
        acknowledgement releases them)."""
        out: list[int] = []
        ended = [op for op, tokens in self.ack_prefetch_queue if tokens is None]
        for op in self.prefetch_buffer + ended:
            if op.host_indices is not None:
                out.extend(op.host_indices[op.completed_tokens :])
        return out


def _merge(kind: str, ops: list[HiCacheAck]) -> HiCacheAck:
    """One transfer covering ``ops`` in order (node ids concatenated), issued."""
    if len(ops) == 1:
        ops[0].issued = True
        return ops[0]
    return HiCacheAck(kind, [i for op in ops for i in op.node_ids],
                      [h for op in ops for h in op.host_indices],
                      [d for op in ops for d in op.device_indices], True)  # fmt: skip


__all__ = ["HiCacheAck", "HiCacheController", "PrefetchOperation"]
