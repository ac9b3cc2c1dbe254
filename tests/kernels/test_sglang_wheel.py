"""Opt-in (``--run-sglang-wheel``): the kernel harness on SGLang's own Triton kernels.

Downloads SGLang's published wheel (``pip download --no-deps``) into ``.sglang-wheel/`` (git
ignored), reads the source of its allocation and index kernels straight out of the zip, extracts
just those ``@triton.jit`` functions (and the module constants they use) with ``ast``, runs them
in a namespace holding only ``triton`` and ``tl``, and checks each, wrapped with kvpool's kernel
signature and launched the way SGLang launches it, under the checked interpreter. Nothing from
the wheel is stored in this repository. Run with ``-s`` to see each verdict.
"""

from __future__ import annotations

import ast
import linecache
import zipfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import torch
import triton
import triton.language as tl

from kvpool.sglang.source import download_wheel
from kvpool.testing.kernel_harness.differential import KernelReport, check_kernel
from kvpool.testing.kernel_harness.interpreter import allow_access, interpreted

pytestmark = pytest.mark.sglang_wheel
Tensor = torch.Tensor

SGLANG_VERSION = "0.5.16"
CACHE = Path(__file__).resolve().parents[2] / ".sglang-wheel"
KERNELS = (
    "alloc_extend_kernel",
    "alloc_decode_kernel",
    "write_req_to_token_pool_triton",
    "get_last_loc_kernel",
    "create_flashinfer_kv_indices_triton",
    "create_flashmla_kv_indices_triton",
)
_SKIP_PATHS = ("npu", "hardware_backend", "multimodal")
OPTIONS: dict[str, Any] = {"max_examples": 30, "max_tokens": 512, "max_batch": 8, "checked": True}


def _wheel() -> Path:
    return download_wheel(SGLANG_VERSION, CACHE)


def _extract(path: str, source: str, wanted: set[str]) -> str:
    """The functions of ``source`` named in ``wanted`` (decorators dropped) preceded by the
    module-level assignments they reach, as one source text."""
    tree = ast.parse(source)
    consts = {
        t.id: node
        for node in tree.body
        if isinstance(node, ast.Assign)
        for t in node.targets
        if isinstance(t, ast.Name)
    }
    funcs = [n for n in tree.body if isinstance(n, ast.FunctionDef) and n.name in wanted]
    needed: list[ast.Assign] = []
    todo = [n.id for f in funcs for n in ast.walk(f) if isinstance(n, ast.Name)]
    while todo:
        name = todo.pop()
        node = consts.get(name)
        if node is not None and node not in needed:
            needed.append(node)
            todo += [n.id for n in ast.walk(node.value) if isinstance(n, ast.Name)]
    parts = [
        ast.get_source_segment(source, n) or "" for n in sorted(needed, key=lambda n: n.lineno)
    ]
    parts += [ast.get_source_segment(source, f) or "" for f in funcs]
    return "\n\n".join(parts) + "\n"


def _load_kernels(wheel: Path) -> dict[str, Callable[..., Any]]:
    """Kernel name -> plain function, exec'd from the wheel's source."""
    kernels: dict[str, Callable[..., Any]] = {}
    with zipfile.ZipFile(wheel) as zf:
        for path in sorted(zf.namelist()):
            if not path.endswith(".py") or any(s in path for s in _SKIP_PATHS):
                continue
            text = zf.read(path).decode()
            wanted = {k for k in KERNELS if k not in kernels and f"def {k}(" in text}
            if not wanted:
                continue
            code = _extract(path, text, wanted)
            filename = str(CACHE / "extracted" / path)  # never written: served from linecache
            linecache.cache[filename] = (len(code), None, code.splitlines(True), filename)
            namespace: dict[str, Any] = {"triton": triton, "tl": tl}
            exec(compile(code, filename, "exec"), namespace)
            kernels.update({k: namespace[k] for k in wanted})
    missing = set(KERNELS) - set(kernels)
    assert not missing, f"kernels not found in {wheel.name}: {sorted(missing)}"
    return kernels


