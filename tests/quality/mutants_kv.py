"""Seeded bugs in the KV storage variants and in layer-wise loading.

:data:`KV_STORAGE_MUTANTS` patch the lifecycle's KV pool (``manager.kv_cache``) of one built
twin, under a configuration pinned to the variant: the stored bytes come out wrong while every
index stays right, so only the KV tags see it (``INV-KV-INTEGRITY``, or the lockstep comparison
of the tags the two sides read back). :data:`LAYERWISE_LIFECYCLE_MUTANTS` patch the
lifecycle's KV pool under ``layerwise_loading`` so that the forward's layer reads skip the wait;
the lifecycle machine's layer steps name them (``INV-LAYER-LOADED``).
:data:`LAYER_LOADING_MUTANTS` patch a twin pool or its layer-transfer counter so that a read can
run ahead of a layer's load; the layer-loading harness
(:func:`kvpool.testing.layer_loading.run_twin`, detector ``layer-loading``) finds them.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch

from kvpool.optimized.kv.layer_transfer import LayerDoneCounter
from kvpool.optimized.kv.mha import MHATokenToKVPool
from kvpool.testing.layer_loading import run_twin
from kvpool.testing.quality import Mutant, need, wrap
from kvpool.testing.swarm import LAYER_KINDS

FP4_MHA = {"kv_storage": "fp4", "kv_layout": "mha", "head_num": 2, "head_dim": 16}
"""FP4 with two scale blocks per token row (so a shifted scale lands on a different block)."""
PAGE_MAJOR = {"kv_storage": "page_major", "kv_layout": "mha", "head_num": 1, "head_dim": 2}


def _after_write(kv: Any, fix: Callable[[int, torch.Tensor], None]) -> None:
    """Run ``fix(local layer, slots)`` after every write of ``kv``'s storage: its ``_store``
    (local layer, checked slots, data), which ``set_kv_buffer`` and ``write_tags`` both write
    through once their arguments are checked."""

    def make(orig: Any) -> Callable[..., None]:
        def store(local: int, slots: torch.Tensor, *args: Any) -> None:
            orig(local, slots, *args)
            fix(local, slots)

        return store

    wrap(kv, "_store", make)


def fp4_nibbles_swapped(manager: Any) -> None:
    """The FP4 writer packs value ``2i`` in the HIGH nibble (the reader expects the low one)."""
    kv = manager.kv_cache
    need(kv, "k_buffer", "v_buffer", "k_scale_buffer")

    def fix(local: int, slots: torch.Tensor) -> None:
        for buf in (kv.k_buffer[local], kv.v_buffer[local]):
            b = buf[slots]
            buf[slots] = (b << 4) | (b >> 4)

    _after_write(kv, fix)


def fp4_scale_block_shifted(manager: Any) -> None:
    """Each FP4 block is stored with the scale of the next block (an off-by-one block index)."""
    kv = manager.kv_cache
    need(kv, "k_scale_buffer", "v_scale_buffer")

    def fix(local: int, slots: torch.Tensor) -> None:
        for buf in (kv.k_scale_buffer[local], kv.v_scale_buffer[local]):
            buf[slots] = torch.roll(buf[slots], -1, dims=-1)

    _after_write(kv, fix)


def page_major_page_stride(manager: Any) -> None:
    """The page-major views step from one page to the next by ONE layer's K+V block instead of
    the whole page (all layers): page ``p`` of layer 0 overlaps page ``p - 1`` of layer 1."""
    kv = manager.kv_cache
    need(kv, "_raw", "k_buffer", "v_buffer", "page_items")
    items = kv._raw.view(torch.float32)
    layer_block = kv.page_items // kv.layer_num
    for layer, (k, v) in enumerate(zip(kv.k_buffer, kv.v_buffer, strict=True)):
        kv.k_buffer[layer] = torch.as_strided(
            items, k.shape, (layer_block, *k.stride()[1:]), k.storage_offset()
        )
        kv.v_buffer[layer] = torch.as_strided(
            items, v.shape, (layer_block, *v.stride()[1:]), v.storage_offset()
        )


KV_STORAGE_MUTANTS: tuple[Mutant, ...] = (
    Mutant("kv-fp4-nibble-order", "FP4 values packed high nibble first",
           ("INV-KV-INTEGRITY", "lockstep-diff"), fp4_nibbles_swapped, (1, 2, 4), FP4_MHA),
    Mutant("kv-fp4-scale-off-by-one", "FP4 blocks stored with the next block's scale",
           ("INV-KV-INTEGRITY", "lockstep-diff"), fp4_scale_block_shifted, (1, 2, 4), FP4_MHA),
    Mutant("kv-page-major-stride", "page-major page stride of one layer's block",
           ("INV-KV-INTEGRITY", "lockstep-diff"), page_major_page_stride, (1, 2, 4), PAGE_MAJOR),
)  # fmt: skip
"""Storage-variant bugs hunted by the lifecycle machine (:func:`kvpool.testing.quality.hunt`)."""


LAYERWISE: dict[str, Any] = {"layerwise_loading": True, "layer_wait_s": 0.002, "num_layers": 3,
             "kv_storage": "plain"}  # fmt: skip
"""The lifecycle with layer-wise loading on, as the campaign draws it (a 2 ms twin wait)."""
LAYER_FOCUS = ("new_req", "extend", "decode", "finish", *LAYER_KINDS)
"""The hunt's operation kinds: a short lifecycle interleaved with the layer steps (the
hypothesis machine draws layer steps only in runs focused on them)."""


def forward_skips_layer_wait(manager: Any) -> None:
    """The forward reads a layer without waiting for its load (the pool's transfer counter is
    bypassed on ``get_key_buffer``): a read returns while the layer is still loading."""
    kv = manager.kv_cache
    need(kv, "get_key_buffer", "layer_transfer_counter")

    def make(orig: Any) -> Callable[[int], Any]:
        def get_key_buffer(layer_id: int) -> Any:
            counter, kv.layer_transfer_counter = kv.layer_transfer_counter, None
            try:
                return orig(layer_id)
            finally:
                kv.layer_transfer_counter = counter

        return get_key_buffer

    wrap(kv, "get_key_buffer", make)


LAYERWISE_LIFECYCLE_MUTANTS: tuple[Mutant, ...] = (
    Mutant("layer-forward-no-wait", "the forward reads a layer before its load completed",
           ("INV-LAYER-LOADED",), forward_skips_layer_wait, (1, 2, 4), LAYERWISE, LAYER_FOCUS),
)  # fmt: skip
"""Layer-wise loading bugs hunted by the lifecycle machine (the layer steps of
:mod:`kvpool.testing.layer_ops`)."""


@dataclass(frozen=True)
class LayerLoadingMutant:
    """A layer-loading bug: ``patch(pool, counter)`` returns the counter to register (the
    original or a wrapper); the ``layer-loading`` harness should catch it."""

    name: str
    kind: str
    patch: Callable[[Any, Any], Any]
    expected: tuple[str, ...] = ("layer-loading",)


def read_without_wait(pool: Any, counter: Any) -> Any:
    """``get_key_buffer`` forgets the transfer wait (reads whatever the layer holds now)."""
    pool.get_key_buffer = lambda layer_id: pool.k_buffer[pool._layer(layer_id)]
    return counter


class _PreviousLayerCounter:
    """Waits for the layer before the one asked (an off-by-one threshold)."""

    def __init__(self, inner: Any) -> None:
        self.inner, self.events = inner, inner.events

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)

    def wait_until(self, threshold: int) -> None:
        self.inner.wait_until(max(threshold - 1, 0))


def wait_on_previous_layer(pool: Any, counter: Any) -> Any:
    """The read of layer ``i`` waits for layer ``i - 1`` (a local/global index slip)."""
    return _PreviousLayerCounter(counter)


LAYER_LOADING_MUTANTS: tuple[LayerLoadingMutant, ...] = (
    LayerLoadingMutant("layer-read-without-wait", "a layer read that skips the wait",
                       read_without_wait),
    LayerLoadingMutant("layer-wait-off-by-one", "a read waits for the previous layer",
                       wait_on_previous_layer),
)  # fmt: skip
"""Layer-loading bugs hunted by :func:`hunt_layer_loading`."""


def hunt_layer_loading(mutant: LayerLoadingMutant | None, seeds: int = 8) -> list[str]:
    """Run the twin layer-loading harness on a 4-layer pool with ``mutant`` (None: no bug) for
    ``seeds`` seeds; the violations of the first seed that shows any (empty: none caught)."""
    for seed in range(seeds):
        pool = MHATokenToKVPool(8, 1, torch.float32, 1, 2, 4)
        counter = LayerDoneCounter(4, timeout=10)
        registered = counter if mutant is None else mutant.patch(pool, counter)

        def make(x: list[Any]) -> torch.Tensor:
            return torch.tensor(x, dtype=torch.float32)

        violations = run_twin(pool, seed, registered, make)
        if violations:
            return violations
    return []


__all__ = [
    "KV_STORAGE_MUTANTS",
    "LAYERWISE",
    "LAYERWISE_LIFECYCLE_MUTANTS",
    "LAYER_FOCUS",
    "LAYER_LOADING_MUTANTS",
    "LayerLoadingMutant",
    "forward_skips_layer_wait",
    "fp4_nibbles_swapped",
    "fp4_scale_block_shifted",
    "hunt_layer_loading",
    "page_major_page_stride",
    "read_without_wait",
    "wait_on_previous_layer",
]
