"""A campaign's progress bar on stderr: seconds of its time budget, and a count beside them.

``kvpool verify`` counts lockstep steps and ``kvpool sessions`` plans; both run for a time
budget, so the bar's length is that budget in seconds and the count is a postfix. Made with
tqdm (MPL 2.0 / MIT), refreshed at most twice a second.
"""

from __future__ import annotations

import sys
from typing import Any


class CampaignBar:
    """A bar of ``seconds`` (the budget) labelled ``desc``; :meth:`update` moves it to
    ``elapsed`` seconds (never past the budget) with ``count`` ``unit`` beside it."""

    def __init__(self, seconds: float, desc: str, unit: str) -> None:
        from tqdm import tqdm

        self.unit = unit
        self.bar: Any = tqdm(total=round(seconds, 1), unit="s", desc=desc, file=sys.stderr,
                             bar_format="{l_bar}{bar}| {n:.1f}/{total:.1f}s {postfix}",
                             mininterval=0.5)  # fmt: skip

    def update(self, elapsed: float, count: int) -> None:
        """Show ``elapsed`` seconds of the budget gone and ``count`` units done."""
        self.bar.n = min(round(elapsed, 1), self.bar.total)
        self.bar.set_postfix_str(f"{count} {self.unit}", refresh=False)
        self.bar.update(0)

    def close(self) -> None:
        self.bar.close()


__all__ = ["CampaignBar"]
