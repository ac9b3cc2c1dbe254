"""Generated streaming sessions through SGLang's own session code, checked by kvpool's rules.

A plan is a list of :data:`Turn` s of one streaming session, or of two taking turns (turn ``i``
is session ``i % 2``'s; the second starts from the first's first prompt, as sessions sharing a
system prompt do). :func:`run_session` plays it on a :mod:`kvpool.sglang.session_world` world
(SGLang 0.5.23's cache, pools and glue): every turn is admitted (the session lends its record),
prefilled and checkpointed unless its first token finishes it (a session's first turn
publishes its prompt into the tree), computed by the forward's stand-in, finished, aborted or
retracted and admitted again, as SGLang's scheduler does; then ``release_session``. With
``neighbours`` a plain request runs after every turn, pressing on the pool so that the tree
evicts (every allocation of the world evicts first).

After every step kvpool's rules must hold on SGLang's state, each a named invariant
(:func:`check_held`: every KV slot, row, SWA slot and Mamba state free, cached in the tree or
a session's; a kept turn holding exactly its tokens through the stop; on a hybrid model, while
no turn has overlapped, every state the tree caches matching its node,
:func:`check_tree_states`). A broken rule raises :class:`~kvpool.errors.InvariantViolation`, as
does a step where SGLang leaves the driver's model of its scheduler
(:data:`~kvpool.sglang.session_world.MODEL`).

What every admission resumes from is checked too, and returned rather than raised
(:data:`Mismatch`): each resumed position must hold its own token's KV (``INV-KV-INTEGRITY``), a
lent Mamba state must have consumed exactly the resumed prefix (``INV-MAMBA-STATE-INTEGRITY``)
and, with a sliding window, the window before the prefix must be live (``INV-SWA-WINDOW``).
:func:`predicted_findings` computes, from the plan alone, the mismatches that findings 10, 11
and 12 of specs/sglang_findings.md cause, each with its finding's number.

Units: tokens throughout (a plan's numbers, prefixes, mismatches); page size 1 or 4.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from kvpool.constants import ceil_align
from kvpool.invariants.derived import free_pages, page_of
from kvpool.sglang.cache_req import token_array
from kvpool.sglang.scheduler_checker import SchedulerChecks, SchedulerState, ships_checker
from kvpool.sglang.session_world import (
    MODEL,
    WINDOW,
    StreamingSessionStandIn,
    TurnReq,
    World,
    admit,
    require,
)

Turn = tuple[int, int, int, int | None, bool, str | None, bool]
"""A generated turn: new input tokens, output tokens sampled, reserve (more than 0: speculative
decoding), the stop (an output position; None: the last token), whether it is aborted, whether
it is retracted once first (then admitted again, as a retracted request is: ``"overlap"`` with
the step computing its last sampled token launched, finding 11; ``"plain"`` before that step, of
a decode without speculation; None not at all; a retracted turn had sampled no stop, so its
stop is ignored), and whether its next step is already launched when its finish is processed
(overlap scheduling with the running batch next)."""

RETRACTIONS = (None, "overlap", "plain")
"""The retraction modes of a :data:`Turn`."""

Mismatch = tuple[int, str, int]
"""What a turn resumes from, not matching its tokens: (turn, ``"state"``, the lent Mamba
state's tokens minus the resumed prefix), (turn, ``"kv"``, how many resumed positions hold
another token's KV), (turn, ``"swa"``, how many positions of the window before the prefix are
freed) or, for the plain request after a turn, (turn, ``"plain-kv"``, as ``"kv"``)."""

REJECTED = -2
"""The token the forward's stand-in records for a rejected draft's KV."""

INVARIANT_OF = {
    "kv": "INV-KV-INTEGRITY",
    "plain-kv": "INV-KV-INTEGRITY",
    "state": "INV-MAMBA-STATE-INTEGRITY",
    "swa": "INV-SWA-WINDOW",
}
"""The named rule each kind of :data:`Mismatch` breaks."""

FINDINGS = (10, 11, 12)
"""The findings of specs/sglang_findings.md that :func:`predicted_findings` predicts."""


def session_ids(sessions: int) -> list[str]:
    """The ids of a plan's ``sessions`` streaming sessions; turn ``i`` is session
    ``i % sessions``'s."""
    return ["s", *(f"s{k}" for k in range(1, sessions))]


