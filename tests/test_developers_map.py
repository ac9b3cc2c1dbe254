"""DEVELOPERS.md's map names every module of ``kvpool/``, so the map cannot drift from the tree.

A module ``kvpool/PKG/NAME.py`` is named when ```NAME.py``` appears in the map's section for
``kvpool/PKG/`` (a ``### kvpool/PKG/`` heading under "## Module map"); a package is named by its
heading. The twins' mirrored files are named by the "## Mirrored files" table, which covers both
``kvpool/reference/`` and ``kvpool/optimized/``."""

from __future__ import annotations

import re
from pathlib import Path

import kvpool

ROOT = Path(kvpool.__file__).parent
DEVELOPERS = ROOT.parent / "DEVELOPERS.md"
TWINS = ("kvpool/reference/", "kvpool/optimized/")
_FILE = re.compile(r"`([A-Za-z_][\w]*\.py)`")
_PACKAGE = re.compile(r"kvpool/(?:\w+/)*")


def _section(text: str, title: str) -> str:
    """The body of the ``## title...`` section (up to the next ``## `` heading)."""
    match = re.search(rf"^## {re.escape(title)}.*?$(.*?)(?=^## |\Z)", text, re.M | re.S)
    assert match, f"DEVELOPERS.md has no '## {title}' section"
    return match.group(1)


def named_modules(text: str) -> dict[str, set[str]]:
    """Package path (``kvpool/.../``) -> the file names its map section names."""
    named: dict[str, set[str]] = {}
    for part in re.split(r"^### ", _section(text, "Module map"), flags=re.M)[1:]:
        heading, _, body = part.partition("\n")
        for package in _PACKAGE.findall(heading):
            named.setdefault(package, set()).update(_FILE.findall(body))
    mirrored = set(_FILE.findall(_section(text, "Mirrored files")))
    for twin in TWINS:
        named.setdefault(twin, set()).update(mirrored)
    return named


def unnamed_modules(text: str) -> list[str]:
    """Every ``kvpool/**/*.py`` the map does not name (packages by their heading)."""
    named = named_modules(text)
    missing = []
    for path in sorted(ROOT.rglob("*.py")):
        package = path.parent.relative_to(ROOT.parent).as_posix() + "/"
        if package not in named:
            missing.append(package)
        elif path.name != "__init__.py" and path.name not in named[package]:
            missing.append(package + path.name)
    return sorted(set(missing))


def test_parser_reads_sections() -> None:
    text = (
        "## Mirrored files\n| `a.py` | A |\n## Module map\n### kvpool/\n| `b.py` | B |\n"
        "### kvpool/cli/\n| `c.py` | C |\n## Rules\n`d.py`\n"
    )
    named = named_modules(text)
    assert named["kvpool/"] == {"b.py"} and named["kvpool/cli/"] == {"c.py"}
    assert named["kvpool/reference/"] == named["kvpool/optimized/"] == {"a.py"}


def test_every_module_is_on_the_map() -> None:
    assert unnamed_modules(DEVELOPERS.read_text(encoding="utf-8")) == []


def test_the_map_names_no_missing_module() -> None:
    """A row for a module that no longer exists is drift too."""
    named = named_modules(DEVELOPERS.read_text(encoding="utf-8"))
    stale = [
        package + name
        for package, names in named.items()
        for name in names
        if package not in TWINS and not (ROOT.parent / package / name).is_file()
    ]
    mirrored = named["kvpool/reference/"] | named["kvpool/optimized/"]
    stale += [
        name
        for name in mirrored
        if not any((ROOT.parent / twin / name).is_file() for twin in TWINS)
    ]
    assert stale == []
