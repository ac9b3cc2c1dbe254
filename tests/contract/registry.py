"""Every family's contract table, in one tuple (the coverage test and the sweeps walk it)."""

from __future__ import annotations

from tests.contract.families import base, hicache, kv, lifecycle, mamba, pools, radix, swa, unified
from tests.contract.machinery import Family

FAMILIES: tuple[Family, ...] = (
    base.FAMILY,
    pools.FAMILY,
    kv.FAMILY,
    radix.FAMILY,
    swa.FAMILY,
    mamba.FAMILY,
    unified.FAMILY,
    hicache.FAMILY,
    lifecycle.FAMILY,
)


def family_of(cls: str) -> Family | None:
    """The family that covers public class ``cls`` (``None``: none does)."""
    for family in FAMILIES:
        if cls in family.classes:
            return family
    return None
