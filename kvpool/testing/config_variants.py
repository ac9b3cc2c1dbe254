"""Configuration variants the swarm derives from fields it has already drawn (no extra draw,
so every seed's operations stay as they were): KV storage variants and host-tier settings."""

from __future__ import annotations

from typing import Any

STORAGE_GEOMETRY: dict[str, dict[str, int]] = {
    "fp4": {"head_num": 1, "head_dim": 16},
    "mxfp8": {"head_num": 1, "head_dim": 32},
    "page_major": {},
    "noop": {},
}
"""Head geometry each MHA storage variant is drawn with (the smallest its blocks allow)."""


def storage_fields(fields: dict[str, Any], pages: int, overrides: dict[str, Any]) -> dict[str, Any]:
    """One configuration in three stores its KV in a variant pool (specs/kv_variants.md): MHA
    cycles through FP4, MXFP8, page-major and no-op by page count, MLA uses MLA FP4. Derived
    from fields already drawn (no extra draw, so every seed's operations stay as they were);
    nothing when the overrides pin the storage or the head geometry."""
    pinned = {"kv_storage", "head_num", "head_dim", "v_head_dim", "kv_lora_rank"}
    if pinned & set(overrides) or (pages + fields["req_pool_size"]) % 3:
        return {}
    if fields["kv_layout"] == "mla":
        return {"kv_storage": "fp4", "kv_lora_rank": 12, "qk_rope_head_dim": 4}
    storage = tuple(STORAGE_GEOMETRY)[pages % len(STORAGE_GEOMETRY)]
    return {"kv_storage": storage, **STORAGE_GEOMETRY[storage]}


WRITE_POLICIES: tuple[str, ...] = ("write_through", "write_through_selective", "write_back")


def host_tier_fields(pages: int, page_size: int) -> dict[str, Any]:
    """Host-tier fields derived from the pool's page count: every write policy, small host
    pools (half to twice the device pool) and load-back thresholds of 0 or one page."""
    return {
        "enable_hierarchical_cache": True,
        "hicache_write_policy": WRITE_POLICIES[pages % 3],
        "hicache_ratio": (0.5, 1.0, 2.0)[pages // 3 % 3],
        "hicache_load_back_threshold": (0, page_size)[pages // 2 % 2],
    }


__all__ = ["STORAGE_GEOMETRY", "WRITE_POLICIES", "host_tier_fields", "storage_fields"]
