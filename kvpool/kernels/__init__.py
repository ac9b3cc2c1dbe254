"""Triton kernels (alloc_extend, alloc_decode, FlashInfer and FlashMLA index builders, the
request-table writer, get_last_loc), each beside a torch fallback and a pure-Python reference with
the same contract. (Being built: see the kernels issue.)
"""
