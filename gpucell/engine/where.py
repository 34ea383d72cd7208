"""Which iteration of a chunk runs now, and how many have started: read by the
output tags, the error report and the chunk's timing while the chunk runs.

Standard library only.
"""

from __future__ import annotations

from typing import Any

__all__ = ["Where"]


class Where:
    """Which iteration of a chunk runs now, and how many have started.

    A stamped program records each iteration's start (``stamps``: the last key
    is the iteration running).  The unstamped one records nothing: the items'
    iterator says how far it got (``__length_hint__`` of a range, list or tuple
    iterator), so a print is still tagged and an error still names its iteration.
    """

    __slots__ = ("_it", "_n", "namespace", "stamps", "start")

    def __init__(self, stamps: dict[int, float], start: int) -> None:
        self.stamps = stamps
        self.start = start
        self._it: Any = None
        self._n = 0
        # the namespace the chunk's code runs in (functions it makes have it
        # as their globals: see wire.dumps's cell_globals)
        self.namespace: dict[str, Any] | None = None

    def follow(self, it: Any, n: int) -> None:
        """Read the position off ``it``'s ``__length_hint__`` (items not taken
        yet) among ``n``: a range, list or tuple iterator, or _TimedBlocks."""
        self._it, self._n = it, n

    @property
    def unstamped(self) -> bool:
        return self._it is not None

    def done(self) -> int:
        """Iterations started (all of them once the chunk finished)."""
        if self._it is not None:
            return int(self._n - self._it.__length_hint__())
        return len(self.stamps)

    def current(self) -> int | None:
        """The iteration running (or that ran last); ``None`` before the first."""
        if self._it is not None:
            done = self.done()
            return self.start + done - 1 if done > 0 else None
        return next(reversed(self.stamps), None)
