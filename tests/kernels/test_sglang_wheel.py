"""Opt-in (``--run-sglang-wheel``): the kernel harness on SGLang's own Triton kernels, for each
release in :data:`SGLANG_VERSIONS`.

Takes SGLang's published wheel (``$KVPOOL_SGLANG_CACHE``, else ``~/.cache/kvpool/sglang``, else
``pip download --no-deps``), reads the source of its allocation and index kernels straight out of
the zip (wherever the release keeps them: 0.5.23 moved the index kernels from
``kernels/ops/kvcache/kv_indices.py`` to ``kernels/ops/attention/kv_indices.py``), extracts just
those ``@triton.jit`` functions (and the module constants they use) with ``ast``, runs them in a
namespace holding only ``triton`` and ``tl``, and checks each, wrapped with kvpool's kernel
signature and launched the way that release launches it, under the checked interpreter. Nothing
from the wheel is stored in this repository. Run with ``-s`` to see each verdict.

What 0.5.23 changed in the launches: the paged allocator checks capacity BEFORE launching
``alloc_extend_kernel`` / ``alloc_decode_kernel`` (0.5.16 launched first and checked after), and
the FlashInfer index kernel is launched by ``KVIndexTranslator.pack_read_stream`` on a
``(bs, num_token_blocks)`` grid with ``TOKEN_BLOCK_PARALLEL=num_token_blocks > 1``,
``ENTRY_PAGE_SIZE=1`` (a static pool's token table) and no ``token_mapping``, its table stride a
runtime argument. The kernels' bodies are otherwise 0.5.16's.
"""

from __future__ import annotations

import ast
import functools
import linecache
import zipfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import torch
import triton
import triton.language as tl

from kvpool.constants import SUPPORTED_PAGE_SIZES_TESTED
from kvpool.sglang.source import download_wheel
from kvpool.testing.kernel_harness.differential import KernelReport, check_kernel
from kvpool.testing.kernel_harness.interpreted import interpreted
from kvpool.testing.kernel_harness.interpreter import allow_access

pytestmark = pytest.mark.sglang_wheel
Tensor = torch.Tensor

SGLANG_VERSIONS = ("0.5.16", "0.5.23")
CACHE = Path(__file__).resolve().parents[2] / ".sglang-wheel"  # names extracted sources only
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


def _wheel(version: str) -> Path:
    return download_wheel(version)  # $KVPOOL_SGLANG_CACHE or ~/.cache/kvpool/sglang


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
            filename = str(
                CACHE / "extracted" / wheel.stem / path
            )  # never written: served from linecache
            linecache.cache[filename] = (len(code), None, code.splitlines(True), filename)
            namespace: dict[str, Any] = {"triton": triton, "tl": tl}
            exec(compile(code, filename, "exec"), namespace)
            kernels.update({k: namespace[k] for k in wanted})
    missing = set(KERNELS) - set(kernels)
    assert not missing, f"kernels not found in {wheel.name}: {sorted(missing)}"
    return kernels


@pytest.fixture(scope="module", params=SGLANG_VERSIONS)
def sgl(request: pytest.FixtureRequest) -> dict[str, Any]:
    version = str(request.param)
    kernels: dict[str, Any] = {
        n: interpreted(fn) for n, fn in _load_kernels(_wheel(version)).items()
    }
    kernels["version"] = version
    return kernels


def _checks_capacity_first(sgl: dict[str, Any]) -> bool:
    """0.5.23's ``PagedTokenToKVPoolAllocator`` refuses an allocation the free list cannot hold
    before launching its kernel; 0.5.16 launched first and checked after."""
    return str(sgl["version"]) != "0.5.16"


