"""A tiny fake SGLang source tree for the loader's always-run tests (no SGLang needed).

Its modules import heavy packages that do not exist here, use stubbed helpers as decorators,
bases and context managers, and define a helper inside a module whose top level must never run.
"""

from __future__ import annotations

import textwrap
from pathlib import Path

FILES = {
    "sglang/__init__.py": "raise RuntimeError('the real package __init__ must never run')\n",
    "sglang/_version.py": "__version__ = version = '0.5.16'\n",
    "sglang/srt/__init__.py": "",
    "sglang/srt/mem_cache/__init__.py": "",
    "sglang/srt/mem_cache/thing.py": """
        from __future__ import annotations

        import abc
        import time

        import flashinfer_does_not_exist
        import sglang.srt.other_heavy
        from sglang.srt.environ import envs
        from sglang.srt.layers.base import LayerBase
        from sglang.srt.utils import cached, ceil_align, get_bool_env_var, is_hip

        _is_hip = is_hip()
        DEBUG = get_bool_env_var("SGLANG_DEBUG_MEMORY_POOL")
        FEATURE = envs.SGLANG_SOME_FEATURE.get()
        HEAVY = flashinfer_does_not_exist.kernel


        @cached
        def plain():
            return 41


        @cached(maxsize=4)
        def configured():
            return 42


        class Thing(LayerBase, abc.ABC):
            def __init__(self, n):
                self.n = n
                self.stamp = time.monotonic()

            def pages(self, page_size):
                return ceil_align(self.n, page_size) // page_size

            def with_region(self):
                with sglang.srt.other_heavy.region("kv"):
                    return self.n


        def lazy():
            from sglang.srt.mem_cache.thing import Thing as Again

            return Again
    """,
    "sglang/srt/utils/__init__.py": "from sglang.srt.utils.common import *\n",
    "sglang/srt/utils/common.py": """
        import math

        import vllm_does_not_exist

        raise RuntimeError("the rest of utils/common.py must never run")

        _UNIT = 1


        def _round_up(x, y):
            return math.ceil(x / y) * y * _UNIT


        def ceil_align(x, y):
            return _round_up(x, y)


        def unrelated():
            return vllm_does_not_exist.thing()
    """,
}


def make_fake_tree(root: Path, layout: str = "flat") -> Path:
    """Write the fake tree under ``root`` (``layout="checkout"``: under ``root/python``);
    returns the folder holding ``sglang/``."""
    base = root / "python" if layout == "checkout" else root
    for rel, text in FILES.items():
        path = base / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(textwrap.dedent(text).lstrip("\n"))
    return base
