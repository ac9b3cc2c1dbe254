"""The radix-cache request proxy (:class:`kvpool.sglang.cache_req.CacheReq`) and the token-array
conversion it and the key conversion share; no SGLang needed (the SGLang-side key conversion is
tested with the wheel in test_sglang_lifecycle.py)."""

from __future__ import annotations

from array import array
from typing import Any

import numpy as np
import pytest
import torch

from kvpool.optimized.req import Req as TwinReq
from kvpool.reference.req import Req as RefReq
from kvpool.sglang.cache_req import CacheReq, InsertedLen, request_tokens, token_array


@pytest.mark.parametrize(
    "ids",
    [
        [5, 6, 7],
        (5, 6, 7),
        np.array([5, 6, 7], dtype=np.int32),
        np.array([5, 6, 7], dtype=np.int64)[::1],
        torch.tensor([5, 6, 7], dtype=torch.int32),
        array("q", [5, 6, 7]),
    ],
    ids=["list", "tuple", "int32", "int64", "tensor", "array"],
)
def test_token_array_is_sglangs_type(ids: Any) -> None:
    out = token_array(ids)
    assert isinstance(out, array) and out.typecode == "q" and out.tolist() == [5, 6, 7]


def test_token_array_keeps_an_array_q_and_handles_big_ids() -> None:
    held = array("q", [1, 2])
    assert token_array(held) is held
    big = 2**40
    assert token_array(np.array([big, 1], dtype=np.int64)).tolist() == [big, 1]
    assert token_array(np.array([1, 2, 3, 4])[::2]).tolist() == [1, 3]  # not contiguous


@pytest.mark.parametrize("cls", [TwinReq, RefReq], ids=["twin", "reference"])
def test_tokens_and_fill_ids(cls: Any) -> None:
    req = cls("r1", [1, 2, 3, 4], extra_key="ns", priority=3)
    req.output_ids.extend([9, 8])
    req.fill_ids = req.all_token_ids[:5]
    proxy = CacheReq(req)
    assert request_tokens(req).tolist() == [1, 2, 3, 4, 9, 8]
    assert proxy.origin_input_ids.tolist() == [1, 2, 3, 4]
    assert proxy.output_ids.tolist() == [9, 8]
    both = proxy.origin_input_ids + proxy.output_ids  # what SGLang 0.5.16 concatenates
    assert isinstance(both, array) and both.typecode == "q"
    assert proxy.get_fill_ids().tolist() == [1, 2, 3, 4, 9]
    assert proxy.full_untruncated_fill_ids.tolist() == [1, 2, 3, 4, 9, 8]
    assert (proxy.extra_key, proxy.priority, proxy.rid, proxy.cache_salt) == ("ns", 3, "r1", None)


@pytest.mark.parametrize("cls", [TwinReq, RefReq], ids=["twin", "reference"])
def test_writes_land_on_the_kvpool_request_in_its_types(cls: Any) -> None:
    req = cls("r1", [1, 2, 3])
    req.req_pool_idx = 4
    proxy = CacheReq(req)
    proxy.cache_protected_len = np.int64(2)
    node = object()
    proxy.last_node = node
    proxy.prefix_indices = torch.tensor([7, 8, 9], dtype=torch.int32)
    assert req.cache_protected_len == 2 and type(req.cache_protected_len) is int
    assert req.last_node is node
    if cls is TwinReq:
        assert isinstance(req.prefix_indices, torch.Tensor)
        assert req.prefix_indices.dtype == torch.int64
        assert req.prefix_indices.tolist() == [7, 8, 9]
    else:
        assert req.prefix_indices == [7, 8, 9]
    assert proxy.req_pool_idx == 4


def test_only_mapped_fields_exist() -> None:
    proxy = CacheReq(TwinReq("r1", [1, 2]))
    with pytest.raises(AttributeError):
        _ = proxy.kv_committed_len  # type: ignore[attr-defined]  # not read by the tree
    with pytest.raises(AttributeError, match="does not map"):
        proxy.output_ids = array("q")  # type: ignore[misc]  # read-only
    with pytest.raises(AttributeError, match="does not map"):
        proxy.finished_len = 3
    with pytest.raises(AttributeError, match="does not map"):
        proxy.kv.kv_allocated_len = 3  # type: ignore[misc]


def test_kv_view_of_0_5_23() -> None:
    req = TwinReq("r1", [1, 2, 3, 4])
    req.req_pool_idx, req.kv_committed_len, req.kv_allocated_len = 2, 4, 6
    req.cache_protected_len = 2
    inserted = InsertedLen()
    locks: list[Any] = []

    class Lock:
        def __init__(self, node: Any) -> None:
            self.node = node
            locks.append(node)

    proxy = CacheReq(req, inserted, Lock)
    kv = proxy.kv
    assert (kv.req_pool_idx, kv.kv_committed_len, kv.kv_allocated_len) == (2, 4, 6)
    assert kv.swa_evict_floor == 0 and kv.get_evicted_seqlen(object()) == 0
    assert kv.swa_dead_lo(4) == 2 == kv.cache_protected_len
    kv.cache_protected_len = 4
    assert req.cache_protected_len == 4
    assert kv.cache_inserted_len == 0
    kv.cache_inserted_len = 4
    assert CacheReq(req, inserted).kv.cache_inserted_len == 4  # kept per request
    inserted.forget(req)
    assert kv.cache_inserted_len == 0
    assert proxy.lock is None  # no node: no lock
    node: Any = object()
    req.last_node = node
    held: Any = CacheReq(req, inserted, Lock).lock
    assert held.node is node and locks == [node]
    other: Any = object()
    proxy.lock = Lock(other)
    assert req.last_node is other
    proxy.lock = None  # released: kvpool forgets last_node itself
    assert req.last_node is other
