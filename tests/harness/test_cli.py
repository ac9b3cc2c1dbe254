"""``kvpool verify`` and ``kvpool replay`` end to end, with small budgets."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from kvpool.cli import main
from kvpool.constants import EVICTION_POLICIES
from kvpool.replay import ReplaySettings, ReplayStats
from kvpool.testing.campaign import run_campaign
from kvpool.testing.factories import reference_factory
from kvpool.testing.lockstep_driver import Lockstep
from kvpool.testing.swarm import Op


@pytest.mark.slow
def test_verify_reference_vs_optimized(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    report = tmp_path / "verify.json"
    code = main(["verify", "--seconds", "3", "--seed", "7", "--report", str(report)])
    out = capsys.readouterr()
    assert code == 0, out.out
    data = json.loads(report.read_text())
    assert data["failures"] == 0 and data["failure"] is None
    assert data["steps"] > 0 and data["invariant_checks"] > data["steps"]
    assert data["configurations"] >= 1 and data["steps_per_second"] > 0
    assert data["self_check"]["configurations"] >= 5  # phase 1: every page size
    assert "reference self-check" in out.out
    for word in ("configurations", "steps", "invariant checks", "failures", "steps per second"):
        assert word in out.out
    assert "verify" in out.err  # the progress bar


@pytest.mark.slow
def test_verify_rules_runs_both_twins_as_a_release(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """``--rules 0.5.23``: reference@0.5.23 against optimized@0.5.23 (SGLang 0.5.23's rules,
    the lifecycle over the unified tree, chunks cached through ``checkpoint``)."""
    report = tmp_path / "verify.json"
    argv = ["verify", "--rules", "0.5.23", "--seconds", "2", "--seed", "3", "--workers", "0",
            "--no-progress", "--report", str(report)]  # fmt: skip
    code = main(argv)
    out = capsys.readouterr().out
    assert code == 0, out
    assert "reference@0.5.23 vs optimized[torch]@0.5.23" in out
    data = json.loads(report.read_text())
    assert (data["oracle"], data["candidate"]) == ("reference@0.5.23", "optimized[torch]@0.5.23")
    assert data["failures"] == 0 and data["steps"] > 0


@pytest.mark.slow
def test_verify_third_party_implementation(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    report = tmp_path / "verify.json"
    code = main(["verify", "--seconds", "1", "--no-progress", "--report", str(report),
                 "--impl", "tests.harness.buggy_impl:reference_copy"])  # fmt: skip
    assert code == 0
    assert "reference vs tests.harness.buggy_impl:reference_copy" in capsys.readouterr().out
    data = json.loads(report.read_text())
    assert data["candidate"] == "tests.harness.buggy_impl:reference_copy" and data["steps"] > 0


@pytest.mark.slow
def test_verify_reports_a_failure_and_exits_nonzero(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    report = tmp_path / "verify.json"
    code = main(["verify", "--seconds", "20", "--no-progress", "--report", str(report),
                 "--impl", "tests.harness.buggy_impl:leaky_factory"])  # fmt: skip
    out = capsys.readouterr().out
    assert code == 1
    assert "minimal trace" in out and "page map" in out and "step 1:" in out
    failure = json.loads(report.read_text())["failure"]
    assert failure["detector"].startswith("INV-") or failure["detector"] == "lockstep-diff"
    assert 1 <= len(failure["ops"]) <= failure["original_steps"]
    assert f"failed after step {len(failure['ops'])}: " in out


@pytest.mark.slow
def test_campaign_is_deterministic_for_a_seed(monkeypatch: pytest.MonkeyPatch) -> None:
    seen: list[str] = []
    original = Lockstep.run

    def spy(self: Lockstep, op: Op) -> object:
        seen.append(op.render())
        return original(self, op)

    monkeypatch.setattr(Lockstep, "run", spy)

    def steps_of(seed: int) -> list[str]:
        seen.clear()
        run_campaign(reference_factory, reference_factory, 60.0, seed, 20, max_runs=3)
        return list(seen)

    first = steps_of(3)
    assert len(first) == 60
    assert first == steps_of(3) != steps_of(4)


@pytest.mark.slow
def test_replay_compare_policies_and_plot(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    plot, report = tmp_path / "hit.png", tmp_path / "rows.json"
    code = main(["replay", "conversation_sample.jsonl", "--requests", "50", "--pool-tokens",
                 "512", "--page-size", "4", "--block-tokens", "8", "--plot", str(plot),
                 "--plot-pools", "256", "1024", "--report", str(report)])  # fmt: skip
    captured = capsys.readouterr()
    out = captured.out
    assert code == 0
    assert "mode: twin only" in out.splitlines()[0]  # the many-run default
    runs = 2 * len(EVICTION_POLICIES)  # two pool sizes, every policy
    last = f"run {runs}/{runs} {EVICTION_POLICIES[-1]} pool=1024"
    assert last in captured.err  # the progress bar names each run
    rows = json.loads(report.read_text())
    assert len(rows) == runs
    assert {r["policy"] for r in rows} == set(EVICTION_POLICIES)
    assert all(r["requests"] == 50 and r["steps"] > 0 and r["invariant_checks"] > 0 for r in rows)
    assert any(r["matched_tokens"] > 0 for r in rows) and any(r["evicted_tokens"] > 0 for r in rows)
    assert all(0.0 <= r["hit_ratio"] <= 1.0 for r in rows)
    assert plot.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert "hit ratio" in out


@pytest.mark.slow
def test_replay_lockstep_explains_rejections(capsys: pytest.CaptureFixture[str]) -> None:
    code = main(["replay", "conversation_sample.jsonl", "--requests", "12", "--pool-tokens",
                 "512", "--page-size", "4", "--block-tokens", "8", "--no-progress"])  # fmt: skip
    captured = capsys.readouterr()
    assert code == 0
    lines = captured.out.splitlines()
    assert "mode: lockstep" in lines[0]
    assert lines[3].split()[6] == "1"  # request 11: 1362 tokens at 8 per block > 512
    assert lines[-1].startswith("rejected: requests that cannot fit the pool")
    assert captured.err == ""  # --no-progress: no bar


def test_verify_rejects_an_unloadable_impl_before_running(
    capsys: pytest.CaptureFixture[str],
) -> None:
    code = main(["verify", "--seconds", "1", "--no-progress", "--impl", "kvpool_no_such:f"])
    out = capsys.readouterr()
    assert code == 2
    assert "cannot load --impl kvpool_no_such:f" in out.err
    assert "self-check" not in out.out  # failed fast, nothing ran


@pytest.mark.slow
def test_verify_impl_accepts_a_file_path(capsys: pytest.CaptureFixture[str]) -> None:
    path = Path(__file__).with_name("buggy_impl.py")
    code = main(["verify", "--seconds", "1", "--no-progress", "--impl", f"{path}:reference_copy"])
    assert code == 0
    assert f"reference vs {path}:reference_copy" in capsys.readouterr().out


def test_replay_prints_each_row_when_its_run_ends(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    import kvpool.replay

    seen: list[str] = []  # stdout printed before each run starts

    def fake(records: list[object], settings: ReplaySettings, *args: object) -> ReplayStats:
        seen.append(capsys.readouterr().out)
        return ReplayStats(settings.policy, settings.pool_tokens, settings.page_size, len(records))

    monkeypatch.setattr(kvpool.replay, "replay_trace", fake)
    code = main(["replay", "--requests", "5", "--compare-policies", "--no-progress"])
    assert code == 0 and len(seen) == len(EVICTION_POLICIES)
    assert "policy" in seen[0] and "lru" not in seen[0]  # the head, before the first run
    assert [s.split()[0] for s in seen[1:]] == list(EVICTION_POLICIES[:-1])
    assert capsys.readouterr().out.split()[0] == EVICTION_POLICIES[-1]


@pytest.mark.slow
def test_replay_default_trace_is_the_shipped_sample(capsys: pytest.CaptureFixture[str]) -> None:
    code = main(["replay", "--requests", "3", "--pool-tokens", "4096", "--no-progress"])
    out = capsys.readouterr().out
    assert code == 0
    assert out.startswith("trace conversation_sample.jsonl: 3 requests, page size 16")
    assert len(out.splitlines()) == 4  # header, head, rule, one row
