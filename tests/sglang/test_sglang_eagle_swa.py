"""Opt-in (``--run-sglang-wheel``): EAGLE's bigram keys with a sliding window against SGLang's
own code. SGLang 0.5.23's SWA scheduler glue (:mod:`kvpool.sglang.glue_swa`: its
``checkpoint_into_tree`` with the bigram frontier of its #34870, ``release_kv_cache``,
``maybe_evict_swa``) on both cores, and 0.5.16's over its unified FULL + SWA tree (its own
``cache_finished_req`` / ``cache_unfinished_req``), in lockstep with kvpool's reference SWA
lifecycle on the EAGLE configurations of the ``swa_manager`` machine; a glue that forgot the
flag is caught. (SGLang's SWA trees built with ``CacheInitParams.is_eagle``, driven directly by
the tree machines: tests/sglang/test_sglang_eagle.py.)"""

from __future__ import annotations

import dataclasses
from typing import Any

import pytest

from kvpool.config import PoolConfig
from kvpool.rules import Rules
from kvpool.sglang import implementation
from kvpool.testing.implementations import reference_implementation
from kvpool.testing.runs import focused_runs

pytestmark = pytest.mark.sglang_wheel

CORES = [{}, {"tree_core": "python"}]


def _eagle(config: PoolConfig) -> bool:
    return config.is_eagle


@pytest.mark.slow
@pytest.mark.parametrize("options", CORES, ids=["rust", "python"])
def test_sglangs_checkpoint_keeps_a_window_below_its_bigram_key(options: dict[str, Any]) -> None:
    """The directed chunk case of tests/reference/test_eagle_swa.py on SGLang 0.5.23's glue: a
    chunk of 8 tokens (page size 2, window 3) checkpoints 6 slots and keeps a window of live SWA
    slots below them; a prompt agreeing on the chunk matches all 6. The reference agrees."""
    config = PoolConfig(size=96, page_size=2, sliding_window=3, is_eagle=True,
                        rules=Rules.for_sglang("0.5.23"))  # fmt: skip
    candidate = implementation("0.5.23", **options)
    seen = []
    for impl in (reference_implementation(), candidate):
        assert impl.swa_manager is not None
        m = impl.swa_manager(config)
        prompt = list(range(1, 22))
        m.new_req("a", prompt)
        m.extend(["a"], [8])
        req = next(r for r in m.snapshot().reqs if r.rid == "a")
        m.new_req("b", [*prompt[:8], 99])
        seen.append((req.cache_protected_len, req.swa_evicted_seqlen, int(m.match_prefix("b"))))
    assert seen[0] == seen[1]
    protected, evicted, matched = seen[0]
    assert protected == matched == 6 and protected - evicted >= 3


@pytest.mark.slow
@pytest.mark.parametrize(
    ("source", "options"), [("0.5.23", {}), ("0.5.23", {"tree_core": "python"}), ("0.5.16", {})]
)
def test_eagle_swa_glue_campaign_passes(source: str, options: dict[str, Any]) -> None:
    """SGLang's SWA glue (0.5.23's on both cores; 0.5.16's over its unified FULL + SWA tree)
    on the ``swa_manager`` machine's EAGLE configurations."""
    candidate = implementation(source, **options)
    ran, failure = focused_runs("swa_manager", reference_implementation(), candidate, 5, 150,
                                _eagle)  # fmt: skip
    assert failure is None, str(failure)
    assert ran >= 10


@pytest.mark.slow
def test_an_swa_glue_not_told_of_eagle_is_caught() -> None:
    """Planted: SGLang's SWA glue built without ``is_eagle`` (a server that forgot the flag)
    under a lifecycle that asks for bigram keys: the campaign reports a difference."""
    candidate = implementation("0.5.23")
    build = candidate.swa_manager
    assert build is not None

    def untold(config: PoolConfig) -> Any:
        return build(dataclasses.replace(config, is_eagle=False))

    planted = dataclasses.replace(candidate, swa_manager=untold)
    ran, failure = focused_runs("swa_manager", reference_implementation(), planted, 5, 150,
                                _eagle)  # fmt: skip
    assert failure is not None and ran >= 1
    assert failure.detector == "lockstep-diff", str(failure)
