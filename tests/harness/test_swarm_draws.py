"""RandomChooser draws what ``random.Random.randint`` and ``randrange`` draw: the same numbers
in the same order, leaving the generator in the same state, so a campaign's runs are the
interpreter's own seeded sequences (a seed names the same trace everywhere)."""

from __future__ import annotations

import random

import pytest

from kvpool.testing.swarm import RandomChooser

RANGES = [(0, 0), (0, 1), (1, 3), (0, 7), (0, 8), (-5, 5), (3, 1000), (0, 2**40), (7, 7)]


@pytest.mark.parametrize("seed", ["0/0", "0/1", "5/17", 12345])
def test_integers_and_choices_match_the_generator(seed: int | str) -> None:
    ours, plain = RandomChooser(random.Random(seed)), random.Random(seed)
    options = tuple("abcdefghij")
    for i in range(3000):
        lo, hi = RANGES[i % len(RANGES)]
        assert ours.integer(lo, hi) == plain.randint(lo, hi)
        cut = options[: 1 + i % len(options)]
        assert ours.choice(cut) == cut[plain.randrange(len(cut))]
    assert ours.rng.getstate() == plain.getstate()


def test_errors_are_the_generators() -> None:
    chooser = RandomChooser(0)
    with pytest.raises(ValueError):
        chooser.integer(3, 2)
    with pytest.raises(ValueError):
        chooser.choice(())


def test_another_kind_of_generator_draws_its_own_way() -> None:
    class Counting(random.Random):
        calls = 0

        def randrange(self, start: int, stop: int | None = None, step: int = 1) -> int:
            Counting.calls += 1
            return super().randrange(start, stop, step)

    chooser = RandomChooser(Counting(1))
    chooser.integer(0, 9)
    chooser.choice((1, 2, 3))
    assert Counting.calls == 2
