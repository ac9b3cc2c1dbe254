"""``PageMajorMHATokenToKVPool`` (torch twin of :mod:`kvpool.reference.kv.page_major`).

One contiguous ``uint8`` buffer ``_raw`` holds every layer's K and V, page-major and
layer-major within a page; ``k_buffer[l]`` / ``v_buffer[l]`` are 4-D strided float32 views
``(num_pages, page_size, head_num, head_dim)`` over it (``torch.as_strided``, no copies), as
SGLang's ``build_page_major_mha_views``. Token ``t`` is ``[t // page_size, t % page_size]``.
The getters return those views (SGLang's shape); ``_raw`` holds exactly the reference's
``raw_bytes()``.
"""

from __future__ import annotations

import numpy as np
import numpy.typing as npt
import torch

from kvpool.errors import ConfigError, InvalidArgumentError
from kvpool.optimized.host_view import float_ints, in_bounds
from kvpool.optimized.kv.kv_cache import IndexLike, KVCache, TensorLike, data_tensor
from kvpool.optimized.kv.quant import as_float32
from kvpool.optimized.options import TwinOptions
from kvpool.reference.kv.kv_cache import as_scale

_ITEM = 4  # float32 bytes


class PageMajorMHATokenToKVPool(KVCache):
    """One raw buffer, per-layer strided K/V views (see the module docstring)."""

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
        if self.dtype != torch.float32:
            raise ConfigError("the page-major pool models float32 storage only")
        if size % page_size:
            raise ConfigError("page-major needs size + page_size divisible by page_size")
        k_row, v_row = head_num * head_dim, head_num * v_dim
        self.num_pages = self.num_rows // page_size
        self.page_items = page_size * layer_num * (k_row + v_row)
        self._raw = torch.zeros(self.num_pages * self.page_items * _ITEM, dtype=torch.uint8,
                                device=self.device)  # fmt: skip
        items = self._raw.view(torch.float32)
        self.k_buffer: list[torch.Tensor] = []
        self.v_buffer: list[torch.Tensor] = []
        for layer in range(layer_num):
            k_base = layer * page_size * (k_row + v_row)
            self.k_buffer.append(torch.as_strided(
                items, (self.num_pages, page_size, head_num, head_dim),
                (self.page_items, k_row, head_dim, 1), k_base))  # fmt: skip
            self.v_buffer.append(torch.as_strided(
                items, (self.num_pages, page_size, head_num, v_dim),
                (self.page_items, v_row, v_dim, 1), k_base + page_size * k_row))  # fmt: skip

    def raw_bytes(self) -> bytes:
        """The raw buffer's bytes (equal to the reference's ``raw_bytes()``)."""
        return bytes(self._raw.cpu().numpy().tobytes())

    def _input(
        self, what: str, data: TensorLike, shape: tuple[int, ...], scale: float | None
    ) -> torch.Tensor:
        # float32 first, then the division in float32: the reference's div32, bit for bit.
        x = data_tensor(what, data, self.device)
        if tuple(x.shape) != shape:
            raise InvalidArgumentError(f"{what} must have shape {list(shape)}, got {list(x.shape)}")
        return as_float32(x, scale)

    def _split(self, slots: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        return slots // self.page_size, slots % self.page_size

    def set_kv_buffer(
        self,
        layer_id: int,
        loc: IndexLike,
        cache_k: TensorLike,
        cache_v: TensorLike,
        k_scale: float | None = None,
        v_scale: float | None = None,
    ) -> None:
        """Store ``cache_k / k_scale`` and ``cache_v / v_scale`` (float32) at tokens ``loc``
        through the layer's 4-D views. All checks (layer, slots, scales, data) before any
        write."""
        local = self._layer(layer_id)
        slots = self._slots(loc)
        n = slots.numel()
        ks, vs = as_scale("k_scale", k_scale), as_scale("v_scale", v_scale)
        k = self._input("cache_k", cache_k, (n, self.head_num, self.head_dim), ks)
        v = self._input("cache_v", cache_v, (n, self.head_num, self.v_head_dim), vs)
        self._store(local, slots, k, v)

    def _store(self, local: int, slots: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> None:
        page, slot = self._split(slots)
        self.k_buffer[local][page, slot] = k
        self.v_buffer[local][page, slot] = v

    def get_key_buffer(self, layer_id: int) -> torch.Tensor:
        """Layer ``layer_id``'s K view ``(num_pages, page_size, head_num, head_dim)``."""
        return self.k_buffer[self._wait(layer_id)]

    def get_value_buffer(self, layer_id: int) -> torch.Tensor:
        """Layer ``layer_id``'s V view ``(num_pages, page_size, head_num, v_head_dim)``."""
        return self.v_buffer[self._wait(layer_id)]

    def get_kv_buffer(self, layer_id: int) -> tuple[torch.Tensor, torch.Tensor]:
        """``(K view, V view)``."""
        local = self._wait(layer_id)
        return self.k_buffer[local], self.v_buffer[local]

    def move_kv_cache(self, tgt_loc: IndexLike, src_loc: IndexLike) -> None:
        """Copy tokens ``src_loc`` to ``tgt_loc`` on every layer (the gather reads first)."""
        tgt, src = self._move_pairs(tgt_loc, src_loc)
        tp, ts = self._split(tgt)
        sp, ss = self._split(src)
        for view in (*self.k_buffer, *self.v_buffer):
            view[tp, ts] = view[sp, ss]

    def write_tags(self, loc: IndexLike, tags: IndexLike) -> None:
        """Tag (``[0, TAG_LIMIT)``) in channel 0 of every head of K and V on every held layer
        (others 0); slots and tags checked first."""
        slots = self._slots(loc)
        values = self._tags(tags, slots.numel())
        k = self._tag_rows_as(values, self.head_num, self.head_dim, torch.float32)
        v = self._tag_rows_as(values, self.head_num, self.v_head_dim, torch.float32)
        for local in range(self.layer_num):
            self._store(local, slots, k, v)

    def read_tags(self, loc: IndexLike) -> list[int]:
        """Tag at each token: K of the first held layer, head 0, channel 0."""
        page, slot = self._split(self._slots(loc))
        values = self.k_buffer[0][page, slot, 0, 0]
        return [int(v) for v in values.to(torch.float64).tolist()]

    def _snapshot_tags(self, slots: npt.NDArray[np.int64]) -> list[int]:
        """:meth:`read_tags` of a manager's own slots: channel 0 of head 0 of every token read
        once on the host (a view on the CPU), then gathered by page and slot there."""
        buf = self.k_buffer[0]
        if buf.device.type != "cpu" or not in_bounds(slots, self.num_rows):
            return self.read_tags(slots.tolist())  # one device gather; or its error
        ps = self.page_size
        return float_ints(self._numpy_of(buf)[slots // ps, slots % ps, 0, 0])


__all__ = ["PageMajorMHATokenToKVPool"]
