"""The metadata contract of every public kernel function (:mod:`kvpool.kernels.checks`).

For each public function of :mod:`kvpool.kernels` and each backend that runs on a CPU, a valid
call is built and hypothesis replaces ONE argument by a bad one: a wrong number of dimensions,
a float / bool / int16 dtype, a wrong length of a per-request array or of a host copy, an output
too short or strided, an empty batch with non-empty token arrays (or a non-empty batch with an
empty table), a tensor on the ``meta`` device. The call must raise the contract's
:class:`~kvpool.errors.KVPoolError` subclass naming the argument, and leave every output as it
was. The unmutated call is run too (every backend), so a refusal is the mutation's doing.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

import kvpool.kernels as kernels
from kvpool.errors import InvalidArgumentError, KernelError, KVPoolError
from kvpool.kernels import available_backends

CPU_BACKENDS = [b for b in ("torch", "python", "interpret") if b in available_backends()]
PS = 4  # page size of every built call (tokens)
Args = dict[str, Any]
Mutation = tuple[str, str, Args, type[KVPoolError]]
"""(label, the argument it names, the replaced arguments, the error expected)."""


def _i64(values: list[int]) -> torch.Tensor:
    return torch.tensor(values, dtype=torch.int64)


def _table(rows: int, cols: int) -> torch.Tensor:
    """A request table (int32) whose cells hold slots ``10 + row * cols + col``."""
    return (10 + torch.arange(rows * cols, dtype=torch.int32)).reshape(rows, cols)


def _exclusive_ends(lens: list[int]) -> list[int]:
    ends = [0]
    for n in lens:
        ends.append(ends[-1] + n)
    return ends


# --------------------------------------------------------------------------- valid calls
# Each builder returns a valid call for a batch of ``bs`` requests (every backend runs it);
# ``flag`` toggles the optional operands (host copies, kv_start_idx, v2p).


def _alloc_extend(bs: int, flag: bool) -> Args:
    prefix = [2 * (i % 2) for i in range(bs)]  # 0 or 2 tokens (mid-page prefix)
    seq = [p + 3 for p in prefix]
    last = [-1 if p == 0 else PS * (10 + i) + 1 for i, p in enumerate(prefix)]
    args: Args = {
        "prefix_lens": _i64(prefix),
        "seq_lens": _i64(seq),
        "last_loc": _i64(last),
        "free_pages": _i64(list(range(100, 100 + bs))),  # one new page per request
        "out_indices": torch.full((3 * bs,), -7, dtype=torch.int64),
        "page_size": PS,
    }
    if flag:
        args["prefix_lens_cpu"] = list(prefix)
        args["seq_lens_cpu"] = _i64(seq)
    return args


def _alloc_decode(bs: int, flag: bool) -> Args:
    seq = [1 + i % PS for i in range(bs)]  # S == 1 opens a page
    last = [PS * (10 + i) + s - 2 for i, s in enumerate(seq)]
    args: Args = {
        "seq_lens": _i64(seq),
        "last_loc": _i64(last),
        "free_pages": _i64(list(range(100, 100 + bs))),
        "out_indices": torch.full((bs,), -7, dtype=torch.int64),
        "page_size": PS,
    }
    if flag:
        args["seq_lens_cpu"] = list(seq)
    return args


def _write_req_to_token(bs: int, flag: bool) -> Args:
    prefix = [i % 3 for i in range(bs)]
    seq = [p + 2 for p in prefix]
    return {
        "req_to_token": torch.zeros(bs + 2, 8, dtype=torch.int32),
        "req_pool_indices": _i64(list(range(1, bs + 1))),
        "prefix_slots": _i64(list(range(10, 10 + sum(prefix)))),
        "prefix_lens": _i64(prefix),
        "seq_lens": _i64(seq),
        "out_cache_loc": _i64(list(range(100, 100 + 2 * bs))),
    }


def _get_last_loc(bs: int, flag: bool) -> Args:
    return {
        "req_to_token": _table(bs + 2, 8),
        "req_pool_indices": _i64(list(range(1, bs + 1))),
        "prefix_lens": _i64([i % 5 for i in range(bs)]),
    }


def _flashinfer(bs: int, flag: bool) -> Args:
    lens = [1 + i % 4 for i in range(bs)]
    return {
        "req_to_token": _table(bs + 2, 8),
        "req_pool_indices": _i64(list(range(1, bs + 1))),
        "page_kernel_lens": _i64(lens),
        "kv_indptr": _i64(_exclusive_ends(lens)),
        "kv_start_idx": _i64([i % 2 for i in range(bs)]) if flag else None,
        "kv_indices": torch.full((sum(lens) + 2,), -7, dtype=torch.int32),
    }


def _flashmla(bs: int, flag: bool, v2p: bool = False) -> Args:
    args: Args = {
        "req_to_token": _table(bs + 2, 16),  # slots < 10 + 16 * (bs + 2)
        "req_pool_indices": _i64(list(range(1, bs + 1))),
        "page_kernel_lens": _i64([i % 9 for i in range(bs)]),
        "kv_start_idx": _i64([PS * (i % 2) for i in range(bs)]) if flag else None,
        "kv_indices": torch.full((bs + 1, 4), -7, dtype=torch.int32),
        "page_size": PS,
    }
    if v2p or flag:
        pages = (10 + 16 * (bs + 2)) // PS + 1
        args["v2p"] = torch.arange(pages, dtype=torch.int64)
    return args


# --------------------------------------------------------------------------- the contracts


@dataclass(frozen=True)
class Contract:
    """How to call one public kernel function and which of its arguments are related."""

    build: Callable[[int, bool], Args]
    outputs: tuple[str, ...]
    per_request: tuple[str, ...]  # 1-D tensors of exactly bs entries
    host_copies: tuple[str, ...] = ()
    per_token: tuple[str, ...] = ()  # flat token arrays: empty for an empty batch
    table: str | None = None  # the request table: rows for a non-empty batch
    output_dtype: torch.dtype | None = None  # the one output dtype, when int32 is refused


CONTRACTS: dict[str, Contract] = {
    "alloc_extend": Contract(
        _alloc_extend,
        ("out_indices",),
        ("prefix_lens", "seq_lens", "last_loc"),
        ("prefix_lens_cpu", "seq_lens_cpu"),
        ("out_indices",),
        output_dtype=torch.int64,
    ),
    "alloc_decode": Contract(
        _alloc_decode,
        ("out_indices",),
        ("seq_lens", "last_loc", "out_indices"),
        ("seq_lens_cpu",),
        output_dtype=torch.int64,
    ),
    "write_req_to_token": Contract(
        _write_req_to_token,
        ("req_to_token",),
        ("req_pool_indices", "prefix_lens", "seq_lens"),
        per_token=("prefix_slots", "out_cache_loc"),
        table="req_to_token",
    ),
    "get_last_loc": Contract(
        _get_last_loc, (), ("req_pool_indices", "prefix_lens"), table="req_to_token"
    ),
    "create_flashinfer_kv_indices": Contract(
        _flashinfer,
        ("kv_indices",),
        ("req_pool_indices", "page_kernel_lens", "kv_start_idx"),
        table="req_to_token",
    ),
    "create_flashmla_kv_indices": Contract(
        _flashmla,
        ("kv_indices",),
        ("req_pool_indices", "page_kernel_lens", "kv_start_idx"),
        table="req_to_token",
    ),
    "create_flashmla_kv_indices_v2p": Contract(
        lambda bs, flag: _flashmla(bs, flag, v2p=True),
        ("kv_indices",),
        ("req_pool_indices", "page_kernel_lens", "kv_start_idx"),
        table="req_to_token",
    ),
}

NOT_KERNELS = {
    "BACKENDS",
    "KERNEL_FUNCTIONS",
    "available_backends",
    "register_kernel_backend",
    "resolve_backend",
    "unregister_kernel_backend",
}
"""Public names of kvpool.kernels that are not kernel functions (backend plumbing)."""


def test_every_public_kernel_function_has_a_contract() -> None:
    public = set(kernels.__all__)
    missing = public - NOT_KERNELS - set(CONTRACTS)
    assert not missing, f"public kernel functions without contract coverage: {sorted(missing)}"
    assert set(kernels.KERNEL_FUNCTIONS) <= set(CONTRACTS)
    assert set(CONTRACTS) <= public
    for name in NOT_KERNELS & public:  # plumbing takes no kernel arguments
        assert name not in kernels.KERNEL_FUNCTIONS


# --------------------------------------------------------------------------- bad arguments


def _longer(t: torch.Tensor) -> torch.Tensor:
    return torch.cat((t, torch.zeros(1, dtype=t.dtype)))


def mutations(c: Contract, args: Args, bs: int) -> list[Mutation]:
    """Every single-argument breakage of the valid call ``args`` (a batch of ``bs``)."""
    found: list[Mutation] = []
    for name, v in args.items():
        if name in c.host_copies:
            as_list = v.tolist() if isinstance(v, torch.Tensor) else list(v)
            found.append((f"{name} one longer", name, {name: [*as_list, 1]}, InvalidArgumentError))
            found.append(
                (f"{name} as 2-D", name, {name: _i64(as_list)[None]}, InvalidArgumentError)
            )
            found.append(
                (f"{name} on meta", name, {name: _i64(as_list).to("meta")}, InvalidArgumentError)
            )
            if bs:
                found.append(
                    (f"{name} one shorter", name, {name: as_list[:-1]}, InvalidArgumentError)
                )
            continue
        if not isinstance(v, torch.Tensor):
            continue
        wrong_dim = v.reshape(-1) if v.dim() == 2 else v.reshape(1, -1)
        found.append((f"{name} of shape {tuple(wrong_dim.shape)}", name, {name: wrong_dim},
                      InvalidArgumentError))  # fmt: skip
        found.append((f"{name} 3-D" if v.dim() == 2 else f"{name} 0-D", name,
                      {name: v[None] if v.dim() == 2 else torch.tensor(1, dtype=v.dtype)},
                      InvalidArgumentError))  # fmt: skip
        for dtype in (torch.float32, torch.float64, torch.bool, torch.int16):
            found.append((f"{name} as {dtype}", name, {name: v.to(dtype)}, InvalidArgumentError))
        found.append((f"{name} on meta", name, {name: v.to("meta")}, KernelError))
        if name in c.per_request:
            found.append((f"{name} one longer", name, {name: _longer(v)}, InvalidArgumentError))
            if bs:
                found.append((f"{name} one shorter", name, {name: v[:-1]}, InvalidArgumentError))
    for name in c.outputs:
        out = args[name]
        if out.dim() == 1 and out.numel() > 1:
            strided = torch.empty(2 * out.numel(), dtype=out.dtype)[::2]
            found.append((f"{name} strided", name, {name: strided}, InvalidArgumentError))
        if out.dim() == 2 and out.shape[0] > 1 and out.shape[1] > 1:
            found.append((f"{name} transposed", name, {name: out.t()}, InvalidArgumentError))
        if c.output_dtype is not None:
            found.append((f"{name} int32", name, {name: out.to(torch.int32)}, InvalidArgumentError))
    if bs == 0:  # an empty batch: token arrays must be empty too
        for name in c.per_token:
            found.append(
                (f"{name} non-empty, empty batch", name, {name: _longer(args[name])},
                 InvalidArgumentError)
            )  # fmt: skip
    elif c.table is not None:  # a non-empty batch needs table rows
        empty = args[c.table][:0]
        found.append((f"{c.table} with no rows", c.table, {c.table: empty}, InvalidArgumentError))
    if "kv_indptr" in args:
        short = args["kv_indptr"][:-1]
        found.append(("kv_indptr of bs entries", "kv_indptr", {"kv_indptr": short},
                      InvalidArgumentError))  # fmt: skip
    if "kv_indices" in args and args["kv_indices"].dim() == 2 and bs:
        rows = args["kv_indices"][: bs - 1]
        found.append((f"kv_indices of {bs - 1} rows", "kv_indices", {"kv_indices": rows},
                      InvalidArgumentError))  # fmt: skip
    return found


def _call(name: str, args: Args, backend: str) -> object:
    fn: Callable[..., object] = getattr(kernels, name)
    return fn(**args, backend=backend)


@pytest.mark.parametrize("backend", CPU_BACKENDS)
@pytest.mark.parametrize("name", sorted(CONTRACTS))
@given(data=st.data(), bs=st.sampled_from([0, 1, 2, 5]), flag=st.booleans())
def test_one_bad_argument_is_refused_before_anything_is_written(
    name: str, backend: str, data: st.DataObject, bs: int, flag: bool
) -> None:
    c = CONTRACTS[name]
    args = c.build(bs, flag)
    label, arg, replaced, error = data.draw(st.sampled_from(mutations(c, args, bs)), "mutation")
    before = {out: args[out].clone() for out in c.outputs}
    with pytest.raises(KVPoolError) as raised:
        _call(name, {**args, **replaced}, backend)
    assert isinstance(raised.value, error), (label, raised.value)
    assert arg in str(raised.value), (label, str(raised.value))
    for out, saved in before.items():
        assert torch.equal(args[out], saved), f"{label}: {out} was written"


def _results(c: Contract, args: Args, got: object) -> list[list[int]]:
    """What a call produced: its outputs, or its returned tensor (get_last_loc)."""
    if isinstance(got, torch.Tensor):
        return [got.tolist()]
    return [args[out].reshape(-1).tolist() for out in c.outputs]


@pytest.mark.parametrize("backend", CPU_BACKENDS)
@pytest.mark.parametrize("name", sorted(CONTRACTS))
@pytest.mark.parametrize("bs", [0, 1, 5])
def test_the_unmutated_calls_are_accepted(name: str, backend: str, bs: int) -> None:
    """The control: each built call runs on every backend, with and without its optional
    operands, and writes what the pure reference (``python``) writes; with 5 requests it writes
    something. So every refusal above is its mutation's doing."""
    c = CONTRACTS[name]
    for flag in (False, True):
        initial = c.build(bs, flag)
        ref_args, args = c.build(bs, flag), c.build(bs, flag)
        expected = _results(c, ref_args, _call(name, ref_args, "python"))
        got = _results(c, args, _call(name, args, backend))
        assert got == expected, (name, backend, bs, flag)
        if bs == 5:
            assert got != _results(c, initial, None) or not c.outputs, (name, flag)


def test_strided_inputs_are_read_as_their_values() -> None:
    """Inputs may be strided views (the Triton launches copy them dense first): a strided
    ``seq_lens`` gives the same slots as its contiguous copy, on every CPU backend."""
    full = _i64([3, 5] * 4)
    seq = full[::2]  # [3, 3, 3, 3]: no request opens a page
    last = _i64([9, 13, 17, 21])
    for backend in CPU_BACKENDS:
        out = torch.full((4,), -7, dtype=torch.int64)
        kernels.alloc_decode(seq, last, _i64([50]), out, PS, backend=backend)
        assert out.tolist() == [10, 14, 18, 22], backend


@pytest.mark.parametrize("name", sorted(CONTRACTS))
def test_every_tensor_on_meta_is_refused(name: str) -> None:
    """All tensors on ``meta`` agree on a device but hold no data: KernelError, on the default
    backend choice too."""
    c = CONTRACTS[name]
    args = c.build(2, False)
    on_meta = {k: v.to("meta") if isinstance(v, torch.Tensor) else v for k, v in args.items()}
    fn: Callable[..., object] = getattr(kernels, name)
    with pytest.raises(KernelError, match="meta"):
        fn(**on_meta)