def _extend_fits(p: Tensor, s: Tensor, free: Tensor, ps: int) -> bool:
    """0.5.23's ``alloc_extend`` pre-launch check: the cheap bound, else the exact page count
    (``get_num_new_pages``); False is its ``return None`` (no launch)."""
    bound = int((s - p).sum()) // ps + p.numel() + 1
    if bound <= free.numel():
        return True
    new_pages = int(((s + ps - 1) // ps - (p + ps - 1) // ps).sum())
    return new_pages <= free.numel()


def _decode_fits(s: Tensor, free: Tensor, ps: int) -> bool:
    """0.5.23's ``alloc_decode`` pre-launch check (``get_num_new_pages(decode=True)``: the
    requests whose new token opens a page, ``seq_len % page_size == 1``)."""
    return int((s % ps == 1).sum()) <= free.numel()


def _candidates(sgl: dict[str, Any]) -> dict[str, Callable[..., Any]]:
    """SGLang's kernels behind kvpool's signatures, launched as ``sgl["version"]`` launches
    them."""
    first = _checks_capacity_first(sgl)

    def alloc_extend(p: Tensor, s: Tensor, loc: Tensor, free: Tensor, out: Tensor, ps: int) -> None:
        bs = p.numel()
        if first and not _extend_fits(p, s, free, ps):
            return  # refused before the launch; the output is discarded
        sgl["alloc_extend_kernel"][(bs,)](p, s, loc, free, out, triton.next_power_of_2(bs), ps)

    def alloc_decode(s: Tensor, loc: Tensor, free: Tensor, out: Tensor, ps: int) -> None:
        bs = s.numel()
        if first and not _decode_fits(s, free, ps):
            return
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
        table: Tensor,
        rows: Tensor,
        lens: Tensor,
        indptr: Tensor,
        start: Tensor | None,
        out: Tensor,
        blocks: int = 1,
    ) -> None:
        kernel = sgl["create_flashinfer_kv_indices_triton"]
        if sgl["version"] == "0.5.16":
            kernel[(rows.numel(),)](table, rows, lens, indptr, start, out, table.stride(0))
            return
        # 0.5.23: KVIndexTranslator.pack_read_stream on a static pool's token table
        kernel[(rows.numel(), blocks)](
            table, rows, lens, indptr, start, out, table.stride(0), ENTRY_PAGE_SIZE=1,
            TOKEN_BLOCK_PARALLEL=blocks > 1, token_mapping=None,
        )  # fmt: skip

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


def _verdict(sgl: dict[str, Any], report: KernelReport, label: str) -> None:
    print(f"\n=== SGLang {sgl['version']} {label} ===\n{report.render()}")
    assert report.examples > 0


OPS = (
    "alloc_extend",
    "alloc_decode",
    "write_req_to_token",
    "get_last_loc",
    "create_flashinfer_kv_indices",
    "create_flashmla_kv_indices",
)
ALLOC_OPS = ("alloc_extend", "alloc_decode")
PAGED_SIZES = tuple(ps for ps in SUPPORTED_PAGE_SIZES_TESTED if ps > 1)
"""The page sizes SGLang runs its paged allocator (the allocation kernels) at: page size 1 gets
``TokenToKVPoolAllocator`` (0.5.23's ``kv_cache_configurator``; there,
``get_num_new_pages(decode=True)`` counts ``seq_len % 1 == 1``, never true, so the paged
allocator's pre-launch check would not refuse)."""


def _check(sgl: dict[str, Any], op: str, **options: Any) -> KernelReport:
    if op in ALLOC_OPS and _checks_capacity_first(sgl):
        options.setdefault("page_sizes", PAGED_SIZES)
    return check_kernel(_candidates(sgl)[op], op, **(OPTIONS | options))


@pytest.mark.parametrize("op", OPS)
def test_sglang_kernel_runs_to_a_verdict(sgl: dict[str, Any], op: str) -> None:
    report = _check(sgl, op, shuffle_seeds=(0,))
    _verdict(sgl, report, op)
    if op in ALLOC_OPS and not _checks_capacity_first(sgl):
        return  # 0.5.16 launches before its capacity check: a short free list is read past
    assert report.passed, report.render()


def test_sglang_flashinfer_token_block_parallel_launch(sgl: dict[str, Any]) -> None:
    """0.5.23's spec-decode and long-context launches tile each request over several programs
    (``TOKEN_BLOCK_PARALLEL``, grid ``(bs, num_token_blocks)``; any count is correct)."""
    if sgl["version"] == "0.5.16":
        pytest.skip("0.5.16's create_flashinfer_kv_indices_triton has no TOKEN_BLOCK_PARALLEL")
    candidate = functools.partial(_candidates(sgl)["create_flashinfer_kv_indices"], blocks=3)
    report = check_kernel(
        candidate,
        "create_flashinfer_kv_indices",
        **(OPTIONS | {"shuffle_seeds": (0,), "max_tokens": 1600}),
    )
    _verdict(sgl, report, "create_flashinfer_kv_indices (TOKEN_BLOCK_PARALLEL, 3 blocks)")
    assert report.passed, report.render()


@pytest.mark.parametrize("op", ALLOC_OPS)
def test_sglang_alloc_kernels_with_strict_short_free_lists(sgl: dict[str, Any], op: str) -> None:
    report = _check(sgl, op, short_free_lists="strict")
    _verdict(sgl, report, f"{op} (strict short free lists)")
    if _checks_capacity_first(sgl):
        assert report.passed, report.render()  # refused before the launch: nothing read
    # 0.5.16 launches these kernels before checking capacity: the verdict shows what they read.
