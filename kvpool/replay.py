"""Trace replay: a real workload through both implementations in lockstep (``kvpool replay``).

The driver is a small FCFS scheduler over :class:`kvpool.protocols.MemoryManagerProtocol`:
requests arrive in trace order; while fewer than ``concurrency`` run, the next one is admitted
(``new_req``, ``match_prefix``, then ``extend``, in chunks of ``chunk_size`` tokens if set);
every running request then decodes one token per step until it has produced
``min(output_length, max_output)`` tokens, and finished requests leave in one batch (inserted
into the radix tree). An admission or decode that runs out of memory aborts the youngest request
and sends it back to the head of the queue; a request that cannot fit even in an idle pool is
rejected (skipped: it counts as a miss in the hit ratio). By default every call runs through
:class:`kvpool.testing.lockstep.Lockstep`, so the two implementations are compared at every step
and every invariant is checked (every ``check_every`` steps when asked, for long prompts). With
no second factory (``kvpool replay --twin-only``) only one implementation runs, through
:class:`SoloStepper`: every invariant is still checked on its snapshot every ``check_every``
steps, but nothing compares it with the reference (capacity planning at real sizes).

Prompts come from :mod:`kvpool.traces` (block ids turned into tokens). ``block_tokens`` below
512 keeps the first ``block_tokens`` tokens of every 512-token block: the same sharing structure
at a smaller scale, for quick runs on small pools.

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
from typing import Any, Protocol

from kvpool.config import PoolConfig
from kvpool.constants import ceil_align
from kvpool.errors import InvariantViolation, KVPoolError, OutOfMemoryError
from kvpool.invariants import check_all
from kvpool.snapshot import PoolSnapshot
from kvpool.testing.lockstep import Factory, Lockstep, LockstepFailure
from kvpool.testing.swarm import Op
from kvpool.traces import BLOCK_SIZE, TraceRecord, blocks_token_array


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


class Stepper(Protocol):
    """What the driver steps: :class:`~kvpool.testing.lockstep.Lockstep` or :class:`SoloStepper`
    (``a`` is the implementation whose statistics are reported)."""

    config: PoolConfig
    a: Any
    checks: int

    def run(self, op: Op) -> Any: ...


class SoloStepper:
    """One implementation alone: each op is called, and every ``check_every`` steps its snapshot
    goes through every invariant (:func:`kvpool.invariants.check_all`, with the previous checked
    snapshot). Returns the result or the :class:`~kvpool.errors.KVPoolError` instance, like
    :meth:`Lockstep.run`; a violation raises :class:`~kvpool.testing.lockstep.LockstepFailure`
    named by the invariant id; any other exception propagates."""

    def __init__(self, factory: Factory, config: PoolConfig, label: str, check_every: int = 1):
        self.config, self.label = config, label
        self.check_every = max(check_every, 1)
        self.a = factory(config)
        self.steps = 0
        self.checks = 0
        self.snap: PoolSnapshot = self.a.snapshot()
        self._check(None, "build")

    def _check(self, prev: PoolSnapshot | None, what: str) -> None:
        try:
            self.checks += check_all(self.snap, prev)
        except InvariantViolation as exc:
            text = f"{self.label} after step {self.steps} ({what}): {exc}"
            raise LockstepFailure(exc.invariant_id, self.steps, text, exc.indices) from exc

    def run(self, op: Op) -> Any:
        self.steps += 1
        try:
            out: Any = op.call(self.a)
        except KVPoolError as exc:
            out = exc
        if self.steps % self.check_every == 0:
            prev, self.snap = self.snap, self.a.snapshot()
            self._check(prev, op.name)
        return out

    def check_now(self) -> None:
        """Check the current state if the last step was not checked (the end of a replay)."""
        if self.steps % self.check_every:
            prev, self.snap = self.snap, self.a.snapshot()
            self._check(prev, "end")


def scaled_prompt(record: TraceRecord, block_tokens: int) -> list[int]:
    """The record's prompt with every block cut to its first ``block_tokens`` tokens (all of
    them when ``block_tokens >= 512``); equal block ids still give equal tokens."""
    full = blocks_token_array(record.hash_ids)
    if block_tokens >= BLOCK_SIZE:
        tokens: list[int] = full[: record.input_length].tolist()
        return tokens
    keep = max(-(-record.input_length * block_tokens // BLOCK_SIZE), 1)
    cut: list[int] = full.reshape(-1, BLOCK_SIZE)[:, :block_tokens].reshape(-1)[:keep].tolist()
    return cut


def prepare_requests(
    records: list[TraceRecord], settings: ReplaySettings
) -> tuple[list[list[int]], list[int]]:
    """Prompts (tokens, see :func:`scaled_prompt`) and output lengths (tokens, capped at
    ``max_output``, at least 1) of ``records``: computed once, shared by every replay of a job."""
    prompts = [scaled_prompt(r, settings.block_tokens) for r in records]
    outputs = [max(min(r.output_length, settings.max_output), 1) for r in records]
    return prompts, outputs


def cache_footprint_tokens(records: list[TraceRecord], block_tokens: int) -> int:
    """Tokens the distinct prompt blocks of ``records`` occupy (each ``block_tokens`` long, at
    most 512): about the pool size above which nothing is ever evicted."""
    return len({b for r in records for b in r.hash_ids}) * min(block_tokens, BLOCK_SIZE)


def replay_pool_sizes(
    records: list[TraceRecord], settings: ReplaySettings, points: int = 4
) -> list[int]:
    """``points`` pool sizes (tokens, whole pages) for a hit-ratio curve, from the trace's peak
    demand: the smallest pool that rejects nothing (the longest request, page-aligned, plus an
    output page per running request) times 1, 2, 4, ... (``2**k`` for ``k < points``), none
    above the cache footprint (:func:`cache_footprint_tokens`: past it nothing is evicted)."""
    ps = settings.page_size
    prompts, outputs = prepare_requests(records, settings)
    need = max((ceil_align(len(p) + o, ps) for p, o in zip(prompts, outputs, strict=True)),
               default=ps) + settings.concurrency * ps  # fmt: skip
    top = max(ceil_align(cache_footprint_tokens(records, settings.block_tokens), ps), need)
    return sorted({min(need << k, top) for k in range(points)})


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
        out = self.call(Op("decode", (rids, [(step * 7 + i) % 997 + 1 for i in range(len(rids))])))
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
    requests: tuple[list[list[int]], list[int]] | None = None,
    on_request: Callable[[], None] | None = None,
) -> ReplayStats:
    """Replay ``records`` (in order) on A and B in lockstep; the statistics of A (equal to B's:
    any difference raises :class:`~kvpool.testing.lockstep.LockstepFailure`). With
    ``factory_b`` None, A runs alone (:class:`SoloStepper`, labelled ``labels[0]``).
    ``requests``: :func:`prepare_requests` of ``records`` when already computed;
    ``on_request`` is called once per request finished or rejected (progress bars)."""
    # Long prompts keep millions of token ints alive (prompts, rows, snapshots); the cyclic
    # collector would rescan them over and over (~20% of a replay) while the replay itself makes
    # few cycles (tree parent links): pause it for the run, collect once at the end.
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
    requests: tuple[list[list[int]], list[int]] | None,
    on_request: Callable[[], None] | None,
) -> ReplayStats:
    start = time.monotonic()
    prompts, outputs = requests or prepare_requests(records, settings)
    longest = max((len(p) for p in prompts), default=1)
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
            if ceil_align(len(prompts[i]) + outputs[i], settings.page_size) > pair.config.size:
                queue.popleft()
                stats.rejected += 1
                driver.on_request()
                continue
            if driver.running and not driver.room_for(len(prompts[i]), outputs[i]):
                break
            admitted = driver.admit(rid, i, prompts[i], outputs[i])
            if admitted is False:
                break
            queue.popleft()
            if admitted is None:
                stats.rejected += 1
                driver.on_request()
        if not driver.running:
            continue
        step += 1
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
    stats.prompt_tokens = sum(len(p) for p in prompts)
    stats.matched_tokens = sum(driver.matched.values())
    stats.invariant_checks = pair.checks
    stats.seconds = time.monotonic() - start
    return stats
