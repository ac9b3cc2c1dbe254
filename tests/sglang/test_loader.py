"""The loader's source resolution, private import system and stubs, on a fake SGLang tree (always
run: needs neither SGLang nor the network)."""

from __future__ import annotations

import importlib.util
import os
import subprocess
import sys
import types
import zipfile
from pathlib import Path
from typing import Any

import pytest

from kvpool.errors import KVPoolError, SGLangLoadError
from kvpool.sglang import importer as importer_mod
from kvpool.sglang import load_sglang, resolve_source
from kvpool.sglang import source as source_mod
from kvpool.sglang.importer import PrivateSGLang
from kvpool.sglang.stubs import NOTHING, is_placeholder, placeholder
from tests.sglang.fake_tree import FILES, make_fake_tree

REAL = ("sglang.srt.mem_cache.thing",)
PARTIAL = {"sglang.srt.utils": ("sglang/srt/utils/common.py", ("ceil_align",))}


def _load(root: Path, prefix: str) -> Any:
    """The fake ``thing`` module loaded under ``prefix`` (the finder removed afterwards)."""
    finder = PrivateSGLang(resolve_source(str(root)), prefix, REAL, PARTIAL)
    finder.install()
    try:
        return finder.import_module("sglang.srt.mem_cache.thing")
    finally:
        sys.meta_path.remove(finder)


def test_real_module_runs_over_stubs(tmp_path: Path) -> None:
    thing = _load(make_fake_tree(tmp_path), "_kvpool_test_fake_a")
    assert thing._is_hip is False and thing.DEBUG is False  # explicit overrides
    assert not thing.FEATURE and not thing.HEAVY  # placeholders are falsy
    assert thing.plain() == 41 and thing.configured() == 42  # stub decorators keep the function
    obj = thing.Thing(10)
    assert obj.pages(4) == 3  # the partial module's real ceil_align (and its helper)
    assert obj.with_region() == 10  # stub context manager
    assert thing.lazy() is thing.Thing  # lazy imports resolve to the same private module
    assert thing.__name__ == "_kvpool_test_fake_a.sglang.srt.mem_cache.thing"


