"""The op log: a worker process's record of the ops of its current run, on disk.

A worker appends each op to its log BEFORE executing it, with one ``write`` system call: the
bytes are then in the kernel's page cache, so they outlive the process however it ends (a
segfault in a kernel, an abort, the OOM killer). The parent reads the log only when it needs the
ops: after the worker died or hung, or for a checkpoint. This replaces a message per op on the
worker's pipe, which woke the parent at every step (tens of microseconds of the parent's CPU per
step, taken from the two cores the workers run on).

A record is ``run`` (int64), the payload's length in bytes (uint32), then the pickled
fields of the :class:`~kvpool.testing.swarm.Op` as a tuple ``(name, args, kwargs,
expect_error)``: a plain tuple pickles without the dataclass's reduce protocol, and a worker
logs every step. The worker empties the log when a run starts; records carry their run
number, so a reader that looks before the worker emptied it takes no op of an earlier run for
the current one. A record cut short by the end of the file (a write that a kill
interrupted) is ignored.
"""

from __future__ import annotations

import contextlib
import os
import pickle
import struct
import tempfile

from kvpool.testing.swarm import Op

_HEADER = struct.Struct("<qI")
"""Run number, payload length in bytes."""


def new_log() -> str:
    """The path of a new, empty log file (the caller removes it with :func:`remove_log`)."""
    fd, path = tempfile.mkstemp(prefix="kvpool-ops-", suffix=".log")
    os.close(fd)
    return path


def remove_log(path: str) -> None:
    """Delete the log file (nothing when it is already gone)."""
    with contextlib.suppress(FileNotFoundError):
        os.unlink(path)


class OpLogWriter:
    """The worker's side: :meth:`start` at each run, :meth:`append` before each op."""

    def __init__(self, path: str) -> None:
        self.fd = os.open(path, os.O_WRONLY | os.O_CREAT, 0o600)
        self.run = 0

    def start(self, run: int) -> None:
        """Empty the log for run ``run``."""
        os.ftruncate(self.fd, 0)
        os.lseek(self.fd, 0, os.SEEK_SET)
        self.run = run

    def append(self, op: Op) -> None:
        """Record ``op`` (one system call: complete in the page cache when it returns)."""
        fields = (op.name, op.args, op.kwargs, op.expect_error)
        data = pickle.dumps(fields, protocol=pickle.HIGHEST_PROTOCOL)
        os.write(self.fd, _HEADER.pack(self.run, len(data)) + data)

    def close(self) -> None:
        os.close(self.fd)


def read_ops(path: str, run: int) -> list[Op]:
    """The ops of run ``run`` the log holds, in order (empty when the file is gone or holds
    another run's)."""
    try:
        with open(path, "rb") as f:
            data = f.read()
    except FileNotFoundError:
        return []
    ops: list[Op] = []
    at = 0
    while at + _HEADER.size <= len(data):
        record_run, size = _HEADER.unpack_from(data, at)
        end = at + _HEADER.size + size
        if end > len(data):
            break  # a record cut short by a kill: the op never started
        if record_run == run:
            name, args, kwargs, expect_error = pickle.loads(data[at + _HEADER.size : end])
            ops.append(Op(name, args, kwargs, expect_error))
        at = end
    return ops


def log_mark(path: str) -> tuple[int, int]:
    """What changes when the worker appends: the file's size and modification time in ns
    (``(0, 0)`` when it is gone). The parent's sign of progress between messages."""
    try:
        st = os.stat(path)
    except FileNotFoundError:
        return (0, 0)
    return (st.st_size, st.st_mtime_ns)


__all__ = ["OpLogWriter", "log_mark", "new_log", "read_ops", "remove_log"]
