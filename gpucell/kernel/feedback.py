"""The kernel's end of a run's ``/dev/shm`` feedback channel: the paces trials
publish at their budget, the verdict they wait for, and the hand-back flag
(the engines' end is :mod:`gpucell.protocol.shm`'s readers in the chunk runner).
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterable
from typing import Any

from gpucell.core.run_events import PaceHeard
from gpucell.core.schedule_fields import Chunk
from gpucell.protocol import shm

__all__ = ["Feedback"]


class Feedback:
    """One run's files in the channel (``channel`` None: engines elsewhere)."""

    def __init__(self, channel: Any, cell: str) -> None:
        self.channel = channel
        self.cell = cell
        self.verdict_file: str | None = None

    def paces(self, trials: Iterable[Chunk]) -> list[PaceHeard]:
        """What running trials published (the unpublished are skipped)."""
        heard = []
        for c in trials:
            assert c.engine is not None
            raw = shm.peek(shm.pace_path(self.channel, self.cell, c.engine, c.start))
            if raw is None or len(raw) != shm.PACE.size:
                continue
            done, seconds, stamped = shm.PACE.unpack(raw)
            heard.append(PaceHeard(c.id, done, seconds, bool(stamped)))
        return heard

    def say_verdict(self, uniform: bool) -> bool:
        """``1`` run whole, ``0`` stop and send the rest back; False when the
        file could not be written (trials then stop as usual)."""
        path = shm.verdict_path(self.channel, self.cell)
        if shm.put(path, b"1" if uniform else b"0"):
            self.verdict_file = path
            return True
        return False

    def hand_back(self, threshold: float | None) -> None:
        """Raise the flag at ``threshold`` seconds of rest, or lower it."""
        path = shm.hand_back_path(self.channel, self.cell)
        if threshold is not None:
            shm.put(path, shm.HAND_BACK.pack(threshold))
        else:
            with contextlib.suppress(OSError):
                os.unlink(path)

    def forget(self, trials: Iterable[Chunk]) -> None:
        """The verdict, the flag and the paces go with the run."""
        if self.channel is None:
            return
        paths = [
            shm.pace_path(self.channel, self.cell, c.engine, c.start)
            for c in trials
            if c.engine is not None
        ]
        paths.append(shm.verdict_path(self.channel, self.cell))
        paths.append(shm.hand_back_path(self.channel, self.cell))
        for path in paths:
            with contextlib.suppress(OSError):
                os.unlink(path)
