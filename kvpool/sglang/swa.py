"""SGLang's ``SWATokenToKVPoolAllocator`` behind the SWA allocator API of kvpool's reference.

:class:`SGLangSWAAllocator` constructs SGLang's own class (``mem_cache/allocator/swa.py``) on the
CPU: two of SGLang's token or paged allocators (full and SWA) joined by SGLang's
``full_to_swa_index_mapping``. What the adapter adds:

- **The KV pool.** SGLang's constructor asserts an instance of its ``BaseSWAKVPool`` and hands
  it the mapping (``register_mapping``); ``translate_loc_from_full_to_swa`` goes through it.
  The adapter passes :func:`mapping_kv_pool`'s object: a ``BaseSWAKVPool`` subclass without
  buffers (the allocators never read or write KV) whose translation indexes the registered
  mapping, which is all SGLang's ``SWAKVPool.translate_loc_from_full_to_swa`` does.
- **Index arguments** reach SGLang as int64 CPU tensors, as in
  :class:`~kvpool.sglang.allocators.SGLangAllocator`; results are SGLang's tensors.
- **merge_and_sort_free**: SGLang's SWA allocator inherits the base class's, which reads its own
  ``release_pages`` (None: a TypeError); no SGLang caller merges the SWA allocator itself (its
  two page allocators merge inside their own ``alloc``). The adapter merges the two page
  allocators with SGLang's code, which is what kvpool's reference does.
- **Snapshot.** Both page allocators' free lists (SGLang's fields), the mapping, and the free
  group as SGLang keeps it at the SWA level (0.5.16): ``in_free_group`` on both pools, the
  buffered full slots as the full pool's ``pending_free``, none on the SWA pool (0.5.16 looks
  their SWA slots up at ``free_group_end``; ``Rules.swa_free_resolve="group_end"``).
"""

from __future__ import annotations

import copy
from typing import Any

import torch

from kvpool.sglang.allocators import (
    _STATE_FIELDS,
    as_index_tensor,
    call_alloc_extend,
    page_allocator_snapshot,
)
from kvpool.sglang.kernels import route_naive_extend
from kvpool.sglang.loader import SGLangModules
from kvpool.snapshot import SWAAllocatorSnapshot

_SWA = "sglang.srt.mem_cache.allocator.swa"
_BASE_POOL = "sglang.srt.mem_cache.base_swa_memory_pool"
_KV_DTYPE = torch.bfloat16
"""What SGLang records as the KV dtype; the allocators never read it."""

_POOL_CLASSES: dict[int, type] = {}


def mapping_kv_pool(modules: SGLangModules) -> Any:
    """A buffer-less subclass instance of SGLang's ``BaseSWAKVPool`` (see the module
    docstring): it keeps the mapping SGLang's allocator registers and translates through it."""
    base = modules.attr(_BASE_POOL, "BaseSWAKVPool")
    cls = _POOL_CLASSES.get(id(base))
    if cls is None:

        def register_mapping(self: Any, mapping: torch.Tensor) -> None:
            self.full_to_swa_index_mapping = mapping

        def translate(self: Any, kv_indices: torch.Tensor) -> torch.Tensor:
            mapping: torch.Tensor = self.full_to_swa_index_mapping
            return mapping[kv_indices]

        def no_state(self: Any) -> tuple[list[int], list[int], list[int]]:
            return [], [], []

        cls = type(
            "MappingOnlySWAKVPool",
            (base,),
            {
                "full_kv_pool": None,
                "swa_kv_pool": None,
                "full_to_swa_index_mapping": None,
                "register_mapping": register_mapping,
                "translate_loc_from_full_to_swa": translate,
                "get_state_buf_infos": no_state,
            },
        )
        _POOL_CLASSES[id(base)] = cls
    return cls()


def _ints(value: Any) -> tuple[int, ...]:
    if value is None:
        return ()
    if isinstance(value, list):
        return tuple(int(x) for part in value for x in part.tolist())
    return tuple(int(x) for x in value.tolist())


