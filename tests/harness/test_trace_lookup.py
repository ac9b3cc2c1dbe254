"""Trace names are looked up inside the repository (``kvpool/data``) and in the folder
``$KVPOOL_TRACES`` names, nowhere else: the repository stands alone."""

from __future__ import annotations

from pathlib import Path

import pytest

from kvpool.traces import (
    DATA_DIR,
    SAMPLE_TRACE,
    TRACES_ENV_VAR,
    TraceError,
    trace_path,
    traces_dir,
)


def test_unset_means_the_package_data_only(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(TRACES_ENV_VAR, raising=False)
    assert traces_dir() is None
    assert trace_path(SAMPLE_TRACE) == DATA_DIR / SAMPLE_TRACE
    with pytest.raises(TraceError, match=rf"looked up in {DATA_DIR} \(\$KVPOOL_TRACES unset\)$"):
        trace_path("conversation_trace_missing.jsonl")


def test_a_name_is_found_in_the_named_folder(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    (tmp_path / "mine.jsonl").write_text("")
    monkeypatch.setenv(TRACES_ENV_VAR, str(tmp_path))
    assert traces_dir() == tmp_path
    assert trace_path("mine.jsonl") == tmp_path / "mine.jsonl"
    with pytest.raises(TraceError, match=f"looked up in {DATA_DIR} and {tmp_path}$"):
        trace_path("other.jsonl")
