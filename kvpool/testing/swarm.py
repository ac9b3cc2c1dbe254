"""What a lockstep run draws: a pool configuration and, step by step, lifecycle operations.

Drawing goes through a :class:`Chooser`, so the same generator serves hypothesis (every choice is
a ``data.draw``, hence shrinkable) and the time-budgeted campaign (a seeded ``random.Random``,
fast and replayable). Operations are plain data (:class:`Op`): a run is replayed by executing the
same list again, which is how the campaign shrinks a failing trace.

Configurations (the "swarm"): page sizes 1, 2, 4, 16, 64; ``need_sort`` on and off; radix cache on
and off; every eviction policy; MHA and MLA; pools of a few pages and a handful of rows so that
out-of-memory and eviction happen often. Prompt lengths land on and around page boundaries.
"""

from __future__ import annotations

import random
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol, TypeVar

from kvpool.config import PoolConfig
from kvpool.constants import EVICTION_POLICIES, SUPPORTED_PAGE_SIZES_TESTED
from kvpool.snapshot import PoolSnapshot, ReqSnapshot
from kvpool.testing.config_variants import host_tier_fields, storage_fields

T = TypeVar("T")

ALPHABET: tuple[int, ...] = (1, 2, 3)
"""Tiny token alphabet: random suffixes collide with each other and with the shared prefixes."""

EXTRA_KEYS: tuple[str | None, ...] = (None, None, "a", "b")
"""Namespaces drawn for requests (``None`` twice: the common case)."""


class Chooser(Protocol):
    """Source of choices: hypothesis data or a seeded random generator."""

    def integer(self, lo: int, hi: int) -> int:
        """An int in ``[lo, hi]`` (both inclusive)."""
        ...

    def choice(self, options: Sequence[T]) -> T:
        """One element of a non-empty sequence."""
        ...


class RandomChooser:
    """Chooser over ``random.Random(seed)``: fast, deterministic for a seed.

    Each draw is the one ``randint`` / ``randrange`` make, from the same generator in the same
    order: for a plain ``random.Random`` the draw is taken here as the interpreter takes it
    (``getrandbits`` of the width's bit length until below the width), without their two
    layers of argument handling (a campaign draws a dozen numbers a step);
    ``tests/harness/test_swarm_draws.py`` holds the two to the same numbers and state."""

    def __init__(self, seed: int | random.Random) -> None:
        self.rng = seed if isinstance(seed, random.Random) else random.Random(seed)
        self._bits = self.rng.getrandbits if type(self.rng) is random.Random else None

    def _below(self, n: int) -> int:
        """A uniform int in ``[0, n)`` for ``n >= 1``: ``randrange(n)``'s draw."""
        bits = self._bits
        if bits is None:  # a generator of another kind draws its own way
            return self.rng.randrange(n)
        k = n.bit_length()
        r = bits(k)
        while r >= n:
            r = bits(k)
        return r

    def integer(self, lo: int, hi: int) -> int:
        if type(lo) is not int or type(hi) is not int or hi < lo:
            return self.rng.randint(lo, hi)  # (its conversions and its error)
        return lo + self._below(hi - lo + 1)

    def choice(self, options: Sequence[T]) -> T:
        if not options:
            return options[self.rng.randrange(0)]  # (its error)
        return options[self._below(len(options))]


@dataclass(frozen=True)
class Op:
    """One lifecycle call: ``getattr(manager, name)(*args, **dict(kwargs))``.

    ``expect_error``: the call is deliberately invalid (unknown id, wrong state, mismatched
    lengths) and both implementations must raise the same :class:`~kvpool.errors.KVPoolError`
    subclass and change nothing."""

    name: str
    args: tuple[Any, ...] = ()
    kwargs: tuple[tuple[str, Any], ...] = ()
    expect_error: bool = False

    def call(self, manager: Any) -> Any:
        return getattr(manager, self.name)(*self.args, **dict(self.kwargs))

    def render(self) -> str:
        parts = [repr(a) for a in self.args] + [f"{k}={v!r}" for k, v in self.kwargs]
        mark = "  # invalid on purpose" if self.expect_error else ""
        return f"{self.name}({', '.join(parts)}){mark}"