def test_nothing_leaks_into_sys_modules(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    users_sglang = types.ModuleType("sglang")  # as if the user had SGLang installed and imported
    monkeypatch.setitem(sys.modules, "sglang", users_sglang)
    _load(make_fake_tree(tmp_path), "_kvpool_test_fake_b")
    assert sys.modules["sglang"] is users_sglang
    leaked = [m for m in sys.modules if m.startswith(("sglang.", "flashinfer", "vllm"))]
    assert leaked == []
    assert "_kvpool_test_fake_b._external.flashinfer_does_not_exist" in sys.modules


def test_partial_module_takes_only_the_named_definitions(tmp_path: Path) -> None:
    _load(make_fake_tree(tmp_path), "_kvpool_test_fake_c")
    utils = sys.modules["_kvpool_test_fake_c.sglang.srt.utils"]
    assert utils.__dict__["ceil_align"](5, 4) == 8
    assert "unrelated" not in utils.__dict__  # not reached from ceil_align
    assert is_placeholder(utils.unrelated)  # so the stub answers for it


def test_missing_partial_name_is_a_typed_error(tmp_path: Path) -> None:
    root = make_fake_tree(tmp_path)
    partial = {"sglang.srt.utils": ("sglang/srt/utils/common.py", ("no_such_helper",))}
    finder = PrivateSGLang(resolve_source(str(root)), "_kvpool_test_fake_d", REAL, partial)
    finder.install()
    try:
        with pytest.raises(SGLangLoadError, match="no_such_helper"):
            finder.import_module("sglang.srt.mem_cache.thing")
    finally:
        sys.meta_path.remove(finder)


@pytest.mark.parametrize("layout", ["flat", "checkout"])
def test_resolve_directory_layouts(tmp_path: Path, layout: str) -> None:
    root = make_fake_tree(tmp_path, layout)
    found = resolve_source(str(tmp_path))
    assert found.root == root and found.version == "0.5.16"
    assert resolve_source(str(root / "sglang")).root == root  # the package folder itself
    assert found.read("sglang/srt/utils/__init__.py") == FILES["sglang/srt/utils/__init__.py"]
    assert found.read("sglang/nothing.py") is None


def test_resolve_wheel(tmp_path: Path) -> None:
    wheel = tmp_path / "sglang-0.5.23-py3-none-any.whl"
    with zipfile.ZipFile(wheel, "w") as zf:
        zf.writestr("sglang/__init__.py", "")
        zf.writestr("sglang/srt/x.py", "X = 1\n")
    found = resolve_source(str(wheel))
    assert found.version == "0.5.23"  # no _version.py: taken from the file name
    assert found.read("sglang/srt/x.py") == "X = 1\n" and found.read("sglang/y.py") is None


def test_a_wheel_is_opened_once_per_process(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Opening a zip reads its whole directory: many reads share one open wheel, and a process
    of another id (a forked worker) opens its own."""
    wheel = tmp_path / "sglang-0.5.23-py3-none-any.whl"
    with zipfile.ZipFile(wheel, "w") as zf:
        zf.writestr("sglang/__init__.py", "")
        for i in range(5):
            zf.writestr(f"sglang/srt/m{i}.py", f"X = {i}\n")
    found = resolve_source(str(wheel))
    opened: list[Path] = []
    real = zipfile.ZipFile

    def counting(path: Path, *args: Any, **kwargs: Any) -> zipfile.ZipFile:
        opened.append(Path(path))
        return real(path, *args, **kwargs)

    monkeypatch.setattr(zipfile, "ZipFile", counting)
    monkeypatch.setattr(source_mod, "_OPEN_WHEELS", {})
    texts = [found.read(f"sglang/srt/m{i}.py") for i in range(5) for _ in range(3)]
    assert texts == [f"X = {i}\n" for i in range(5) for _ in range(3)]
    assert opened == [wheel]
    monkeypatch.setattr(os, "getpid", lambda: -1)  # as a forked child would see
    assert found.read("sglang/srt/m4.py") == "X = 4\n"
    assert opened == [wheel, wheel]


def test_missing_path_is_a_typed_error(tmp_path: Path) -> None:
    with pytest.raises(SGLangLoadError, match="no SGLang source"):
        load_sglang(str(tmp_path / "nowhere"))
    finders = list(sys.meta_path)
    with pytest.raises(SGLangLoadError, match="allocator"):
        load_sglang(str(make_fake_tree(tmp_path / "fake")))  # no allocator modules
    assert sys.meta_path == finders  # the failed load uninstalled its finder
    (tmp_path / "empty").mkdir()
    with pytest.raises(KVPoolError):
        resolve_source(str(tmp_path / "empty"))
    bad = tmp_path / "bad.whl"
    bad.write_text("not a zip")
    with pytest.raises(SGLangLoadError, match="not a readable wheel"):
        resolve_source(str(bad))


def test_failed_download_is_a_typed_error(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    def fake_pip(cmd: list[str], **kwargs: Any) -> subprocess.CompletedProcess[str]:
        assert cmd[1:5] == ["-m", "pip", "download", "--no-deps"] and "sglang==9.9.9" in cmd
        return subprocess.CompletedProcess(cmd, 1, "", "ERROR: No matching distribution")

    monkeypatch.setattr(subprocess, "run", fake_pip)
    monkeypatch.setenv("KVPOOL_SGLANG_CACHE", str(tmp_path))
    with pytest.raises(SGLangLoadError, match="No matching distribution"):
        resolve_source("9.9.9")


def test_failed_download_names_the_reason_in_one_short_line(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """pip lists every release of the index when a version is missing: the error keeps its
    ERROR lines without that list, and stays short."""
    releases = ", ".join(f"0.{i}.{j}" for i in range(6) for j in range(40))
    pip_says = (
        "WARNING: Location 'file:///x' is ignored: it is neither a file nor a directory.\n"
        f"ERROR: Could not find a version that satisfies the requirement sglang==9.9.9 "
        f"(from versions: {releases})\n"
        "ERROR: No matching distribution found for sglang==9.9.9\n"
    )

    def fake_pip(cmd: list[str], **kwargs: Any) -> subprocess.CompletedProcess[str]:
        return subprocess.CompletedProcess(cmd, 1, "", pip_says)

    monkeypatch.setattr(subprocess, "run", fake_pip)
    monkeypatch.setenv("KVPOOL_SGLANG_CACHE", str(tmp_path))
    with pytest.raises(SGLangLoadError) as caught:
        resolve_source("9.9.9")
    message = str(caught.value)
    assert "No matching distribution found for sglang==9.9.9" in message
    assert "satisfies the requirement sglang==9.9.9" in message
    assert "from versions" not in message and "0.3.7" not in message
    assert "WARNING" not in message and "\n" not in message
    reason = message.split(": ", 1)[1]
    assert len(reason) <= source_mod.PIP_FAILURE_CHARS + len(str(tmp_path)) + 40


def test_pip_failure_without_error_lines_keeps_the_last_lines() -> None:
    out = "one\ntwo\nthree\nfour\n"
    assert source_mod.pip_failure(out) == "two | three | four"
    assert source_mod.pip_failure("") == "pip gave no output"
    assert source_mod.pip_failure("ERROR: " + "x" * 1000).endswith("...")
    assert len(source_mod.pip_failure("ERROR: " + "x" * 1000)) == source_mod.PIP_FAILURE_CHARS


def test_no_installed_sglang(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(importlib.util, "find_spec", lambda name: None)
    with pytest.raises(SGLangLoadError, match="no installed sglang"):
        resolve_source("installed")


def test_placeholders() -> None:
    stub: Any = placeholder("Stubbed", "somewhere")
    assert not stub and stub(1, 2) is NOTHING and is_placeholder(stub.child.grandchild)

    def fn() -> int:
        return 1

    assert stub(fn) is fn and stub(key="x")(fn) is fn  # bare and configured decorators
    assert stub(placeholder("Other", "x")) is NOTHING  # a placeholder argument is not decorated

    class Real(stub):  # type: ignore[misc]
        def __init__(self, x: int) -> None:
            self.x = x

    assert Real(3).x == 3 and bool(Real)  # a real subclass is an ordinary class
    with NOTHING as value:
        assert value is NOTHING and list(NOTHING) == [] and not NOTHING.anything()
    assert importer_mod.PrivateSGLang is PrivateSGLang
