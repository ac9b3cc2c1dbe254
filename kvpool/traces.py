"""Real request traces (Mooncake's FAST'25 release) turned into deterministic token arrays.

A trace is JSONL, one request a line: ``timestamp`` (ms), ``input_length``, ``output_length`` and
``hash_ids``, prefix-block hashes over blocks of :data:`BLOCK_SIZE` tokens (two requests whose
lists share their first ``k`` ids share their first ``k * 512`` prompt tokens). No token text is
included, so tokens are synthesised from the ids:

- block id ``b`` gives the same :data:`BLOCK_SIZE` tokens wherever it appears (they depend on
  ``b`` only); its first token is the **block marker** ``VOCAB_SIZE + b``, which no other block
  and no ordinary token shares, so two different blocks differ from their very first token and a
  prefix match (at any page size, any ``--block-tokens``) never runs past the block ids the two
  prompts share;
- the other tokens are a splitmix64 hash of ``(b, offset)`` mapped into
  ``[OUTPUT_TOKEN_LIMIT, VOCAB_SIZE)``: ids below :data:`OUTPUT_TOKEN_LIMIT` are left to the
  tokens a replay decodes, so a cached output never matches a later prompt either;
- a request's prompt is its blocks in order, the last one truncated so the prompt has exactly
  ``input_length`` tokens.

Where traces are found (:func:`trace_path`): a path to an existing file; else a name in the
package's own ``kvpool/data`` (:data:`SAMPLE_TRACE`, the first 400 requests of the conversation
trace, always there); else a name in the folder ``$KVPOOL_TRACES`` names, when set (the full
Mooncake files, not shipped: nothing outside the repository is looked up by default).
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Final

import numpy as np
import numpy.typing as npt

from kvpool.errors import KVPoolError

BLOCK_SIZE: Final[int] = 512
"""Tokens per hash block (Mooncake's block size)."""

VOCAB_SIZE: Final[int] = 32_000
"""Ordinary token ids lie in ``[OUTPUT_TOKEN_LIMIT, VOCAB_SIZE)``; block markers above."""

OUTPUT_TOKEN_LIMIT: Final[int] = 1024
"""Token ids in ``[0, OUTPUT_TOKEN_LIMIT)`` never occur in a synthesised prompt (decode's)."""

MAX_BLOCK_ID: Final[int] = 2**31 - 1 - VOCAB_SIZE
"""Largest block id whose marker ``VOCAB_SIZE + id`` fits an int32 token."""

TRACES_ENV_VAR: Final[str] = "KVPOOL_TRACES"
"""Environment variable naming the directory that holds the full trace files."""

CONVERSATION_TRACE: Final[str] = "conversation_trace.jsonl"
SYNTHETIC_TRACE: Final[str] = "synthetic_trace.jsonl"
SAMPLE_TRACE: Final[str] = "conversation_sample.jsonl"
"""Shipped in ``kvpool/data``: the first 400 lines of :data:`CONVERSATION_TRACE` (Apache-2.0,
see ``kvpool/data/NOTICE``)."""

DATA_DIR: Final[Path] = Path(__file__).resolve().parent / "data"
"""The package's own trace sample."""

_FIELDS = ("timestamp", "input_length", "output_length", "hash_ids")


class TraceError(KVPoolError, ValueError):
    """A trace cannot be found or read: a missing file, or a line that is not a valid record."""


@dataclass(frozen=True)
class TraceRecord:
    """One request of a trace (lengths in tokens, ``timestamp`` in ms)."""

    timestamp: int
    input_length: int
    output_length: int
    hash_ids: tuple[int, ...]


def traces_dir() -> Path | None:
    """The folder ``$KVPOOL_TRACES`` names, or None when it is unset or empty."""
    env = os.environ.get(TRACES_ENV_VAR)
    return Path(env) if env else None


def trace_path(name: str = CONVERSATION_TRACE) -> Path:
    """Path of trace ``name``: itself when it is an existing file, else the file of that name in
    :data:`DATA_DIR`, else in :func:`traces_dir` (when set). Raises :class:`TraceError` naming
    ``name`` as typed (and where names are looked up) when none exists."""
    direct = Path(name)
    if direct.is_file():
        return direct
    extra = traces_dir()
    folders = [DATA_DIR] if extra is None else [DATA_DIR, extra]
    if direct.name == name:  # a bare name: look in the trace folders
        for folder in folders:
            if (folder / name).is_file():
                return folder / name
    if direct.exists():
        raise TraceError(f"trace {name!r} is not a file")
    where = " and ".join(str(f) for f in folders)
    unset = f" (${TRACES_ENV_VAR} unset)" if extra is None else ""
    hint = f"; names are looked up in {where}{unset}" if direct.name == name else ""
    raise TraceError(f"trace {name!r}: no such file{hint}")


def _record(raw: object, where: str) -> TraceRecord:
    """One parsed line as a record; :class:`TraceError` (``where``: file and line) if invalid."""
    if not isinstance(raw, dict) or any(k not in raw for k in _FIELDS):
        raise TraceError(f"{where}: expected an object with fields {', '.join(_FIELDS)}")
    ids = raw["hash_ids"]
    try:
        if not isinstance(ids, list):
            raise TypeError("hash_ids is not a list")
        rec = TraceRecord(int(raw["timestamp"]), int(raw["input_length"]),
                          int(raw["output_length"]), tuple(int(b) for b in ids))  # fmt: skip
    except (TypeError, ValueError) as exc:
        raise TraceError(f"{where}: {exc}") from None
    if not 0 < rec.input_length <= len(rec.hash_ids) * BLOCK_SIZE:
        raise TraceError(f"{where}: input_length {rec.input_length} does not fit its "
                         f"{len(rec.hash_ids)} block(s) of {BLOCK_SIZE} tokens")  # fmt: skip
    if rec.output_length < 0 or any(not 0 <= b <= MAX_BLOCK_ID for b in rec.hash_ids):
        raise TraceError(f"{where}: negative output_length or a block id outside "
                         f"[0, {MAX_BLOCK_ID}]")  # fmt: skip
    return rec


def iter_trace(name: str = CONVERSATION_TRACE, limit: int | None = None) -> Iterator[TraceRecord]:
    """The first ``limit`` records (all when None) of trace ``name`` (see :func:`trace_path`),
    read one line at a time. Raises :class:`TraceError` for a line that is not a valid record
    (not JSON, a field missing, ``input_length`` not fitting its blocks)."""
    path = trace_path(name)
    count = 0
    with path.open() as fh:
        for number, line in enumerate(fh, 1):
            if limit is not None and count >= limit:
                return
            if not line.strip():
                continue
            try:
                raw = json.loads(line)
            except json.JSONDecodeError as exc:
                raise TraceError(f"{path} line {number}: not JSON ({exc.msg})") from None
            yield _record(raw, f"{path} line {number}")
            count += 1


def load_trace(name: str = CONVERSATION_TRACE, limit: int | None = None) -> list[TraceRecord]:
    """:func:`iter_trace` as a list (records hold block ids, not tokens: ~200 bytes each)."""
    return list(iter_trace(name, limit))


def _splitmix64(x: npt.NDArray[np.uint64]) -> npt.NDArray[np.uint64]:
    """SplitMix64's finaliser, vectorised (uint64 arithmetic wraps modulo 2**64)."""
    mask = np.uint64(0xFFFFFFFFFFFFFFFF)
    with np.errstate(over="ignore"):
        z = (x + np.uint64(0x9E3779B97F4A7C15)) & mask
        z = ((z ^ (z >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)) & mask
        z = ((z ^ (z >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)) & mask
        out: npt.NDArray[np.uint64] = z ^ (z >> np.uint64(31))
        return out


def blocks_token_array(hash_ids: tuple[int, ...] | list[int]) -> npt.NDArray[np.int32]:
    """Tokens of the blocks ``hash_ids``, each :data:`BLOCK_SIZE` long, concatenated (int32):
    per block its marker ``VOCAB_SIZE + id``, then 511 hashed ordinary tokens."""
    ids = np.asarray(hash_ids, dtype=np.uint64).reshape(-1, 1)
    if ids.size and int(ids.max()) > MAX_BLOCK_ID:
        raise TraceError(f"block ids must be <= {MAX_BLOCK_ID}")
    offsets = np.arange(BLOCK_SIZE, dtype=np.uint64).reshape(1, -1)
    with np.errstate(over="ignore"):
        mixed = _splitmix64(ids * np.uint64(BLOCK_SIZE) + offsets)
    span = np.uint64(VOCAB_SIZE - OUTPUT_TOKEN_LIMIT)
    tokens = (mixed % span + np.uint64(OUTPUT_TOKEN_LIMIT)).astype(np.int32)
    tokens[:, 0] = (ids[:, 0] + np.uint64(VOCAB_SIZE)).astype(np.int32)  # the block marker
    flat: npt.NDArray[np.int32] = tokens.reshape(-1)
    return flat


def request_token_array(record: TraceRecord) -> npt.NDArray[np.int32]:
    """The prompt of ``record`` as an int32 array of ``input_length`` tokens."""
    return blocks_token_array(record.hash_ids)[: record.input_length]


def request_tokens(record: TraceRecord) -> list[int]:
    """The prompt of ``record`` as a list of ``input_length`` token ids."""
    tokens: list[int] = request_token_array(record).tolist()
    return tokens


__all__ = [
    "BLOCK_SIZE",
    "CONVERSATION_TRACE",
    "DATA_DIR",
    "MAX_BLOCK_ID",
    "OUTPUT_TOKEN_LIMIT",
    "SAMPLE_TRACE",
    "SYNTHETIC_TRACE",
    "TRACES_ENV_VAR",
    "VOCAB_SIZE",
    "TraceError",
    "TraceRecord",
    "blocks_token_array",
    "iter_trace",
    "load_trace",
    "request_token_array",
    "request_tokens",
    "trace_path",
    "traces_dir",
]
