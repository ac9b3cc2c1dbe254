"""The seeded self-check campaign of the reference pools (kvpool.testing.selfcheck)."""

from __future__ import annotations

import pytest

from kvpool.reference.pools.allocator import BaseTokenToKVPoolAllocator
from kvpool.testing.selfcheck import SelfCheckFailure, run_campaign, run_configuration


@pytest.mark.slow
def test_campaign_covers_every_page_size_and_is_deterministic() -> None:
    first = run_campaign(seconds=1e9, seed=3, steps_per_config=150, max_configs=10)
    again = run_campaign(seconds=1e9, seed=3, steps_per_config=150, max_configs=10)
    assert first == again
    assert first.configurations == 10
    assert first.page_sizes == (1, 2, 4, 16, 64)
    assert first.steps == 1500
    quick = run_campaign(seconds=0, seed=3, steps_per_config=10)
    assert quick.configurations == 5  # at least one configuration per page size
    assert first.invariant_checks > 10 * first.steps  # every invariant after every step
    assert first.ooms > 50  # small pools: allocations run out often
    assert first.misuse_checked > 0


def test_campaign_catches_a_leaking_allocator(monkeypatch: pytest.MonkeyPatch) -> None:
    real = BaseTokenToKVPoolAllocator._take_pages

    def leaky(self: BaseTokenToKVPoolAllocator, num_pages: int) -> list[int] | None:
        taken = real(self, num_pages)
        if taken and self.free_pages:  # silently loses one more free page
            self._set_free_lists(self.free_pages[1:], self.release_pages)
        return taken

    monkeypatch.setattr(BaseTokenToKVPoolAllocator, "_take_pages", leaky)
    with pytest.raises(SelfCheckFailure, match="INV-TOKEN-ACCOUNTING") as info:
        run_configuration(4, False, seed=1, steps=200)
    assert "page_size=4" in str(info.value) and "step=" in str(info.value)
