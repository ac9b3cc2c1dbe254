"""The KV buffers: ``KVCacheProtocol`` (what attention layers use) and the KV-pool family
(``KVPoolProtocol``, ``LayerTransferCounter``: what the lifecycle and the host tier use).

The rules every method shares: :mod:`kvpool.protocols`.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Protocol

from kvpool.protocols.index import IdxT_contra


class KVCacheProtocol(Protocol):
    """KV buffers: per layer ``size + page_size`` rows (row = slot). Layers are addressed by global
    id ``start_layer..end_layer`` (inclusive). MHA keeps K and V; MLA one fused buffer whose value
    view is its first ``kv_lora_rank`` channels. Buffer types are the twin's own."""

    size: int
    page_size: int
    start_layer: int
    end_layer: int

    def set_kv_buffer(
        self,
        layer_id: int,
        loc: Any,
        cache_k: Any,
        cache_v: Any,
        k_scale: float | None = None,
        v_scale: float | None = None,
    ) -> None:
        """Store ``cache_k / k_scale`` (and V likewise) at slots ``loc`` of layer ``layer_id``.
        Never mutates ``cache_k`` or ``cache_v``. MLA ignores ``cache_v``."""
        ...

    def get_key_buffer(self, layer_id: int) -> Any: ...

    def get_value_buffer(self, layer_id: int) -> Any: ...

    def get_kv_buffer(self, layer_id: int) -> tuple[Any, Any]: ...

    def move_kv_cache(self, tgt_loc: Any, src_loc: Any) -> None:
        """Copy every layer's rows ``src_loc`` to ``tgt_loc``."""
        ...

    def read_tags(self, loc: Sequence[int]) -> list[int]:
        """The KV tag (:mod:`kvpool.tags`) stored at each slot (layer ``start_layer``, K channel
        0); 0 for a slot never written."""
        ...


# ----------------------------------------------------------------- KV pools (kv/)
# The KV-pool family: the MHA and MLA pools and their storage variants (FP4, MXFP8, page-major,
# no-op) of either twin. KVCacheProtocol above is the buffer interface the attention layers use;
# what follows is what the request lifecycle and the host tier use of a pool beyond it: the
# geometry, the KV tags written at allocation and checked at every read, and the layer-wise
# loading hook. Units: tokens (slots); layers by global id.


class LayerTransferCounter(Protocol):
    """The layer-wise loading hook (pipeline / disaggregation): a pool's buffer reads wait on it
    until their layer has loaded (:mod:`kvpool.reference.kv.layer_transfer`)."""

    def wait_until(self, threshold: int) -> None:
        """Return once local layer ``threshold`` (``layer_id - start_layer``) has loaded."""
        ...


class KVPoolProtocol(Protocol[IdxT_contra]):
    """A KV pool as the lifecycle and the host tier use it (every storage variant of either twin
    satisfies it; ``IdxT_contra``: the twin's slot containers, ``Sequence[int]`` in the reference,
    a tensor or a sequence in the optimized twin)."""

    @property
    def size(self) -> int:
        """Usable slots (tokens); the buffers hold ``size + page_size`` rows."""
        ...

    @property
    def page_size(self) -> int: ...

    @property
    def num_rows(self) -> int:
        """Rows per layer buffer: ``size + page_size``."""
        ...

    @property
    def layer_num(self) -> int: ...

    @property
    def start_layer(self) -> int: ...

    @property
    def end_layer(self) -> int:
        """``start_layer + layer_num - 1`` (inclusive)."""
        ...

    @property
    def head_num(self) -> int:
        """Heads per row (1 for MLA's fused row)."""
        ...

    @property
    def store_dtype(self) -> object:
        """What a row element is stored as: a dtype name in the reference, a ``torch.dtype`` in
        the optimized twin (fp8 and FP4 store bytes)."""
        ...

    def write_tags(self, loc: IdxT_contra, tags: IdxT_contra) -> None:
        """Store ``tags[i]`` at slot ``loc[i]`` on every held layer (K channel 0 of every head,
        other channels 0; the variants encode it in their own format)."""
        ...

    def read_tags(self, loc: IdxT_contra) -> list[int]:
        """The tag stored at each slot of ``loc`` (layer ``start_layer``; 0 if never written)."""
        ...

    def register_layer_transfer_counter(self, counter: LayerTransferCounter) -> None:
        """Make every later buffer read of layer ``l`` first call
        ``counter.wait_until(l - start_layer)``."""
        ...


__all__ = ["KVCacheProtocol", "KVPoolProtocol", "LayerTransferCounter"]
