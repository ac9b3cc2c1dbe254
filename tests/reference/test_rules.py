"""Unit tests of kvpool.rules: the knobs' validation and the SGLang presets (specs/fidelity.md)."""

from __future__ import annotations

import pytest

from kvpool.errors import ConfigError
from kvpool.rules import Rules


def test_default_rules_are_kvpools_strict_ones() -> None:
    r = Rules()
    assert (r.row_order, r.generation_on_clear, r.release_order) == ("lifo", "keep", "prepend")
    assert r.refused_alloc_unchanged and r.rejects_misuse
    assert (r.unaligned_paged_alloc, r.eviction_demand, r.eviction_amount) == (
        "error",
        "exact",
        "shortfall",
    )
    assert (r.tree_free, r.hit_count, r.release_path) == ("free", "chunked", "finished_req")


@pytest.mark.parametrize(
    ("version", "row", "generation", "release", "amount"),
    [
        ("0.5.16", "fifo", "reset", "prepend", "demand"),
        ("0.5.17", "fifo", "reset", "prepend", "demand"),
        ("0.5.18", "lifo", "reset", "prepend", "demand"),
        ("0.5.23", "lifo", "keep", "append", "shortfall"),
        ("0.5.30", "lifo", "keep", "append", "shortfall"),
    ],
)
def test_sglang_presets(version: str, row: str, generation: str, release: str, amount: str) -> None:
    r = Rules.for_sglang(version)
    assert (r.row_order, r.generation_on_clear, r.release_order, r.eviction_amount) == (
        row,
        generation,
        release,
        amount,
    )
    assert not r.refused_alloc_unchanged and not r.rejects_misuse
    assert r.unaligned_paged_alloc == "floor" and r.eviction_demand == "bound"
    new = version in ("0.5.23", "0.5.30")
    assert (r.tree_free, r.hit_count, r.release_path) == (
        ("segment", "inserted_len", "checkpoint") if new else ("free", "chunked", "finished_req")
    )


@pytest.mark.parametrize("version", ["0.5.15", "0.4.9", "1.0.0", "latest"])
def test_unknown_releases_are_refused(version: str) -> None:
    with pytest.raises(ConfigError):
        Rules.for_sglang(version)


@pytest.mark.parametrize(
    "field",
    [
        "row_order",
        "unaligned_paged_alloc",
        "generation_on_clear",
        "release_order",
        "eviction_demand",
        "eviction_amount",
        "tree_free",
        "hit_count",
        "release_path",
    ],
)
def test_unknown_knob_values_are_refused(field: str) -> None:
    with pytest.raises(ConfigError, match=field):
        Rules(**{field: "bogus"})  # type: ignore[arg-type]
