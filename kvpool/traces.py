"""Real request traces (Mooncake's FAST'25 release) turned into deterministic token lists.

A trace is JSONL, one request a line: ``timestamp`` (ms), ``input_length``, ``output_length`` and
``hash_ids``, prefix-block hashes over blocks of :data:`BLOCK_SIZE` tokens (two requests whose
lists share their first ``k`` ids share their first ``k * 512`` prompt tokens). No token text is
included, so tokens are synthesised from the ids:

- block id ``b`` gives the same :data:`BLOCK_SIZE` tokens wherever it appears (they depend on
  ``b`` only): tokens 0 and 1 spell ``b`` in base :data:`VOCAB_SIZE` (so different ids always give
  different blocks), the others are a splitmix64 hash of ``(b, offset)`` modulo the vocabulary;
- a request's prompt is its blocks in order, the last one truncated so the prompt has exactly
  ``input_length`` tokens.

Traces are found in ``$KVPOOL_TRACES`` when set, else in ``../shared/traces`` next to the
repository root. ``kvpool replay`` and the benchmarks load them through this module.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Final

import numpy as np
import numpy.typing as npt

BLOCK_SIZE: Final[int] = 512
"""Tokens per hash block (Mooncake's block size)."""

VOCAB_SIZE: Final[int] = 32_000
"""Token ids lie in ``[0, VOCAB_SIZE)``."""

TRACES_ENV_VAR: Final[str] = "KVPOOL_TRACES"
"""Environment variable naming the directory that holds the trace files."""

CONVERSATION_TRACE: Final[str] = "conversation_trace.jsonl"
SYNTHETIC_TRACE: Final[str] = "synthetic_trace.jsonl"

_MASK64 = np.uint64(0xFFFFFFFFFFFFFFFF)


@dataclass(frozen=True)
class TraceRecord:
    """One request of a trace (lengths in tokens, ``timestamp`` in ms)."""

    timestamp: int
    input_length: int
    output_length: int
    hash_ids: tuple[int, ...]


def traces_dir() -> Path:
    """``$KVPOOL_TRACES`` if set, else ``<repository root>/../shared/traces``."""
    env = os.environ.get(TRACES_ENV_VAR)
    if env:
        return Path(env)
    repo_root = Path(__file__).resolve().parent.parent
    return repo_root.parent / "shared" / "traces"


def trace_path(name: str = CONVERSATION_TRACE) -> Path:
    """Path of a trace: ``name`` itself when it is an existing file, else inside
    :func:`traces_dir`."""
    direct = Path(name)
    return direct if direct.is_file() else traces_dir() / name


def load_trace(name: str = CONVERSATION_TRACE, limit: int | None = None) -> list[TraceRecord]:
    """The first ``limit`` records (all when None) of trace ``name`` (see :func:`trace_path`).
    Raises ValueError for a record whose ``input_length`` does not fit its blocks."""
    out: list[TraceRecord] = []
    with trace_path(name).open() as fh:
        for line in fh:
            if limit is not None and len(out) >= limit:
                break
            if not line.strip():
                continue
            raw = json.loads(line)
            rec = TraceRecord(
                int(raw["timestamp"]),
                int(raw["input_length"]),
                int(raw["output_length"]),
                tuple(int(b) for b in raw["hash_ids"]),
            )
            if not 0 < rec.input_length <= len(rec.hash_ids) * BLOCK_SIZE:
                raise ValueError(f"record {len(out)}: input_length does not fit its hash_ids")
            out.append(rec)
    return out


def _splitmix64(x: npt.NDArray[np.uint64]) -> npt.NDArray[np.uint64]:
    """SplitMix64's finaliser, vectorised (uint64 arithmetic wraps modulo 2**64)."""
    with np.errstate(over="ignore"):
        z = (x + np.uint64(0x9E3779B97F4A7C15)) & _MASK64
        z = ((z ^ (z >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)) & _MASK64
        z = ((z ^ (z >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)) & _MASK64
        out: npt.NDArray[np.uint64] = z ^ (z >> np.uint64(31))
        return out


def blocks_token_array(hash_ids: tuple[int, ...] | list[int]) -> npt.NDArray[np.int32]:
    """Tokens of the blocks ``hash_ids``, each :data:`BLOCK_SIZE` long, concatenated (int32:
    ids are below :data:`VOCAB_SIZE`)."""
    ids = np.asarray(hash_ids, dtype=np.uint64).reshape(-1, 1)
    if ids.size and int(ids.max()) >= VOCAB_SIZE * VOCAB_SIZE:
        raise ValueError(f"block ids must be < {VOCAB_SIZE * VOCAB_SIZE}")
    offsets = np.arange(BLOCK_SIZE, dtype=np.uint64).reshape(1, -1)
    with np.errstate(over="ignore"):
        mixed = _splitmix64(ids * np.uint64(BLOCK_SIZE) + offsets)
    tokens = (mixed % np.uint64(VOCAB_SIZE)).astype(np.int32)
    flat_ids = ids[:, 0].astype(np.int64)
    tokens[:, 0] = flat_ids % VOCAB_SIZE  # tokens 0 and 1 spell the id: distinct ids differ
    tokens[:, 1] = flat_ids // VOCAB_SIZE
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
    "SYNTHETIC_TRACE",
    "TRACES_ENV_VAR",
    "VOCAB_SIZE",
    "TraceRecord",
    "blocks_token_array",
    "load_trace",
    "request_token_array",
    "request_tokens",
    "trace_path",
    "traces_dir",
]
