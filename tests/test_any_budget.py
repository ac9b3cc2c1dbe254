"""Each twin names ``typing.Any`` at most :data:`BUDGET` times, and each use says why.

``Any`` switches type checking off where it appears; a twin's components talk to each other
through Protocols and precise types instead. Where ``Any`` stays (a node of whichever tree the
request came from, a match result of an injected tree), a comment on the same line or the line
above gives the reason."""

from __future__ import annotations

import io
import tokenize
from pathlib import Path

import kvpool

ROOT = Path(kvpool.__file__).parent
BUDGET = 10


def any_uses(source: str) -> list[tuple[int, bool]]:
    """(line, explained) for each ``Any`` name in code (imports excluded): explained when the
    line or the one above carries a comment."""
    lines = source.splitlines()
    commented = set()
    uses = []
    for tok in tokenize.generate_tokens(io.StringIO(source).readline):
        if tok.type == tokenize.COMMENT:
            commented.add(tok.start[0])
        elif tok.type == tokenize.NAME and tok.string == "Any":
            line = lines[tok.start[0] - 1].lstrip()
            if not line.startswith(("from ", "import ")):
                uses.append(tok.start[0])
    return [(n, n in commented or n - 1 in commented) for n in uses]


def twin_uses(twin: str) -> list[tuple[str, int, bool]]:
    return [
        (path.relative_to(ROOT).as_posix(), line, explained)
        for path in sorted((ROOT / twin).rglob("*.py"))
        for line, explained in any_uses(path.read_text(encoding="utf-8"))
    ]


def test_the_counter_sees_code_not_imports() -> None:
    source = "from typing import Any\nx: Any = 1  # why\n# because\ny: Any\nz: Any\n"
    assert any_uses(source) == [(2, True), (4, True), (5, False)]


def test_each_twin_stays_within_the_budget() -> None:
    for twin in ("reference", "optimized"):
        uses = twin_uses(twin)
        assert len(uses) <= BUDGET, (twin, uses)


def test_every_any_says_why() -> None:
    for twin in ("reference", "optimized"):
        assert [u for u in twin_uses(twin) if not u[2]] == [], twin
