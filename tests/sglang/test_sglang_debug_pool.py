"""Opt-in (``--run-sglang-wheel``): the glue managers build SGLang's paged allocators with its
memory-pool debug asserts on (``SGLANG_DEBUG_MEMORY_POOL``, :mod:`kvpool.sglang.debug_pool`),
both releases; the component allocators and anything built outside the scope keep SGLang's
default build; ``+no-debug-memory-pool`` leaves them off; the glue campaigns pass with them
on; and the asserts fire, inside the call, on what they are for: a double free, a last slot
that disagrees with the length, part of a page."""

from __future__ import annotations

import dataclasses
from typing import Any

import pytest
import torch

from kvpool.config import PoolConfig
from kvpool.sglang import implementation
from kvpool.sglang.allocators import SGLangAllocator, call_alloc_extend
from kvpool.sglang.debug_pool import DEBUG_SWITCH, DebugSwitch, debug_asserts
from kvpool.sglang.implementation import from_spec
from kvpool.sglang.loader import load_sglang
from kvpool.testing.campaign import run_machine
from kvpool.testing.implementations import reference_implementation

pytestmark = pytest.mark.sglang_wheel

RELEASES = ("0.5.16", "0.5.23")
PAGED = PoolConfig(size=64, page_size=4)


def _paged_allocators(manager: Any) -> list[Any]:
    """SGLang's paged allocators under a glue manager (the SWA allocator's two included)."""
    impl = manager.token_to_kv_pool_allocator.impl
    subs = [getattr(impl, name, None) for name in ("full_attn_allocator", "swa_attn_allocator")]
    return [a for a in [impl, *subs] if a is not None and hasattr(a, "debug_mode")]


@pytest.mark.parametrize("release", RELEASES)
@pytest.mark.parametrize("sliding_window", [None, 8])
def test_glue_managers_build_sglangs_allocators_in_debug_mode(
    release: str, sliding_window: int | None
) -> None:
    impl = implementation(release)
    assert impl.rules is not None
    config = PoolConfig(size=64, page_size=4, sliding_window=sliding_window, rules=impl.rules)
    make = impl.manager if sliding_window is None else impl.swa_manager
    assert make is not None
    allocators = _paged_allocators(make(config))
    assert allocators and all(a.debug_mode for a in allocators)
    quiet = from_spec(f"{release}+no-debug-memory-pool")
    make = quiet.manager if sliding_window is None else quiet.swa_manager
    assert make is not None
    assert not any(a.debug_mode for a in _paged_allocators(make(config)))


@pytest.mark.parametrize("release", RELEASES)
def test_the_component_allocators_keep_sglangs_default_build(release: str) -> None:
    """kvpool's allocator campaign calls ``alloc`` with part of a page, which SGLang's default
    build floors (the rules compare that) and its debug build refuses."""
    impl = implementation(release)
    assert impl.allocator is not None and impl.swa_allocator is not None
    assert not impl.allocator(PAGED).impl.debug_mode
    assert not impl.swa_allocator(PAGED).impl.full_attn_allocator.debug_mode
    assert len(impl.allocator(PAGED).alloc(6)) == 4  # one page of the 1.5 asked for


def test_the_switch_is_scoped_and_answers_only_its_own_name() -> None:
    modules = load_sglang("0.5.23")
    switch = modules.module("sglang.srt.mem_cache.allocator.paged").get_bool_env_var
    assert isinstance(switch, DebugSwitch)
    with debug_asserts(modules):
        inside = SGLangAllocator(modules, 64, 4).impl.debug_mode
        assert switch(DEBUG_SWITCH) and not switch("SGLANG_SOMETHING_ELSE")
        with debug_asserts(modules, on=False):
            assert not SGLangAllocator(modules, 64, 4).impl.debug_mode
        assert switch(DEBUG_SWITCH)  # the inner scope gave the outer value back
    assert inside and not switch(DEBUG_SWITCH)
    assert not SGLangAllocator(modules, 64, 4).impl.debug_mode


def _debug_allocator(release: str) -> Any:
    modules = load_sglang(release)
    with debug_asserts(modules):
        return SGLangAllocator(modules, 64, 4, naive_extend=True)


