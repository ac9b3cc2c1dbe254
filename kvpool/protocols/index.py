"""The type variables of the protocols: ``IdxT`` is a twin's index container (``list[int]`` in the
reference, ``torch.Tensor`` in the twin); ``IdxT_contra`` / ``IdxT_co`` are its variance-specific
forms, for protocols that only take (or only return) index containers."""

from __future__ import annotations

from typing import TypeVar

IdxT = TypeVar("IdxT")
IdxT_contra = TypeVar("IdxT_contra", contravariant=True)
IdxT_co = TypeVar("IdxT_co", covariant=True)

__all__ = ["IdxT", "IdxT_co", "IdxT_contra"]
