"""``kvpool diff-kernel``: PASS / FAIL verdicts and exit codes on candidate kernels."""

from __future__ import annotations

from pathlib import Path

import pytest

from kvpool.cli import main

FAST = ["--examples", "25", "--max-tokens", "128", "--max-batch", "6"]


def test_correct_kernel_passes(capsys: pytest.CaptureFixture[str]) -> None:
    code = main(
        ["diff-kernel", "tests.kernels.candidates:alloc_extend_ok", "--op", "alloc_extend", *FAST]
    )
    out = capsys.readouterr().out
    assert code == 0, out
    assert "PASS alloc_extend" in out and "edges:" in out


@pytest.mark.slow
def test_buggy_kernel_fails_with_the_minimal_input(capsys: pytest.CaptureFixture[str]) -> None:
    target = "tests.kernels.candidates:alloc_extend_shared_cursor"
    code = main(["diff-kernel", target, "--op", "alloc_extend", "--seed", "1", *FAST])
    out = capsys.readouterr().out
    assert code == 1
    assert "FAIL alloc_extend" in out
    assert "req 1:" in out and "first difference at position" in out and "free-list effect" in out


def test_kvpool_backend_option_and_file_path_target(capsys: pytest.CaptureFixture[str]) -> None:
    code = main(
        [
            "diff-kernel",
            "kvpool.kernels:get_last_loc",
            "--op",
            "get_last_loc",
            "--backend",
            "torch",
            *FAST,
        ]
    )
    assert code == 0, capsys.readouterr().out
    path = Path(__file__).with_name("candidates.py")
    code = main(["diff-kernel", f"{path}:get_last_loc_off_by_one", "--op", "get_last_loc", *FAST])
    assert code == 1
    assert "FAIL get_last_loc" in capsys.readouterr().out


@pytest.mark.slow
def test_shuffle_finds_the_race_the_plain_run_misses(capsys: pytest.CaptureFixture[str]) -> None:
    target = "tests.kernels.candidates:alloc_decode_racy_triton"
    options = [
        "--op",
        "alloc_decode",
        "--examples",
        "20",
        "--max-tokens",
        "32",
        "--page-sizes",
        "1,4",
    ]
    assert main(["diff-kernel", target, *options]) == 0
    capsys.readouterr()
    assert main(["diff-kernel", target, *options, "--shuffle"]) == 1
    out = capsys.readouterr().out
    assert "checked interpreter, shuffled orders" in out and "[order-dependence]" in out


@pytest.mark.parametrize(
    "target",
    [
        "no_colon_here",
        "tests.kernels.no_such_module:f",
        "tests.kernels.candidates:no_such_function",
    ],
)
def test_bad_target_exits_2(target: str, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["diff-kernel", target, "--op", "alloc_extend"]) == 2
    assert "error:" in capsys.readouterr().err


def test_bad_page_size_exits_2(capsys: pytest.CaptureFixture[str]) -> None:
    target = "tests.kernels.candidates:alloc_extend_ok"
    assert main(["diff-kernel", target, "--op", "alloc_extend", "--page-sizes", "3"]) == 2
    assert "powers of two" in capsys.readouterr().err


def test_checked_on_a_plain_torch_function_does_not_claim_a_check(
    capsys: pytest.CaptureFixture[str],
) -> None:
    target = "kvpool.kernels:get_last_loc"
    code = main(["diff-kernel", target, "--op", "get_last_loc", "--backend", "torch", "--checked",
                 *FAST])  # fmt: skip
    out = capsys.readouterr()
    assert code == 2
    assert "outputs compared only" in out.out and "(checked interpreter" not in out.out
    assert out.err.count("\n") == 1 and "--checked/--shuffle did not apply" in out.err
    code = main(["diff-kernel", target, "--op", "get_last_loc", "--backend", "interpret",
                 "--checked", "--examples", "3", "--page-sizes", "4"])  # fmt: skip
    out = capsys.readouterr()
    assert code == 0, out.err
    assert "(checked interpreter: " in out.out and " launches)" in out.out
