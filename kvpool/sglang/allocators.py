"""SGLang's token (page size 1) and paged allocators behind kvpool's allocator protocols.

:class:`SGLangAllocator` constructs SGLang's own class on the CPU (``kvcache=None``: the
allocators only hand it back through ``get_kvcache``) and forwards every call with kvpool's call
shapes. Index arguments may be lists or tensors; they reach SGLang as int64 CPU tensors, the
``*_cpu`` lengths too (SGLang sums them on the host). Results are SGLang's own tensors (or
None), compared with kvpool's through ``.tolist()``.

Differences between releases the adapter absorbs (and reports nowhere else):

- 0.5.23 removed ``backup_state`` / ``restore_state``: the adapter copies the free-list fields
  itself (``free_pages`` and the need_sort staging: ``release_pages`` for page size 1,
  ``staged_pages`` for the paged allocator);
- 0.5.23's paged allocator stages need_sort frees as a list of tensors (``staged_pages``,
  appended); 0.5.16 keeps one ``release_pages`` tensor (prepended). The snapshot's
  ``release_pages`` is their concatenation in SGLang's order;
- the free-group flag is ``not is_not_in_free_group`` (0.5.16) or ``free_group is not None``.
"""

from __future__ import annotations

import copy
from collections.abc import Sequence
from typing import Any

import torch

from kvpool.sglang.kernels import route_naive_extend
from kvpool.sglang.loader import SGLangModules
from kvpool.snapshot import AllocatorSnapshot

_KV_DTYPE = torch.bfloat16
"""What SGLang records as the KV dtype; the allocators never read it."""

_STATE_FIELDS = ("free_pages", "release_pages", "staged_pages", "num_staged_pages")


def as_index_tensor(values: Any) -> torch.Tensor:
    """``values`` (a list, tuple or tensor of ints) as an int64 CPU tensor."""
    if isinstance(values, torch.Tensor):
        return values.to(device="cpu", dtype=torch.int64)
    return torch.tensor(list(values), dtype=torch.int64)


def _ints(value: Any) -> tuple[int, ...]:
    if value is None:
        return ()
    if isinstance(value, list):  # 0.5.23's staged_pages / free_group: a list of tensors
        return tuple(int(x) for part in value for x in part.tolist())
    return tuple(int(x) for x in value.tolist())


def page_allocator_snapshot(
    impl: Any, page_size: int, need_sort: bool, in_group: bool, pending: tuple[int, ...]
) -> AllocatorSnapshot:
    """kvpool's snapshot of SGLang's token or paged allocator ``impl``: its free pages and
    need_sort staging (``staged_pages`` where the release has it, else ``release_pages``), with
    the free-group state ``in_group`` / ``pending`` (slots) the caller read."""
    staged = getattr(impl, "staged_pages", None)
    release = staged if staged is not None else impl.release_pages
    return AllocatorSnapshot(
        page_size=page_size,
        num_pages=int(impl.size) // page_size,
        size=int(impl.size),
        free_pages=_ints(impl.free_pages),
        release_pages=_ints(release),
        need_sort=need_sort,
        in_free_group=in_group,
        pending_free=pending,
    )


def call_alloc_extend(impl: Any, extend_num_tokens: int, *index_args: Any) -> Any:
    """SGLang allocator ``impl``'s ``alloc_extend(prefix_lens, prefix_lens_cpu, seq_lens,
    seq_lens_cpu, last_loc, extend_num_tokens)``, ``index_args`` being the first five as kvpool
    passes them (per request: lengths in tokens, last slots), made the index tensors SGLang
    takes."""
    return impl.alloc_extend(*map(as_index_tensor, index_args), int(extend_num_tokens))