def predicted(plan: list[Turn], hybrid: bool, sessions: int = 1) -> list[Mismatch]:
    """The mismatches of :func:`predicted_findings`, without their findings."""
    return [mismatch for mismatch, _ in predicted_findings(plan, hybrid, sessions)]


def predicted_findings(
    plan: list[Turn], hybrid: bool, sessions: int = 1
) -> list[tuple[Mismatch, int]]:
    """:func:`session_findings` of each of ``sessions`` interleaved sessions (turn ``i`` is
    session ``i % sessions``'s), their turns numbered in ``plan``: the findings are each
    session's own, whatever the others share with it."""
    out: list[tuple[Mismatch, int]] = []
    for k in range(sessions):
        turns = list(range(k, len(plan), sessions))
        for (turn, kind, amount), finding in session_findings([plan[t] for t in turns], hybrid):
            out.append(((turns[turn], kind, amount), finding))
    out.sort(key=lambda entry: entry[0][0])  # by turn; stable: one session's order as it is
    return out


def session_findings(plan: list[Turn], hybrid: bool) -> list[tuple[Mismatch, int]]:
    """The mismatches findings 10, 11 and 12 predict for ``plan`` on a world of full attention
    (or a sliding window: no SWA mismatch is predicted) or, with ``hybrid``, of Mamba layers,
    each with its finding. They follow from how far each finished turn's forward got
    (``consumed`` tokens: its KV and state) against what SGLang's hand-over keeps
    (``held = min(prompt + finished_len, allocated)``). On a hybrid model the next turn resumes
    ``consumed - held`` tokens off its state: ahead by the tokens past a stop inside the run
    (10), behind by one when a speculating turn stopping at its last token finished with no step
    launched (12). A turn retracted under overlap resumes a token behind its state (11). KV: in
    that case of finding 12 the last token's position holds another token's KV, which every
    later admission of the session resumes over until an abort makes it forget."""
    out: list[tuple[Mismatch, int]] = []
    bad = 0  # positions of the session's history holding another token's KV
    for i, (_, outputs, reserve, stop, aborted, retracted, launched) in enumerate(plan):
        stop = None if retracted else stop  # see run_session
        for _ in range(1 + (retracted is not None) if bad else 0):  # each lend of the record
            out.append(((i, "kv", bad), 12))
        if hybrid and retracted == "overlap":
            out.append(((i, "state", 1), 11))
        kept = outputs if stop is None else min(stop, outputs)  # past the prompt, as all here
        if retracted:  # the re-admission computed every sampled token
            consumed = held = outputs
        else:
            clock = outputs - 1 if reserve or not launched else outputs
            consumed = outputs if launched else clock
            held = min(kept, clock + reserve)
        if aborted:
            bad = 0
            continue
        if hybrid and consumed != held and i + 1 < len(plan):
            ahead = consumed - held  # past a stop inside the run, else behind the last token
            out.append(((i + 1, "state", ahead), 10 if ahead > 0 else 12))
        bad += max(0, held - consumed)
    return out


def is_swa(world: World) -> bool:
    """Whether the world's allocator is SGLang's SWA allocator
    (:func:`~kvpool.sglang.session_world.build_swa`)."""
    return hasattr(world.allocator, "swa_available_size")


def full_free(world: World) -> int:
    """Free full-attention KV slots."""
    if is_swa(world):
        return int(world.allocator.full_available_size())
    return int(world.allocator.impl.available_size())


def tree_full(world: World) -> tuple[int, int]:
    """The full-attention slots SGLang's tree holds: (evictable, protected)."""
    tree: Any = world.tree if is_swa(world) else world.cache
    return int(tree.evictable_size()), int(tree.protected_size())