@pytest.mark.parametrize("release", RELEASES)
def test_a_double_free_fails_inside_the_free(release: str) -> None:
    allocator = _debug_allocator(release)
    slots = allocator.alloc(8)
    allocator.free(slots)
    with pytest.raises(AssertionError):
        allocator.free(slots)


def test_without_debug_mode_sglang_takes_the_double_free() -> None:
    modules = load_sglang("0.5.23")
    allocator = SGLangAllocator(modules, 64, 4)
    slots = allocator.alloc(8)
    allocator.free(slots)
    allocator.free(slots)  # no error: the pages are now twice on the free list
    assert allocator.available_size() == 64 + 8  # 8 slots more than the pool has


@pytest.mark.parametrize("release", RELEASES)
def test_a_last_slot_that_disagrees_with_the_length_fails_the_extend(release: str) -> None:
    allocator = _debug_allocator(release)
    prefix = allocator.alloc(4)  # one full page: the next token starts a page
    last = int(prefix[-1])
    ok = call_alloc_extend(allocator.impl, 3, [4], [4], [7], [7], [last])
    assert ok is not None and len(ok) == 3
    with pytest.raises(AssertionError):  # last slot of a 4-token prefix, length said 5
        call_alloc_extend(allocator.impl, 3, [5], [5], [8], [8], [last])


@pytest.mark.parametrize("release", RELEASES)
def test_part_of_a_page_fails_the_alloc(release: str) -> None:
    with pytest.raises(AssertionError):
        _debug_allocator(release).alloc(6)


@pytest.mark.parametrize("release", RELEASES)
def test_the_glue_campaigns_pass_in_debug_mode(release: str) -> None:
    """The manager campaign (page sizes 1 and above) over SGLang's glue with the asserts on."""
    candidate = implementation(release)
    result = run_machine("manager", reference_implementation(), candidate, 3600.0, seed=7,
                         max_runs=16)  # fmt: skip
    assert result.failure is None, result.failure.report
    assert result.steps >= 16 * 50
    paged = sum(n for key, n in result.page_sizes.items() if key != "page_size=1")
    assert paged >= 4, result.page_sizes  # runs whose allocators have the asserts


def _freeing_twice(spec: str) -> Any:
    """SGLang's glue lifecycle whose paged allocator puts every page it frees on its free list
    twice (0.5.23's ``_release_page_ids``, under ``free``, ``free_page_ids``, ``free_segment``
    and a group's end); page size 1 as released (its token allocator has no debug asserts)."""
    impl = from_spec(spec)
    make = impl.manager
    assert make is not None

    def build(config: PoolConfig, *args: Any, **kwargs: Any) -> Any:
        mm = make(config, *args, **kwargs)
        if config.page_size == 1:
            return mm
        allocator = mm.token_to_kv_pool_allocator.impl
        release = allocator._release_page_ids

        def twice(*page_ids: torch.Tensor) -> None:
            release(*page_ids)
            release(*page_ids)

        allocator._release_page_ids = twice
        return mm

    return dataclasses.replace(impl, manager=build)


def test_a_double_free_is_caught_inside_the_step_that_makes_it() -> None:
    """With the asserts the campaign fails inside the freeing call, with SGLang's assertion;
    without them kvpool's invariants find it after the step."""
    found = {}
    for spec in ("0.5.23", "0.5.23+no-debug-memory-pool"):
        result = run_machine("manager", reference_implementation(), _freeing_twice(spec),
                             3600.0, seed=7, max_runs=16)  # fmt: skip
        assert result.failure is not None
        found[spec] = result.failure
    debug, quiet = found["0.5.23"], found["0.5.23+no-debug-memory-pool"]
    assert debug.detector == "crash" and "AssertionError" in debug.report, debug.report
    assert quiet.detector != "crash", quiet.report


def test_the_session_worlds_run_sglangs_allocators_in_debug_mode() -> None:
    """SGLang's streaming sessions (``kvpool sessions``) are its scheduler's calls too."""
    from kvpool.sglang import session_world

    full = session_world.build("python", hybrid=False, page_size=4)
    assert full.allocator.impl.debug_mode
    swa = session_world.build_swa("python", page_size=4)
    assert swa.allocator.impl.swa_attn_allocator.debug_mode
    assert swa.allocator.impl.full_attn_allocator.debug_mode
