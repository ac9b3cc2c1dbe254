"""Opt-in (``--run-sglang-wheel``): kvpool's FlashMLA block table with a virtual-to-physical page
map against SGLang 0.5.23's own kernel, through the checked Triton interpreter on CPU.

0.5.23 builds the unified pool's FlashMLA block table with ``create_mla_kv_page_table_for_dcp``
(``HAS_V2P``); with one decode-context-parallel rank (``DCP_SIZE=1``) it is the plain block table
of this harness op. The kernel is read from the wheel, its decorator dropped, and launched the way
0.5.23's trtllm MLA backend launches it (4096-token blocks of pages). That kernel has no
``kv_start_idx``: a request's window start is applied by launching it once per request on a view
of the table starting at that column. Nothing from the wheel is stored here.
"""

from __future__ import annotations

import zipfile
from typing import Any

import pytest
import torch
import triton
import triton.language as tl

from kvpool.sglang.source import download_wheel
from kvpool.testing.kernel_harness.differential import check_kernel
from kvpool.testing.kernel_harness.interpreted import interpreted
from tests.kernels.test_sglang_wheel import _extract

pytestmark = pytest.mark.sglang_wheel
VERSION = "0.5.23"
PATH = "sglang/kernels/ops/attention/dcp_kernels.py"
NAME = "create_mla_kv_page_table_for_dcp"


@pytest.fixture(scope="module")
def kernel() -> Any:
    with zipfile.ZipFile(download_wheel(VERSION)) as zf:  # $KVPOOL_SGLANG_CACHE or pip download
        source = zf.read(PATH).decode()
    namespace: dict[str, Any] = {"triton": triton, "tl": tl}
    exec(compile(_extract(PATH, source, {NAME}), f"<sglang {VERSION} {PATH}>", "exec"), namespace)
    return interpreted(namespace[NAME])


def test_sglang_0_5_23_v2p_block_table_agrees(kernel: Any) -> None:
    def candidate(
        table: torch.Tensor,
        rows: torch.Tensor,
        lens: torch.Tensor,
        start: torch.Tensor | None,
        out: torch.Tensor,
        ps: int,
        v2p: torch.Tensor,
    ) -> None:
        per_block = 4096 // ps
        for b in range(rows.numel()):
            s = 0 if start is None else int(start[b])
            grid = (1, triton.cdiv(out.shape[1], per_block))
            kernel[grid](
                table[:, s:], rows[b : b + 1], lens[b : b + 1], out[b : b + 1], v2p,
                table.stride(0), out.stride(0), PHYSICAL_PAGE_SIZE=ps, DCP_SIZE=1, DCP_RANK=0,
                PAGES_PER_BLOCK=per_block, HAS_V2P=True,
            )  # fmt: skip

    report = check_kernel(
        candidate, "create_flashmla_kv_indices_v2p", max_examples=25, max_tokens=512,
        max_batch=6, checked=True,
    )  # fmt: skip
    print(f"\n=== SGLang {VERSION} {NAME} ===\n{report.render()}")
    assert report.passed, report.render()
    assert report.edges.get("freed v2p entry", 0) > 0
