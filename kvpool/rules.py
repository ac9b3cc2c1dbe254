"""Rules: the documented knobs where kvpool's behaviour may differ from a given SGLang release.

kvpool reproduces SGLang's observable choices wherever SGLang's are deterministic. In a few places
kvpool is deliberately stricter (specs/fidelity.md, "Where kvpool is stricter"), and SGLang's own
releases differ from each other (row order, for one). Each such difference is a field of
:class:`Rules`; a :class:`~kvpool.config.PoolConfig` carries one ``Rules`` value and both twins
follow it. An adapter for another implementation (``kvpool.sglang``) selects the preset that
describes it: :meth:`Rules.for_sglang`. The default, ``Rules()``, is kvpool's own strict rules.

Torch-free: the reference imports it.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from kvpool.errors import ConfigError

ROW_ORDERS = ("lifo", "fifo")
UNALIGNED_ALLOC = ("error", "floor")
GENERATION_ON_CLEAR = ("keep", "reset")
SGLANG_RELEASES = ("0.5.16", "0.5.23")
"""SGLang releases with a preset (:meth:`Rules.for_sglang`); audited in specs/fidelity.md."""


@dataclass(frozen=True)
class Rules:
    """Behaviour knobs (see specs/fidelity.md for each one's SGLang rule and kvpool's).

    - ``row_order``: ``"lifo"`` (kvpool; SGLang 0.5.18+): ``ReqToTokenPool`` hands out the row
      freed last first. ``"fifo"`` (SGLang <= 0.5.17): rows come from the head of ``free_slots``
      and freed rows go to its tail.
    - ``refused_alloc_unchanged``: True (kvpool): an allocation that returns None leaves the
      allocator exactly as it was. False (SGLang): a ``need_sort`` merge made by the
      allocation's pre-test stays even when the allocation is then refused.
    - ``unaligned_paged_alloc``: ``"error"`` (kvpool): paged ``alloc(n)`` with ``n`` not a
      multiple of ``page_size`` raises AlignmentError. ``"floor"`` (SGLang): it hands out
      ``n // page_size`` whole pages.
    - ``generation_on_clear``: ``"keep"`` (kvpool): ``ReqToTokenPool.clear`` keeps
      ``req_generation`` (it never goes backwards). ``"reset"`` (SGLang): it zeroes it.
    - ``rejects_misuse``: True (kvpool): freeing a free, reserved or out-of-range slot, a
      nested free group and similar misuse raise a typed error and change nothing. False
      (SGLang): such calls silently corrupt the state, so a harness must not issue them to an
      implementation with these rules (the reference still refuses them).
    """

    row_order: str = "lifo"
    refused_alloc_unchanged: bool = True
    unaligned_paged_alloc: str = "error"
    generation_on_clear: str = "keep"
    rejects_misuse: bool = True

    def __post_init__(self) -> None:
        for name, value, allowed in (
            ("row_order", self.row_order, ROW_ORDERS),
            ("unaligned_paged_alloc", self.unaligned_paged_alloc, UNALIGNED_ALLOC),
            ("generation_on_clear", self.generation_on_clear, GENERATION_ON_CLEAR),
        ):
            if value not in allowed:
                raise ConfigError(f"Rules.{name} must be one of {allowed}, got {value!r}")

    @classmethod
    def for_sglang(cls, version: str) -> Rules:
        """The rules of SGLang release ``version`` (one of :data:`SGLANG_RELEASES`; a later
        0.5.x patch takes the newest preset at or below it). ConfigError for an unknown one."""
        parts = _version_tuple(version)
        known = [v for v in SGLANG_RELEASES if _version_tuple(v) <= parts]
        if parts[:2] != (0, 5) or not known:
            raise ConfigError(f"no rules preset for SGLang {version!r}; known: {SGLANG_RELEASES}")
        lenient = cls(
            refused_alloc_unchanged=False,
            unaligned_paged_alloc="floor",
            generation_on_clear="reset",
            rejects_misuse=False,
        )
        return replace(lenient, row_order="fifo" if parts < (0, 5, 18) else "lifo")


def _version_tuple(version: str) -> tuple[int, ...]:
    try:
        return tuple(int(p) for p in version.split(".")[:3])
    except ValueError:
        raise ConfigError(f"not a release number: {version!r}") from None


__all__ = ["SGLANG_RELEASES", "Rules"]
