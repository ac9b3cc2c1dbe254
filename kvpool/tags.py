"""KV content tags: the small integer a model of the KV buffers stores for each token.

The reference (and the twin, in tests) writes ``kv_tags(tokens, extra_key)[p]`` into the slot of
token ``p`` when that token's KV is computed. A tag depends on the namespace and on every token up
to and including ``p``, so a request that reads a slot written for a different prefix (a wrong
index, a use after free, a bad share) reads a different tag. Tags lie in ``[1, TAG_MODULUS]`` so
they are exact in float32 buffers (< 2**24) and never equal the 0 of an unwritten slot.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Final

TAG_MODULUS: Final[int] = 16_777_213  # largest prime below 2**24
TAG_MULTIPLIER: Final[int] = 1_000_003


def namespace_seed(extra_key: str | None) -> int:
    """Deterministic seed of a namespace (no use of Python's salted ``hash``)."""
    seed = 7
    for ch in extra_key or "":
        seed = (seed * 131 + ord(ch)) % TAG_MODULUS
    return seed


def kv_tags(token_ids: Sequence[int], extra_key: str | None = None) -> list[int]:
    """Tag of every position of ``token_ids`` in namespace ``extra_key`` (one per token)."""
    return list(kv_tags_tuple(token_ids, extra_key))


_MEMO_LIMIT: Final[int] = 4096
"""Token sequences :func:`kv_tags_tuple` remembers before it starts over (bounds memory)."""

_PLAIN_INT: Final[frozenset[type]] = frozenset({int})
"""The element types of a list of plain ints (``set(map(type, ...))`` runs in C)."""

_memo: dict[tuple[str | None, tuple[int, ...]], tuple[int, ...]] = {}


def kv_tags_tuple(token_ids: Sequence[int], extra_key: str | None = None) -> tuple[int, ...]:
    """:func:`kv_tags` as a tuple, remembered per ``(extra_key, tokens)``: the lockstep harness
    asks for every live request's tags after every step, and a request's tokens are mostly the
    same as at the previous step or one token longer (continued from the shorter sequence's
    last tag). Exact: the tags are a pure function of the namespace and the tokens."""
    if type(token_ids) is list and set(map(type, token_ids)) <= _PLAIN_INT:
        tokens = tuple(token_ids)  # plain ints already (a request's tokens): no call per item
    else:
        tokens = tuple(map(int, token_ids))
    key = (extra_key, tokens)
    found = _memo.get(key)
    if found is not None:
        return found
    shorter = _memo.get((extra_key, tokens[:-1])) if tokens else None
    if shorter is not None:  # one token more than a known sequence
        state = shorter[-1] - 1 if shorter else namespace_seed(extra_key)
        found = shorter + tuple(continue_tags(state, tokens[-1:]))
    else:
        found = tuple(continue_tags(namespace_seed(extra_key), tokens))
    if len(_memo) >= _MEMO_LIMIT:
        _memo.clear()
    _memo[key] = found
    return found


def continue_tags(state: int, token_ids: Sequence[int]) -> list[int]:
    """Tags of ``token_ids`` following a prefix whose hash state is ``state``: the seed
    (:func:`namespace_seed`) for an empty prefix, else the prefix's last tag minus 1. So
    ``kv_tags(a + b, k) == kv_tags(a, k) + continue_tags(kv_tags(a, k)[-1] - 1, b)``."""
    h = state
    out: list[int] = []
    append = out.append
    for t in token_ids:
        h = (h * TAG_MULTIPLIER + int(t) + 1) % TAG_MODULUS
        append(h + 1)
    return out


def mamba_state_tag(token_ids: Sequence[int], extra_key: str | None = None) -> int:
    """Tag of the recurrent (Mamba) state after consuming ``token_ids`` from a cleared state:
    0 for no tokens (a cleared slot), else the tag of the last position. Like a KV tag it
    depends on every token of the history, so a state computed for another history differs."""
    return kv_tags_tuple(token_ids, extra_key)[-1] if token_ids else 0