class SGLangAllocator:
    """SGLang's ``TokenToKVPoolAllocator`` (``page_size == 1``) or
    ``PagedTokenToKVPoolAllocator`` (``page_size > 1``) of ``size`` tokens, as a kvpool
    :class:`~kvpool.protocols.PagedAllocatorProtocol`. ``naive_extend``: extend launches run
    SGLang's ``alloc_extend_naive`` instead of the Triton kernel, whoever calls ``impl`` (from
    0.5.23 by SGLang's own ``use_triton_kernels = False`` switch, which also routes decode
    through ``alloc_decode_naive``; before, by :func:`~kvpool.sglang.kernels.route_naive_extend`:
    decode has no torch path there). ``impl`` is SGLang's object."""

    def __init__(
        self,
        modules: SGLangModules,
        size: int,
        page_size: int = 1,
        need_sort: bool = False,
        *,
        naive_extend: bool = False,
    ) -> None:
        self.size = size
        self.page_size = page_size
        self.need_sort = need_sort
        self.num_pages = size // page_size
        self.version = modules.version
        if page_size == 1:
            cls = modules.attr("sglang.srt.mem_cache.allocator.token", "TokenToKVPoolAllocator")
            self.impl: Any = cls(size, _KV_DTYPE, "cpu", None, need_sort)
        else:
            cls = modules.attr(
                "sglang.srt.mem_cache.allocator.paged", "PagedTokenToKVPoolAllocator"
            )
            self.impl = cls(size, page_size, _KV_DTYPE, "cpu", None, need_sort)
            if hasattr(self.impl, "use_triton_kernels"):
                self.impl.use_triton_kernels = not naive_extend
            elif naive_extend:
                route_naive_extend(self.impl)

    # ------------------------------------------------------------------ queries
    def available_size(self) -> int:
        """Free tokens, as SGLang counts them."""
        return int(self.impl.available_size())

    def snapshot(self) -> AllocatorSnapshot:
        """kvpool's snapshot built from SGLang's fields (see the module docstring)."""
        impl = self.impl
        if hasattr(impl, "is_not_in_free_group"):
            in_group = not impl.is_not_in_free_group
        else:
            in_group = impl.free_group is not None
        pending = _ints(impl.free_group) if in_group else ()
        return page_allocator_snapshot(impl, self.page_size, self.need_sort, in_group, pending)

    # ------------------------------------------------------------------ alloc / free
    def alloc(self, need_size: int) -> Any:
        """SGLang's ``alloc(need_size)``: slots, or None."""
        return self.impl.alloc(need_size)

    def free(self, free_index: Any) -> None:
        self.impl.free(as_index_tensor(free_index))

    def free_segment(self, free_index: Any, start_pos: int = 0) -> None:
        """SGLang's ``free_segment`` (0.5.23 on; AttributeError on a release without it)."""
        self.impl.free_segment(as_index_tensor(free_index), start_pos=start_pos)

    def free_page_ids(self, page_ids: Any) -> None:
        """SGLang's ``free_page_ids`` (paged, 0.5.23 on)."""
        self.impl.free_page_ids(as_index_tensor(page_ids))

    def free_group_begin(self) -> None:
        self.impl.free_group_begin()

    def free_group_end(self) -> None:
        self.impl.free_group_end()

    def merge_and_sort_free(self) -> None:
        self.impl.merge_and_sort_free()

    def clear(self) -> None:
        self.impl.clear()

    def backup_state(self) -> Any:
        """SGLang's ``backup_state()`` where it has one (<= 0.5.22), else a copy of its
        free-list fields."""
        if hasattr(self.impl, "backup_state"):
            return self.impl.backup_state()
        return {f: copy.copy(getattr(self.impl, f)) for f in _STATE_FIELDS if hasattr(self.impl, f)}

    def restore_state(self, state: Any) -> None:
        if hasattr(self.impl, "restore_state"):
            self.impl.restore_state(state)
            return
        for name, value in state.items():
            setattr(self.impl, name, copy.copy(value))

    # ------------------------------------------------------------------ batch operations
    def alloc_extend(
        self,
        prefix_lens: Any,
        prefix_lens_cpu: Sequence[int] | torch.Tensor,
        seq_lens: Any,
        seq_lens_cpu: Sequence[int] | torch.Tensor,
        last_loc: Any,
        extend_num_tokens: int,
    ) -> Any:
        """SGLang's ``alloc_extend``: the slots of tokens ``[P_i, S_i)``, or None."""
        return call_alloc_extend(self.impl, extend_num_tokens, prefix_lens, prefix_lens_cpu,
                                 seq_lens, seq_lens_cpu, last_loc)  # fmt: skip

    def alloc_decode(
        self, seq_lens: Any, seq_lens_cpu: Sequence[int] | torch.Tensor, last_loc: Any
    ) -> Any:
        """SGLang's ``alloc_decode``: one slot per request, or None."""
        return self.impl.alloc_decode(
            as_index_tensor(seq_lens), as_index_tensor(seq_lens_cpu), as_index_tensor(last_loc)
        )


__all__ = ["SGLangAllocator", "as_index_tensor", "call_alloc_extend", "page_allocator_snapshot"]
