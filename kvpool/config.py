"""PoolConfig: the one set of knobs that builds a memory manager in either twin."""

from __future__ import annotations

from dataclasses import dataclass, field

from kvpool.constants import EVICTION_POLICIES, is_power_of_two
from kvpool.errors import ConfigError, PageSizeError
from kvpool.field_types import check_field_types
from kvpool.rules import Rules

KV_STORAGES: tuple[str, ...] = ("plain", "fp4", "mxfp8", "page_major", "noop")
"""Values of :attr:`PoolConfig.kv_storage`."""


@dataclass(frozen=True)
class PoolConfig:
    """Sizes are in tokens (``size``), rows (``req_pool_size``) and columns (``max_context_len``).

    ``size`` must be a multiple of ``page_size``; the allocator then has ``size // page_size``
    pages with ids ``1..size // page_size`` (page 0 is reserved), and the KV buffers have
    ``size + page_size`` rows. ``kv_layout`` is ``"mha"`` or ``"mla"``. ``rules`` selects the
    documented behaviour knobs (:class:`kvpool.rules.Rules`; default: kvpool's strict rules)."""

    size: int = 256
    page_size: int = 1
    req_pool_size: int = 16
    max_context_len: int = 512
    need_sort: bool = False
    disable_radix_cache: bool = False
    eviction_policy: str = "lru"
    kv_layout: str = "mha"
    num_layers: int = 2
    head_num: int = 1
    head_dim: int = 2
    v_head_dim: int | None = None
    kv_lora_rank: int = 2
    qk_rope_head_dim: int = 1
    start_layer: int = 0
    rules: Rules = field(default_factory=Rules)
    mamba_slots: int | None = None
    """Hybrid (Mamba / linear-attention) models: slots of recurrent state (``1..mamba_slots``;
    slot 0 is reserved). None (the default): not a hybrid model, no Mamba state at all."""
    mamba_layers: int = 1
    """Mamba layers whose conv and temporal state every Mamba slot holds."""
    mamba_track_buffers: int = 0
    """Speculative track buffers per request (SGLang's ping-pong buffer: 0 = off, 1 or 2)."""
    sliding_window: int | None = None
    """Hybrid sliding-window models (tokens): the window of the SWA layers; None: no SWA."""
    swa_full_tokens_ratio: float = 0.8
    """SWA pool size / full pool size (SGLang's ``swa_full_tokens_ratio``); see ``swa_size``."""
    hicache_ratio: float = 2.0
    """Host tier: host pool tokens per device pool token (SGLang's ``hicache_ratio``)."""
    hicache_write_policy: str = "write_through"
    """Host tier: ``write_through``, ``write_through_selective`` or ``write_back``."""
    hicache_load_back_threshold: int = 10
    """Host tier: fewer host tokens than this (tokens) are not loaded back (SGLang's 10)."""
    hicache_prefetch_threshold: int = 256
    """Host tier: storage prefetches shorter than this (tokens) are not started (SGLang's 256)."""
    hicache_storage: bool = False
    """Host tier: a storage backend is attached (prefetches can run)."""
    kv_storage: str = "plain"
    """How the lifecycle's KV buffers store values (specs/kv_variants.md): ``"plain"`` (float32
    MHA / MLA pools), ``"fp4"`` (MHA or MLA FP4), ``"mxfp8"``, ``"page_major"`` or ``"noop"``
    (MHA only). The quantised formats need a geometry they can block: FP4 an even ``head_dim``
    and ``head_num * head_dim`` (MLA: ``kv_lora_rank + qk_rope_head_dim``) a multiple of 16,
    MXFP8 ``head_dim`` and ``v_head_dim`` multiples of 32."""
    enable_hierarchical_cache: bool = False
    """Host tier in the request lifecycle (SGLang's ``--enable-hierarchical-cache``): the memory
    manager's tree cache is a ``HiRadixCache`` over a host pool of ``hicache_ratio`` times the
    device pool. Needs the radix cache; not for hybrid (Mamba) models."""
    layerwise_loading: bool = False
    """Layer-wise KV loading (specs/kv_variants.md): the manager registers a
    ``LayerDoneCounter`` on its KV pool, so a read of layer ``i`` waits until the load in
    progress has completed that layer (the reference raises ``LayerNotLoadedError`` instead)."""
    layer_wait_s: float = 30.0
    """Twin only, with ``layerwise_loading``: seconds a read waits for its layer's load before
    ``LayerNotLoadedError`` (single-threaded harnesses use a few milliseconds: nothing else can
    complete the layer)."""
    is_eagle: bool = False
    """EAGLE speculative decoding (SGLang's ``CacheInitParams.is_eagle``): the radix tree keys
    each sequence by its bigrams (adjacent token pairs), so a sequence of ``n`` tokens caches the
    slots of its first ``n - 1`` (specs/radix_cache.md, "EAGLE bigram keys"). Modelled for the
    radix cache, its host tier, the sliding-window trees and their lifecycle (specs/radix_cache.md,
    "EAGLE with a sliding window"); not with ``hicache_storage``. A hybrid Mamba model's tree
    keeps token keys (SGLang turns bigrams off with a MAMBA component)."""

    def __post_init__(self) -> None:
        check_field_types(self)  # types first: the checks below compare and do arithmetic
        self._check_kv_storage()
        if not is_power_of_two(self.page_size):
            raise PageSizeError(f"page_size must be a positive power of two, got {self.page_size}")
        if self.size <= 0 or self.size % self.page_size:
            raise ConfigError(
                f"size must be a positive multiple of page_size={self.page_size}, got {self.size}"
            )
        if self.req_pool_size <= 0:
            raise ConfigError(f"req_pool_size must be positive, got {self.req_pool_size}")
        if self.max_context_len <= 0:
            raise ConfigError(f"max_context_len must be positive, got {self.max_context_len}")
        if self.eviction_policy not in EVICTION_POLICIES:
            raise ConfigError(
                f"unknown eviction_policy {self.eviction_policy!r}; known: {EVICTION_POLICIES}"
            )
        if self.kv_layout not in ("mha", "mla"):
            raise ConfigError(f"kv_layout must be 'mha' or 'mla', got {self.kv_layout!r}")
        if self.num_layers <= 0 or self.head_num <= 0 or self.head_dim <= 0:
            raise ConfigError("num_layers, head_num and head_dim must be positive")
        if not isinstance(self.rules, Rules):
            raise ConfigError(f"rules must be a kvpool.rules.Rules, got {self.rules!r}")
        if self.start_layer < 0:
            raise ConfigError(f"start_layer must be >= 0, got {self.start_layer}")
        if self.mamba_slots is not None and self.mamba_slots <= 0:
            raise ConfigError(f"mamba_slots must be positive or None, got {self.mamba_slots}")
        if self.mamba_layers <= 0:
            raise ConfigError(f"mamba_layers must be positive, got {self.mamba_layers}")
        if self.mamba_track_buffers not in (0, 1, 2):
            raise ConfigError(f"mamba_track_buffers must be 0, 1 or 2: {self.mamba_track_buffers}")
        if self.sliding_window is not None and self.sliding_window < 1:
            raise ConfigError(f"sliding_window must be >= 1 token, got {self.sliding_window}")
        if not self.swa_full_tokens_ratio > 0:
            raise ConfigError(
                f"swa_full_tokens_ratio must be positive, got {self.swa_full_tokens_ratio}"
            )
        if not self.hicache_ratio > 0:
            raise ConfigError(f"hicache_ratio must be positive, got {self.hicache_ratio}")
        if self.hicache_write_policy not in (
            "write_through",
            "write_through_selective",
            "write_back",
        ):
            raise ConfigError(f"unknown hicache_write_policy {self.hicache_write_policy!r}")
        if self.hicache_load_back_threshold < 0 or self.hicache_prefetch_threshold < 0:
            raise ConfigError("hicache thresholds must be >= 0 tokens")
        if self.enable_hierarchical_cache and (self.disable_radix_cache or self.mamba_slots):
            raise ConfigError("the host tier needs the radix cache and a non-hybrid model")
        if self.is_eagle and self.hicache_storage:
            raise ConfigError("is_eagle is not modelled with hicache_storage")
        self._check_layerwise()

    def _check_kv_storage(self) -> None:
        storage, mla = self.kv_storage, self.kv_layout == "mla"
        if storage not in KV_STORAGES:
            raise ConfigError(f"unknown kv_storage {storage!r}; known: {KV_STORAGES}")
        if mla and storage not in ("plain", "fp4"):
            raise ConfigError(f"kv_storage {storage!r} has no MLA pool (plain or fp4 only)")
        width = self.kv_lora_rank + self.qk_rope_head_dim if mla else self.head_num * self.head_dim
        v_dim = self.head_dim if self.v_head_dim is None else self.v_head_dim
        if storage == "fp4" and (
            width % 16 or (not mla and (self.head_dim % 2 or v_dim != self.head_dim))
        ):
            raise ConfigError(
                "kv_storage 'fp4' needs rows of a multiple of 16 values, even head_dim"
            )
        if storage == "mxfp8" and (self.head_dim % 32 or v_dim % 32):
            raise ConfigError("kv_storage 'mxfp8' needs head_dim and v_head_dim multiples of 32")

    def _check_layerwise(self) -> None:
        if not isinstance(self.layerwise_loading, bool):
            raise ConfigError(f"layerwise_loading must be a bool, got {self.layerwise_loading!r}")
        wait = self.layer_wait_s
        if isinstance(wait, bool) or not isinstance(wait, int | float) or not wait > 0:
            raise ConfigError(f"layer_wait_s must be a positive number of seconds, got {wait!r}")

    @property
    def swa_size(self) -> int:
        """SWA pool tokens: ``size * swa_full_tokens_ratio`` rounded down to whole pages, at
        least one page."""
        pages = int(self.size * self.swa_full_tokens_ratio) // self.page_size
        return max(pages, 1) * self.page_size

    @property
    def num_pages(self) -> int:
        """Allocatable pages (page 0 excluded)."""
        return self.size // self.page_size

    @property
    def end_layer(self) -> int:
        """Last layer id held by the pool (inclusive), as SGLang counts it."""
        return self.start_layer + self.num_layers - 1