class SGLangSWAAllocator:
    """SGLang's ``SWATokenToKVPoolAllocator`` of ``size`` full and ``size_swa`` SWA tokens (see
    the module docstring). Above page size 1 its two paged allocators run their Triton kernels
    (through the interpreter), or with ``naive_extend`` SGLang's torch path, as on a platform
    without Triton (0.5.23: ``use_triton_kernels = False``, ``alloc_extend_naive`` and
    ``alloc_decode_naive``; 0.5.16: ``alloc_extend_naive`` through
    :func:`~kvpool.sglang.kernels.route_naive_extend`, decode having no torch path).
    ``impl`` is SGLang's object."""

    def __init__(
        self,
        modules: SGLangModules,
        size: int,
        size_swa: int,
        page_size: int = 1,
        need_sort: bool = False,
        *,
        naive_extend: bool = False,
    ) -> None:
        self.page_size = page_size
        self.need_sort = need_sort
        self.version = modules.version
        cls = modules.attr(_SWA, "SWATokenToKVPoolAllocator")
        self.impl: Any = cls(
            size, size_swa, page_size, _KV_DTYPE, "cpu", mapping_kv_pool(modules), need_sort
        )
        for sub in (self.impl.full_attn_allocator, self.impl.swa_attn_allocator):
            if hasattr(sub, "use_triton_kernels"):
                sub.use_triton_kernels = not naive_extend
            elif naive_extend and page_size > 1:
                route_naive_extend(sub)

    # ------------------------------------------------------------------ queries
    @property
    def full_to_swa_index_mapping(self) -> torch.Tensor:
        return self.impl.full_to_swa_index_mapping  # type: ignore[no-any-return]

    @property
    def full_attn_allocator(self) -> Any:
        return self.impl.full_attn_allocator

    @property
    def size(self) -> int:
        return int(self.impl.size)

    def available_size(self) -> int:
        return int(self.impl.available_size())

    def full_available_size(self) -> int:
        return int(self.impl.full_available_size())

    def swa_available_size(self) -> int:
        return int(self.impl.swa_available_size())

    def _in_group(self) -> bool:
        impl = self.impl
        if hasattr(impl, "is_not_in_free_group"):
            return not impl.is_not_in_free_group
        return impl.free_group is not None

    def snapshot(self) -> SWAAllocatorSnapshot:
        """Both pools and the mapping (see the module docstring)."""
        impl = self.impl
        in_group = self._in_group()
        pending = _ints(impl.free_group) if in_group else ()
        at_end = not hasattr(impl, "swa_free_group")  # 0.5.16: the SWA pool is in no group
        swa_group = in_group and not at_end
        swa_pending = _ints(impl.swa_free_group) if swa_group else ()
        if in_group and hasattr(impl, "swa_page_ids_group"):
            # 0.5.23: the full pool's own group buffers its slot frees; the SWA slots a free
            # resolved wait in two piles (slots, with the page expansion's sentinels and each
            # page once per slot freed in it, which the paged free de-duplicates; pages from
            # segment frees, which at page size 1 are slots)
            pending = _ints(impl.full_attn_allocator.free_group)
            swa_pending = tuple(dict.fromkeys(s for s in swa_pending if s > 0))
            if self.page_size == 1:
                swa_pending += _ints(impl.swa_page_ids_group)
        return SWAAllocatorSnapshot(
            full=page_allocator_snapshot(
                impl.full_attn_allocator, self.page_size, self.need_sort, in_group, pending
            ),
            swa=page_allocator_snapshot(
                impl.swa_attn_allocator, self.page_size, self.need_sort, swa_group, swa_pending
            ),
            full_to_swa=tuple(int(x) for x in impl.full_to_swa_index_mapping.tolist()),
            resolves_at_group_end=at_end,
        )

    def translate_loc_from_full_to_swa(self, kv_indices: Any) -> torch.Tensor:
        return self.impl.translate_loc_from_full_to_swa(as_index_tensor(kv_indices))  # type: ignore[no-any-return]

    def set_full_to_swa_mapping(self, full_indices: Any, swa_indices: Any) -> None:
        full, swa = as_index_tensor(full_indices), as_index_tensor(swa_indices)
        self.impl.set_full_to_swa_mapping(full, swa)

    # ------------------------------------------------------------------ alloc / free
    def alloc(self, need_size: int) -> Any:
        return self.impl.alloc(need_size)

    def alloc_extend(
        self,
        prefix_lens: Any,
        prefix_lens_cpu: Any,
        seq_lens: Any,
        seq_lens_cpu: Any,
        last_loc: Any,
        extend_num_tokens: int,
    ) -> Any:
        return call_alloc_extend(self.impl, extend_num_tokens, prefix_lens, prefix_lens_cpu,
                                 seq_lens, seq_lens_cpu, last_loc)  # fmt: skip

    def alloc_extend_swa_tail(
        self,
        prefix_lens: Any,
        prefix_lens_cpu: Any,
        seq_lens: Any,
        seq_lens_cpu: Any,
        last_loc: Any,
        extend_num_tokens: int,
        swa_tail_len: int,
    ) -> Any:
        return self.impl.alloc_extend_swa_tail(
            as_index_tensor(prefix_lens),
            as_index_tensor(prefix_lens_cpu),
            as_index_tensor(seq_lens),
            as_index_tensor(seq_lens_cpu),
            as_index_tensor(last_loc),
            int(extend_num_tokens),
            int(swa_tail_len),
        )

    def alloc_decode(self, seq_lens: Any, seq_lens_cpu: Any, last_loc: Any) -> Any:
        return self.impl.alloc_decode(
            as_index_tensor(seq_lens), as_index_tensor(seq_lens_cpu), as_index_tensor(last_loc)
        )

    def free(self, free_index: Any) -> None:
        self.impl.free(as_index_tensor(free_index))

    def free_swa(self, free_index: Any) -> None:
        self.impl.free_swa(as_index_tensor(free_index))

    def free_group_begin(self) -> None:
        self.impl.free_group_begin()

    def free_group_end(self) -> None:
        self.impl.free_group_end()

    def merge_and_sort_free(self) -> None:
        """Both page allocators' merge (see the module docstring)."""
        self.impl.full_attn_allocator.merge_and_sort_free()
        self.impl.swa_attn_allocator.merge_and_sort_free()

    def free_full(self, free_index: Any) -> None:
        """SGLang's ``free_full`` (0.5.23): full slots whose SWA slots are gone already."""
        self.impl.free_full(as_index_tensor(free_index))

    def free_segment(self, free_index: Any, start_pos: int = 0) -> None:
        """SGLang's ``free_segment`` (0.5.23): both pools, a kv-row segment at ``start_pos``."""
        self.impl.free_segment(as_index_tensor(free_index), start_pos=start_pos)

    def free_full_segment(self, free_index: Any, start_pos: int = 0) -> None:
        """SGLang's ``free_full_segment`` (0.5.23): the full pool alone."""
        self.impl.free_full_segment(as_index_tensor(free_index), start_pos=start_pos)

    def free_swa_segment(self, free_index: Any, start_pos: int = 0) -> None:
        """SGLang's ``free_swa_segment`` (0.5.23): the SWA pool alone."""
        self.impl.free_swa_segment(as_index_tensor(free_index), start_pos=start_pos)

    def backup_state(self) -> Any:
        """SGLang's ``backup_state()`` where it has one (0.5.16), else (0.5.23 dropped it) a
        copy of both page allocators' free lists and of the mapping."""
        if hasattr(self.impl, "backup_state"):
            return self.impl.backup_state()
        impl = self.impl
        subs = (impl.full_attn_allocator, impl.swa_attn_allocator)
        lists = tuple({f: copy.copy(getattr(a, f)) for f in _STATE_FIELDS if hasattr(a, f)}
                      for a in subs)  # fmt: skip
        return lists, impl.full_to_swa_index_mapping.clone()

    def restore_state(self, state: Any) -> None:
        if hasattr(self.impl, "restore_state"):
            self.impl.restore_state(state)
            return
        impl = self.impl
        lists, mapping = state
        for sub, fields in zip((impl.full_attn_allocator, impl.swa_attn_allocator), lists,
                               strict=True):  # fmt: skip
            for name, value in fields.items():
                setattr(sub, name, copy.copy(value))
        impl.full_to_swa_index_mapping.copy_(mapping)  # in place: the KV pool shares it

    def clear(self) -> None:
        self.impl.clear()


__all__ = ["SGLangSWAAllocator", "mapping_kv_pool"]
