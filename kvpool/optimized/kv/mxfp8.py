"""``MHATokenToKVPoolMXFP8`` (torch twin of :mod:`kvpool.reference.kv.mxfp8`; the same bytes).

Per layer: ``k_buffer[l]`` ``(rows, head_num, head_dim)`` and ``v_buffer[l]``
``(rows, head_num, v_head_dim)`` of e4m3 codes (SGLang's ``float8_e4m3fn`` store dtype, kept as
uint8 because indexed writes do not take fp8; ``get_raw_kv_buffer`` views them as e4m3), and UE8M0
scale bytes ``k_scale_buffer[l]`` ``(rows, head_num, head_dim // 32)`` (V likewise) kept as uint8
(the flat, non-interleaved layout). Writes quantise float K/V; reads dequantise.
"""

from __future__ import annotations

import numpy as np
import numpy.typing as npt
import torch

from kvpool.errors import ConfigError
from kvpool.optimized.host_view import in_bounds
from kvpool.optimized.kv.fp4 import Rows, quantizable
from kvpool.optimized.kv.kv_cache import IndexLike, KVCache, TensorLike
from kvpool.optimized.kv.quant import mxfp8_dequantize, mxfp8_quantize
from kvpool.optimized.kv.tag_codec import mxfp8_host_tags, mxfp8_read_tags, mxfp8_tag_bytes
from kvpool.optimized.options import TwinOptions
from kvpool.reference.kv.kv_cache import as_scale
from kvpool.reference.kv.quant import MXFP8_BLOCK
from kvpool.reference.kv.tag_codec import MXFP8_DIGITS