@pytest.fixture(scope="module")
def sgl() -> dict[str, Any]:
    return {name: interpreted(fn) for name, fn in _load_kernels(_wheel()).items()}


def _candidates(sgl: dict[str, Any]) -> dict[str, Callable[..., Any]]:
    """SGLang's kernels behind kvpool's signatures, launched as SGLang 0.5.16 launches them."""

    def alloc_extend(p: Tensor, s: Tensor, loc: Tensor, free: Tensor, out: Tensor, ps: int) -> None:
        bs = p.numel()
        sgl["alloc_extend_kernel"][(bs,)](p, s, loc, free, out, triton.next_power_of_2(bs), ps)

    def alloc_decode(s: Tensor, loc: Tensor, free: Tensor, out: Tensor, ps: int) -> None:
        bs = s.numel()
        sgl["alloc_decode_kernel"][(bs,)](s, loc, free, out, triton.next_power_of_2(bs), ps)

    def write_req_to_token(
        table: Tensor, rows: Tensor, prefix: Tensor, p: Tensor, s: Tensor, new: Tensor
    ) -> None:
        starts = torch.cumsum(p, 0) - p
        pointers = torch.tensor(
            [
                prefix[a:].data_ptr() if n else 0
                for a, n in zip(starts.tolist(), p.tolist(), strict=True)
            ],
            dtype=torch.uint64,
        )
        with allow_access(prefix):  # reached through the pointer table, as on the GPU
            sgl["write_req_to_token_pool_triton"][(rows.numel(),)](
                table, rows, pointers, p, s, s - p, new, table.stride(0)
            )

    def get_last_loc(table: Tensor, rows: Tensor, p: Tensor) -> Tensor:
        result = torch.empty_like(p)
        grid = (triton.cdiv(p.numel(), 256),)
        sgl["get_last_loc_kernel"][grid](table, rows, p, result, p.numel(), table.stride(0), 256)
        return result

    def flashinfer(
        table: Tensor, rows: Tensor, lens: Tensor, indptr: Tensor, start: Tensor | None, out: Tensor
    ) -> None:
        kernel = sgl["create_flashinfer_kv_indices_triton"]
        kernel[(rows.numel(),)](table, rows, lens, indptr, start, out, table.stride(0))

    def flashmla(
        table: Tensor, rows: Tensor, lens: Tensor, start: Tensor | None, out: Tensor, ps: int
    ) -> None:
        blocks = triton.cdiv(out.shape[1], 4096 // ps)  # SGLang: pages per 4096-token block
        kernel = sgl["create_flashmla_kv_indices_triton"]
        kernel[(rows.numel(), blocks)](
            table, rows, lens, start, out, table.stride(0), out.stride(0), PAGED_SIZE=ps
        )

    return {
        "alloc_extend": alloc_extend,
        "alloc_decode": alloc_decode,
        "write_req_to_token": write_req_to_token,
        "get_last_loc": get_last_loc,
        "create_flashinfer_kv_indices": flashinfer,
        "create_flashmla_kv_indices": flashmla,
    }


def _verdict(report: KernelReport, label: str) -> None:
    print(f"\n=== SGLang {SGLANG_VERSION} {label} ===\n{report.render()}")
    assert report.examples > 0


@pytest.mark.parametrize(
    "op",
    [
        "alloc_extend",
        "alloc_decode",
        "write_req_to_token",
        "get_last_loc",
        "create_flashinfer_kv_indices",
        "create_flashmla_kv_indices",
    ],
)
def test_sglang_kernel_runs_to_a_verdict(sgl: dict[str, Any], op: str) -> None:
    report = check_kernel(_candidates(sgl)[op], op, shuffle_seeds=(0,), **OPTIONS)
    _verdict(report, op)


@pytest.mark.parametrize("op", ["alloc_extend", "alloc_decode"])
def test_sglang_alloc_kernels_with_strict_short_free_lists(sgl: dict[str, Any], op: str) -> None:
    # 0.5.16 launches these kernels before checking capacity: see what they read then.
    report = check_kernel(_candidates(sgl)[op], op, short_free_lists="strict", **OPTIONS)
    _verdict(report, f"{op} (strict short free lists)")
