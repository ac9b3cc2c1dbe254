"""The lifecycle on every KV storage variant: PoolConfig.kv_storage, the pools it builds in both
twins, the swarm drawing it, and a lockstep run per variant (tags survive in both twins)."""

from __future__ import annotations

import random
from collections import Counter
from typing import Any

import pytest
from hypothesis import settings

import kvpool.optimized.kv.storage as opt
import kvpool.reference.kv.storage as ref
from kvpool.config import KV_STORAGES, PoolConfig
from kvpool.errors import ConfigError
from kvpool.testing.factories import optimized_factory, reference_factory
from kvpool.testing.lockstep_machine import make_lockstep_test
from kvpool.testing.swarm import Chooser, RandomChooser, draw_config

VARIANT_CONFIGS = {
    "fp4": PoolConfig(size=8, page_size=2, kv_storage="fp4", head_num=2, head_dim=8),
    "mxfp8": PoolConfig(size=8, page_size=2, kv_storage="mxfp8", head_dim=32),
    "page_major": PoolConfig(size=8, page_size=4, kv_storage="page_major", v_head_dim=3),
    "noop": PoolConfig(size=8, kv_storage="noop"),
    "mla_fp4": PoolConfig(size=8, kv_layout="mla", kv_storage="fp4", kv_lora_rank=12,
                          qk_rope_head_dim=4),
}  # fmt: skip


@pytest.mark.parametrize("name", sorted(VARIANT_CONFIGS))
def test_both_twins_build_the_named_variant(name: str) -> None:
    config = VARIANT_CONFIGS[name]
    a, b = ref.kv_cache_from_config(config), opt.kv_cache_from_config(config)
    assert type(a).__name__ == type(b).__name__ != "MHATokenToKVPool"
    a.write_tags([1, 3], [7, 16_777_213])
    b.write_tags([1, 3], [7, 16_777_213])
    assert a.read_tags([1, 2, 3]) == b.read_tags([1, 2, 3]) == [7, 0, 16_777_213]


@pytest.mark.parametrize(
    "fields",
    [
        {"kv_storage": "fp8"},
        {"kv_storage": "mxfp8", "kv_layout": "mla"},
        {"kv_storage": "fp4", "head_dim": 2},
        {"kv_storage": "fp4", "head_dim": 16, "v_head_dim": 32},
        {"kv_storage": "mxfp8", "head_dim": 32, "v_head_dim": 16},
        {"kv_storage": "fp4", "kv_layout": "mla"},  # 2 + 1 channels: not a block
    ],
)
def test_kv_storage_needs_a_geometry_it_can_block(fields: dict[str, Any]) -> None:
    with pytest.raises(ConfigError):
        PoolConfig(size=8, **fields)


def test_swarm_draws_every_variant_and_keeps_the_plain_pools() -> None:
    drawn = Counter(draw_config(RandomChooser(random.Random(s))).kv_storage for s in range(400))
    assert set(drawn) == set(KV_STORAGES)
    assert drawn["plain"] > sum(drawn.values()) / 2
    pinned = draw_config(RandomChooser(random.Random(3)), kv_storage="plain", head_dim=4)
    assert (pinned.kv_storage, pinned.head_dim) == ("plain", 4)


def _variant_config(c: Chooser) -> PoolConfig:
    """Swarm configurations with the storage pinned to a variant (geometry from the swarm)."""
    storage = c.choice(("fp4", "mxfp8", "page_major", "noop"))
    head_dim = {"fp4": 16, "mxfp8": 32}.get(storage, 2)
    return draw_config(c, kv_storage=storage, kv_layout="mha", head_dim=head_dim)


_BUDGET = settings(settings(), max_examples=min(settings().max_examples, 30))

TestVariantsReferenceVsOptimized = make_lockstep_test(
    reference_factory,
    optimized_factory("torch"),
    config_drawer=_variant_config,
    test_settings=_BUDGET,
    labels=("reference", "optimized"),
    name="RefOptKVVariants",
)
TestVariantsReferenceVsOptimized = pytest.mark.slow(TestVariantsReferenceVsOptimized)
