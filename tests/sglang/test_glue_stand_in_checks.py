"""The glue stand-in's checks of writes kvpool's lifecycle makes itself (no wheel needed).

SGLang's glue writes some fields of its request that kvpool's lifecycle sets or forgets on its
own right after the call: the release's ``mark_kv_released()`` and ``req.lock = None``, a chunk
boundary's ``prefix_len``, an EAGLE v2 reserve's ``kv_allocated_len``. The stand-in
(:class:`kvpool.sglang.glue.GlueReq`) notes each write and the glue managers check it after the
call (:func:`~kvpool.sglang.glue.check_released`, :func:`~kvpool.sglang.glue.check_resume`,
:func:`~kvpool.sglang.glue.check_allocated`), so a glue that forgets one fails a named invariant
instead of passing unseen. The opt-in twin of these tests (``tests/sglang/test_glue_mutants.py``)
plants the same faults in SGLang's own glue."""

from __future__ import annotations

from typing import Any

import pytest

from kvpool.errors import InvariantViolation
from kvpool.optimized.req import Req
from kvpool.sglang.cache_req import InsertedLen
from kvpool.sglang.glue import GlueReq, check_allocated, check_released, check_resume
from kvpool.sglang.glue_swa import SWAGlueReq, SWAReqState


class _Lock:
    """A ``TreeLock`` of a node (0.5.23's handle)."""

    def __init__(self, node: Any) -> None:
        self.node = node


def _glue(rid: str = "r1") -> GlueReq:
    req = Req(rid, [1, 2, 3, 4])
    req.req_pool_idx, req.kv_committed_len, req.kv_allocated_len = 1, 4, 8
    req.fill_ids = [1, 2, 3, 4]
    return GlueReq(req, InsertedLen(), _Lock)


def test_a_release_that_marks_the_record_and_drops_the_lock_passes() -> None:
    glue = _glue()
    glue.req.last_node = "node-7"
    assert glue.lock.node == "node-7"
    glue.lock = None
    glue.kv.mark_kv_released()
    check_released(glue, "release_kv_cache")
    # the drop is noted, not applied: kvpool forgets last_node with the other fields itself
    assert glue.req.last_node == "node-7"


def test_a_release_that_keeps_the_allocated_length_fails_lengths() -> None:
    glue = _glue()
    glue.lock = None
    with pytest.raises(InvariantViolation) as caught:
        check_released(glue, "release_kv_cache")
    assert caught.value.invariant_id == "INV-LENGTHS"
    assert "'r1'" in str(caught.value) and "mark_kv_released" in str(caught.value)


def test_a_release_that_keeps_the_lock_handle_fails_locks() -> None:
    glue = _glue()
    glue.kv.mark_kv_released()
    glue.lock = _Lock("node-3")  # a new handle is not a drop
    with pytest.raises(InvariantViolation) as caught:
        check_released(glue, "release_kv_cache")
    assert caught.value.invariant_id == "INV-LOCKS"
    assert glue.req.last_node == "node-3"


def test_the_notes_belong_to_one_call() -> None:
    """Each glue call gets a fresh stand-in: an earlier call's release does not count."""
    first = _glue()
    first.kv.mark_kv_released()
    first.lock = None
    again = GlueReq(first.req, InsertedLen(), _Lock)
    assert not again.released and not again.lock_dropped


def test_a_chunk_boundary_must_resume_where_kvpool_does() -> None:
    glue = _glue()
    with pytest.raises(InvariantViolation) as caught:  # nothing written
        check_resume(glue, 4, "checkpoint_kv_cache")
    assert caught.value.invariant_id == "INV-LENGTHS"
    glue.prefix_len = 3
    with pytest.raises(InvariantViolation) as caught:
        check_resume(glue, 4, "checkpoint_kv_cache")
    assert "wrote prefix_len 3" in str(caught.value) and "resumes at 4" in str(caught.value)
    glue.prefix_len = glue.extend_end
    check_resume(glue, 4, "checkpoint_kv_cache")


def test_an_allocated_length_the_glue_leaves_short_fails_lengths() -> None:
    a, b = _glue("a"), _glue("b")
    a.kv.kv_allocated_len = 16
    check_allocated([a], [16], "alloc_for_spec_decode")
    with pytest.raises(InvariantViolation) as caught:
        check_allocated([a, b], [16, 16], "alloc_for_spec_decode")
    assert caught.value.invariant_id == "INV-LENGTHS"
    assert "('b', 8, 16)" in str(caught.value) and "'a'" not in str(caught.value)


def test_the_sliding_window_record_is_noted_as_released_too() -> None:
    base = _glue()
    state = SWAReqState(evicted={"swa": 4})
    glue = SWAGlueReq(base.req, state, InsertedLen(), _Lock)
    glue.kv.mark_kv_released()
    glue.lock = None
    assert state.evicted == {}
    check_released(glue, "release_kv_cache")