def check_held(
    world: World,
    sizes: tuple[int, int, int, int],
    where: object,
    sids: Sequence[str] = ("s",),
) -> dict[str, Any]:
    """Every KV slot, row and Mamba state is free, cached in the tree or a session's (each
    session's last partial page its own), and no page a session's row names is free
    (``INV-ROW-SLOTS``); with a sliding window, every SWA slot too (a session's are its row's
    columns still mapped to one). ``sizes``: the free KV slots, rows, Mamba states and SWA
    slots of the fresh world; ``sids``: the sessions whose slots count as held (a slot of any
    other counts as nothing: after ``release_session``, none); ``where`` goes into a
    violation's message. Returns the slot of each of them that holds one."""
    kv_size, rows, state_size, swa_size = sizes
    slots: dict[str, Any] = {}
    for sid in sids:
        if (slot := world.cache.session.slots.get(sid)) is not None:
            slots[sid] = slot
    held = sum(
        ceil_align(slot.kv.kv_allocated_len, world.tree.page_size) - slot.kv.cache_protected_len
        for slot in slots.values()
    )
    tree = sum(tree_full(world))
    free = full_free(world)
    require(
        free + held + tree == kv_size,
        "INV-TOKEN-ACCOUNTING",
        f"{free} free + {held} session + {tree} tree != {kv_size} KV slots after {where}",
    )
    # counts balance when the tree frees a page a session's row still names: check names too
    unowned = _free_pages(world)
    for sid, slot in slots.items():
        cols = world.pool.impl.req_to_token[slot.kv.req_pool_idx, : slot.kv.kv_allocated_len]
        freed = sorted(unowned.intersection(page_of(cols.tolist(), world.tree.page_size)))
        require(
            not freed,
            "INV-ROW-SLOTS",
            f"session {sid}'s row names free page(s) {freed[:8]} after {where}",
        )
    free_rows = int(world.pool.impl.available_size())
    require(
        free_rows == rows - len(slots),
        "INV-ROW-ACCOUNTING",
        f"{free_rows} free rows of {rows}, sessions holding {len(slots)}, after {where}",
    )
    if is_swa(world):
        pages: set[int] = set()
        for slot in slots.values():
            row = world.pool.impl.req_to_token[slot.kv.req_pool_idx]
            mapping = world.allocator.full_to_swa_index_mapping
            cols = row[slot.kv.cache_protected_len : slot.kv.kv_allocated_len].long()
            pages |= {int(s) // world.tree.page_size for s in mapping[cols] if int(s) != 0}
        swa_held = len(pages) * world.tree.page_size
        swa_tree = int(world.cache.swa_evictable_size() + world.cache.swa_protected_size())
        swa_free = int(world.allocator.swa_available_size())
        require(
            swa_free + swa_held + swa_tree == swa_size,
            "INV-SWA-ACCOUNTING",
            f"{swa_free} free + {swa_held} session + {swa_tree} tree != {swa_size} SWA "
            f"slots after {where}",
        )
    states = getattr(world.pool.impl, "mamba_allocator", None)
    if states is not None:
        holds = sum(bool(slot.kv.holds_mamba) for slot in slots.values())
        free_states, cached = int(states.available_size()), cached_states(world)
        require(
            free_states + holds + cached == state_size,
            "INV-MAMBA-ACCOUNTING",
            f"{free_states} free + {holds} session + {cached} tree != {state_size} "
            f"Mamba states after {where}",
        )
    return slots


def _free_pages(world: World) -> frozenset[int]:
    """The full-attention pages nobody owns in ``world``'s allocator
    (:data:`kvpool.invariants.derived.free_pages` of its snapshot)."""
    snap = world.allocator.snapshot()
    return free_pages(getattr(snap, "full", snap))


def run_session(
    world: World, plan: list[Turn], neighbours: bool = False, sessions: int = 1, chunk: int = 0
) -> list[Mismatch]:
    """Turns of streaming sessions through SGLang's own code (admission, hand-over, abort,
    retraction and re-admission), then ``release_session``; with ``neighbours``, a plain
    request after every turn, pressing on the pool so that the tree evicts. With ``sessions``
    above 1 turn ``i`` is session ``i % sessions``'s (:func:`session_ids`), and every session
    but the first starts (and starts again after an abort) from the first session's latest
    first prompt, as sessions sharing a system prompt do. With ``chunk`` (tokens, a multiple of
    the page size; 0: none) every prefill runs in chunks of that many tokens past its prefix,
    each but the last stashed as the scheduler's chunked prefill does. After every step
    kvpool's rules hold on SGLang's state (:func:`check_held`; a kept turn holds exactly its
    tokens through the stop, ``INV-SESSION-TRIMMED``), then SGLang's own scheduler checks
    (:func:`scheduler_checks`); at the end everything is free. The
    forward's stand-in records the token whose KV each slot holds and tags a Mamba state with
    the tokens it has consumed; returns every admission whose resumed KV or lent state does not
    match its tokens."""
    states = getattr(world.pool.impl, "mamba_allocator", None)
    hybrid = states is not None
    swa = is_swa(world)
    sizes = (
        full_free(world),
        int(world.pool.impl.available_size()),
        0 if states is None else int(states.available_size()),
        int(world.allocator.swa_available_size()) if swa else 0,
    )
    found: list[Mismatch] = []
    kv: dict[int, int] = {}  # slot -> the token whose KV it holds

    def slot_at(req: TurnReq, pos: int) -> int:
        return int(world.pool.impl.req_to_token[req.kv.req_pool_idx, pos])

    swa_type = world.tree._swa if swa else None
    eagle = int(bool(world.cache.tree_core.is_eagle))  # EAGLE's tree: bigram keys
    ids = session_ids(sessions)
    # each session's running record's sliding window as kvpool models SGLang's slide: the
    # tree-owned prefix below ``lo``, the record's cursor, and the SWA columns freed,
    # ``[lo, dead)``
    windows = {sid: {"lo": 0, "cursor": 0, "dead": 0} for sid in ids}

    def resume(req: TurnReq, fill: list[int], turn: int) -> int:
        sid = req.session_id
        assert sid is not None
        window = windows[sid]
        lent = sid in world.cache.session.slots  # the session lends its record
        prefix = admit(world, req, len(fill))
        wrong = sum(kv.get(slot_at(req, pos)) != fill[pos] for pos in range(prefix))
        if wrong:
            found.append((turn, "kv", wrong))
        if swa:  # the window the resumed turn's first token attends to
            if lent:  # the match clamps the record's cursor to the prefix
                window["cursor"] = min(window["cursor"], prefix)
            else:
                window.update(lo=int(req.kv.cache_protected_len), cursor=0, dead=0)
            cursor = int(req.kv.get_evicted_seqlen(swa_type))
            require(
                cursor == window["cursor"],
                MODEL,
                f"turn {turn}: SWA cursor {cursor}, the slide model's {window['cursor']}",
            )
            mapping = world.allocator.full_to_swa_index_mapping
            span = range(max(0, prefix - WINDOW), prefix)
            dead = sum(int(mapping[slot_at(req, pos)]) == 0 for pos in span)
            expected = len(range(max(span.start, window["lo"]), min(prefix, window["dead"])))
            require(
                dead == expected,
                MODEL,
                f"turn {turn}: {dead} dead window positions, the slide model's {expected}",
            )
            if dead:
                found.append((turn, "swa", dead))
        if hybrid and not req.kv.mamba_needs_clear:  # a lent state, not a fresh one
            (tag,) = world.pool.mamba_pool.state_tags([int(req.kv.mamba_pool_idx)])
            if tag != prefix:
                found.append((turn, "state", tag - prefix))
        return prefix

    def forward(req: TurnReq, fill: list[int], start: int, clock: int, consumed: int) -> None:
        """The steps computing positions ``[start, consumed)`` (their KV and the state); the
        request's clock at ``clock``."""
        for pos in range(start, consumed):
            kv[slot_at(req, pos)] = fill[pos]
        req.kv.kv_committed_len = clock
        req.kv.mamba_needs_clear = False
        if hybrid:
            world.pool.mamba_pool.write_state([int(req.kv.mamba_pool_idx)], [consumed])

    def slide(req: TurnReq, pre_len: int, prompt: int) -> None:
        """A decode preparation's window slide (``maybe_evict_swa``: the tree's
        ``evict_sliding_windows`` at ``seqlen - 1``), after at least one decode step; the
        model follows (``free_swa_out_of_window_slots``: the cursor rises to the tree-owned
        prefix, then frees up to a page-floored window behind ``pre_len``)."""
        if not swa or pre_len < prompt:
            return
        assert req.session_id is not None
        world.cache.evict_sliding_windows(req, pre_len)
        advance(windows[req.session_id], pre_len)

    def advance(window: dict[str, int], pre_len: int) -> None:
        """The model of ``free_swa_out_of_window_slots`` at ``pre_len`` on ``window``."""
        if pre_len - WINDOW < window["cursor"] + 1:
            return
        ps = world.tree.page_size
        start = max(window["cursor"], window["lo"])
        end = max(start, pre_len - ceil_align(max(WINDOW, ps), ps)) // ps * ps
        window["cursor"] = max(start, end)
        window["dead"] = max(window["dead"], window["cursor"])

    def stash(req: TurnReq, up_to: int, publishes: bool) -> None:
        """The scheduler's checkpoint up to ``up_to`` tokens; with a window the model follows:
        a publishing insert (``publishes``: the session's first turn) slides first, at the
        key's last position, below the prefix the tree owned until then; then the tree owns
        the published prompt."""
        world.checkpoint(req, up_to)
        if swa:
            assert req.session_id is not None
            window = windows[req.session_id]
            if publishes:  # at the key's last position: a bigram key is a token shorter
                advance(window, up_to - 1 - eagle)
            window["lo"] = max(window["lo"], int(req.kv.cache_protected_len))

    first_prompt: list[int] = []  # the first session's latest first turn's prompt

    def neighbour(i: int, token: int) -> int:
        """A plain request (no session) after turn ``i``: the first shares the session's first
        prompt (it matches the node that prompt was published to), every later one has fresh
        tokens, enough of them (20 + 2i, and one output) that the pool runs short and the tree
        evicts, least recently used first. Admitted, computed and finished into the tree as
        the scheduler does; the positions its match resumes over must hold their own tokens'
        KV. Returns the next fresh token."""
        size = 20 + 2 * i
        tokens = (first_prompt if i == 0 else []) + list(range(token, token + size))
        r = TurnReq(world, f"n{i}", tokens, None)
        prefix = admit(world, r, len(tokens))
        wrong = sum(kv.get(slot_at(r, pos)) != tokens[pos] for pos in range(prefix))
        if wrong:
            found.append((i, "plain-kv", wrong))
        world.extend_slots(r, len(tokens) + 1)
        fill = [*tokens, token + size]
        r.output_ids = token_array(fill[-1:])
        forward(r, fill, prefix, len(fill), len(fill))
        r.finished_reason = world.finish_reason(False)
        world.finish(r)
        checked(f"the plain request after turn {i}")
        return token + size + 1

    stand_ins = {sid: StreamingSessionStandIn(sid) for sid in ids}
    # each session's tokens: what its next turn continues from
    histories: dict[str, list[int]] = {sid: [] for sid in ids}
    # the hybrid world keeps no track slots: SGLang's no_buffer strategy, which it runs only
    # without overlap (under overlap its hybrid models take the extra buffer, whose tree caches
    # a tracked state), so the tree's states are checked until a turn overlaps
    overlapped = False

    running: list[TurnReq] = []  # the request of the batch, if one runs (SGLang's checks)
    own = scheduler_checks(world, running)

    def checked(where: str, req: TurnReq | None = None) -> dict[str, Any]:
        """:func:`check_held`, and the tree's Mamba states while no turn has overlapped;
        then SGLang's own scheduler checks, with ``req`` running (None: the scheduler idle)."""
        slots = check_held(world, sizes, where, ids)
        if hybrid and not overlapped:
            check_tree_states(world, where)
        if own is not None:
            running[:] = [] if req is None else [req]
            own.run()
        return slots

    token = 100
    for i, (new, outputs, reserve, stop, aborted, retracted, launched) in enumerate(plan):
        sid = ids[i % sessions]
        where = f"turn {i}"
        # a turn retracted while decoding had sampled no stop yet: it finishes at its last
        # sampled token
        stop = None if retracted else stop
        history = histories[sid]
        # a later session's first turn continues the first session's first prompt
        start = history or (first_prompt if sid != ids[0] else [])
        prompt = start + list(range(token, token + new))
        fill = prompt + list(range(token + new, token + new + outputs))
        token += new + outputs
        req = TurnReq(world, f"t{i}", prompt, stand_ins[sid])
        if not history and sid == ids[0]:  # the prompt it publishes is the others' to share
            first_prompt[:] = prompt
        prefix = resume(req, prompt, i)
        sampled = len(fill)
        kept = len(prompt) + (outputs if stop is None else min(stop, outputs))
        req.output_ids = token_array(fill[len(prompt) :])
        # the prefill: the prompt's KV and state, then its first sampled token; unless that
        # token finishes the turn the scheduler checkpoints it (a session's first turn
        # publishes its prompt into the tree, the session's lock moving onto its node). A
        # chunked prefill stashes every chunk but the last the same way
        # (``stash_chunked_request``), the first turn publishing chunk by chunk. A chunk ends
        # on a page boundary (``PrefillAdder``: the end floored to a page), the prefix need not
        done = prefix
        page = world.tree.page_size
        first_end = (prefix + chunk) // page * page
        for end in range(first_end, len(prompt), chunk) if chunk else ():
            world.extend_slots(req, end)
            forward(req, fill, done, end, end)
            stash(req, end, not history)
            checked(f"{where}, chunk ending at {end}", req)
            done = end
        world.extend_slots(req, len(prompt))
        forward(req, fill, done, len(prompt), len(prompt))
        if retracted or outputs > 1:
            stash(req, len(prompt), not history)
            checked(where, req)
        if retracted:  # the scheduler's release_req: no insert; the session keeps the record
            # under overlap the step computing the last sampled token is launched; a plain
            # retraction is of a decode without speculation, which reserves nothing
            committed = sampled - (retracted == "plain")
            reserve = 0 if retracted == "plain" else reserve
            world.extend_slots(req, committed + reserve)
            forward(req, fill, prefix, committed, committed)
            slide(req, sampled - 2, len(prompt))  # the preparation before the last sample
            overlapped = overlapped or retracted == "overlap"
            world.retract(req)
            slot: Any = checked(where).get(sid)
            require(
                slot is not None and slot.kv.kv_committed_len == committed,
                MODEL,
                f"turn {i}: the session did not keep the retracted turn's {committed} tokens",
            )
            allocated = int(slot.kv.kv_allocated_len)
            require(
                allocated == committed,
                "INV-SESSION-TRIMMED",  # the reserve went back
                f"turn {i} retracted: the session holds {allocated} slots for {committed}",
            )
            # admitted again over its fill ids (prompt and output): the key stops a token
            # short, so under overlap the session frees that token's slot to compute it again
            again = resume(req, fill, i)
            require(
                again == sampled - 1,
                MODEL,
                f"turn {i} resumed at {again} tokens after its retraction, not {sampled - 1}",
            )
            world.extend_slots(req, sampled + reserve)
            forward(req, fill, sampled - 1, sampled, sampled)
        else:
            # the finish: a speculative step's clock leaves out its bonus (the last token),
            # whose KV the next step computes; a step without speculation counts the launched
            # next step in its clock
            clock = sampled - 1 if reserve or not launched else sampled
            world.extend_slots(req, clock + reserve)
            forward(req, fill, prefix, clock, sampled if launched else clock)
            # the last decode preparation's slide came before the step that sampled the stop
            # (at a seqlen of ``kept - 1`` at the latest): a preparation reads the output ids
            # of processed results only, so under overlap the launched step's lags too
            slide(req, kept - 2, len(prompt))
            if reserve and not launched:  # the last verify's first rejected draft
                kv[slot_at(req, sampled - 1)] = REJECTED
        req.finished_len = None if stop is None else min(stop, outputs)
        req.finished_reason = world.finish_reason(aborted)
        allocated = req.kv.kv_allocated_len
        overlapped = overlapped or (not retracted and launched)
        world.finish(req)
        slot = checked(where).get(sid)
        if aborted:  # the session forgets its history; the next turn starts afresh
            require(slot is None, MODEL, f"the session kept aborted turn {i}")
            histories[sid] = []
        else:
            # the session keeps the tokens through the stop that the row holds (without
            # speculation a finish with no step launched holds all but the last)
            require(slot is not None, MODEL, f"the session kept nothing of turn {i}")
            held = min(kept, allocated)
            lengths = (int(slot.kv.kv_committed_len), int(slot.kv.kv_allocated_len))
            require(
                lengths == (held, held),
                "INV-SESSION-TRIMMED",
                f"turn {i}: the session holds (committed, allocated) {lengths}, not "
                f"{held} tokens through the stop",
            )
            histories[sid] = fill[:kept]
        if neighbours:
            token = neighbour(i, token)
    for sid in ids:
        world.cache.session.release_session(sid)
    # everything is free or the tree's (no session may hold anything now), and nothing is
    # locked any more
    check_held(world, sizes, "release_session", ())
    protected = tree_full(world)[1]
    require(protected == 0, "INV-LOCKS", f"{protected} slots still locked after release_session")
    if own is not None:
        running.clear()
        own.run()
    return found


def scheduler_checks(world: World, running: list[TurnReq]) -> SchedulerChecks | None:
    """SGLang's own scheduler checks over ``world`` (:mod:`kvpool.sglang.scheduler_checker`;
    None for a release without them). The batch is ``running`` as it is at each run (the
    requests that hold a row of their own: SGLang's checker leaves out one running on a
    session's record); idle when it is empty; the session records are the tree's own."""
    if not ships_checker(world.modules):
        return None
    cache = world.cache

    def state() -> SchedulerState:
        return SchedulerState(owners=[(r.rid, r.kv) for r in running], idle=not running)

    return SchedulerChecks(
        world.modules, tree=cache, allocator=cache.token_to_kv_pool_allocator,
        pool=cache.req_to_token_pool, page_size=world.tree.page_size, swa=is_swa(world),
        mamba=getattr(world.pool.impl, "mamba_allocator", None) is not None, state=state,
    )  # fmt: skip


def check_tree_states(world: World, where: object) -> None:
    """Every Mamba state SGLang's tree caches has consumed exactly the tokens of its node's
    path from the root (``INV-MAMBA-STATE-INTEGRITY``): a later request resuming at that node
    continues from it. ``where`` goes into a violation's message."""
    snap = world.tree.snapshot()
    nodes = {node.node_id: node for node in snap.nodes}
    for node in snap.nodes[1:]:
        if node.mamba_value is None:
            continue
        depth, walk = 0, node
        while walk.parent_id is not None:
            depth += len(walk.key)
            walk = nodes[walk.parent_id]
        (tag,) = world.pool.mamba_pool.state_tags([int(node.mamba_value)])
        require(
            tag == depth,
            "INV-MAMBA-STATE-INTEGRITY",
            f"the tree's node {node.node_id} ends at {depth} tokens, its Mamba state has "
            f"consumed {tag}, after {where}",
        )


def cached_states(world: World) -> int:
    """The Mamba states SGLang's tree holds (an aborted turn's release caches its prompt and
    state, as any finished request's does)."""
    snap = world.tree.snapshot()
    return sum(n.mamba_value is not None for n in snap.nodes[1:])
