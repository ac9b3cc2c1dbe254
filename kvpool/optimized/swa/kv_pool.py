"""``SWAKVPool`` (optimized twin): the KV buffers of a hybrid sliding-window model.

Twin of :mod:`kvpool.reference.swa.kv_pool` (same layers mapping, results and errors): two
:class:`~kvpool.optimized.kv.mha.MHATokenToKVPool` tensors sets, writes and moves on SWA layers
go through the allocator's registered ``full_to_swa_index_mapping`` tensor (shared, not
copied), translated with one gather; ``checked`` validates like the reference.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import numpy.typing as npt
import torch

from kvpool.constants import RESERVED_INDEX
from kvpool.errors import ConfigError, IndexOutOfRangeError, InvalidArgumentError
from kvpool.host_checks import as_int
from kvpool.optimized.index_args import any_outside, index_tensor
from kvpool.optimized.key_match import is_integer_dtype
from kvpool.optimized.kv.kv_cache import TensorLike
from kvpool.optimized.kv.mha import MHATokenToKVPool
from kvpool.optimized.options import TwinOptions, twin_options


def _same_device(got: torch.device, want: torch.device) -> bool:
    """``got`` is ``want`` (an index-less ``want``, such as ``cuda``, takes any of its kind)."""
    return got.type == want.type and (want.index is None or got.index == want.index)


class SWAKVPool:
    """Full and SWA buffers by layer kind (twin of the reference class)."""

    def __init__(
        self,
        size: int,
        size_swa: int,
        page_size: int,
        dtype: str | torch.dtype,
        head_num: int,
        head_dim: int,
        swa_attention_layer_ids: Sequence[int],
        full_attention_layer_ids: Sequence[int],
        v_head_dim: int | None = None,
        *,
        options: TwinOptions | None = None,
    ) -> None:
        swa_ids, full_ids = list(swa_attention_layer_ids), list(full_attention_layer_ids)
        if set(swa_ids) & set(full_ids) or not swa_ids or not full_ids:
            raise ConfigError("need disjoint, non-empty full and SWA layer id lists")
        self.size, self.size_swa, self.page_size = size, size_swa, page_size
        self.options = opts = twin_options(options)
        self.device = opts.device
        self.checked = opts.checked
        shape = (head_num, head_dim)
        self.swa_kv_pool = MHATokenToKVPool(size_swa, page_size, dtype, *shape, len(swa_ids), 0,
                                            v_head_dim, options=opts)  # fmt: skip
        self.full_kv_pool = MHATokenToKVPool(size, page_size, dtype, *shape, len(full_ids), 0,
                                             v_head_dim, options=opts)  # fmt: skip
        self.layers_mapping: dict[int, tuple[int, bool]] = {}
        for local, layer in enumerate(full_ids):
            self.layers_mapping[layer] = (local, False)
        for local, layer in enumerate(swa_ids):
            self.layers_mapping[layer] = (local, True)
        self.full_to_swa_index_mapping: torch.Tensor | None = None

    def register_mapping(self, full_to_swa_index_mapping: torch.Tensor) -> None:
        """Share the allocator's mapping tensor (later updates are seen). InvalidArgumentError
        unless it is a 1-D integer tensor of ``size + page_size + 1`` entries on the pool's
        device (metadata: both modes); checked mode also reads it: the last entry -1
        (InvalidArgumentError), the others inside the SWA pool (IndexOutOfRangeError), as the
        reference."""
        mapping = full_to_swa_index_mapping
        want = self.size + self.page_size + 1
        if (
            not isinstance(mapping, torch.Tensor)
            or mapping.dim() != 1
            or mapping.numel() != want
            or mapping.dtype == torch.bool
            or not is_integer_dtype(mapping.dtype)
            or not _same_device(mapping.device, torch.device(self.device))
        ):
            raise InvalidArgumentError(
                f"full_to_swa_index_mapping must be a 1-D integer tensor of {want} slots on "
                f"{self.device}, got {mapping!r:.80}"
            )
        if self.checked:
            if int(mapping[-1]) != -1:
                raise InvalidArgumentError("full_to_swa_index_mapping must end with -1")
            limit = self.size_swa + self.page_size
            body = mapping[:-1]
            bad = (body < 0) | (body >= limit)
            if bool(bad.any()):
                raise IndexOutOfRangeError(
                    f"SWA slots out of range [0, {limit}): {body[bad][:8].tolist()}"
                )
        self.full_to_swa_index_mapping = mapping

    def translate_loc_from_full_to_swa(self, kv_indices: TensorLike) -> torch.Tensor:
        """SWA slot of each full slot (0: none; -1 stays -1); checked mode validates."""
        mapping = self.full_to_swa_index_mapping
        if mapping is None:
            raise InvalidArgumentError("no full_to_swa_index_mapping registered")
        locs = index_tensor("kv_indices", kv_indices, self.device)  # metadata: both modes
        # values: checked mode, or host values (no device read for them)
        if (self.checked or not isinstance(kv_indices, torch.Tensor)) and any_outside(
            locs, -1, mapping.numel() - 1
        ):
            bad = (locs < -1) | (locs >= mapping.numel() - 1)
            if bool(bad.any()):
                raise IndexOutOfRangeError(f"full slots out of range: {locs[bad].tolist()}")
        return mapping[locs]

    def _pool(self, layer_id: int) -> tuple[MHATokenToKVPool, int, bool]:
        """As the reference: InvalidArgumentError unless ``layer_id`` is an integer,
        IndexOutOfRangeError for an unknown layer."""
        layer_id = as_int("layer_id", layer_id)
        if layer_id not in self.layers_mapping:
            raise IndexOutOfRangeError(f"layer {layer_id} is neither a full nor an SWA layer")
        local, is_swa = self.layers_mapping[layer_id]
        return (self.swa_kv_pool if is_swa else self.full_kv_pool), local, is_swa

    def get_key_buffer(self, layer_id: int) -> torch.Tensor:
        pool, local, _ = self._pool(layer_id)
        return pool.get_key_buffer(local)

    def get_value_buffer(self, layer_id: int) -> torch.Tensor:
        pool, local, _ = self._pool(layer_id)
        return pool.get_value_buffer(local)

    def get_kv_buffer(self, layer_id: int) -> tuple[torch.Tensor, torch.Tensor]:
        pool, local, _ = self._pool(layer_id)
        return pool.get_kv_buffer(local)

    def set_kv_buffer(
        self,
        layer_id: int,
        loc: TensorLike,
        cache_k: TensorLike,
        cache_v: TensorLike,
        k_scale: float | None = None,
        v_scale: float | None = None,
        swa_loc: TensorLike | None = None,
    ) -> None:
        """Write K/V of ``layer_id`` for the tokens at full slots ``loc`` (SWA layers: at their
        SWA slots, ``swa_loc`` when precomputed)."""
        pool, local, is_swa = self._pool(layer_id)
        if is_swa:
            loc = self.translate_loc_from_full_to_swa(loc) if swa_loc is None else swa_loc
        pool.set_kv_buffer(local, loc, cache_k, cache_v, k_scale, v_scale)

    def move_kv_cache(self, tgt_loc: TensorLike, src_loc: TensorLike) -> None:
        """Copy full rows ``src_loc`` to ``tgt_loc`` and their SWA rows likewise."""
        tgt_swa = self.translate_loc_from_full_to_swa(tgt_loc)
        src_swa = self.translate_loc_from_full_to_swa(src_loc)
        self.full_kv_pool.move_kv_cache(tgt_loc, src_loc)
        self.swa_kv_pool.move_kv_cache(tgt_swa, src_swa)

    def write_tags(self, loc: TensorLike, tags: TensorLike) -> None:
        """``tags[i]`` at full slot ``loc[i]`` on every full layer and at its SWA slot on every
        SWA layer (tokens without an SWA slot skip the SWA layers)."""
        swa = self.translate_loc_from_full_to_swa(loc)  # checked before the first write
        self.full_kv_pool.write_tags(loc, tags)
        values = torch.as_tensor(tags, device=self.device).reshape(-1)
        if self.checked and swa.is_cpu and bool((swa.numpy() != RESERVED_INDEX).all()):
            # every token has an SWA slot (the usual write): no selection to make (checked
            # mode reads the host anyway)
            self.swa_kv_pool.write_tags(swa, values)
            return
        keep = swa != RESERVED_INDEX
        self.swa_kv_pool.write_tags(swa[keep], values[keep])

    def read_tags(self, loc: TensorLike) -> list[int]:
        """The tag at each full slot (the first full layer)."""
        return self.full_kv_pool.read_tags(loc)

    def _snapshot_tags(self, slots: npt.NDArray[np.int64]) -> list[int]:
        """:meth:`read_tags` of a manager's own full slots, from one host read."""
        return self.full_kv_pool._snapshot_tags(slots)

    def read_swa_tags(self, loc: TensorLike) -> list[int]:
        """The tag at each token's SWA slot (the first SWA layer); 0 for a token without one."""
        swa = self.translate_loc_from_full_to_swa(loc)
        tags = self.swa_kv_pool.read_tags(swa)
        return [t if s else 0 for s, t in zip(swa.tolist(), tags, strict=True)]


__all__ = ["SWAKVPool"]