def draw_config(
    c: Chooser,
    page_size: int | None = None,
    hybrid: bool = False,
    host: bool = False,
    eagle: bool = False,
    **overrides: Any,
) -> PoolConfig:
    """A small pool configuration. ``page_size`` and ``overrides`` pin fields (focused runs).
    ``hybrid``: the candidate models hybrid (Mamba) models, so configurations with the radix
    cache off and ``need_sort`` (one in eight) get a few Mamba slots, fewer than rows, so that
    admission is often refused for want of them; so do those with the radix cache on, page size
    1 and ``need_sort`` (the Mamba radix cache: three to seven slots, so that cached states are
    evicted and admissions refused often; LRU eviction, no track buffers). ``host``: the
    candidate has a host tier, so non-hybrid radix-cache configurations with 3 or 6 rows get one
    (:func:`host_tier_fields`). ``eagle``: the candidate's manager models EAGLE's bigram keys, so
    radix-cache configurations (no storage; hybrid Mamba ones too, whose trees keep token
    keys) with a page count of 1 mod 3 get ``is_eagle``. No extra draw: the other fields, and
    so every seed's run, stay as they were."""
    ps = page_size if page_size is not None else c.choice(SUPPORTED_PAGE_SIZES_TESTED)
    pages = c.integer(4, 24) if ps <= 2 else c.integer(3, 12 if ps <= 4 else 8)
    fields: dict[str, Any] = {
        "size": pages * ps,
        "page_size": ps,
        "req_pool_size": c.integer(2, 6),
        # the tight choice makes decodes, speculative steps and session turns overflow a row
        "max_context_len": c.choice((3 * max(ps, 4) + 4, 6 * max(ps, 4) + 24)),
        "need_sort": c.choice((False, True)),
        "disable_radix_cache": c.choice((False, False, False, True)),
        "eviction_policy": c.choice(EVICTION_POLICIES),
        "kv_layout": c.choice(("mha", "mla")),
    }
    fields.update(overrides)
    fields.update(storage_fields(fields, pages, overrides))
    if (
        hybrid
        and fields["disable_radix_cache"]
        and fields["need_sort"]
        and "mamba_slots" not in overrides
    ):
        fields["mamba_slots"] = max(1, fields["req_pool_size"] - 2 + pages % 2)
        fields["mamba_track_buffers"] = pages % 3
        fields["mamba_layers"] = 1 + pages % 2
    elif (
        hybrid
        and not fields["disable_radix_cache"]
        and fields["need_sort"]
        and ps == 1
        and models_mamba_tree(fields.get("rules"))
        and "mamba_slots" not in overrides
    ):  # the Mamba radix cache (0.5.16's, or 0.5.23's unified tree): page size 1, LRU, no
        # track buffers, few slots
        fields["mamba_slots"] = 3 + pages % 5
        fields["mamba_layers"] = 1 + pages % 2
        fields["eviction_policy"] = "lru"
    if (
        host
        and not fields["disable_radix_cache"]
        and fields["req_pool_size"] % 3 == 0
        and "enable_hierarchical_cache" not in overrides
        and fields.get("mamba_slots") is None
    ):
        fields.update(host_tier_fields(pages, ps))
    if (
        eagle
        and not fields["disable_radix_cache"]
        and not fields.get("hicache_storage")
        and "is_eagle" not in overrides
        and pages % 3 == 1
    ):
        fields["is_eagle"] = True
    return PoolConfig(**fields)


def models_mamba_tree(rules: Any) -> bool:
    """Whether the lifecycle models the Mamba tree under ``rules`` (None: the default): SGLang
    0.5.16's legacy tree or its unified tree with 0.5.16's release path, or 0.5.23's unified
    tree with its
    (:func:`kvpool.reference.lifecycle.mamba_hooks.check_hybrid_config`)."""
    release = getattr(rules, "release_path", "finished_req")
    tree = getattr(rules, "mamba_tree", "mamba_radix")
    return (tree, release) in (
        ("mamba_radix", "finished_req"),
        ("unified", "checkpoint"),
        ("unified", "finished_req"),
    )


