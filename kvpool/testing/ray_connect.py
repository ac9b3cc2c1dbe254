"""Connecting to a Ray cluster for ``kvpool verify --ray`` (:mod:`kvpool.testing.ray_campaign`).

``ray`` is imported only here, only when asked for: :func:`connect` turns a missing package or
an unreachable address into :class:`RayUnavailable` (one line).
"""

from __future__ import annotations

import contextlib
import importlib
import os
import socket
import sys
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

from kvpool.errors import KVPoolError

CONNECT_TIMEOUT = 5.0
"""Seconds to wait for a TCP connection to a cluster's address before calling it unreachable."""

INSTALL_HINT = "the ray package is not installed (pip install 'kvpool[ray]')"


class RayUnavailable(KVPoolError):
    """``ray`` is not installed, or the cluster cannot be reached (a one-line reason)."""


def import_ray() -> Any:
    """The ``ray`` module (typed ``Any``: ray ships no annotations kvpool checks against);
    :class:`RayUnavailable` when it is not installed."""
    try:
        return importlib.import_module("ray")
    except ImportError:
        raise RayUnavailable(INSTALL_HINT) from None


def _reachable(address: str) -> None:
    """Raise :class:`RayUnavailable` unless ``HOST:PORT`` (after ``ray://``) takes a TCP
    connection within :data:`CONNECT_TIMEOUT` (Ray itself may retry for minutes)."""
    host, _, port = address.removeprefix("ray://").rpartition(":")
    try:
        with socket.create_connection((host.strip("[]"), int(port)), CONNECT_TIMEOUT):
            pass
    except (OSError, ValueError) as exc:
        why = exc.strerror or str(exc) if isinstance(exc, OSError) else str(exc)
        raise RayUnavailable(f"cannot reach a Ray cluster at {address}: {why}") from None


@contextlib.contextmanager
def _stderr_kept_unless_failing() -> Iterator[None]:
    """Hold what is written to file descriptor 2 (Ray's C++ client logs each retry there when
    an address answers but is no Ray head); pass it on unless the block raises."""
    sys.stderr.flush()
    saved = os.dup(2)
    with tempfile.TemporaryFile() as held:
        os.dup2(held.fileno(), 2)
        failed = True
        try:
            yield
            failed = False
        finally:
            sys.stderr.flush()
            os.dup2(saved, 2)
            os.close(saved)
            if not failed:
                held.seek(0)
                sys.stderr.write(held.read().decode(errors="replace"))


@dataclass
class Connection:
    """A connection made by :func:`connect`; :meth:`close` undoes what it started."""

    address: str
    cpus: int
    owned: bool = False

    def close(self) -> None:
        if self.owned:
            import_ray().shutdown()
            self.owned = False


def connect(
    address: str, local_cpus: int | None = None, runtime_env: dict[str, Any] | None = None
) -> Connection:
    """Connect to ``address``: ``local`` starts a private cluster on this machine
    (``local_cpus`` CPUs), ``auto`` joins the running one (``RAY_ADDRESS`` or this machine's),
    ``ray://HOST:PORT`` (Ray client) or ``HOST:PORT`` (the head's GCS) join that one, as a job
    with ``runtime_env`` (Ray uploads its ``working_dir`` to the cluster once). Reuses a
    connection this process already has (``ray.init`` called by the caller: its job keeps its
    own runtime environment, and the connection is not ``owned``)."""
    ray = import_ray()
    if not ray.is_initialized():
        options: dict[str, Any] = {
            "include_dashboard": False,
            "logging_level": "ERROR",
            "log_to_driver": False,
        }
        if runtime_env:
            options["runtime_env"] = runtime_env
        if address == "local":
            options["num_cpus"] = local_cpus
            # Ray starts its workers at niceness 15, so on a busy machine they yield to every
            # other process and a campaign crawls (0.1x the local workers' steps per CPU,
            # measured: benchmarks/bench_ray.py); this private cluster's workers run at the
            # driver's priority, as the local campaign's worker processes do
            options["_system_config"] = {"worker_niceness": 0}
        else:
            if address != "auto":
                _reachable(address)
            options["address"] = address
        held = contextlib.nullcontext() if address == "local" else _stderr_kept_unless_failing()
        try:  # (a local start spawns Ray's processes: they keep the real stderr)
            with held:
                ray.init(**options)
        except Exception as exc:  # ConnectionError, RuntimeError, ValueError, ...: one line
            first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
            raise RayUnavailable(f"cannot connect to Ray at {address}: {first}") from None
        owned = True
    else:
        owned = False
    cpus = max(int(ray.cluster_resources().get("CPU", 1)), 1)
    return Connection(address, cpus, owned)


__all__ = [
    "CONNECT_TIMEOUT",
    "INSTALL_HINT",
    "Connection",
    "RayUnavailable",
    "connect",
    "import_ray",
]
