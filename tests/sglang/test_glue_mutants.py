"""Mutants of SGLang's scheduler glue (:mod:`kvpool.sglang.glue_mutants`).

Without the wheel: the mutants of a small glue-like module (which nodes mutate, which
statements may be deleted, what is left alone) and :func:`install` on modules registered as a
loaded SGLang package (the mutant replaces every binding of the original, a ``from ... import``
included, and behaves as mutated). Opt-in (``--run-sglang-wheel``): on SGLang 0.5.23's own
glue, the campaign as released passes and reaches the release path, and faults the field
reports (a release that forgets the unlock, the row's free or the private slots' free) are
killed by a named invariant, and so is an allocation that forgets the committed length."""

from __future__ import annotations

import dataclasses
import sys
import textwrap
import types
from collections.abc import Iterator
from typing import Any

import pytest

from kvpool.sglang import glue_mutants as gm

GLUE = textwrap.dedent(
    """\
    from __future__ import annotations

    import logging

    logger = logging.getLogger(__name__)


    def release(pool, req, n: int) -> int:
        \"\"\"A docstring.\"\"\"
        assert n >= 0, f"bad {n}"
        if n > 0 and req.held:
            pool.free(req.row)
            req.held = False
        logger.debug("released %s", n)
        req.count += 1
        return n - 1


    @triton.jit
    def kernel(x):
        return x + 1
    """
)


class _Source:
    def __init__(self, texts: dict[str, str]) -> None:
        self.texts = texts

    def read(self, path: str) -> str:
        return self.texts.get(path, "")


class _Modules:
    """What :mod:`kvpool.sglang.glue_mutants` asks of an :class:`SGLangModules`."""

    def __init__(self, prefix: str) -> None:
        self.prefix = prefix
        self.source = _Source({"sglang/srt/mem_cache/allocation.py": GLUE})

    def module(self, dotted: str) -> types.ModuleType:
        return sys.modules[f"{self.prefix}.{dotted}"]


@pytest.fixture
def loaded() -> Iterator[_Modules]:
    """A fake loaded SGLang package: ``allocation`` (the glue module above, its kernel left
    out), ``common`` (empty) and ``user``, which imported ``release`` from ``allocation``."""
    prefix = "_kvpool_sglang_test_glue_mutants"
    names = {
        "allocation": "sglang.srt.mem_cache.allocation",
        "common": "sglang.srt.mem_cache.common",
    }
    made = []
    for dotted in (prefix, *names.values(), "user"):
        name = dotted if dotted == prefix else f"{prefix}.{dotted}"
        module = types.ModuleType(name)
        sys.modules[name] = module
        made.append(name)
    allocation = sys.modules[f"{prefix}.{names['allocation']}"]
    code = compile(GLUE.split("@triton.jit")[0], "fake_allocation.py", "exec")
    exec(code, vars(allocation))
    sys.modules[f"{prefix}.user"].release = allocation.release  # type: ignore[attr-defined]
    try:
        yield _Modules(prefix)
    finally:
        for name in made:
            del sys.modules[name]


class _Req:
    def __init__(self) -> None:
        self.held, self.row, self.count = True, 3, 0


class _Pool:
    def __init__(self) -> None:
        self.freed: list[int] = []

    def free(self, row: int) -> None:
        self.freed.append(row)


def test_mutants_of_a_glue_function(loaded: _Modules) -> None:
    found = gm.mutants(loaded)
    assert {m.function for m in found} == {"release"}  # the kernel is left alone
    changes = {(m.operator, m.line, m.change) for m in found}
    assert ("ROR", 11, "> -> >=") in changes
    assert ("LCR", 11, "and -> or") in changes
    assert ("NEG", 11, "if not (...)") in changes
    assert ("SDL", 12, "delete pool.free(req.row)") in changes
    assert ("SDL", 13, "delete req.held = False") in changes
    assert ("CRP", 13, "False -> True") in changes
    assert ("SDL", 15, "delete req.count += 1") in changes
    assert {("CRP", 16, "1 -> 2"), ("CRP", 16, "1 -> 0"), ("AOR", 16, "- -> +")} <= changes
    # the assertion, its message, the docstring and the logging call are left alone
    assert not [m for m in found if m.line in (9, 10, 14)], found
    assert len({m.name for m in found}) == len(found)


def test_install_rebinds_every_import_and_mutates(loaded: _Modules) -> None:
    found = {m.change: m for m in gm.mutants(loaded)}
    allocation = loaded.module("sglang.srt.mem_cache.allocation")
    user: Any = sys.modules[f"{loaded.prefix}.user"]
    pool, req = _Pool(), _Req()
    assert user.release(pool, req, 2) == 1 and pool.freed == [3] and req.count == 1
    mutated = gm.install(loaded, found["delete pool.free(req.row)"])
    assert allocation.release is mutated and user.release is mutated
    pool, req = _Pool(), _Req()
    assert user.release(pool, req, 2) == 1
    assert pool.freed == [] and not req.held  # the free is gone, the rest as before


