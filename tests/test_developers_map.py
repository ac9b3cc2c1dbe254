"""DEVELOPERS.md's map names every module of ``kvpool/``, so the map cannot drift from the tree.

A module ``kvpool/PKG/NAME.py`` is named when ```NAME.py``` appears in the map's section for
``kvpool/PKG/`` (a ``### kvpool/PKG/`` heading under "## Module map"); a package is named by its
heading. The twins' files are named by the "## Wings" block: one row per wing with its floor and
its files (``*``: the optimized twin only; ``+``: the reference only, a pure helper both twins
import), which :func:`wing_floors` also hands to the import
graph test, so the floors drawn for readers are the floors checked."""

from __future__ import annotations

import re
from pathlib import Path

import kvpool

ROOT = Path(kvpool.__file__).parent
DEVELOPERS = ROOT.parent / "DEVELOPERS.md"
TWINS = ("reference", "optimized")
_FILE = re.compile(r"`([A-Za-z_][\w]*\.py)`")
_PACKAGE = re.compile(r"kvpool/(?:\w+/)*")
_WING_ROW = re.compile(r"^\s*(\d+)\s+(\w+/|\(root\))\s+(.*)$")
_CONTINUATION = re.compile(r"^\s{8,}([\w.*+ ]+\.py[*+]?)\s*$")
ROOT_WING = ""


def _section(text: str, title: str) -> str:
    """The body of the ``## title...`` section (up to the next ``## `` heading)."""
    match = re.search(rf"^## {re.escape(title)}.*?$(.*?)(?=^## |\Z)", text, re.M | re.S)
    assert match, f"DEVELOPERS.md has no '## {title}' section"
    return match.group(1)


def named_modules(text: str) -> dict[str, set[str]]:
    """Package path (``kvpool/.../``) -> the file names its map section names (the twins
    excluded: see :func:`wing_files`)."""
    named: dict[str, set[str]] = {}
    for part in re.split(r"^### ", _section(text, "Module map"), flags=re.M)[1:]:
        heading, _, body = part.partition("\n")
        for package in _PACKAGE.findall(heading):
            named.setdefault(package, set()).update(_FILE.findall(body))
    return named


def wing_table(text: str) -> dict[str, tuple[int, dict[str, str]]]:
    """Wing (``"pools"``, ..., ``""`` for the root) -> (its floor, file name -> where it lives:
    ``"both"``, ``"optimized"`` or ``"reference"``)."""
    block = _section(text, "Wings").split("```")[1]
    table: dict[str, tuple[int, dict[str, str]]] = {}
    current = None
    for line in block.splitlines():
        if row := _WING_ROW.match(line):
            current = ROOT_WING if row.group(2) == "(root)" else row.group(2).rstrip("/")
            table[current] = (int(row.group(1)), {})
            names = row.group(3)
        elif (cont := _CONTINUATION.match(line)) and current is not None:
            names = cont.group(1)
        else:
            continue
        for name in names.split():
            side = {"*": "optimized", "+": "reference"}.get(name[-1], "both")
            table[current][1][name.rstrip("*+")] = side
    return table


def wing_floors() -> dict[str, int]:
    """Wing -> its floor, as DEVELOPERS.md draws them (``""``: the twin's root)."""
    return {w: floor for w, (floor, _) in wing_table(DEVELOPERS.read_text("utf-8")).items()}


def wing_files(text: str, twin: str) -> set[str]:
    """``W/X.py`` (``X.py`` at the root) of every file the wing block names for ``twin``."""
    out = set()
    for wing, (_, files) in wing_table(text).items():
        for name, side in files.items():
            if side in ("both", twin):
                out.add(f"{wing}/{name}" if wing else name)
    return out


def twin_files(twin: str) -> set[str]:
    """The twin's modules as ``W/X.py`` (package ``__init__`` files excluded)."""
    base = ROOT / twin
    return {p.relative_to(base).as_posix() for p in base.rglob("*.py") if p.name != "__init__.py"}


def unnamed_modules(text: str) -> list[str]:
    """Every ``kvpool/**/*.py`` outside the twins that the map does not name (packages by their
    heading)."""
    named = named_modules(text)
    missing = []
    for path in sorted(ROOT.rglob("*.py")):
        rel = path.relative_to(ROOT)
        if rel.parts[0] in TWINS:
            continue
        package = path.parent.relative_to(ROOT.parent).as_posix() + "/"
        if package not in named:
            missing.append(package)
        elif path.name != "__init__.py" and path.name not in named[package]:
            missing.append(package + path.name)
    return sorted(set(missing))


def test_parser_reads_sections() -> None:
    text = (
        "## Wings\n```\nfloor wing files\n  1    pools/  a.py b.py*\n"
        "                 c.py d.py+\n  0    (root)  r.py\n```\n"
        "## Module map\n### kvpool/\n| `b.py` | B |\n"
        "### kvpool/cli/\n| `c.py` | C |\n## Rules\n`d.py`\n"
    )
    named = named_modules(text)
    assert named["kvpool/"] == {"b.py"} and named["kvpool/cli/"] == {"c.py"}
    table = wing_table(text)
    pools = {"a.py": "both", "b.py": "optimized", "c.py": "both", "d.py": "reference"}
    assert table == {"pools": (1, pools), "": (0, {"r.py": "both"})}
    assert wing_files(text, "reference") == {"pools/a.py", "pools/c.py", "pools/d.py", "r.py"}
    assert wing_files(text, "optimized") == {"pools/a.py", "pools/b.py", "pools/c.py", "r.py"}


def test_every_module_is_on_the_map() -> None:
    assert unnamed_modules(DEVELOPERS.read_text(encoding="utf-8")) == []


def test_the_map_names_no_missing_module() -> None:
    """A row for a module that no longer exists is drift too."""
    named = named_modules(DEVELOPERS.read_text(encoding="utf-8"))
    stale = [
        package + name
        for package, names in named.items()
        for name in names
        if not (ROOT.parent / package / name).is_file()
    ]
    assert stale == []


def test_the_wings_are_the_twins_files() -> None:
    """Each twin holds exactly the files the wing block names for it: the same wings and files
    on both sides, the twin-only files marked."""
    text = DEVELOPERS.read_text(encoding="utf-8")
    for twin in TWINS:
        assert twin_files(twin) == wing_files(text, twin), twin


def test_every_wing_exports_its_package() -> None:
    """Each wing is a package whose ``__init__`` names its public classes in ``__all__``."""
    for twin in TWINS:
        for wing in wing_floors():
            if wing:
                init = ROOT / twin / wing / "__init__.py"
                assert init.is_file() and "__all__" in init.read_text(encoding="utf-8"), init