class MHATokenToKVPoolMXFP8(KVCache):
    """MXFP8 K and V per layer (see the reference)."""

    MXFP8_SCALE_BLOCK_SIZE = MXFP8_BLOCK

    def __init__(
        self,
        size: int,
        page_size: int,
        dtype: str | torch.dtype,
        head_num: int,
        head_dim: int,
        layer_num: int,
        start_layer: int = 0,
        v_head_dim: int | None = None,
        *,
        options: TwinOptions | None = None,
    ) -> None:
        super().__init__(
            size,
            page_size,
            dtype,
            layer_num,
            start_layer,
            options=options,
        )
        self._set_mha_heads(head_num, head_dim, v_head_dim)
        v_dim = self.v_head_dim
        if head_dim % MXFP8_BLOCK or v_dim % MXFP8_BLOCK:
            raise ConfigError(f"MXFP8 needs head_dim and v_head_dim divisible by {MXFP8_BLOCK}")
        self.store_dtype = torch.float8_e4m3fn
        rows = self.num_rows
        self.k_buffer = [self._zeros8(rows, head_num, head_dim) for _ in range(layer_num)]
        self.v_buffer = [self._zeros8(rows, head_num, v_dim) for _ in range(layer_num)]
        k_sf, v_sf = head_dim // MXFP8_BLOCK, v_dim // MXFP8_BLOCK
        self.k_scale_buffer = [self._sf(rows, head_num, k_sf) for _ in range(layer_num)]
        self.v_scale_buffer = [self._sf(rows, head_num, v_sf) for _ in range(layer_num)]

    def _zeros8(self, *shape: int) -> torch.Tensor:
        # Kept as uint8 (indexed writes do not take fp8); viewed as e4m3 on the way out.
        return torch.zeros(shape, dtype=torch.uint8, device=self.device)

    def _sf(self, *shape: int) -> torch.Tensor:
        return torch.zeros(shape, dtype=torch.uint8, device=self.device)

    def set_kv_buffer(
        self,
        layer_id: int,
        loc: IndexLike,
        cache_k: TensorLike,
        cache_v: TensorLike,
        k_scale: float | None = None,
        v_scale: float | None = None,
    ) -> None:
        """Quantise ``cache_k / k_scale`` ``(n, head_num, head_dim)`` and ``cache_v / v_scale``
        ``(n, head_num, v_head_dim)``; store bytes and scales at ``loc``. Checks (layer, slots,
        scales, data) first."""
        local = self._layer(layer_id)
        slots = self._slots(loc)
        n = slots.numel()
        ks, vs = as_scale("k_scale", k_scale), as_scale("v_scale", v_scale)
        k = quantizable(self.device, "cache_k", cache_k, (n, self.head_num, self.head_dim), ks)
        v = quantizable(self.device, "cache_v", cache_v, (n, self.head_num, self.v_head_dim), vs)
        self._store(local, slots, k, v)

    def _store(self, local: int, slots: torch.Tensor, k: Rows, v: Rows) -> None:
        """Write K and V rows (float32 to quantise, or their ``(codes, scales)`` bytes made
        already: ``write_tags`` makes them once for every layer) at checked ``slots``."""
        k_q, k_sf = k if isinstance(k, tuple) else mxfp8_quantize(k)
        v_q, v_sf = v if isinstance(v, tuple) else mxfp8_quantize(v)
        self._store_all(
            slots,
            [
                (self.k_buffer[local], k_q),
                (self.v_buffer[local], v_q),
                (self.k_scale_buffer[local], k_sf),
                (self.v_scale_buffer[local], v_sf),
            ],
        )

    def get_key_buffer(self, layer_id: int) -> torch.Tensor:
        """K of ``layer_id`` dequantised: a new float32 ``(rows, head_num, head_dim)``."""
        local = self._wait(layer_id)
        return mxfp8_dequantize(self.k_buffer[local], self.k_scale_buffer[local])

    def get_value_buffer(self, layer_id: int) -> torch.Tensor:
        """V of ``layer_id`` dequantised (a new tensor)."""
        local = self._wait(layer_id)
        return mxfp8_dequantize(self.v_buffer[local], self.v_scale_buffer[local])

    def get_kv_buffer(self, layer_id: int) -> tuple[torch.Tensor, torch.Tensor]:
        """``(get_key_buffer, get_value_buffer)``."""
        return self.get_key_buffer(layer_id), self.get_value_buffer(layer_id)

    def get_raw_kv_buffer(self, layer_id: int) -> tuple[torch.Tensor, torch.Tensor]:
        """The e4m3 tensors of ``layer_id`` (views of the stored bytes): ``(k, v)``."""
        local = self._wait(layer_id)
        return (self.k_buffer[local].view(torch.float8_e4m3fn),
                self.v_buffer[local].view(torch.float8_e4m3fn))  # fmt: skip

    def get_kv_scale_buffer(self, layer_id: int) -> tuple[torch.Tensor, torch.Tensor]:
        """The UE8M0 scale bytes of ``layer_id``: ``(k_scales, v_scales)``."""
        local = self._layer(layer_id)
        return self.k_scale_buffer[local], self.v_scale_buffer[local]

    def move_kv_cache(self, tgt_loc: IndexLike, src_loc: IndexLike) -> None:
        """Copy bytes and scales of rows ``src_loc`` to ``tgt_loc`` on every layer."""
        buffers = (*self.k_buffer, *self.v_buffer, *self.k_scale_buffer, *self.v_scale_buffer)
        self._move(buffers, tgt_loc, src_loc)

    def write_tags(self, loc: IndexLike, tags: IndexLike) -> None:
        """Store each tag (``[0, TAG_LIMIT)``) in MXFP8 form in every head of K and V of every
        held layer; slots and tags checked first."""
        slots = self._slots(loc)
        values = [int(t) for t in self._tags(tags, slots.numel()).tolist()]
        # once for every layer (each stores the same bytes); V the same as K when as wide
        k = mxfp8_tag_bytes(values, self.head_num, self.head_dim, self.device)
        if self.v_head_dim == self.head_dim:
            v = k
        else:
            v = mxfp8_tag_bytes(values, self.head_num, self.v_head_dim, self.device)
        for local in range(self.layer_num):
            self._store(local, slots, k, v)

    def read_tags(self, loc: IndexLike) -> list[int]:
        """The tag each slot stores (head 0 of K on the first held layer; 0 if none)."""
        slots = self._slots(loc)
        heads = mxfp8_dequantize(self.k_buffer[0][slots], self.k_scale_buffer[0][slots])
        return mxfp8_read_tags(heads[:, 0, :])

    def _snapshot_tags(self, slots: npt.NDArray[np.int64]) -> list[int]:
        """:meth:`read_tags` of a manager's own slots: head 0's first scale block of each, read
        once on the host and decoded there
        (:func:`~kvpool.optimized.kv.tag_codec.mxfp8_host_tags`)."""
        if not in_bounds(slots, self.num_rows):
            return self.read_tags(slots.tolist())  # its IndexOutOfRangeError
        codes = self._host_take(self.k_buffer[0], slots, 0, slice(0, 1 + MXFP8_DIGITS))
        return mxfp8_host_tags(codes, self._host_take(self.k_scale_buffer[0], slots, 0, 0))


__all__ = ["MHATokenToKVPoolMXFP8"]
