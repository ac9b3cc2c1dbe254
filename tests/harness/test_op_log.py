"""The op log gives back the ops a worker recorded, in order, for the run asked about: equal
ops (name, arguments, keyword arguments, the invalid-on-purpose mark), none of another run's,
and not a record a kill cut short."""

from __future__ import annotations

import os

from kvpool.testing.op_log import OpLogWriter, log_mark, new_log, read_ops, remove_log
from kvpool.testing.swarm import Op

OPS = [
    Op("new_req", ("r1", [1, 2, 3]), (("extra_key", "a"),)),
    Op("extend", (["r1"],)),
    Op("finish", ("nobody",), expect_error=True),
    Op("evict", (-1,), (), True),
]


def test_a_run_reads_back_equal_ops() -> None:
    path = new_log()
    try:
        writer = OpLogWriter(path)
        writer.start(3)
        for op in OPS:
            writer.append(op)
        assert read_ops(path, 3) == OPS
        assert read_ops(path, 4) == []  # another run's ops are not this one's
        writer.start(4)  # a new run empties the log
        writer.append(OPS[1])
        assert read_ops(path, 4) == [OPS[1]] and read_ops(path, 3) == []
        writer.close()
    finally:
        remove_log(path)
    assert read_ops(path, 4) == [] and log_mark(path) == (0, 0)


def test_a_record_cut_short_is_ignored() -> None:
    path = new_log()
    try:
        writer = OpLogWriter(path)
        writer.start(0)
        for op in OPS[:2]:
            writer.append(op)
        writer.close()
        os.truncate(path, os.path.getsize(path) - 3)  # the last write, interrupted
        assert read_ops(path, 0) == OPS[:1]
    finally:
        remove_log(path)
