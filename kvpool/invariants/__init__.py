"""Named invariants over plain snapshots (:mod:`kvpool.snapshot`); imports neither twin."""
