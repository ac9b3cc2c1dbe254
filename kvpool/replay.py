"""Trace replay: a real workload through both implementations in lockstep (``kvpool replay``).

The driver is a small FCFS scheduler over :class:`kvpool.protocols.MemoryManagerProtocol`:
requests arrive in trace order; while fewer than ``concurrency`` run, the next one is admitted
(``new_req``, ``match_prefix``, then ``extend``, in chunks of ``chunk_size`` tokens if set);
every running request then decodes one token per step until it has produced
``min(output_length, max_output)`` tokens, and finished requests leave in one batch (inserted
into the radix tree). An admission or decode that runs out of memory aborts the youngest request
and sends it back to the head of the queue; a request that cannot fit even in an idle pool is
rejected (skipped: it counts as a miss in the hit ratio). By default every call runs through
:class:`kvpool.testing.lockstep_driver.Lockstep`, so the two implementations are compared at
every step and every invariant is checked (every ``check_every`` steps when asked, for long
prompts). With no second factory (``kvpool replay --twin-only``) only one implementation runs,
through :class:`SoloStepper`: every invariant is still checked on its snapshot every
``check_every`` steps, but nothing compares it with the reference (capacity planning at real
sizes).

Prompts come from :mod:`kvpool.traces` (block ids turned into tokens, each request's when it is
admitted: a replay holds the tokens of its running requests only). ``block_tokens`` below 512
keeps the first ``block_tokens`` tokens of every 512-token block: the same sharing structure at
a smaller scale, for quick runs on small pools. Decoded tokens lie below
:data:`~kvpool.traces.OUTPUT_TOKEN_LIMIT`, where no prompt token does.

Reported (for implementation A): prefix-cache hit ratio (prompt tokens found in the cache when
each request was admitted, over ALL prompt tokens of the replayed requests: a request the pool
cannot hold counts as a miss), tokens evicted from the tree, peak pages in use (held by requests
or cached).
"""

from __future__ import annotations

import gc
import time
from collections import deque
from collections.abc import Callable
from dataclasses import asdict, dataclass
from typing import Any

from kvpool.config import PoolConfig
from kvpool.constants import ceil_align
from kvpool.errors import OutOfMemoryError
from kvpool.replay_stepper import SoloStepper, Stepper
from kvpool.testing.lockstep_driver import Factory, Lockstep
from kvpool.testing.swarm import Op
from kvpool.traces import BLOCK_SIZE, OUTPUT_TOKEN_LIMIT, TraceRecord, blocks_token_array

GC_EVERY_STEPS = 1024
"""Decode steps between two cyclic garbage collections during a replay (the collector is
paused otherwise; evicted tree nodes are cycles and must not pile up over a long trace)."""


