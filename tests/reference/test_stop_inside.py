"""A stop inside the last speculative run (``finish``'s ``finished_lens``), on both twins.

A speculative step commits its whole accepted run, so a stop token may lie before the last
committed token. What the release keeps is ``Rules.release_upto``'s choice: the tokens through
the stop (kvpool, SGLang 0.5.23's ``owned_kv_len``) or every committed token (SGLang 0.5.16,
whose tree then caches an overshoot the client never received). A session turn hands its
session only the tokens through the stop under every preset. Each case runs both twins in
lockstep (:class:`~kvpool.testing.lockstep_driver.Lockstep`: every invariant after every step,
results and snapshots compared).
"""

from __future__ import annotations

import pytest

from kvpool.config import PoolConfig
from kvpool.constants import floor_align
from kvpool.errors import ConfigError, InvalidArgumentError
from kvpool.rules import Rules
from kvpool.testing.campaign import run_machine
from kvpool.testing.factories import optimized_factory, reference_factory
from kvpool.testing.implementations import optimized_implementation, reference_implementation
from kvpool.testing.lockstep_driver import Lockstep
from kvpool.testing.swarm import Op

PRESETS = {
    "kvpool": Rules(),
    "0.5.16": Rules.for_sglang("0.5.16"),
    "0.5.23": Rules.for_sglang("0.5.23"),
}
PROMPT = [1, 2, 3, 4, 5, 6]
RUN = [7, 8, 9, 10, 11]
"""A prompt of 6 tokens, then one speculative step that accepts 5: 11 committed tokens."""


def _pair(rules: Rules, page_size: int, **fields: object) -> Lockstep:
    config = PoolConfig(size=48, page_size=page_size, req_pool_size=4, max_context_len=64,
                        disable_radix_cache=False, rules=rules, **fields)  # type: ignore[arg-type]  # fmt: skip
    return Lockstep(reference_factory, optimized_factory("torch"), config)


def _run(pair: Lockstep, *ops: Op) -> list[object]:
    return [pair.run(op) for op in ops]


@pytest.mark.parametrize("page_size", [1, 4])
@pytest.mark.parametrize("preset", sorted(PRESETS))
def test_the_release_keeps_what_the_rules_say(preset: str, page_size: int) -> None:
    rules = PRESETS[preset]
    pair = _pair(rules, page_size)
    stop = 1  # the client receives output token 7 only
    _run(pair, Op("new_req", ("a", PROMPT)), Op("extend", (["a"],)),
         Op("spec_step", (["a"], [RUN], 3)),
         Op("finish", (["a"],), (("is_insert", True), ("finished_lens", [stop]))))  # fmt: skip
    kept = len(PROMPT) + stop if rules.release_upto == "owned" else len(PROMPT) + len(RUN)
    cached = floor_align(kept, page_size)
    snap = pair.snap_a
    assert snap.tree.evictable_size == cached
    assert sum(len(n.key) for n in snap.tree.nodes) == cached
    # everything else went back: the overshoot with the over-allocation
    assert snap.allocator.available_size() == snap.max_total_num_tokens - cached
    # a follow-up sending everything (overshoot included) matches only what was kept
    tokens = PROMPT + RUN + [99]
    matched = _run(pair, Op("new_req", ("b", tokens)), Op("match_prefix", ("b",)))[1]
    assert matched == cached


