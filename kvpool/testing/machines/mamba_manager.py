"""The lifecycle of hybrid (Mamba) models only (``--component mamba_manager``).

The lifecycle machine (:mod:`.lifecycle`) on configurations that all have Mamba slots: the
``manager`` target draws a hybrid configuration in few runs (one in eight with the radix cache
off, fewer with it on), which starves an hour-long campaign of the hybrid paths. Here half the
runs turn the radix cache on at page size 1 (the Mamba tree: 0.5.16's ``MambaRadixCache`` or
0.5.23's FULL+MAMBA unified tree, as the candidate's rules model it) and the other half turn it
off; every other field is drawn as for the manager (:func:`kvpool.testing.swarm.draw_config`,
``hybrid=True``). An implementation whose manager does not run hybrid models cannot be driven.
"""

from __future__ import annotations

import dataclasses

from kvpool.config import PoolConfig
from kvpool.testing.bundle import Implementation
from kvpool.testing.layer_ops import layer_fields
from kvpool.testing.machines.lifecycle import LifecycleTarget
from kvpool.testing.swarm import Chooser, draw_config, models_mamba_tree


class MambaLifecycleTarget(LifecycleTarget):
    """The hybrid lifecycle as a campaign target (see the module docstring)."""

    name = "mamba_manager"

    def draw_config(self, c: Chooser, impl: Implementation) -> PoolConfig:
        runs_hybrid = (
            impl.hybrid_req_to_token_pool is not None
            and impl.manager is not None
            and impl.manager_runs_hybrid
        )
        if not runs_hybrid:
            raise ValueError(f"{impl.label} provides no manager that runs hybrid models")
        rules = impl.rules_or_default()
        tree = bool(c.integer(0, 1)) and models_mamba_tree(rules)
        config = draw_config(c, page_size=1 if tree else None, hybrid=True, rules=rules,
                             need_sort=True, disable_radix_cache=not tree)  # fmt: skip
        return dataclasses.replace(config, **layer_fields(config))


__all__ = ["MambaLifecycleTarget"]
