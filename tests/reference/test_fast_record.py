"""``kvpool.records``: ``fast_record`` and ``replaced`` give records equal to the dataclass's
own, and the dataclass itself wherever filling ``__dict__`` would not be the same as its
``__init__``."""

from __future__ import annotations

import dataclasses
import pickle
from collections.abc import Callable
from dataclasses import dataclass, field

import pytest

from kvpool.records import fast_record, filled_record, replaced
from kvpool.snapshot import (
    MambaNodeSnapshot,
    MambaReqSnapshot,
    NodeSnapshot,
    ReqSnapshot,
    SessionSnapshot,
)

Maker = Callable[[type], Callable[..., object]]
MAKERS: list[Maker] = [fast_record]

NODE = dict(
    node_id=3, parent_id=0, key=(1, 2), extra_key=None, value=(7, 8), lock_ref=1,
    child_ids=(4,), child_keys=((5,),), last_access_time=2.0, hit_count=1, priority=0,
    swa_tombstone=False, swa_lock_ref=0, evicted=False, host_value=None, host_ref_counter=0,
    write_pending=False,
)  # fmt: skip


@pytest.mark.parametrize("make", MAKERS)
def test_every_field_given_builds_an_equal_record(make: Maker) -> None:
    build = make(NodeSnapshot)
    assert build is not NodeSnapshot  # the fast path is taken for the snapshot records
    made, own = build(**NODE), NodeSnapshot(**NODE)  # type: ignore[arg-type]
    assert type(made) is NodeSnapshot
    assert made == own and hash(made) == hash(own) and repr(made) == repr(own)
    assert vars(made) == vars(own)
    assert pickle.loads(pickle.dumps(made)) == own
    with pytest.raises(AttributeError):  # still frozen
        made.lock_ref = 2  # type: ignore[misc]


@pytest.mark.parametrize("make", MAKERS)
def test_snapshot_records_take_the_fast_path(make: Maker) -> None:
    for cls in (NodeSnapshot, ReqSnapshot, SessionSnapshot, MambaNodeSnapshot, MambaReqSnapshot):
        assert make(cls) is not cls


def test_other_calls_go_to_the_dataclass() -> None:
    build = fast_record(NodeSnapshot)
    partial = {k: v for k, v in NODE.items() if k != "write_pending"}
    assert build(**partial) == NodeSnapshot(**partial)  # type: ignore[arg-type]  # a default
    with pytest.raises(TypeError):  # a name that is no field: the dataclass's own error
        build(**{**partial, "bogus": 1})  # type: ignore[arg-type]


@dataclass(frozen=True)
class _Checked:
    n: int

    def __post_init__(self) -> None:
        if self.n < 0:
            raise ValueError("negative")


@dataclass(frozen=True, slots=True)
class _Slotted:
    n: int


@dataclass(frozen=True)
class _Factory:
    n: list[int] = field(default_factory=list)


@dataclass(frozen=True)
class _Hidden:
    n: int
    m: int = field(default=0, init=False)


class _Plain:
    def __init__(self, n: int) -> None:
        self.n = n


@pytest.mark.parametrize("cls", [_Checked, _Slotted, _Hidden, _Plain])
def test_records_filling_would_change_are_built_by_the_class(cls: type) -> None:
    assert fast_record(cls) is cls


def test_a_default_factory_field_given_is_filled() -> None:
    build = fast_record(_Factory)
    assert build(n=[1]) == _Factory(n=[1]) and build() == _Factory()


def test_replaced_equals_dataclasses_replace() -> None:
    node = NodeSnapshot(**NODE)  # type: ignore[arg-type]
    changed = replaced(node, lock_ref=0, key=(9,))
    assert changed == dataclasses.replace(node, lock_ref=0, key=(9,)) and changed is not node
    assert node.lock_ref == 1  # the original untouched
    with pytest.raises(TypeError):  # a name that is no field: the dataclass's own error
        replaced(node, lock_ref=0, bogus=1)
    with pytest.raises(ValueError):  # a class with __post_init__ is replaced its own way
        replaced(_Checked(1), n=-1)


def test_filled_record_takes_the_dict_or_calls_the_class() -> None:
    fields: dict[str, object] = dict(NODE)
    made = filled_record(NodeSnapshot, fields)
    own = NodeSnapshot(**NODE)  # type: ignore[arg-type]
    assert made == own and hash(made) == hash(own) and repr(made) == repr(own)
    assert vars(made) is fields  # the caller's dict itself, no copy
    partial = {k: v for k, v in NODE.items() if k != "write_pending"}
    assert vars(filled_record(NodeSnapshot, dict(partial))) == vars(own)  # the default, filled
    with pytest.raises(TypeError):  # a name too many: the dataclass's own error
        filled_record(NodeSnapshot, {**NODE, "bogus": 1})
    with pytest.raises(TypeError):  # a default left out and a name that is no field
        filled_record(NodeSnapshot, {**partial, "bogus": 1, "other": 2})
    with pytest.raises(ValueError):  # a class with __post_init__ runs it
        filled_record(_Checked, {"n": -1})
    assert filled_record(_Slotted, {"n": 2}) == _Slotted(2)
    assert filled_record(_Hidden, {"n": 2}) == _Hidden(2)
