"""Bad ``kvpool`` invocations: each ends in ONE line ``kvpool: error: ...`` naming the bad value
and what is expected, exit code 2, before any work starts (nothing on stdout, no traceback).

:data:`BAD` is the table (every subcommand); ``{tmp}`` and the other fields are filled in from
:func:`_files`. A few rows also run through a real process, to prove no traceback escapes.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from kvpool.cli import EXIT_INTERNAL, main

KEEP = "tests.kernels.candidates:alloc_extend_ok"

BAD: list[tuple[str, str]] = [
    # (command line, expected part of the message)
    ("", "the following arguments are required: COMMAND"),
    ("nosuchcommand", "invalid choice: 'nosuchcommand'"),
    ("--nope verify", "unrecognized arguments: --nope"),
    # verify
    ("verify --seconds 0", "--seconds: got '0', expected a positive finite number"),
    ("verify --seconds -1", "got '-1', expected a positive finite number"),
    ("verify --seconds nan", "got 'nan', expected a positive finite number"),
    ("verify --seconds inf", "got 'inf', expected a positive finite number"),
    ("verify --seconds soon", "got 'soon', expected a positive finite number"),
    ("verify --steps-per-run 0", "--steps-per-run: got '0', expected a positive integer"),
    ("verify --steps-per-run -3", "got '-3', expected a positive integer"),
    ("verify --steps-per-run 1.5", "got '1.5', expected a positive integer"),
    ("verify --seed x", "--seed: invalid int value: 'x'"),
    ("verify --report {tmp}/no/dir/r.json", "does not exist"),
    ("verify --report {tmp}", "expected a file path, not a directory"),
    ("verify --impl nocolon", "got 'nocolon', expected MODULE:NAME or path/to/file.py:NAME"),
    ("verify --impl 'a b:f'", "got 'a b:f', expected MODULE:NAME"),
    ("verify --impl mod:", "got 'mod:', expected MODULE:NAME"),
    ("verify --impl ./missing_impl.py:f", "missing_impl.py: no such file"),
    ("verify --impl kvpool_no_such_mod:f --seconds 1", "cannot load --impl kvpool_no_such_mod:f"),
    ("verify --backend cuda", "--backend: invalid choice: 'cuda'"),
    ("verify --naive", "--naive selects SGLang's naive extend path"),
    ("verify --tree-core rust", "--tree-core selects SGLang's unified-cache tree core"),
    ("verify --tree-core java", "invalid choice: 'java'"),
    ("verify --tree-components full,swa", "give it with --component unified_radix_cache"),
    ("verify --tree-components full,host", "invalid choice: 'full,host'"),
    ("verify --oracle no_such_module:thing", "no_such_module"),
    ("verify --rules 0.4.1", "--rules: no rules preset for SGLang '0.4.1'"),
    ("verify --rules 0.5.23 --sglang 0.5.23", "sglang:0.5.23 brings its own"),
    ("verify --rules 0.5.23 --impl kvpool_no_such_mod:f", "kvpool_no_such_mod:f brings its own"),
    ("verify --rules 0.5.23 --oracle reference@0.5.16", "names its release already"),
    ("verify --impl optimized@0.4 --seconds 1", "cannot load --impl optimized@0.4: no rules"),
    ("verify --ray http://head:10001", "--ray: got 'http://head:10001', expected ray://HOST:PORT"),
    ("verify --ray head", "got 'head', expected ray://HOST:PORT, HOST:PORT, auto or local"),
    ("verify --ray local --workers 0", "--workers 0 runs in this process; it cannot be combined"),
    ("verify --ray 127.0.0.1:1 --seconds 1", "cannot reach a Ray cluster at 127.0.0.1:1"),
    ("verify --unknown", "unrecognized arguments: --unknown"),
    ("verify extra", "unrecognized arguments: extra"),
    # diff-kernel
    ("diff-kernel", "the following arguments are required: TARGET, --op"),
    (f"diff-kernel {KEEP}", "the following arguments are required: --op"),
    (f"diff-kernel {KEEP} --op nope", "--op: invalid choice: 'nope'"),
    ("diff-kernel nocolon --op alloc_extend", "got 'nocolon', expected MODULE:NAME"),
    ("diff-kernel ./missing_k.py:f --op alloc_extend", "missing_k.py: no such file"),
    ("diff-kernel kvpool_no_such:f --op alloc_extend", "cannot load kvpool_no_such:f"),
    ("diff-kernel kvpool.constants:nope --op alloc_extend", "has no attribute 'nope'"),
    ("diff-kernel kvpool.constants:RESERVED_INDEX --op alloc_extend", "is not callable"),
    ("diff-kernel {broken}:f --op alloc_extend", "SyntaxError"),
    (f"diff-kernel {KEEP} --op alloc_extend --examples 0", "--examples: got '0', expected a pos"),
    (f"diff-kernel {KEEP} --op alloc_extend --examples x", "got 'x', expected a positive integer"),
    (f"diff-kernel {KEEP} --op alloc_extend --page-sizes 3", "got '3', expected comma-separated"),
    (f"diff-kernel {KEEP} --op alloc_extend --page-sizes 1,0", "got '1,0', expected comma-sep"),
    (f"diff-kernel {KEEP} --op alloc_extend --max-tokens 0", "--max-tokens: got '0', expected"),
    (f"diff-kernel {KEEP} --op alloc_extend --max-batch -1", "--max-batch: got '-1', expected"),
    (f"diff-kernel {KEEP} --op alloc_extend --short bogus", "--short: invalid choice: 'bogus'"),
    # replay: the trace
    ("replay missing.jsonl", "trace 'missing.jsonl': no such file"),
    ("replay ./nodir/x.jsonl", "trace './nodir/x.jsonl': no such file"),
    ("replay {tmp}", "is not a file"),
    ("replay {not_json}", "line 2: not JSON"),
    ("replay {no_field}", "line 1: expected an object with fields"),
    ("replay {too_long}", "line 1: input_length 5000 does not fit its 1 block(s)"),
    ("replay {bad_id}", "line 1: invalid literal for int()"),
    ("replay {empty}", "holds no request"),
    # replay: numbers
    ("replay --block-tokens 0", "--block-tokens: got '0', expected a positive integer"),
    ("replay --block-tokens 513", "--block-tokens 513: expected 1 to 512"),
    ("replay --chunk-size -5", "--chunk-size: got '-5', expected an integer >= 0"),
    ("replay --page-size 0", "--page-size: got '0', expected a positive power of two"),
    ("replay --page-size 3", "got '3', expected a positive power of two"),
    ("replay --concurrency 0", "--concurrency: got '0', expected a positive integer"),
    ("replay --requests 0", "--requests: got '0', expected a positive integer"),
    ("replay --requests x", "--requests: got 'x', expected a positive integer"),
    ("replay --pool-tokens 0", "--pool-tokens: got '0', expected a positive integer"),
    ("replay --pool-tokens 8 --page-size 16", "--pool-tokens 8: expected at least one page"),
    ("replay --max-output 0", "--max-output: got '0', expected a positive integer"),
    ("replay --every 0", "--every: got '0', expected a positive integer"),
    ("replay --policy nope", "--policy: invalid choice: 'nope'"),
    ("replay --backend cuda", "--backend: invalid choice: 'cuda'"),
    ("replay --twin-only --lockstep", "not allowed with argument"),
    # replay: outputs (checked when parsed, not after the runs)
    ("replay --plot {tmp}/no/dir/p.png", "does not exist"),
    ("replay --plot {tmp}/p.txt", "expected a file name ending in .png, .pdf, .svg"),
    ("replay --plot {tmp}", "expected a file path, not a directory"),
    ("replay --report {tmp}/no/dir/r.json", "does not exist"),
    ("replay --plot {tmp}/p.png --plot-pools 0", "--plot-pools: got '0', expected a positive"),
    ("replay --plot {tmp}/p.png --plot-pools 8", "--plot-pools 8: expected at least one page"),
    ("replay --plot-pools 1024", "--plot-pools needs --plot"),
    # bench
    ("bench --only nosuchbench", "--only 'nosuchbench' matches no script"),
    ("bench --quick extra", "unrecognized arguments: extra"),
    # sessions
    ("sessions --seconds 0", "--seconds: got '0', expected a positive finite number"),
    ("sessions --runs 0", "--runs: got '0', expected a positive integer"),
    ("sessions --seed x", "--seed: invalid int value: 'x'"),
    ("sessions --page-size 2", "--page-size: invalid choice: 2"),
    ("sessions --model mamba", "--model: invalid choice: 'mamba'"),
    ("sessions --tree-core java", "--tree-core: invalid choice: 'java'"),
    ("sessions --sessions 3", "--sessions: invalid choice: '3'"),
    ("sessions --eagle yes", "--eagle: invalid choice: 'yes'"),
    ("sessions --eagle with --model hybrid", "--eagle with runs the full and swa models only"),
    ("sessions --run-timeout 0", "--run-timeout: got '0', expected a positive finite number"),
    ("sessions --chunked-prefill yes", "--chunked-prefill: invalid choice: 'yes'"),
    ("sessions --model hybrid --page-size 4", "--model hybrid runs at page size 1 only, not 4"),
    ("sessions --sglang {tmp}/nowhere", "no SGLang source at"),
    ("sessions extra", "unrecognized arguments: extra"),
    ("sessions --workers -1", "--workers: got '-1', expected an integer >= 0"),
    ("sessions --plain-requests sometimes", "--plain-requests: invalid choice: 'sometimes'"),
    ("sessions --plan nonsense", "--plan: 'nonsense' is not a Python or JSON list of turns"),
    ("sessions --report {tmp}", "expected a file path, not a directory"),
    ("sessions --plan '[(1, 1)]'", "--plan: turn 0 is not a 7-tuple"),
    ("sessions --plan '[(1, 9, 0, None, False, None, False)]'", "sampled 9 is not an integer in"),
    ("sessions --plan '[(1, 1, 0, None, False, \"x\", False)]'", "retracted 'x' is not one of"),
    ("sessions --plan '[(1, 1, 0, None, False, None, False)]' --runs 3", "--plan plays one plan"),
]


def _files(tmp: Path) -> dict[str, str]:
    """Bad inputs on disk: traces that are not traces, a module that does not compile."""
    good = '{"timestamp": 0, "input_length": 10, "output_length": 1, "hash_ids": [1]}\n'
    bodies = {
        "not_json": good + "{oops\n",
        "no_field": '{"timestamp": 0}\n',
        "too_long": '{"timestamp": 0, "input_length": 5000, "output_length": 1, "hash_ids": [1]}',
        "bad_id": '{"timestamp": 0, "input_length": 5, "output_length": 1, "hash_ids": ["x"]}',
        "empty": "\n",
    }
    paths = {"tmp": str(tmp)}
    for name, body in bodies.items():
        (tmp / f"{name}.jsonl").write_text(body)
        paths[name] = str(tmp / f"{name}.jsonl")
    (tmp / "broken.py").write_text("def f(:\n")
    paths["broken"] = str(tmp / "broken.py")
    return paths


def _argv(line: str, tmp: Path) -> list[str]:
    import shlex

    return shlex.split(line.format(**_files(tmp)))


def test_the_table_covers_every_subcommand() -> None:
    assert len(BAD) >= 50
    for command in ("verify", "diff-kernel", "replay", "bench"):
        assert sum(line.split(" ")[0] == command for line, _ in BAD) >= 2, command


@pytest.mark.parametrize(("line", "expected"), BAD, ids=[line for line, _ in BAD])
def test_bad_invocation_is_one_line_and_exit_2(
    line: str, expected: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    code = main(_argv(line, tmp_path))
    out = capsys.readouterr()
    assert code == 2, out
    assert out.out == "", "the work must not start"
    lines = out.err.splitlines()
    assert len(lines) == 1 and lines[0].startswith("kvpool: error: "), out.err
    assert expected in lines[0], lines[0]


def _kvpool(*argv: str, cwd: Path | None = None) -> subprocess.CompletedProcess[str]:
    root = Path(__file__).resolve().parents[2]
    env = {"PYTHONPATH": str(root), "PATH": "/usr/bin:/bin"}
    return subprocess.run([sys.executable, "-m", "kvpool", *argv], capture_output=True,
                          text=True, timeout=120, env=env, cwd=cwd or root)  # fmt: skip


@pytest.mark.slow
@pytest.mark.parametrize(
    "line",
    [
        "replay --concurrency 0",  # used to hang
        "replay {not_json}",
        "replay missing.jsonl",
        "verify --seconds nan",
        "verify --ray 127.0.0.1:1 --impl reference",
        "diff-kernel ./missing_k.py:f --op alloc_extend",
    ],
)
def test_a_real_process_shows_no_traceback(line: str, tmp_path: Path) -> None:
    done = _kvpool(*_argv(line, tmp_path))
    assert done.returncode == 2
    assert done.stdout == "" and "Traceback" not in done.stderr
    assert len(done.stderr.splitlines()) == 1 and done.stderr.startswith("kvpool: error: ")


def test_verify_ray_without_the_ray_package_is_one_line(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setitem(sys.modules, "ray", None)  # ``import ray`` raises ImportError
    assert main(["verify", "--ray", "local", "--seconds", "1", "--impl", "reference"]) == 2
    out = capsys.readouterr()
    assert out.out == ""
    assert out.err == (
        "kvpool: error: verify: --ray: the ray package is not installed "
        "(pip install 'kvpool[ray]')\n"
    )


def test_an_internal_error_is_one_line_exit_3_and_debug_shows_it(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    import kvpool.cli.bench as bench

    def broken(self: object, *args: object) -> object:
        raise RuntimeError("boom\nsecond line")

    monkeypatch.setattr(bench, "_run_all_module", lambda: broken(None))
    assert main(["bench", "--quick"]) == EXIT_INTERNAL
    err = capsys.readouterr().err
    assert (
        err == "kvpool: internal error: RuntimeError: boom (rerun with --debug for the traceback)\n"
    )
    with pytest.raises(RuntimeError, match="boom"):
        main(["--debug", "bench", "--quick"])
    with pytest.raises(RuntimeError, match="boom"):
        main(["bench", "--quick", "--debug"])  # after the subcommand too


@pytest.mark.parametrize("command", ["verify --seconds 1", "replay conversation --requests 1"])
def test_a_bad_kvpool_checked_value_is_one_line(
    command: str, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setenv("KVPOOL_CHECKED", "maybe")
    assert main(command.split()) == 2
    err = capsys.readouterr().err.strip()
    assert (
        err
        == "kvpool: error: "
        + command.split()[0]
        + ": $KVPOOL_CHECKED must be '0' or '1', got 'maybe'"
    )


@pytest.mark.slow
def test_a_candidate_that_raises_while_built_is_one_summary_line(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    bad = tmp_path / "bad_factory.py"
    bad.write_text("def factory(config):\n    raise RuntimeError('boom while building')\n")
    report = tmp_path / "r.json"
    code = main(["verify", "--impl", f"{bad}:factory", "--seconds", "5", "--workers", "1",
                 "--no-progress", "--report", str(report)])  # fmt: skip
    out = capsys.readouterr()
    assert code == 1
    assert "Traceback" not in out.out + out.err
    line = f"building the two sides raised RuntimeError: boom while building at {bad}:2 in factory"
    assert line in out.out
    failure = json.loads(report.read_text())["failure"]
    assert failure["detector"] == "build" and failure["ops"] == []
