"""compact_tokens packs token lists through struct for speed: it must give numpy's values."""

from __future__ import annotations

import numpy as np
from hypothesis import given
from hypothesis import strategies as st

from kvpool.optimized.key_match import as_token_array, compact_tokens, matched_tokens

_INT32_MAX = 2**31 - 1


@given(st.lists(st.integers(min_value=-(2**40), max_value=2**40), max_size=50))
def test_compact_tokens_matches_numpy_values_and_width(ids: list[int]) -> None:
    arr = compact_tokens(ids)
    assert arr.tolist() == ids
    fits = all(-(2**31) <= t <= _INT32_MAX for t in ids)
    assert arr.dtype == (np.int32 if fits else np.int64)


def test_compact_tokens_edges() -> None:
    for ids in ([], [0], [2**31 - 1], [2**31], [2**32 - 1], [2**32], [-1, 5], [True, 3]):
        assert compact_tokens(ids).tolist() == [int(t) for t in ids]
    assert compact_tokens([2**31]).dtype == np.int64
    assert compact_tokens([np.int64(7), 8]).tolist() == [7, 8]


@given(
    st.lists(st.integers(0, 3), min_size=1, max_size=40),
    st.lists(st.integers(0, 3), min_size=1, max_size=40),
)
def test_matched_tokens_is_the_common_prefix_length(a: list[int], b: list[int]) -> None:
    expected = 0
    while expected < min(len(a), len(b)) and a[expected] == b[expected]:
        expected += 1
    assert matched_tokens(as_token_array(a), as_token_array(b), 0, len(b)) == expected
