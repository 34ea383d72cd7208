"""The value an iteration's ``del D[k]`` of its own key is recorded with.

The engine program records ``del balances[k]`` as a write of :data:`DELETED`
under ``k`` (the engine's copy is left as it was, as for every recorded
write); the merge deletes the key where it meets it, in iteration order.  It
pickles by name, so the kernel gets this very object back.
"""

from __future__ import annotations

__all__ = ["DELETED"]


class _Deleted:
    """One object: compared by identity."""

    def __repr__(self) -> str:
        return "<deleted>"

    def __reduce__(self) -> str:
        return "DELETED"


DELETED = _Deleted()
