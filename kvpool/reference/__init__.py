"""The executable specification, in pure Python (never imports torch).

Readable first, then correct; speed is not its job. Every index it returns is deterministic, so
the optimized twin can be compared with it exactly.
"""
