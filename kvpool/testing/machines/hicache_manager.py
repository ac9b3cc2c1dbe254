"""The lifecycle of a server with the hierarchical cache only (``--component hicache_manager``).

The lifecycle machine (:mod:`.lifecycle`) on configurations that all have the host tier: the
``manager`` target gives one to the radix-cache configurations with 3 or 6 rows (about one run
in four) and turns layer-wise loading on in a quarter of all runs, which a host-tier hour then
spends on kvpool's own lifecycle (SGLang's glue does not drive layer-wise loading). Here every
run has the radix cache on, 3 or 6 rows, the host tier (:func:`kvpool.testing.config_variants.
host_tier_fields`: every write policy, host pools of half to twice the device pool, load-back
thresholds of 0 or one page) and no layer-wise loading; every other field is drawn as for the
manager (:func:`kvpool.testing.swarm.draw_config`, ``host=True``). The host tier is the one the
candidate's rules name (``Rules.hicache_host_tier``: 0.5.16's ``HiRadixCache``, or 0.5.23's
inside the unified cache, driven by SGLang's glue: :mod:`kvpool.sglang.glue_hicache`). An
implementation without a manager and a host tier cannot be driven.
"""

from __future__ import annotations

from kvpool.config import PoolConfig
from kvpool.testing.bundle import Implementation
from kvpool.testing.machines.lifecycle import LifecycleTarget
from kvpool.testing.swarm import Chooser, draw_config


class HostLifecycleTarget(LifecycleTarget):
    """The host-tier lifecycle as a campaign target (see the module docstring)."""

    name = "hicache_manager"

    def draw_config(self, c: Chooser, impl: Implementation) -> PoolConfig:
        if impl.manager is None or not impl.provides("hiradix_cache"):
            raise ValueError(f"{impl.label} provides no manager with a host tier")
        rows = c.choice((3, 6))
        config = draw_config(c, host=True, rules=impl.rules_or_default(),
                             disable_radix_cache=False, req_pool_size=rows)  # fmt: skip
        assert config.enable_hierarchical_cache  # host_tier_fields applies to every draw here
        return config


__all__ = ["HostLifecycleTarget"]