def test_install_of_a_counted_function_rebinds_its_wrapper(loaded: _Modules) -> None:
    """kvpool's call counters wrap glue functions (``__wrapped__``): a module holding the
    wrapper gets the mutant too."""
    allocation: Any = loaded.module("sglang.srt.mem_cache.allocation")
    original = allocation.release

    def counted(*args: Any) -> Any:
        return original(*args)

    counted.__wrapped__ = original  # type: ignore[attr-defined]
    allocation.release = counted
    mutant = next(m for m in gm.mutants(loaded) if m.change == "- -> +")
    mutated = gm.install(loaded, mutant)
    assert allocation.release is mutated
    assert mutated(_Pool(), _Req(), 2) == 3


WHEEL_MUTANTS = {
    "delete tree_cache.unlock(req.lock)": "INV-LOCKS",
    "delete tree_cache.req_to_token_pool.free(req)": "INV-ROW-OWNERS",
    "delete tree_cache.free_kv_row(req.kv, [(req.kv.cache_protected_len,": "INV-POOL-ACCOUNTING",
    "delete _release_overallocated_kv_indices(req, owned_kv_len, req.kv.": "INV-POOL-ACCOUNTING",
}
"""Faults of 0.5.23's ``release_kv_cache`` (the kinds the field reports: a lock, a row, the
private slots, the speculative over-allocation not given back) and the invariant that must
kill each."""


@pytest.mark.sglang_wheel
def test_release_faults_in_sglangs_glue_are_killed() -> None:
    from kvpool.sglang.loader import load_sglang
    from kvpool.testing.sandbox import Sandbox

    modules = load_sglang("0.5.23")
    baseline = gm.Trial("0.5.23", "manager", 1, 40)
    reached, passed = gm.lines_reached(modules, baseline)
    assert passed.detector is None and passed.steps == 40 * 60
    release = {m.change: m for m in gm.mutants(modules) if m.function == "release_kv_cache"}
    assert set(WHEEL_MUTANTS) <= set(release)
    with Sandbox(gm.play_quietly, gm.warm) as box:
        for change, detector in WHEEL_MUTANTS.items():
            mutant = release[change]
            assert ("common", mutant.line) in reached
            outcome = box.call(dataclasses.replace(baseline, mutant=mutant), 600)
            assert isinstance(outcome, gm.Outcome), (change, outcome)
            assert outcome.detector == detector, (change, outcome)


@pytest.mark.sglang_wheel
def test_a_committed_length_the_glue_forgets_is_killed() -> None:
    """0.5.23's allocation glue writes each request's committed length; kvpool's stand-in
    keeps the write aside and checks it against the step's (``check_committed``): a glue that
    forgets it fails ``INV-LENGTHS`` (before the check, both mutants survived)."""
    from kvpool.sglang.loader import load_sglang
    from kvpool.testing.sandbox import Sandbox

    wanted = {
        ("alloc_for_extend", "delete req.kv.kv_committed_len = seq_len"),
        ("alloc_for_decode_default", "delete req.kv.kv_committed_len += token_per_req"),
    }
    found = [m for m in gm.mutants(load_sglang("0.5.23")) if (m.function, m.change) in wanted]
    assert len(found) == 2
    with Sandbox(gm.play_quietly, gm.warm) as box:
        for mutant in found:
            outcome = box.call(gm.Trial("0.5.23", "manager", 1, 40, mutant), 600)
            assert isinstance(outcome, gm.Outcome) and outcome.detector == "INV-LENGTHS", outcome


DROPPED_WRITES = {
    ("release_kv_cache", "delete req.kv.mark_kv_released()"): "INV-LENGTHS",
    ("release_kv_cache", "delete req.lock = None"): "INV-LOCKS",
    ("checkpoint_kv_cache", "delete req.prefix_len = req.extend_end"): "INV-LENGTHS",
    ("alloc_for_spec_decode",
     "delete req.kv.kv_allocated_len = max(req.kv.kv_allocated_len, nxt_k"): "INV-LENGTHS",
}  # fmt: skip
"""Writes of 0.5.23's glue that kvpool's lifecycle makes itself right after, so the stand-in
keeps them aside and checks them (``check_released``, ``check_resume``, ``check_allocated``):
each mutant that deletes one survived before the check and must die with its invariant."""


@pytest.mark.sglang_wheel
def test_writes_kvpool_makes_itself_are_still_checked() -> None:
    from kvpool.sglang.loader import load_sglang
    from kvpool.testing.sandbox import Sandbox

    found = {(m.function, m.change): m for m in gm.mutants(load_sglang("0.5.23"))
             if (m.function, m.change) in DROPPED_WRITES}  # fmt: skip
    assert set(found) == set(DROPPED_WRITES)
    with Sandbox(gm.play_quietly, gm.warm) as box:
        for key, detector in DROPPED_WRITES.items():
            outcome = box.call(gm.Trial("0.5.23", "manager", 1, 40, found[key]), 600)
            assert isinstance(outcome, gm.Outcome), (key, outcome)
            assert outcome.detector == detector, (key, outcome)
