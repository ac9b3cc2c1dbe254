"""``kvpool.snapshot``'s records compare through their instance dicts: the answer must be the
one the dataclass's generated ``__eq__`` gives (same class, every compared field equal), with
the generated ``__hash__`` kept, on real snapshots of both twins."""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator
from typing import Any

import kvpool.snapshot as snapshot_module
from kvpool.snapshot import (
    AllocatorSnapshot,
    HostTierSnapshot,
    MambaNodeSnapshot,
    MambaTreeSnapshot,
    NodeSnapshot,
    PoolSnapshot,
)
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


def _snapshots(
    runs: int,
    machines: tuple[str, ...] = ("manager", "hicache_manager"),
    trees: list[object] | None = None,
) -> list[PoolSnapshot]:
    """Both twins' snapshots after every step of the first ``runs`` runs, the machines taking
    turns; ``trees`` (when given) also receives each side's tree cache snapshot, as the cache
    takes it."""
    ref, twin = reference_implementation(), optimized_implementation("torch")
    taken: list[PoolSnapshot] = []
    original = Lockstep._snapshot

    def snapshot(self: Lockstep, manager: Any, side: int) -> PoolSnapshot:
        snap = original(self, manager, side)
        taken.append(snap)  # (each one as taken: a step that then fails still shows its own)
        if trees is not None:  # the tree cache's own snapshot (a Mamba tree's nodes too)
            trees.append(manager.tree_cache.snapshot())
        return snap

    Lockstep._snapshot = snapshot  # type: ignore[method-assign]
    try:
        for i in range(runs):
            machine = machines[i % len(machines)]
            chooser, config = run_config(machine, twin, 0, i)
            execute(machine, ref, twin, config, chooser=chooser, steps=30)
    finally:
        Lockstep._snapshot = original  # type: ignore[method-assign]
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


def test_every_record_holds_exactly_its_fields() -> None:
    """The builders' literals (``filled_record``'s precondition): every record of both twins'
    snapshots, on every kind of manager, holds each field of its class once and nothing else."""
    seen: set[type] = set()
    trees: list[object] = []
    machines = ("manager", "hicache_manager", "swa_manager", "mamba_manager")
    for snap in [*_snapshots(16, machines, trees), *trees]:
        for record in _records(snap):
            names = {f.name for f in dataclasses.fields(record)}  # type: ignore[arg-type]
            assert vars(record).keys() == names, type(record).__name__
            seen.add(type(record))
    assert {MambaNodeSnapshot, MambaTreeSnapshot, HostTierSnapshot} <= seen, sorted(
        c.__name__ for c in seen
    )


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
