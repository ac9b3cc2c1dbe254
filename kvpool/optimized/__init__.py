"""The optimized twin: the same components and public API as :mod:`kvpool.reference`, on torch
tensors on any device, built for the GPU (no host syncs on hot paths, vectorised work).
Mirrors the reference file by file. (Being built: see the optimized-twin issue.)
"""
