"""Bad inputs to the memory managers of both twins (the request lifecycle) and bad
configurations: unknown requests and sessions, wrong states, non-integer tokens, counts that do
not match, out of memory; judged on the whole manager snapshot."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

import pytest

from kvpool.config import PoolConfig
from kvpool.errors import (
    ConfigError,
    ContextOverflowError,
    InvalidArgumentError,
    OutOfMemoryError,
    PageSizeError,
    RequestStateError,
    UnknownRequestError,
)
from tests.bad_inputs.harness import Case, Twin, fixture, modes_of, params, run_case

CONFIG = PoolConfig(size=8, page_size=4, req_pool_size=4, max_context_len=16)
"""Two pages: request ``a`` (6 tokens, running) fills them."""


def mm(tw: Twin) -> SimpleNamespace:
    """``a`` running with 6 tokens (pool full), ``w`` waiting with 5, session ``s`` open."""
    m = tw.new("MemoryManager", CONFIG)
    m.new_req("a", [1, 2, 3, 4, 5, 6])
    m.extend(["a"])
    m.new_req("w", [7, 8, 9, 10, 11])
    m.open_session("s")
    return fixture(m)


def in_session(tw: Twin) -> SimpleNamespace:
    """Session ``s`` busy with its turn ``t`` (running)."""
    m = tw.new("MemoryManager", PoolConfig(size=32, page_size=4, max_context_len=16))
    m.open_session("s")
    m.new_req("t", [1, 2, 3], None, "s")
    m.extend(["t"])
    return fixture(m)


def full_row(tw: Twin) -> SimpleNamespace:
    """``f`` running with all 16 columns of its row used."""
    m = tw.new("MemoryManager", PoolConfig(size=32, page_size=4, max_context_len=16))
    m.new_req("f", list(range(1, 17)))
    m.extend(["f"])
    return fixture(m)


def swa_mm(tw: Twin) -> SimpleNamespace:
    """An SWA manager (window 4, page size 4) with ``a`` running."""
    config = PoolConfig(size=32, page_size=4, sliding_window=4, disable_radix_cache=True)
    m = tw.new("SWAMemoryManager", config)
    m.new_req("a", [1, 2, 3, 4, 5])
    m.extend(["a"])
    return fixture(m)


def call(method: str, *args: Any) -> Any:
    """``manager.method(*args)``."""
    return lambda tw, fx: getattr(fx.target, method)(*args)


def build(config: PoolConfig, cls: str = "MemoryManager") -> Any:
    return lambda tw, fx: tw.new(cls, config)


def config(**fields: Any) -> Any:
    """Building a manager from ``PoolConfig(**fields)`` (the config refuses itself)."""
    return lambda tw, fx: tw.new("MemoryManager", PoolConfig(**fields))


LIFECYCLE = [
    Case("decode-string-token", mm, call("decode", ["a"], ["x"]), InvalidArgumentError),
    Case("decode-float-token", mm, call("decode", ["a"], [1.5]), InvalidArgumentError),
    Case("decode-none-token", mm, call("decode", ["a"], [None]), InvalidArgumentError),
    Case("decode-huge-token", mm, call("decode", ["a"], [2**63]), InvalidArgumentError),
    Case("extend-float-chunk", mm, call("extend", ["w"], [2.5]), InvalidArgumentError),
    Case("extend-bool-chunk", mm, call("extend", ["w"], [True]), InvalidArgumentError),
    Case("extend-string-chunk", mm, call("extend", ["w"], ["2"]), InvalidArgumentError),
    Case("decode-token-past-int32", mm, call("decode", ["a"], [2**31]), InvalidArgumentError),
    Case("decode-negative-token", mm, call("decode", ["a"], [-1]), InvalidArgumentError),
    Case("decode-bool-token", mm, call("decode", ["a"], [True]), InvalidArgumentError),
    Case("new-req-huge-token", mm, call("new_req", "n", [1, 2**40]), InvalidArgumentError),
    Case("new-req-bool-token", mm, call("new_req", "n", [False, 1]), InvalidArgumentError),
    Case("new-req-negative-token", mm, call("new_req", "n", [-3]), InvalidArgumentError),
    Case("decode-token-count", mm, call("decode", ["a"], [1, 2]), InvalidArgumentError),
    Case("decode-unknown-request", mm, call("decode", ["zz"], [1]), UnknownRequestError),
    Case("decode-waiting-request", mm, call("decode", ["w"], [1]), RequestStateError),
    Case("decode-request-twice", mm, call("decode", ["a", "a"], [1, 2]), InvalidArgumentError),
    Case("decode-past-context", full_row, call("decode", ["f"], [1]), ContextOverflowError),
    Case("new-req-duplicate", mm, call("new_req", "a", [1]), InvalidArgumentError),
    Case("new-req-empty", mm, call("new_req", "n", []), InvalidArgumentError),
    Case("new-req-string-tokens", mm, call("new_req", "n", ["x"]), InvalidArgumentError),
    Case("new-req-float-tokens", mm, call("new_req", "n", [1.5]), InvalidArgumentError),
    Case("new-req-too-long", mm, call("new_req", "n", [1] * 17), ContextOverflowError),
    Case("new-req-unknown-session", mm, call("new_req", "n", [1], None, "zz"), UnknownRequestError),
    Case("match-unknown-request", mm, call("match_prefix", "zz"), UnknownRequestError),
    Case("extend-unknown-request", mm, call("extend", ["zz"]), UnknownRequestError),
    Case("extend-running-not-chunked", mm, call("extend", ["a"]), RequestStateError),
    Case("extend-chunk-size-0", mm, call("extend", ["w"], [0]), InvalidArgumentError),
    Case("extend-chunk-sizes-count", mm, call("extend", ["w"], [1, 2]), InvalidArgumentError),
    Case("extend-out-of-memory", mm, call("extend", ["w"]), OutOfMemoryError),
    Case("finish-unknown-request", mm, call("finish", ["zz"]), UnknownRequestError),
    Case("finish-waiting-request", mm, call("finish", ["w"]), RequestStateError),
    Case("finish-request-twice", mm, call("finish", ["a", "a"]), InvalidArgumentError),
    Case("abort-unknown-request", mm, call("abort", "zz"), UnknownRequestError),
    Case("retract-waiting-request", mm, call("retract", "w"), RequestStateError),
    Case("open-session-twice", mm, call("open_session", "s"), InvalidArgumentError),
    Case(
        "new-req-busy-session",
        in_session,
        call("new_req", "u", [4], None, "s"),
        RequestStateError,
    ),
    Case("close-busy-session", in_session, call("close_session", "s"), RequestStateError),
    Case("close-unknown-session", mm, call("close_session", "zz"), UnknownRequestError),
    Case("evict-negative", mm, call("evict", -1), InvalidArgumentError),
    Case(
        "spec-step-negative-reserve", mm, call("spec_step", ["a"], [[1]], -1), InvalidArgumentError
    ),
    Case(
        "spec-step-accepted-count",
        mm,
        call("spec_step", ["a"], [[1], [2]], 1),
        InvalidArgumentError,
    ),
    Case(
        "spec-step-too-many-accepted",
        mm,
        call("spec_step", ["a"], [[1, 2, 3]], 1),
        InvalidArgumentError,
    ),
    Case("spec-draft-negative", mm, call("spec_draft_v1", ["a"], -1), InvalidArgumentError),
    Case("swa-decode-string-token", swa_mm, call("decode", ["a"], ["x"]), InvalidArgumentError),
    Case("swa-decode-unknown-request", swa_mm, call("decode", ["zz"], [1]), UnknownRequestError),
    Case("swa-finish-request-twice", swa_mm, call("finish", ["a", "a"]), InvalidArgumentError),
]

CONFIGS = [
    Case("config-size-negative", mm, config(size=-4), ConfigError),
    Case("config-size-not-page-multiple", mm, config(size=10, page_size=4), ConfigError),
    Case("config-page-size-3", mm, config(page_size=3), PageSizeError),
    Case("config-no-rows", mm, config(req_pool_size=0), ConfigError),
    Case("config-unknown-policy", mm, config(eviction_policy="mru-ish"), ConfigError),
    Case("config-unknown-layout", mm, config(kv_layout="gqa"), ConfigError),
    Case("config-three-track-buffers", mm, config(mamba_track_buffers=3), ConfigError),
    Case("config-window-0", mm, config(sliding_window=0), ConfigError),
    Case("config-swa-ratio-0", mm, config(swa_full_tokens_ratio=0.0), ConfigError),
    Case(
        "config-hybrid-radix-track-buffers",
        mm,
        build(PoolConfig(mamba_slots=2, mamba_track_buffers=1)),
        ConfigError,
    ),
    Case(
        "config-swa-without-window",
        mm,
        build(PoolConfig(disable_radix_cache=True), "SWAMemoryManager"),
        ConfigError,
    ),
    Case(
        "config-swa-mla",
        mm,
        build(PoolConfig(sliding_window=4, kv_layout="mla"), "SWAMemoryManager"),
        ConfigError,
    ),
    Case(
        "config-swa-fp4-storage",
        mm,
        build(PoolConfig(sliding_window=4, kv_storage="fp4", head_dim=16), "SWAMemoryManager"),
        ConfigError,
    ),
    Case(
        "config-swa-host-tier",
        mm,
        build(PoolConfig(sliding_window=4, enable_hierarchical_cache=True), "SWAMemoryManager"),
        ConfigError,
    ),
]

CASES = [*LIFECYCLE, *CONFIGS]


@pytest.mark.parametrize("case", params(CASES))
def test_bad_input_is_refused_identically(case: Case) -> None:
    run_case(case, modes_of(case))
