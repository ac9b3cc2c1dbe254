"""Every ```python block of every specs/*.md page runs, in order, in one namespace per page.

The blocks assert their own results, so a page whose worked example drifts from the code fails
here. Only the pages in ``PROSE_ONLY`` may have no blocks; every other page must assert."""

from __future__ import annotations

import re
import sys
import types
from pathlib import Path

import pytest

SPECS = Path(__file__).resolve().parent.parent / "specs"
_BLOCK = re.compile(r"^```python[ \t]*\n(.*?)^```[ \t]*$", re.DOTALL | re.MULTILINE)


def python_blocks(text: str) -> list[str]:
    """The bodies of the page's ```python fenced blocks, in order."""
    return [m.group(1) for m in _BLOCK.finditer(text)]


def test_block_extraction() -> None:
    page = "x\n```python\na = 1\n```\n```text\nno\n```\n```python\nb = a + 1\n```\n"
    assert python_blocks(page) == ["a = 1\n", "b = a + 1\n"]


PROSE_ONLY = {"README.md"}
"""Pages allowed to have no executed example; every other page must show (and assert) one."""


def test_specs_exist() -> None:
    assert (SPECS / "README.md").is_file()


@pytest.mark.parametrize("page", sorted(SPECS.glob("*.md")), ids=lambda p: p.name)
def test_component_pages_assert_their_examples(page: Path) -> None:
    # A page that lost its blocks (or whose blocks only print) would otherwise pass silently.
    if page.name in PROSE_ONLY:
        return
    blocks = python_blocks(page.read_text(encoding="utf-8"))
    assert blocks, f"{page.name} has no ```python example"
    assert any(re.search(r"^\s*assert\b", b, re.MULTILINE) for b in blocks), page.name


@pytest.mark.slow
@pytest.mark.parametrize("page", sorted(SPECS.glob("*.md")), ids=lambda p: p.name)
def test_spec_page_examples_run(page: Path) -> None:
    # A real module object, registered while the page runs, so dataclasses and pickling work.
    module = types.ModuleType(f"kvpool_spec_{page.stem}")
    sys.modules[module.__name__] = module
    try:
        for i, block in enumerate(python_blocks(page.read_text(encoding="utf-8"))):
            code = compile(block, f"{page.name}[block {i}]", "exec")
            exec(code, module.__dict__)
    finally:
        del sys.modules[module.__name__]