@dataclass(frozen=True)
class ReplaySettings:
    """Pool and scheduler knobs (tokens, pages, rows)."""

    pool_tokens: int = 65536
    page_size: int = 16
    policy: str = "lru"
    concurrency: int = 4
    max_output: int = 4
    block_tokens: int = BLOCK_SIZE
    chunk_size: int = 0
    check_every: int = 1

    def pool_config(self, max_prompt: int) -> PoolConfig:
        """A pool of ``pool_tokens`` (rounded down to whole pages) and enough rows/columns."""
        size = max(self.pool_tokens // self.page_size, 1) * self.page_size
        return PoolConfig(
            size=size,
            page_size=self.page_size,
            req_pool_size=self.concurrency + 1,
            max_context_len=max_prompt + self.max_output + 1,
            eviction_policy=self.policy,
            num_layers=1,
        )


@dataclass
class ReplayStats:
    """What one replay measured (token counts are tokens, ``peak_pages`` pages)."""

    policy: str
    pool_tokens: int
    page_size: int
    requests: int
    finished: int = 0
    rejected: int = 0
    requeued: int = 0
    prompt_tokens: int = 0
    matched_tokens: int = 0
    evicted_tokens: int = 0
    peak_pages: int = 0
    steps: int = 0
    invariant_checks: int = 0
    seconds: float = 0.0

    @property
    def hit_ratio(self) -> float:
        return self.matched_tokens / self.prompt_tokens if self.prompt_tokens else 0.0

    def to_json(self) -> dict[str, Any]:
        out = asdict(self)
        out["hit_ratio"] = round(self.hit_ratio, 6)
        return out


def scaled_length(record: TraceRecord, block_tokens: int) -> int:
    """Length (tokens) of :func:`scaled_prompt` of ``record``, without synthesising it."""
    if block_tokens >= BLOCK_SIZE:
        return record.input_length
    return max(-(-record.input_length * block_tokens // BLOCK_SIZE), 1)


def scaled_prompt(record: TraceRecord, block_tokens: int) -> list[int]:
    """The record's prompt with every block cut to its first ``block_tokens`` tokens (all of
    them when ``block_tokens >= 512``); equal block ids still give equal tokens, and different
    ids differ from their first token on (:mod:`kvpool.traces`)."""
    full = blocks_token_array(record.hash_ids)
    keep = scaled_length(record, block_tokens)
    if block_tokens >= BLOCK_SIZE:
        tokens: list[int] = full[:keep].tolist()
        return tokens
    cut: list[int] = full.reshape(-1, BLOCK_SIZE)[:, :block_tokens].reshape(-1)[:keep].tolist()
    return cut


@dataclass(frozen=True)
class PreparedRequests:
    """What a replay needs per request, computed once per job and shared by its runs: prompt
    lengths and output lengths (tokens, outputs capped at ``max_output``, at least 1). The
    prompts themselves are synthesised when a request is admitted (:meth:`prompt`) and dropped
    when it finishes, so a replay holds the tokens of its running requests only, not the trace's
    (145 million tokens for the full conversation trace)."""

    records: list[TraceRecord]
    block_tokens: int
    prompt_lengths: list[int]
    outputs: list[int]

    def prompt(self, index: int) -> list[int]:
        """Tokens of request ``index`` (see :func:`scaled_prompt`)."""
        return scaled_prompt(self.records[index], self.block_tokens)


def prepare_requests(records: list[TraceRecord], settings: ReplaySettings) -> PreparedRequests:
    """The :class:`PreparedRequests` of ``records`` under ``settings``."""
    lengths = [scaled_length(r, settings.block_tokens) for r in records]
    outputs = [max(min(r.output_length, settings.max_output), 1) for r in records]
    return PreparedRequests(records, settings.block_tokens, lengths, outputs)


def cache_footprint_tokens(records: list[TraceRecord], block_tokens: int) -> int:
    """Tokens the distinct prompt blocks of ``records`` occupy (each ``block_tokens`` long, at
    most 512): about the pool size above which nothing is ever evicted."""
    return len({b for r in records for b in r.hash_ids}) * min(block_tokens, BLOCK_SIZE)


def replay_pool_sizes(
    records: list[TraceRecord], settings: ReplaySettings, points: int = 4
) -> list[int]:
    """Up to ``points`` pool sizes (tokens, whole pages) for a hit-ratio curve, spaced evenly on
    a log scale from the trace's peak demand to its cache footprint. Peak demand: the smallest
    pool that rejects nothing (the longest request, page-aligned, plus an output page per
    running request). Footprint (:func:`cache_footprint_tokens`): past it nothing is evicted,
    so the policies can no longer differ. One size when the footprint is below the demand."""
    ps = settings.page_size
    prepared = prepare_requests(records, settings)
    pairs = zip(prepared.prompt_lengths, prepared.outputs, strict=True)
    need = max((ceil_align(n + o, ps) for n, o in pairs), default=ps) + settings.concurrency * ps
    top = ceil_align(cache_footprint_tokens(records, settings.block_tokens), ps)
    if top <= need or points < 2:
        return [need]
    ratio = top / need
    sizes = {ceil_align(round(need * ratio ** (k / (points - 1))), ps) for k in range(points)}
    return sorted(min(max(size, need), top) for size in sizes)


class _Driver:
    """One replay: the queue, the running set and the counters."""

    def __init__(
        self,
        pair: Stepper,
        stats: ReplayStats,
        settings: ReplaySettings,
        on_request: Callable[[], None] | None = None,
    ) -> None:
        self.pair, self.stats, self.settings = pair, stats, settings
        self.on_request = on_request or (lambda: None)  # one call per request done or rejected
        self.running: dict[str, int] = {}  # rid -> output tokens still to produce
        self.hold = False  # after a request was sent back: admit nothing until one finishes
        self.matched: dict[int, int] = {}  # request index -> prompt tokens found cached
        alloc = pair.a.token_to_kv_pool_allocator
        self.pages = alloc.size // alloc.page_size
        tree = pair.a.tree_cache
        evict = tree.evict

        def counting_evict(num_tokens: int) -> int:
            freed: int = evict(num_tokens)
            stats.evicted_tokens += freed
            return freed

        tree.evict = counting_evict  # measurement only: A's own eviction, counted

    def call(self, op: Op) -> Any:
        result = self.pair.run(op)
        self.stats.steps += 1
        alloc = self.pair.a.token_to_kv_pool_allocator
        in_use = self.pages - alloc.available_size() // alloc.page_size
        self.stats.peak_pages = max(self.stats.peak_pages, in_use)
        return result

    def room_for(self, tokens: int, outputs: int) -> bool:
        """Admission control: free + evictable tokens cover this request (whole pages) and the
        outputs still to come of every running one (a page each, at worst), so decodes do not
        run out of memory and send requests back in a loop."""
        ps = self.settings.page_size
        tree = self.pair.a.tree_cache
        have: int = self.pair.a.token_to_kv_pool_allocator.available_size()
        have += tree.evictable_size()
        need = ceil_align(tokens + outputs, ps)
        need += sum(ceil_align(left, ps) + ps for left in self.running.values())
        return have >= need

    def admit(self, rid: str, index: int, tokens: list[int], outputs: int) -> bool | None:
        """True: running; False: out of memory (aborted, retry later); None: never fits."""
        self.call(Op("new_req", (rid, tokens)))
        matched = self.call(Op("match_prefix", (rid,)))
        chunk = self.settings.chunk_size or None
        done = int(matched)
        while True:
            out = self.call(Op("extend", ([rid],), (("chunk_sizes", [chunk]),)))
            if isinstance(out, OutOfMemoryError):
                self.call(Op("abort", (rid,)))
                return None if not self.running else False
            done += len(out)
            if done >= len(tokens):
                break
        self.matched[index] = int(matched)  # a re-admission replaces the earlier match
        self.running[rid] = outputs
        return True

    def decode_all(self, step: int) -> None:
        rids = list(self.running)
        tokens = [(step * 7 + i) % (OUTPUT_TOKEN_LIMIT - 1) + 1 for i in range(len(rids))]
        out = self.call(Op("decode", (rids, tokens)))
        if isinstance(out, OutOfMemoryError):
            victim = rids[-1]  # the youngest goes back to the queue
            self.call(Op("abort", (victim,)))
            del self.running[victim]
            raise _Requeue(victim)
        for rid in rids:
            self.running[rid] -= 1
        done = [rid for rid in rids if self.running[rid] <= 0]
        if done:
            self.call(Op("finish", (done,), (("is_insert", True),)))
            for rid in done:
                del self.running[rid]
            self.stats.finished += len(done)
            for _ in done:
                self.on_request()
            self.hold = False


class _Requeue(Exception):
    def __init__(self, rid: str) -> None:
        self.rid = rid


def replay_trace(
    records: list[TraceRecord],
    settings: ReplaySettings,
    factory_a: Factory,
    factory_b: Factory | None,
    labels: tuple[str, str] = ("reference", "optimized"),
    requests: PreparedRequests | None = None,
    on_request: Callable[[], None] | None = None,
) -> ReplayStats:
    """Replay ``records`` (in order) on A and B in lockstep; the statistics of A (equal to B's:
    any difference raises :class:`~kvpool.testing.lockstep_driver.LockstepFailure`). With
    ``factory_b`` None, A runs alone (:class:`SoloStepper`, labelled ``labels[0]``).
    ``requests``: :func:`prepare_requests` of ``records`` when already computed;
    ``on_request`` is called once per request finished or rejected (progress bars)."""
    # Long prompts keep millions of token ints alive (rows, snapshots); the cyclic collector
    # would rescan them over and over (~20% of a replay) while the replay makes few cycles (tree
    # parent links of evicted nodes): pause it, collect every GC_EVERY_STEPS steps and at the end.
    paused = gc.isenabled()
    gc.disable()
    try:
        return _replay(records, settings, factory_a, factory_b, labels, requests, on_request)
    finally:
        if paused:
            gc.enable()
            gc.collect()


def _replay(
    records: list[TraceRecord],
    settings: ReplaySettings,
    factory_a: Factory,
    factory_b: Factory | None,
    labels: tuple[str, str],
    requests: PreparedRequests | None,
    on_request: Callable[[], None] | None,
) -> ReplayStats:
    start = time.monotonic()
    prepared = requests or prepare_requests(records, settings)
    lengths, outputs = prepared.prompt_lengths, prepared.outputs
    longest = max(lengths, default=1)
    config = settings.pool_config(longest)
    pair: Stepper
    if factory_b is None:
        pair = SoloStepper(factory_a, config, labels[0], settings.check_every)
    else:
        pair = Lockstep(factory_a, factory_b, config, labels, settings.check_every)
    stats = ReplayStats(settings.policy, pair.config.size, settings.page_size, len(records))
    driver = _Driver(pair, stats, settings, on_request)
    queue: deque[tuple[str, int]] = deque((f"q{i}", i) for i in range(len(records)))
    attempts: dict[int, int] = {}
    step = 0
    while queue or driver.running:
        while queue and len(driver.running) < settings.concurrency and not driver.hold:
            rid, i = queue[0]
            if ceil_align(lengths[i] + outputs[i], settings.page_size) > pair.config.size:
                queue.popleft()
                stats.rejected += 1
                driver.on_request()
                continue
            if driver.running and not driver.room_for(lengths[i], outputs[i]):
                break
            admitted = driver.admit(rid, i, prepared.prompt(i), outputs[i])
            if admitted is False:
                break
            queue.popleft()
            if admitted is None:
                stats.rejected += 1
                driver.on_request()
        if not driver.running:
            continue
        step += 1
        if step % GC_EVERY_STEPS == 0:
            gc.collect()
        try:
            driver.decode_all(step)
        except _Requeue as back:
            i = int(back.rid[1:].split(".")[0])
            attempts[i] = attempts.get(i, 0) + 1
            queue.appendleft((f"q{i}.{attempts[i]}", i))
            stats.requeued += 1
            driver.hold = bool(driver.running)
    if isinstance(pair, SoloStepper):
        pair.check_now()
    stats.prompt_tokens = sum(lengths)
    stats.matched_tokens = sum(driver.matched.values())
    stats.invariant_checks = pair.checks
    stats.seconds = time.monotonic() - start
    return stats


__all__ = [
    "GC_EVERY_STEPS",
    "PreparedRequests",
    "ReplaySettings",
    "ReplayStats",
    "cache_footprint_tokens",
    "prepare_requests",
    "replay_pool_sizes",
    "replay_trace",
    "scaled_length",
    "scaled_prompt",
]
