"""What a Ray campaign ships to its nodes (no cluster needed): a candidate file is copied and
its spec rewritten to the copy, a user's package is copied whole, an SGLang release's wheel is
copied with ``KVPOOL_SGLANG_CACHE`` pointing at it, and specs naming nothing of this machine
ship nothing."""

from __future__ import annotations

from pathlib import Path

import pytest

from kvpool.testing.ray_ship import stage
from kvpool.testing.workers import CampaignSpec


def _spec(
    impl_b: str, impl_a: str = "reference", env: tuple[tuple[str, str], ...] = ()
) -> CampaignSpec:
    return CampaignSpec("allocator", impl_a, impl_b, 0, 30, ("a", "b"), env)


def test_specs_naming_nothing_local_ship_nothing(tmp_path: Path) -> None:
    assert stage(_spec("optimized[interpret]"), tmp_path) is None
    assert stage(_spec("optimized[torch]@0.5.23", "reference@0.5.23"), tmp_path) is None
    assert stage(_spec("kvpool.testing.implementations:reference_implementation"),
                 tmp_path) is None  # fmt: skip
    assert not any(tmp_path.iterdir())


def test_a_candidate_file_is_copied_and_its_spec_rewritten(tmp_path: Path) -> None:
    source = tmp_path / "src" / "mine.py"
    source.parent.mkdir()
    source.write_text("def factory(): ...\n")
    folder = tmp_path / "ship"
    shipment = stage(_spec(f"{source}:factory"), folder)
    assert shipment is not None
    assert shipment.spec.impl_b == "impl/b/mine.py:factory"
    assert shipment.spec.impl_a == "reference"
    assert (folder / "impl/b/mine.py").read_text() == source.read_text()
    assert shipment.shipped == ("impl/b/mine.py",)
    assert shipment.runtime_env() == {"working_dir": str(folder)}


def test_a_missing_candidate_file_is_refused(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="no such file"):
        stage(_spec(f"{tmp_path / 'absent.py'}:factory"), tmp_path / "ship")


def test_a_users_package_is_copied_whole(tmp_path: Path) -> None:
    shipment = stage(_spec("tests.harness.crashy_impl:crashy"), tmp_path)
    assert shipment is not None and shipment.shipped == ("tests",)
    assert shipment.spec.impl_b == "tests.harness.crashy_impl:crashy"  # found from the cwd
    assert (tmp_path / "tests" / "harness" / "crashy_impl.py").is_file()
    assert not list(tmp_path.rglob("__pycache__"))


def test_an_sglang_release_ships_its_wheel(tmp_path: Path) -> None:
    cache = tmp_path / "cache"
    cache.mkdir()
    wheel = cache / "sglang-9.9.9-py3-none-any.whl"
    wheel.write_bytes(b"not really a wheel")
    env = (("KVPOOL_SGLANG_CACHE", str(cache)),)
    shipment = stage(_spec("sglang:9.9.9+python-core", env=env), tmp_path / "ship")
    assert shipment is not None
    assert shipment.shipped == (f"sglang/{wheel.name}",)
    assert dict(shipment.spec.env)["KVPOOL_SGLANG_CACHE"] == "sglang"
    assert shipment.spec.impl_b == "sglang:9.9.9+python-core"
    assert (tmp_path / "ship" / "sglang" / wheel.name).read_bytes() == wheel.read_bytes()


def test_an_sglang_wheel_path_is_copied_and_rewritten(tmp_path: Path) -> None:
    wheel = tmp_path / "sglang-9.9.9-py3-none-any.whl"
    wheel.write_bytes(b"x")
    shipment = stage(_spec(f"sglang:{wheel}+kvpool-lifecycle"), tmp_path / "ship")
    assert shipment is not None
    assert shipment.spec.impl_b == f"sglang:sglang/{wheel.name}+kvpool-lifecycle"