@pytest.mark.parametrize("preset", sorted(PRESETS))
def test_a_session_turn_hands_over_the_tokens_through_the_stop(preset: str) -> None:
    pair = _pair(PRESETS[preset], 4)
    stop = 2
    _run(pair, Op("open_session", ("s",)),
         Op("new_req", ("t1", PROMPT), (("session_id", "s"),)), Op("extend", (["t1"],)),
         Op("spec_step", (["t1"], [RUN], 3)),
         Op("finish", (["t1"],), (("finished_lens", [stop]),)))  # fmt: skip
    (session,) = pair.snap_a.sessions
    assert session.kv_committed_len == len(PROMPT) + stop
    # the hand-over freed the overshoot with the over-allocation: from the stop's page on
    assert session.kv_allocated_len == session.kv_committed_len
    held = -(-session.kv_committed_len // 4) * 4  # the stop's page stays whole
    assert pair.snap_a.allocator.available_size() == pair.snap_a.max_total_num_tokens - held
    # the next turn continues from the stop: its KV tags are those of the kept tokens
    matched = _run(pair, Op("new_req", ("t2", [40, 41]), (("session_id", "s"),)),
                   Op("match_prefix", ("t2",)), Op("extend", (["t2"],)))[1]  # fmt: skip
    assert matched == len(PROMPT) + stop
    (turn,) = pair.snap_a.reqs
    assert turn.input_len == len(PROMPT) + stop + 2
    assert turn.kv_tags == turn.expected_tags


def test_a_stop_at_the_last_token_changes_nothing() -> None:
    """``finished_lens`` naming every output token is the plain finish, on both twins."""
    snaps = []
    for stops in (None, [len(RUN)]):
        pair = _pair(Rules(), 4)
        kwargs = () if stops is None else (("finished_lens", stops),)
        _run(pair, Op("new_req", ("a", PROMPT)), Op("extend", (["a"],)),
             Op("spec_step", (["a"], [RUN], 3)), Op("finish", (["a"],), kwargs))  # fmt: skip
        snaps.append(pair.snap_a)
    assert snaps[0] == snaps[1]


@pytest.mark.parametrize("preset", sorted(PRESETS))
def test_a_hybrid_release_caches_no_state_past_a_stop(preset: str) -> None:
    """A hybrid (Mamba) model's state holds every committed token: under "owned" nothing is
    cached for a request that stopped early (SGLang 0.5.23 skips its insert); under 0.5.16's
    "committed" the whole run, overshoot included, enters the tree with its state."""
    rules = PRESETS[preset]
    pair = _pair(rules, 1, mamba_slots=5)
    ops = (Op("new_req", ("a", PROMPT)), Op("extend", (["a"],)),
           Op("spec_step", (["a"], [RUN], 3)),
           Op("finish", (["a"],), (("is_insert", True), ("finished_lens", [1]))),
           Op("new_req", ("b", [*PROMPT, *RUN, 99])), Op("match_prefix", ("b",)))  # fmt: skip
    matched = _run(pair, *ops)[-1]
    assert matched == (0 if rules.release_upto == "owned" else len(PROMPT) + len(RUN))


def _stopped(fields: dict[str, object], session: bool) -> list[object]:
    """Both twins' SWA or hybrid managers, each with request ``a`` (a session turn when
    ``session``) after a prompt of 6 and one speculative step accepting 5."""
    managers = []
    for impl in (reference_implementation(), optimized_implementation()):
        build = impl.swa_manager if "sliding_window" in fields else impl.manager
        assert build is not None
        mm = build(PoolConfig(size=48, page_size=1, req_pool_size=4, max_context_len=64,
                              **fields))  # type: ignore[arg-type]  # fmt: skip
        if session:
            mm.open_session("s")
        mm.new_req("a", PROMPT, session_id="s" if session else None)
        mm.extend(["a"])
        mm.spec_step(["a"], [RUN], 3)
        managers.append(mm)
    return managers


@pytest.mark.parametrize(
    ("fields", "session", "why"),
    [({"mamba_slots": 3, "disable_radix_cache": True}, True, "hybrid"),
     ({"sliding_window": 4, "num_layers": 2, "disable_radix_cache": True}, False, "window of 4")],
)  # fmt: skip
def test_unmodelled_stops_are_refused_and_change_nothing(
    fields: dict[str, object], session: bool, why: str
) -> None:
    """A hybrid model's session turn refuses any stop before its last output token; a
    sliding window manager a stop a whole window or more back (here 4 of a window of 4)."""
    for mm in _stopped(fields, session):
        before = mm.snapshot()  # type: ignore[attr-defined]
        with pytest.raises(ConfigError, match=why):
            mm.finish(["a"], True, [1])  # type: ignore[attr-defined]
        assert mm.snapshot() == before  # type: ignore[attr-defined]
        mm.finish(["a"], True, [len(RUN)])  # type: ignore[attr-defined]  # the plain finish


@pytest.mark.parametrize("page_size", [1, 4])
@pytest.mark.parametrize("preset", sorted(PRESETS))
def test_a_sliding_window_release_keeps_what_the_rules_say(preset: str, page_size: int) -> None:
    """The same stop on the SWA managers (radix cache on, a window of 8): the stop lies less
    than a window back, so the tokens through it keep a live window."""
    rules = PRESETS[preset]
    config = PoolConfig(size=64, page_size=page_size, req_pool_size=4, max_context_len=64,
                        disable_radix_cache=False, sliding_window=8, num_layers=2,
                        rules=rules)  # fmt: skip
    ref, opt = reference_implementation().swa_manager, optimized_implementation().swa_manager
    assert ref is not None and opt is not None
    pair = Lockstep(ref, opt, config)
    stop = 2
    ops = (Op("new_req", ("a", PROMPT)), Op("extend", (["a"],)),
           Op("spec_step", (["a"], [RUN], 3)),
           Op("finish", (["a"],), (("is_insert", True), ("finished_lens", [stop]))),
           Op("new_req", ("b", [*PROMPT, *RUN, 99])), Op("match_prefix", ("b",)))  # fmt: skip
    matched = _run(pair, *ops)[-1]
    kept = len(PROMPT) + stop if rules.release_upto == "owned" else len(PROMPT) + len(RUN)
    assert matched == floor_align(kept, page_size)


@pytest.mark.parametrize("bad", [[len(RUN) + 1], [-1], [1, 1], [True], ["1"], 3, "1"])
def test_a_bad_stop_is_refused_before_any_change(bad: object) -> None:
    pair = _pair(Rules(), 4)
    _run(pair, Op("new_req", ("a", PROMPT)), Op("extend", (["a"],)),
         Op("spec_step", (["a"], [RUN], 3)))  # fmt: skip
    for mm in (pair.a, pair.b):
        before = mm.snapshot()
        with pytest.raises(InvalidArgumentError):
            mm.finish(["a"], True, bad)
        assert mm.snapshot() == before


@pytest.mark.slow
@pytest.mark.parametrize("machine", ["manager", "swa_manager"])
def test_the_campaign_stops_requests_inside_their_runs(machine: str) -> None:
    """The lifecycle machines draw stops for the twins (plain finishes and session turns), and
    the twins agree on them."""
    result = run_machine(machine, reference_implementation(), optimized_implementation(),
                         seconds=300.0, seed=7, max_runs=60)  # fmt: skip
    assert result.failure is None, result.failure
    for tag in ("finish:stop-inside", "session:stop-inside"):
        assert result.coverage[tag] > 0, (tag, result.coverage)
