"""``kvpool verify --ray HOST:PORT`` across a two-node cluster: a head (``ray start --head``)
and a second node process (``ray start --address``), each with one CPU, started for the module
and stopped after it. The campaign's blocks run on both nodes, and a candidate named by a file
path reaches the nodes through the job's runtime environment: the file refuses to be imported
from the driver's copy anywhere but in the driver."""

from __future__ import annotations

import json
import os
import shutil
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

pytest.importorskip("ray")

RAY = Path(sys.executable).with_name("ray")
START_TIMEOUT = 120.0

CANDIDATE = """
import os
from pathlib import Path

from kvpool.testing.implementations import reference_implementation

if Path(__file__).resolve().parent == Path({origin!r}) and not os.environ.get({marker!r}):
    raise ImportError("a node imported the driver's copy, not the shipped one")


def factory():
    return reference_implementation()
"""
MARKER = "KVPOOL_TEST_DRIVER_SIDE"


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


def _env() -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("RAY_")}
    env["RAY_AUTH_MODE"] = "disabled"  # a throw-away cluster on the loopback interface
    return env


def _nodes(address: str) -> int:
    script = (
        f"import ray; ray.init(address={address!r}, logging_level='ERROR'); "
        "print(sum(1 for n in ray.nodes() if n['Alive']))"
    )
    done = subprocess.run([sys.executable, "-c", script], env=_env(), capture_output=True,
                          text=True, timeout=60)  # fmt: skip
    return int(done.stdout.strip().splitlines()[-1]) if done.returncode == 0 else 0


@pytest.fixture(scope="module")
def two_nodes(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    if shutil.which(str(RAY)) is None:
        pytest.fail(f"ray's command line is missing beside {sys.executable}")
    port = _free_port()
    address = f"127.0.0.1:{port}"
    temp = Path(f"/tmp/kvpool-ray-{os.getpid()}-{port}")  # short: Ray's socket paths
    logs = tmp_path_factory.mktemp("ray-logs")
    common = ["--num-cpus", "1", "--disable-usage-stats", "--node-ip-address", "127.0.0.1",
              "--block"]  # fmt: skip
    head_cmd = [str(RAY), "start", "--head", "--port", str(port), "--include-dashboard",
                "false", "--temp-dir", str(temp), *common]  # fmt: skip
    with open(logs / "head.log", "w") as head_log, open(logs / "node.log", "w") as node_log:
        head = subprocess.Popen(head_cmd, env=_env(), stdout=head_log, stderr=subprocess.STDOUT)
        node = None
        try:
            deadline = time.monotonic() + START_TIMEOUT
            while _nodes(address) < 1:
                assert time.monotonic() < deadline and head.poll() is None, "head did not start"
                time.sleep(1)
            node_cmd = [str(RAY), "start", "--address", address, *common]
            node = subprocess.Popen(node_cmd, env=_env(), stdout=node_log,
                                    stderr=subprocess.STDOUT)  # fmt: skip
            while _nodes(address) < 2:
                assert time.monotonic() < deadline and node.poll() is None, "node did not join"
                time.sleep(1)
            yield address
        finally:  # SIGTERM: a --block process drains and stops the processes it started
            for proc in (node, head):
                if proc is not None and proc.poll() is None:
                    proc.terminate()
                    try:
                        proc.wait(60)
                    except subprocess.TimeoutExpired:
                        proc.kill()
            shutil.rmtree(temp, ignore_errors=True)


@pytest.mark.slow
def test_a_campaign_runs_on_both_nodes_with_the_candidate_file_shipped(
    two_nodes: str, tmp_path: Path
) -> None:
    home = tmp_path / "mine"
    home.mkdir()
    source = home / "mine.py"
    source.write_text(CANDIDATE.format(origin=str(home.resolve()), marker=MARKER))
    report = tmp_path / "r.json"
    cmd = [sys.executable, "-m", "kvpool", "verify", "--ray", two_nodes, "--component",
           "allocator", "--impl", f"{source}:factory", "--seconds", "20", "--no-progress",
           "--report", str(report)]  # fmt: skip
    env = {**_env(), MARKER: "1"}  # the driver may import its own copy (to build the labels)
    done = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    payload = json.loads(report.read_text())
    ray = payload["ray"]
    assert ray["nodes"] == 2 and ray["cpus"] == 2, ray
    assert ray["shipped"] == ["impl/b/mine.py"], ray
    assert ray["actors"] == 2 and ray["tasks"] >= 2, ray
    assert payload["failures"] == 0 and payload["steps"] > 0, payload
    assert "2 nodes" in done.stdout and "shipped impl/b/mine.py" in done.stdout
