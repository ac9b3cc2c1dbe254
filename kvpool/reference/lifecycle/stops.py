"""A stop inside the last speculative run: what a finished request owns, and the stops the
lifecycle does not model. Pure helpers both twins' managers call (units: tokens).

A speculative step commits its whole accepted run, so the stop token a client ends on may lie
before the last committed token; ``finish``'s ``finished_lens`` names it (SGLang's
``finished_len``: output tokens through the stop). The request owns ``min(committed, prompt +
finished_len)`` tokens (SGLang 0.5.23's ``owned_kv_len``); what its release keeps of them is
``Rules.release_upto``'s choice (specs/lifecycle.md, "A stop inside the last speculative run").
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Protocol, TypeVar

from kvpool.errors import ConfigError


class StopReq(Protocol):
    """What these helpers read of a request (either twin's ``Req``)."""

    rid: str
    kv_committed_len: int
    origin_input_ids: list[int]
    output_ids: list[int]
    finished_len: int | None


R = TypeVar("R", bound=StopReq)


def owned_at(req: StopReq, stop: int | None) -> int:
    """The tokens ``req`` keeps when it stops ``stop`` output tokens in (its
    ``finished_len``): ``min(kv_committed_len, prompt + stop)``; ``kv_committed_len`` for None."""
    if stop is None:
        return req.kv_committed_len
    return min(req.kv_committed_len, len(req.origin_input_ids) + stop)


def owned_len(req: StopReq) -> int:
    """The tokens of ``req`` that are its to keep (SGLang 0.5.23's ``owned_kv_len``):
    :func:`owned_at` its ``finished_len``."""
    return owned_at(req, req.finished_len)


def check_hybrid_stops(
    reqs: Sequence[R], stops: Sequence[int | None], in_session: Callable[[R], bool]
) -> None:
    """ConfigError when a hybrid (Mamba) model's session turn (``in_session``) would stop before
    its last output token: its state holds every committed token and cannot be cut back to the
    tokens its session keeps (not modelled; SGLang 0.5.23's streaming session keeps that state
    and resumes the next turn from it: specs/sglang_findings.md, finding 10)."""
    short = [r.rid for r, s in zip(reqs, stops, strict=True)
             if s is not None and s < len(r.output_ids) and in_session(r)]  # fmt: skip
    if short:
        raise ConfigError(f"session turns {short} of a hybrid (Mamba) model: a stop before the "
                          "last output token is not modelled (its state ran past the stop; "
                          "SGLang's session would resume from it: sglang_findings.md, "
                          "finding 10)")  # fmt: skip


def check_swa_stops(
    reqs: Sequence[StopReq],
    stops: Sequence[int | None],
    window: int,
    evicted: Callable[[str], int],
) -> None:
    """ConfigError when a request would stop a whole ``window`` or more before its last
    committed token, or at or below its window's cursor (``evicted(rid)``): the tokens through
    the stop would keep no live window. Not modelled: a real window spans hundreds of tokens, a
    speculative run a handful."""
    for req, stop in zip(reqs, stops, strict=True):
        committed, owned = req.kv_committed_len, owned_at(req, stop)
        if committed - owned >= window or (owned < committed and owned <= evicted(req.rid)):
            raise ConfigError(
                f"request {req.rid!r}: a stop {committed - owned} tokens before its last "
                f"committed one, past a window of {window} tokens or its cursor, is not modelled"
            )


__all__ = ["StopReq", "check_hybrid_stops", "check_swa_stops", "owned_at", "owned_len"]
