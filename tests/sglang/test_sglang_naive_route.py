"""``+naive`` reaches every extend of SGLang 0.5.16's paged
allocators, SGLang's own callers included.

0.5.16's ``PagedTokenToKVPoolAllocator`` has no ``use_triton_kernels`` switch: kvpool's adapter
routes its ``alloc_extend`` to ``alloc_extend_naive``
(:func:`kvpool.sglang.kernels.route_naive_extend`).
The scheduler glue (``alloc_for_extend``) and the SWA allocator call SGLang's object, not the
adapter, so the route has to sit on the object: before it did, a ``--sglang 0.5.16 --naive``
lifecycle campaign still launched most extends as Triton kernels through the interpreter, and
every extend of the SWA lifecycle. Launches are counted at the kernel switches
(:class:`kvpool.sglang.kernels.KernelSwitch`); decode has no torch path in 0.5.16 and stays a
kernel either way. The campaigns are opt-in (``--run-sglang-wheel``)."""

from __future__ import annotations

from collections import Counter
from typing import Any

import pytest

from kvpool.sglang import implementation
from kvpool.sglang.kernels import KernelSwitch, route_naive_extend
from kvpool.testing.campaign import run_machine
from kvpool.testing.implementations import reference_implementation


def _launches(monkeypatch: pytest.MonkeyPatch) -> Counter[str]:
    """Counts ``naive-extend``, ``kernel-extend`` and ``kernel-decode`` launches from now on."""
    seen: Counter[str] = Counter()
    launch = KernelSwitch.__getitem__

    def counted(self: KernelSwitch, grid: Any) -> Any:
        routed = launch(self, grid)
        if self.naive is None:  # the decode switch: no torch path to take
            seen["kernel-decode"] += 1
        else:
            seen["naive-extend" if routed == self._naive_launch else "kernel-extend"] += 1
        return routed

    monkeypatch.setattr(KernelSwitch, "__getitem__", counted)
    return seen


@pytest.mark.sglang_wheel
@pytest.mark.parametrize("component", ["manager", "swa_manager", "swa_allocator"])
@pytest.mark.parametrize("naive", [False, True], ids=["triton-kernels", "naive"])
def test_naive_reaches_every_extend_of_0_5_16(
    monkeypatch: pytest.MonkeyPatch, component: str, naive: bool
) -> None:
    candidate = implementation("0.5.16", naive_extend=naive)
    seen = _launches(monkeypatch)
    result = run_machine(component, reference_implementation(), candidate, 3600.0, seed=5,
                         max_runs=12)  # fmt: skip
    assert result.failure is None, result.failure.report
    extends = seen["naive-extend"] + seen["kernel-extend"]
    assert extends > 10, dict(seen)  # paged configurations were drawn and extended
    assert seen["naive-extend" if naive else "kernel-extend"] == extends, dict(seen)
    assert seen["kernel-decode"] > 0, dict(seen)


def test_the_route_is_idempotent_and_keeps_the_result() -> None:
    """Routing twice wraps once, and the routed call returns what the method returns."""

    class Paged:
        def alloc_extend(self, *args: Any) -> tuple[Any, ...]:
            return args

    impl = Paged()
    route_naive_extend(impl)
    once = impl.alloc_extend
    route_naive_extend(impl)
    assert impl.alloc_extend is once
    assert impl.alloc_extend(1, 2) == (1, 2)
