"""The repository stands alone: every fact its code, tests and pages cite lives in ``specs/``.

Checked over every ``.py`` and ``.md`` file of the repository: a ``specs/NAME.md`` it names
exists; a "NAME.md, section N" it cites is a numbered ``## N.`` heading of that page; a relative
link of a page to another ``.md`` file resolves; and nothing points outside the repository (the
parent folder, or a semantics document kept elsewhere)."""

from __future__ import annotations

import re
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
SPECS = REPO / "specs"
_SKIP = {".git", ".venv", "build", "dist", "__pycache__", ".mypy_cache", ".ruff_cache"}
_SPEC_NAME = re.compile(r"specs/(\w+\.md)")
_SECTION = re.compile(r"(\w+\.md)\)?,? sections? (\d+)")
_LINK = re.compile(r"\]\(([^)#\s]+\.md)(?:#[^)]*)?\)")
_OUTSIDE = (re.compile(r"\.\./" + "shared"), re.compile("SEMAN" + "TICS"))


def repository_files() -> list[Path]:
    """Every ``.py`` and ``.md`` file of the repository (build and tool folders left out)."""
    return sorted(
        p
        for p in REPO.rglob("*")
        if p.suffix in (".py", ".md") and not _SKIP & set(p.relative_to(REPO).parts)
    )


def _numbered_sections(page: Path) -> set[str]:
    return set(re.findall(r"^## (\d+)\.", page.read_text(encoding="utf-8"), re.M))


def citation_problems(files: list[Path]) -> list[str]:
    problems = []
    for path in files:
        if path == Path(__file__).resolve():
            continue  # its own examples and patterns
        text = path.read_text(encoding="utf-8")
        where = path.relative_to(REPO).as_posix() if path.is_relative_to(REPO) else path.name
        for name in _SPEC_NAME.findall(text):
            if not (SPECS / name).is_file():
                problems.append(f"{where}: names specs/{name}, which does not exist")
        for name, number in _SECTION.findall(text):
            page = SPECS / name
            if not page.is_file() or number not in _numbered_sections(page):
                problems.append(f"{where}: cites {name} section {number}, not in specs/")
        if path.suffix == ".md":
            for target in _LINK.findall(text):
                if "://" not in target and not (path.parent / target).resolve().is_file():
                    problems.append(f"{where}: links to {target}, which does not exist")
        problems += [f"{where}: points outside the repository ({p.pattern})"
                     for p in _OUTSIDE if p.search(text)]  # fmt: skip
    return problems


def test_the_scan_sees_code_tests_and_pages() -> None:
    names = {p.relative_to(REPO).as_posix() for p in repository_files()}
    assert {"README.md", "DEVELOPERS.md", "specs/sglang_behaviour.md"} <= names
    assert "kvpool/kernels/alloc_extend.py" in names and "tests/test_specs.py" in names


def test_a_bad_citation_is_reported(tmp_path: Path) -> None:
    bad = tmp_path / "x.md"
    outside = "../" + "shared"
    bad.write_text(f"specs/nowhere.md; sglang_behaviour.md, section 99; [a](missing.md); {outside}")
    problems = citation_problems([bad])
    assert [p.split(": ")[1].split(" ")[0] for p in problems] == [
        "names",
        "cites",
        "links",
        "points",
    ]
    good = tmp_path / "y.md"
    good.write_text("specs/fidelity.md; sglang_behaviour.md, section 10; [s](y.md)")
    assert citation_problems([good]) == []


def test_every_citation_resolves_inside_the_repository() -> None:
    assert citation_problems(repository_files()) == []
