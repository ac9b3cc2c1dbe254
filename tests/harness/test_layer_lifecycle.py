"""Layer-wise loading inside the request lifecycle: PoolConfig.layerwise_loading registers a
LayerDoneCounter in both twins, the lockstep's layer steps (kvpool.testing.layer_ops) keep the
twins in step, an early read is one outcome on both sides, a read that runs ahead of its layer
is INV-LAYER-LOADED, and the lifecycle campaign draws the knob without changing the other
seeds' runs."""

from __future__ import annotations

import dataclasses
import random
from typing import Any

import pytest

import kvpool.optimized.lifecycle.memory_manager as opt
import kvpool.reference.lifecycle.memory_manager as ref
from kvpool.config import PoolConfig
from kvpool.errors import ConfigError, LayerNotLoadedError, LockError
from kvpool.testing.bundle import Implementation
from kvpool.testing.campaign import run_machine
from kvpool.testing.factories import optimized_factory, reference_factory
from kvpool.testing.implementations import optimized_implementation, reference_implementation
from kvpool.testing.layer_ops import LAYER_WAIT_S, draw_lifecycle_op
from kvpool.testing.lockstep_driver import Factory, Lockstep, LockstepFailure
from kvpool.testing.machines.lifecycle import LifecycleTarget
from kvpool.testing.swarm import KINDS, Op, RandomChooser, draw_config, draw_op
from tests.quality.mutants_kv import LAYERWISE, forward_skips_layer_wait

CONFIG = PoolConfig(size=16, layerwise_loading=True, num_layers=3, layer_wait_s=0.002)
PROMPT = [Op("new_req", ("r1", [1, 2, 3])), Op("extend", (["r1"],))]


@pytest.mark.parametrize(
    "fields",
    [{"layerwise_loading": 1}, {"layer_wait_s": 0}, {"layer_wait_s": -1.0},
     {"layer_wait_s": True}, {"layer_wait_s": "2"}],
)  # fmt: skip
def test_layerwise_knobs_are_validated(fields: dict[str, Any]) -> None:
    with pytest.raises(ConfigError):
        PoolConfig(**fields)


@pytest.mark.parametrize("manager_class", [ref.MemoryManager, opt.MemoryManager])
def test_the_knob_registers_a_counter_on_the_managers_kv_pool(manager_class: Any) -> None:
    on = manager_class(CONFIG)
    assert on.layer_done_counter is not None
    assert on.kv_cache.layer_transfer_counter is on.layer_done_counter
    assert on.layer_done_counter.num_layers == 3
    off = manager_class(PoolConfig(size=16))
    assert off.layer_done_counter is None and off.kv_cache.layer_transfer_counter is None


def _pair(factory_b: Factory | None = None, config: PoolConfig = CONFIG) -> Lockstep:
    pair = Lockstep(reference_factory, factory_b or optimized_factory("torch"), config)
    for op in PROMPT:
        pair.run(op)
    return pair


def test_an_early_read_is_one_outcome_on_both_twins() -> None:
    pair = _pair()
    assert pair.run(Op("layer_read", (1,))) is None  # no load in progress: nothing to wait for
    assert pair.run(Op("layer_load")) == 0
    assert isinstance(pair.run(Op("layer_read", (1,))), LayerNotLoadedError)
    assert pair.run(Op("layer_done", (1,))) is None  # out of order: layer 1 before layer 0
    assert pair.run(Op("layer_read", (1,))) is None
    assert isinstance(pair.run(Op("layer_read", (0,))), LayerNotLoadedError)
    assert pair.run(Op("layer_load")) == 1  # event 0 is still loading: the next one is used
    assert pair.run(Op("layer_load")) == 2
    assert isinstance(pair.run(Op("layer_load")), LockError)  # event 0 has not finished
    for layer in (2, 0):
        pair.run(Op("layer_done", (layer,)))
    assert pair.layers is not None
    assert [side.early_reads for side in pair.layers.sides] == [0, 0]


def test_a_completion_without_a_load_is_refused_on_both() -> None:
    assert isinstance(_pair().run(Op("layer_done", (0,))), LockError)


