"""Every public method of every public class of both twins has a contract, or a stated reason
why it has no bad argument: a new public method without one fails here."""

from __future__ import annotations

import inspect

import pytest

import kvpool.optimized as opt_pkg
import kvpool.reference as ref_pkg
from tests.contract.machinery import public_methods
from tests.contract.registry import FAMILIES, family_of


def _public_classes(pkg: object) -> list[str]:
    return sorted(
        name
        for name, obj in vars(pkg).items()
        if inspect.isclass(obj) and obj.__module__.startswith(pkg.__name__)  # type: ignore[attr-defined]
    )


CLASSES = sorted(set(_public_classes(ref_pkg)) | set(_public_classes(opt_pkg)))


@pytest.mark.parametrize("cls", CLASSES)
def test_every_public_method_has_a_contract(cls: str) -> None:
    family = family_of(cls)
    assert family is not None, (
        f"public class {cls} is in no contract family (tests/contract/families)"
    )
    missing = []
    for pkg in (ref_pkg, opt_pkg):
        klass = getattr(pkg, cls, None)
        if klass is None:
            continue
        for method in public_methods(klass):
            if family.contract(cls, method) is None and family.exemption(cls, method) is None:
                missing.append(f"{pkg.__name__}.{cls}.{method}")
    assert not missing, "public methods without a contract: " + ", ".join(sorted(set(missing)))


def test_exemptions_give_a_reason_and_name_real_methods() -> None:
    for family in FAMILIES:
        for key, why in family.exempt.items():
            assert len(why) >= 10, f"{family.name}: exemption {key} needs a reason"
        for key in [*family.exempt, *family.methods]:
            cls, _, method = key.rpartition(".")
            owners = [cls] if cls else list(family.classes)
            assert any(
                method in public_methods(k)
                for c in owners
                for pkg in (ref_pkg, opt_pkg)
                if (k := getattr(pkg, c, None)) is not None
            ), f"{family.name}: {key} names no public method of its classes"


def test_each_class_in_one_family() -> None:
    seen: dict[str, str] = {}
    for family in FAMILIES:
        for cls in family.classes:
            assert cls not in seen, f"{cls} in {seen[cls]} and {family.name}"
            seen[cls] = family.name
