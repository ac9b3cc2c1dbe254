"""``PoolConfig`` and ``Rules`` refuse a knob of the wrong type at construction with one clear
``ConfigError`` naming the field, the value and its type: no float truncated, no string read for
its truthiness, no bool taken for an int, no int for a bool. Every field is tried, from its
annotation, so a new knob is covered the day it is added."""

from __future__ import annotations

import dataclasses
import typing
from typing import Any

import pytest

from kvpool.config import PoolConfig
from kvpool.errors import ConfigError
from kvpool.rules import Rules

WRONG: dict[str, list[Any]] = {
    "int": [True, 2.0, 2.5, "2", None],
    "bool": [1, 0, "false", None, 1.0],
    "float": [True, "2", None],
    "str": [1, None, b"lru", True],
    "int | None": [True, 2.0, "2"],
}
"""Values each annotation must refuse (by its printed name)."""


def _cases(cls: type) -> list[tuple[str, Any]]:
    hints = typing.get_type_hints(cls)
    cases = []
    for f in dataclasses.fields(cls):
        name = getattr(hints[f.name], "__name__", str(hints[f.name]))
        cases += [(f.name, value) for value in WRONG.get(name, [])]
    return cases


@pytest.mark.parametrize(("name", "value"), _cases(PoolConfig))
def test_pool_config_refuses_a_wrong_type(name: str, value: Any) -> None:
    with pytest.raises(ConfigError, match=rf"PoolConfig\.{name} must be .*got {value!r}"):
        PoolConfig(**{name: value})


@pytest.mark.parametrize(("name", "value"), _cases(Rules))
def test_rules_refuse_a_wrong_type(name: str, value: Any) -> None:
    with pytest.raises(ConfigError, match=rf"Rules\.{name} must be .*got {value!r}"):
        Rules(**{name: value})


def test_every_field_is_covered() -> None:
    for cls in (PoolConfig, Rules):
        hints = typing.get_type_hints(cls)
        for f in dataclasses.fields(cls):
            name = getattr(hints[f.name], "__name__", str(hints[f.name]))
            assert name in WRONG or f.name == "rules", (cls.__name__, f.name, name)


def test_the_right_types_are_taken() -> None:
    config = PoolConfig(size=64, hicache_ratio=1, sliding_window=None, mamba_slots=None)
    assert config.hicache_ratio == 1 and isinstance(config.rules, Rules)
    with pytest.raises(ConfigError, match=r"PoolConfig\.rules must be Rules"):
        PoolConfig(rules="strict")  # type: ignore[arg-type]