def shared_prefix(index: int, length: int) -> list[int]:
    """Prefix number ``index`` of the small shared pool (deterministic, over :data:`ALPHABET`)."""
    return [ALPHABET[(index * 7 + i * i + i // 3) % len(ALPHABET)] for i in range(length)]


def draw_length(c: Chooser, ps: int, longest: int) -> int:
    """A token count in ``[1, longest]``, biased onto and around page boundaries."""
    if c.integer(0, 2):
        unit = max(ps, 3)
        n = unit * c.integer(0, 3) + c.choice((-1, 0, 0, 1))
    else:
        n = c.integer(1, longest)
    return min(max(n, 1), longest)


def draw_tokens(c: Chooser, ps: int, longest: int) -> list[int]:
    """Prompt tokens: maybe a cut of a shared prefix, then a short random tail."""
    n = draw_length(c, ps, longest)
    prefix = c.integer(-1, 2)
    head = shared_prefix(prefix, c.integer(0, n)) if prefix >= 0 else []
    return head + [c.choice(ALPHABET) for _ in range(n - len(head))]


@dataclass
class View:
    """What the generator knows of the state: request and session ids by lifecycle state (read
    from the reference's snapshot), plus the counters that name new requests and sessions."""

    config: PoolConfig
    waiting: list[str]
    chunked: list[str]
    running: list[str]
    done: list[str]
    idle_sessions: list[str]
    busy_sessions: list[str]
    remaining: dict[str, int]
    next_rid: int
    next_sid: int
    prompts: dict[str, tuple[list[int], str | None]] = field(default_factory=dict)
    """Prompts (tokens, extra key) of the requests in prefill (waiting or chunked) the generator
    created: a new request may copy a waiting one's (the same prompt sent twice, or parallel
    sampling), which makes two requests prefill the same prefix in one batch: the duplicate-slot
    paths; an extend may take those that share a prefix together (:func:`_sharing`)."""
    layers: Any = None
    """Layer-wise loading: the run's ``layer_ops.LayerLoads`` (draws the layer steps)."""
    requests: tuple[ReqSnapshot, ...] = ()
    """The snapshot's requests (read only by the draws that need more than their ids)."""
    stops: bool = False
    """Whether a finish may stop a request before its last output token (``finished_lens``:
    the candidate models it, :attr:`~kvpool.testing.bundle.Implementation.manager_models_stops`)."""
    stop_span: int = 7
    """The most tokens such a stop lies before the last output token (a speculative run: a step
    accepts at most ``2 * reserve <= 6``; less than a sliding window)."""
    session_stops: bool = True
    """Whether a session turn may stop so too (not a hybrid model's: its state cannot be cut
    back to the tokens its session keeps)."""


def make_view(config: PoolConfig, snap: PoolSnapshot, next_rid: int, next_sid: int) -> View:
    """Classify every request and session of ``snap``."""
    v = View(config, [], [], [], [], [], [], {}, next_rid, next_sid, requests=snap.reqs)
    for r in snap.reqs:
        if r.state == "waiting":
            v.waiting.append(r.rid)
        elif r.state == "running" and r.is_chunked > 0:
            v.chunked.append(r.rid)
        elif r.state == "running":
            v.running.append(r.rid)
        else:
            v.done.append(r.rid)
        v.remaining[r.rid] = max(r.input_len - r.kv_committed_len, 1)
    for s in snap.sessions:
        (v.busy_sessions if s.busy_with else v.idle_sessions).append(s.session_id)
    return v


def _sharing(c: Chooser, v: View) -> list[str]:
    """Under the checkpoint release path (``Rules.release_path``, SGLang 0.5.23's), two times
    in three when requests in prefill share their prompt's first two pages: two or three of one
    such group, in drawn order (else nothing, with no draw under kvpool's own rules).

    Why: a chunk's checkpoint frees its duplicates node by node over the unified tree, and the
    order shows only when the duplicates span two nodes or more: one request of a group must
    start its prefill before another's chunks are cached, then overtake them, which independent
    picks (:func:`_pick`) of small, busy pools rarely made (the seeded bug
    ``checkpoint-frees-once`` of tests/quality/mutants_release.py went unseen)."""
    if v.config.rules.release_path != "checkpoint":
        return []
    head = 2 * v.config.page_size
    groups: dict[tuple[str | None, tuple[int, ...]], list[str]] = {}
    for rid in v.waiting + v.chunked:
        if rid in v.prompts and len(v.prompts[rid][0]) > head:
            tokens, extra = v.prompts[rid]
            groups.setdefault((extra, tuple(tokens[:head])), []).append(rid)
    shared = [g for g in groups.values() if len(g) > 1]
    if not shared or c.integer(0, 2) == 0:
        return []
    group = list(c.choice(shared))
    return [group.pop(c.integer(0, len(group) - 1)) for _ in range(min(len(group), 3))]


def _pick(c: Chooser, pool: Sequence[str], most: int) -> list[str]:
    """Up to ``most`` distinct ids of ``pool`` (at least one), in drawn order."""
    left = list(pool)
    out: list[str] = []
    for _ in range(c.integer(1, min(most, len(left)))):
        out.append(left.pop(c.integer(0, len(left) - 1)))
    return out


KINDS: tuple[str, ...] = (
    "new_req", "new_req", "twin_req", "match_prefix", "extend", "extend", "extend",
    "decode", "decode", "spec_step", "spec_step", "spec_draft_v1", "finish", "finish",
    "abort", "retract", "session_turn", "session_turn", "open_session", "close_session",
    "evict", "invalid",
)  # fmt: skip
"""Operation kinds, repeated by weight (the campaign draws uniformly from this tuple).
``twin_req`` is a new request copying a waiting request's prompt when there is one."""

HOST_KINDS: tuple[str, ...] = (
    "ack_writes", "ack_writes", "ack_loads", "ack_loads", "match_prefix", "match_prefix",
    "match_prefix", "evict", "evict", "finish", "finish",
)  # fmt: skip
"""Kinds added to :data:`KINDS` for a manager with the host tier: write and load
acknowledgements (the first ``k`` arrive; ``-1``: an invalid call), and more admissions
(``match_prefix``, where host hits load back), finishes (whose inserts write to host) and
evictions (which make nodes host-only)."""


def _stop(c: Chooser, req: ReqSnapshot, v: View) -> int | None:
    """A ``finished_len`` for ``req``: None (every output token) one time in three, else a stop
    before its last token, at most :attr:`View.stop_span` tokens back (inside the last
    speculative run); always None for a session turn unless :attr:`View.session_stops`."""
    out, turn = req.output_len, req.session_id is not None
    if not out or v.stop_span < 1 or (turn and not v.session_stops) or c.integer(0, 2) == 0:
        return None
    return c.integer(max(0, out - v.stop_span), out - 1)


def draw_op(c: Chooser, v: View, kind: str) -> Op:
    """An operation of ``kind`` valid in ``v`` when possible; otherwise a progressing one (an
    extend of a waiting request, or a new request), so every drawn kind yields a step. Kind
    ``invalid`` gives a deliberately invalid call (:func:`draw_invalid`)."""
    ps, longest = v.config.page_size, max(v.config.page_size * 3 + 2, 12)
    if kind in ("new_req", "twin_req"):
        rid = f"r{v.next_rid}"
        twins = [r for r in v.waiting if r in v.prompts]
        if twins and (kind == "twin_req" or c.integer(0, 3) == 0):
            tokens, extra = v.prompts[c.choice(twins)]
            tail = [c.choice(ALPHABET) for _ in range(c.integer(0, 2))]
            return Op("new_req", (rid, tokens + tail), (("extra_key", extra),))
        extra = c.choice(EXTRA_KEYS)
        return Op("new_req", (rid, draw_tokens(c, ps, longest)), (("extra_key", extra),))
    if kind == "session_turn" and v.idle_sessions:
        sid = c.choice(v.idle_sessions)
        tokens = draw_tokens(c, ps, max(ps + 2, 6))
        extra = c.choice((None, None, None, "a"))  # a turn may (wrongly) name a namespace
        kwargs = (("session_id", sid),) + ((("extra_key", extra),) if extra else ())
        return Op("new_req", (f"r{v.next_rid}", tokens), kwargs)
    if kind == "open_session" or (kind == "session_turn" and not v.idle_sessions):
        return Op("open_session", (f"s{v.next_sid}",))
    if kind == "close_session" and v.idle_sessions + v.busy_sessions:
        return Op("close_session", (c.choice(v.idle_sessions + v.busy_sessions),))
    if kind == "match_prefix" and v.waiting:
        return Op("match_prefix", (c.choice(v.waiting),))
    if kind == "extend" and v.waiting + v.chunked:
        rids = _sharing(c, v)
        if rids:
            sizes: list[int | None] = [
                min(c.choice((1, ps, ps, 2 * ps)), v.remaining[r]) for r in rids
            ]
        else:
            rids = _pick(c, v.waiting + v.chunked, 3)
            sizes = [
                c.choice((None, c.integer(1, v.remaining[r]), 1 + v.remaining[r] // 2))
                for r in rids
            ]
        return Op("extend", (rids,), (("chunk_sizes", sizes),))
    if kind == "decode" and v.running:
        rids = _pick(c, v.running, 3)
        return Op("decode", (rids, [c.choice(ALPHABET) for _ in rids]))
    if kind == "spec_step" and v.running:
        rids = _pick(c, v.running, 2)
        reserve = c.integer(0, 3)
        accepted = [[c.choice(ALPHABET) for _ in range(c.integer(0, 2 * reserve))] for _ in rids]
        return Op("spec_step", (rids, accepted, reserve))
    if kind == "spec_draft_v1" and v.running:
        return Op("spec_draft_v1", (_pick(c, v.running, 2), c.integer(0, 3)))
    if kind == "finish" and v.running:
        rids = _pick(c, v.running, 3)
        finish: list[tuple[str, Any]] = [("is_insert", c.choice((True, False)))]
        if v.stops and c.integer(0, 1):
            reqs = {r.rid: r for r in v.requests}
            finish.append(("finished_lens", [_stop(c, reqs[r], v) for r in rids]))
        return Op("finish", (rids,), tuple(finish))
    if kind == "abort" and v.waiting + v.running + v.chunked:
        return Op("abort", (c.choice(v.waiting + v.running + v.chunked),))
    if kind == "retract" and v.running + v.chunked:
        return Op("retract", (c.choice(v.running + v.chunked),))
    if kind == "evict":
        return Op("evict", (c.integer(1, max(v.config.size // 2, 1)),))
    if kind in ("ack_writes", "ack_loads"):
        count = c.choice((0, 1, 1, 2, 8, -1))
        return Op(f"hicache_{kind}", (count,), expect_error=count < 0)
    if kind == "invalid":
        return draw_invalid(c, v)
    if kind in LAYER_KINDS and v.layers is not None:
        return v.layers.draw(c, kind)  # type: ignore[no-any-return]
    # Not applicable in this state: make progress instead.
    return draw_op(c, v, "extend" if v.waiting and kind != "extend" else "new_req")


def draw_invalid(c: Chooser, v: View) -> Op:
    """A call every implementation must refuse with a typed error, changing nothing."""
    ghost = f"ghost{c.integer(0, 9)}"
    options: list[Op] = [
        Op("match_prefix", (ghost,), expect_error=True),
        Op("decode", ([ghost], [1]), expect_error=True),
        Op("finish", ([ghost],), expect_error=True),
        Op("abort", (ghost,), expect_error=True),
        Op("retract", (ghost,), expect_error=True),
        Op("extend", ([ghost],), expect_error=True),
        Op("close_session", (ghost,), expect_error=True),
    ]
    rid = f"r{v.next_rid}"
    too_long = [1] * (v.config.max_context_len + 1)
    options += [
        Op("new_req", (rid, []), expect_error=True),
        Op("new_req", (rid, too_long), expect_error=True),
        Op("new_req", (rid, [1]), (("session_id", ghost),), expect_error=True),
        Op("evict", (-1,), expect_error=True),
    ]
    if v.busy_sessions:
        busy = c.choice(v.busy_sessions)
        options += [
            Op("new_req", (rid, [1]), (("session_id", busy),), expect_error=True),
            Op("close_session", (busy,), expect_error=True),
        ]
    if v.waiting:
        w = c.choice(v.waiting)
        options += [
            Op("decode", ([w], [1]), expect_error=True),
            Op("retract", (w,), expect_error=True),
            Op("new_req", (w, [1, 2]), expect_error=True),
            Op("extend", ([w],), (("chunk_sizes", [None, None]),), expect_error=True),
            Op("extend", ([w],), (("chunk_sizes", [0]),), expect_error=True),
            Op("extend", ([w, w],), expect_error=True),
        ]
    if v.chunked:
        ch = c.choice(v.chunked)
        options += [
            Op("decode", ([ch], [1]), expect_error=True),
            Op("finish", ([ch],), expect_error=True),
            Op("match_prefix", (ch,), expect_error=True),
        ]
    if v.running:
        r = c.choice(v.running)
        options += [
            Op("match_prefix", (r,), expect_error=True),
            Op("decode", ([r], [1, 2]), expect_error=True),
            Op("decode", ([r, r], [1, 2]), expect_error=True),
            Op("extend", ([r],), expect_error=True),
            Op("spec_step", ([r], [[1]], -1), expect_error=True),
            Op("spec_step", ([r], [[1], [2]], 1), expect_error=True),
            Op("spec_step", ([r], [[1, 2, 3]], 1), expect_error=True),
            Op("spec_draft_v1", ([r], -1), expect_error=True),
        ]
    if v.done:
        d = c.choice(v.done)
        options += [
            Op("finish", ([d],), expect_error=True),
            Op("decode", ([d], [1]), expect_error=True),
            Op("abort", (d,), expect_error=True),
            Op("retract", (d,), expect_error=True),
        ]
    if v.idle_sessions:
        options.append(Op("open_session", (c.choice(v.idle_sessions),), expect_error=True))
    return c.choice(options)


def advance_counters(op: Op, next_rid: int, next_sid: int) -> tuple[int, int]:
    """Counters after ``op`` (a fresh id is consumed whether or not the call succeeded)."""
    if op.name == "new_req" and not op.expect_error:
        next_rid += 1
    if op.name == "open_session" and not op.expect_error:
        next_sid += 1
    return next_rid, next_sid


LAYER_KINDS = ("layer_load", "layer_done", "layer_done", "layer_read", "layer_read")
"""Layer steps (:mod:`kvpool.testing.layer_ops`), by weight; only under layer-wise loading."""
