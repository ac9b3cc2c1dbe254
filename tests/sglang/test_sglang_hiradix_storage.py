"""Opt-in (``--run-sglang-wheel``): storage prefetches through SGLang 0.5.16's own
``HiRadixCache`` (:class:`kvpool.sglang.hiradix.SGLangHiRadixCache` with ``enable_storage``).
The tree's code is SGLang's (``prefetch_from_storage``, the allocation of a storage hit,
``check_prefetch_progress``, ``release_aborted_request``, the drain of its queues); its query
thread and I/O worker are kvpool's model of them. Two facts kvpool states are SGLang's: a
prefetch completing through a device node with no host copy attaches its refill there, and the
eviction that promotes that node then fails SGLang's own assertion (specs/sglang_findings.md,
9); a refill directly below the root takes the root's floor priority."""

from __future__ import annotations

import logging

import pytest

from kvpool.config import PoolConfig
from kvpool.constants import ROOT_PRIORITY
from kvpool.sglang import implementation
from kvpool.testing.implementations import following_release, reference_implementation
from kvpool.testing.runs import execute
from kvpool.testing.swarm import Op
from tests.reference.test_prefetch_refill import OLD, TRACE, _config, attached
from tests.reference.test_prefetch_root import fetched

pytestmark = pytest.mark.sglang_wheel


def test_a_refill_below_a_device_node_crashes_sglangs_eviction(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """The trace that found finding 9 on the reference, now on SGLang's tree: in lockstep with
    the reference under 0.5.16's preset up to the eviction, then SGLang's ``_evict_regular``
    asserts a leaf, as its scheduler would die."""
    caplog.set_level(logging.ERROR)
    impl = implementation("0.5.16")
    ref = following_release(reference_implementation(), "0.5.16")
    done = execute("hiradix_cache", ref, impl, _config(OLD), ops=TRACE[:-1])
    assert done.failure is None, done.failure
    assert done.steps == len(TRACE) - 1
    evict = attached(impl)
    with pytest.raises(AssertionError, match="non-leaf"):
        evict()


def test_a_refill_below_the_root_takes_its_floor_priority() -> None:
    _, node = fetched(implementation("0.5.16")).nodes
    assert node.evicted and node.key == (2, 3, 3, 1)
    assert node.priority == ROOT_PRIORITY


def test_a_prefetch_in_a_namespace_fetches_that_namespaces_content() -> None:
    """The content the worker writes is the tags of the anchor's path and the fetched tokens in
    the anchor's namespace (the adapter computed it in the root's, None, until the 0.5.16
    campaign's first run with storage, seed 20261212, showed the host tag differ)."""
    config = PoolConfig(size=14, page_size=1, eviction_policy="mru", hicache_storage=True,
                        hicache_prefetch_threshold=1, rules=OLD)  # fmt: skip
    a = (("extra_key", "a"),)
    ops = [Op("insert", ([2, 2, 1, 1, 3, 3, 1],), a), Op("insert", ([2],), a),
           Op("prefetch", (0, [2, 3, 1]), a), Op("storage_hit", (0, 3)),
           Op("prefetch_io", (0, 1))]  # fmt: skip
    done = execute("hiradix_cache", reference_implementation(), implementation("0.5.16"), config,
                   ops=ops)  # fmt: skip
    assert done.failure is None, done.failure
    assert done.steps == len(ops)
