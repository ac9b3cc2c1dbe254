"""``kvpool.snapshot``'s records compare through their instance dicts: the answer must be the
one the dataclass's generated ``__eq__`` gives (same class, every compared field equal), with
the generated ``__hash__`` kept, on real snapshots of both twins."""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator

import kvpool.snapshot as snapshot_module
from kvpool.snapshot import AllocatorSnapshot, NodeSnapshot, PoolSnapshot
from kvpool.testing.implementations import optimized_implementation, reference_implementation
from kvpool.testing.lockstep_driver import Lockstep
from kvpool.testing.runs import execute, run_config


def _fields(record: object) -> tuple[object, ...]:
    return tuple(
        getattr(record, f.name)
        for f in dataclasses.fields(record)  # type: ignore[arg-type]
        if f.compare
    )


def _records(value: object) -> Iterator[object]:
    """Every snapshot record inside ``value`` (depth first)."""
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        yield value
        for f in dataclasses.fields(value):
            yield from _records(getattr(value, f.name))
    elif isinstance(value, tuple):
        for item in value:
            yield from _records(item)


def _snapshots(runs: int) -> list[PoolSnapshot]:
    """Both twins' snapshots after every step of the first ``runs`` default-campaign runs."""
    ref, twin = reference_implementation(), optimized_implementation("torch")
    taken: list[PoolSnapshot] = []
    original = Lockstep.run

    def run(self: Lockstep, op: object) -> object:
        out = original(self, op)  # type: ignore[arg-type]
        taken.extend((self.snap_a, self.snap_b))
        return out

    Lockstep.run = run  # type: ignore[method-assign]
    try:
        for i in range(runs):
            chooser, config = run_config("hicache_manager" if i % 2 else "manager", twin, 0, i)
            execute("hicache_manager" if i % 2 else "manager", ref, twin, config,
                    chooser=chooser, steps=30)  # fmt: skip
    finally:
        Lockstep.run = original  # type: ignore[method-assign]
    return taken


def test_every_record_class_but_the_pool_compares_by_its_fields() -> None:
    records = [
        cls
        for cls in vars(snapshot_module).values()
        if isinstance(cls, type) and dataclasses.is_dataclass(cls)
    ]
    assert len(records) > 15
    for cls in records:
        by_dict = cls.__eq__ is snapshot_module._same_fields
        assert by_dict == (cls is not PoolSnapshot), cls.__name__
        assert cls.__hash__ is not None, cls.__name__  # frozen: hashable by value


def test_equality_is_the_field_by_field_answer_on_real_snapshots() -> None:
    by_class: dict[type, list[object]] = {}
    for snap in _snapshots(6):
        for record in _records(snap):
            by_class.setdefault(type(record), []).append(record)
    assert NodeSnapshot in by_class and AllocatorSnapshot in by_class
    for cls, found in by_class.items():
        sample = found[:: max(1, len(found) // 40)]
        for a in sample:
            for b in sample:
                assert (a == b) == (_fields(a) == _fields(b)), cls.__name__
                assert (a != b) == (_fields(a) != _fields(b)), cls.__name__
                if a == b:
                    assert hash(a) == hash(b), cls.__name__


def test_other_types_and_uncompared_fields() -> None:
    a = AllocatorSnapshot(1, 4, 4, (1, 2), (), False)
    as_tuple: object = (1, 4, 4, (1, 2), (), False)
    nothing: object = None
    assert a != as_tuple and a != nothing
    twin = dataclasses.replace(a, need_sort=True)
    assert a != twin and a == dataclasses.replace(twin, need_sort=False)
    pool = _snapshots(1)[-1]
    other = dataclasses.replace(pool, extra={"capacity_refusals": 99})
    assert pool == other  # ``extra`` takes no part in ``==``