def _mutated(patch: Any) -> Factory:
    def build(config: PoolConfig) -> Any:
        manager = optimized_factory("torch", checked=False)(config)
        patch(manager)
        return manager

    return build


def test_a_read_that_runs_ahead_of_its_layer_is_inv_layer_loaded() -> None:
    pair = _pair(_mutated(forward_skips_layer_wait))
    pair.run(Op("layer_load"))
    pair.run(Op("layer_done", (0,)))
    pair.run(Op("layer_read", (0,)))  # loaded: fine on both
    with pytest.raises(LockstepFailure) as caught:
        pair.run(Op("layer_read", (2,)))
    assert caught.value.detector == "INV-LAYER-LOADED"
    assert "returned before the layer loaded" in str(caught.value)


def test_counters_that_drift_apart_are_a_lockstep_diff() -> None:
    def forget_consumer(manager: Any) -> None:
        manager.layer_done_counter.set_consumer = lambda index: None

    pair = _pair(_mutated(forget_consumer))
    with pytest.raises(LockstepFailure) as caught:
        pair.run(Op("layer_load"))
    assert caught.value.detector == "lockstep-diff"
    assert "layer-transfer counters differ" in str(caught.value)


def test_the_lifecycle_target_draws_the_knob_and_keeps_the_other_configurations() -> None:
    target, impl, layered = LifecycleTarget(), optimized_implementation(), 0
    hybrid = impl.hybrid_req_to_token_pool is not None and impl.manager is not None
    host, rules = (
        impl.manager is not None and impl.provides("hiradix_cache"),
        impl.rules_or_default(),
    )
    for seed in range(300):
        drawn_rng, plain_rng = random.Random(seed), random.Random(seed)
        drawn = target.draw_config(RandomChooser(drawn_rng), impl)
        plain = draw_config(RandomChooser(plain_rng), hybrid=hybrid, host=host,
                            eagle=impl.manager_models_eagle, rules=rules)  # fmt: skip
        assert drawn_rng.random() == plain_rng.random()  # no extra draw
        assert (
            not plain.layerwise_loading
        )  # draw_config itself (the hypothesis machine) is as it was
        if drawn.layerwise_loading:
            layered += 1
            assert 2 <= drawn.num_layers <= 4 and drawn.layer_wait_s == LAYER_WAIT_S
            drawn = dataclasses.replace(drawn, layerwise_loading=False, num_layers=2,
                                        layer_wait_s=30.0)  # fmt: skip
        assert drawn == plain
    assert 40 < layered < 120


def test_without_layerwise_loading_the_op_draws_are_unchanged() -> None:
    pair = Lockstep(reference_factory, reference_factory, PoolConfig(size=16))
    assert pair.layers is None
    for seed in range(50):
        a, b = random.Random(seed), random.Random(seed)
        kind = KINDS[seed % len(KINDS)]
        view = pair.view()
        assert draw_lifecycle_op(RandomChooser(a), view, None, kind) == draw_op(
            RandomChooser(b), view, kind
        )
        assert a.random() == b.random()


@pytest.mark.slow
def test_the_lifecycle_campaign_reaches_the_layer_steps() -> None:
    def layered(c: RandomChooser) -> PoolConfig:
        return draw_config(c, **LAYERWISE)

    result = run_machine("manager", reference_implementation(), optimized_implementation(),
                         3600.0, seed=5, max_runs=6, config_drawer=layered)  # fmt: skip
    assert result.failures == 0, result.failure.report if result.failure else ""
    for tag in ("layer_load:ok", "layer_done:ok", "layer_read:ok",
                "layer_read:LayerNotLoadedError"):  # fmt: skip
        assert result.coverage.get(tag), (tag, dict(result.coverage))


def test_the_lifecycle_campaign_names_a_forward_that_skips_the_wait() -> None:
    def layered(c: RandomChooser) -> PoolConfig:
        return draw_config(c, **LAYERWISE)

    buggy = Implementation("no-wait", manager=_mutated(forward_skips_layer_wait))
    result = run_machine("manager", reference_implementation(), buggy, 3600.0, seed=1,
                         max_runs=20, config_drawer=layered)  # fmt: skip
    assert result.failure is not None and result.failure.detector == "INV-LAYER-LOADED"
    assert "layer_read(" in result.failure.report
