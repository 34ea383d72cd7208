"""A running chunk's line to the kernel through the host's ``/dev/shm``
(engines on the kernel's host): a trial's pace out and the kernel's verdict
back, and the hand-back flag (see ``engine/chunk``'s ``_TrialEnd`` and
``_HandBack``, which read them through these objects).
"""

from __future__ import annotations

import time

from gpucell.protocol import shm

__all__ = ["feedback", "median_iteration"]


#: iterations' durations a chunk's median is taken over, at most
MEDIAN_SAMPLE = 4096


def median_iteration(stamps: dict[int, float], end: float) -> float | None:
    """The chunk's median iteration time (computed here, in parallel, rather
    than in the kernel): the schedule's speed estimate, which the first
    iteration's one-time costs (imports, warm-up) would otherwise skew."""
    if len(stamps) < 3:
        return None
    starts = [*stamps.values(), end]
    # a cheap loop's trial stamps 10^5 iterations or more: sorting all their
    # durations took 22 ms per chunk, the engine idle meanwhile; an evenly
    # spread sample of at most MEDIAN_SAMPLE of them gives the same median
    step = max(1, (len(starts) - 1) // MEDIAN_SAMPLE)
    durations = sorted(
        starts[i + 1] - starts[i] for i in range(0, len(starts) - 1, step)
    )
    return durations[len(durations) // 2]


class ShmVerdict:
    """A trial chunk's side of ``shm.pace_path`` and ``shm.verdict_path``: the
    pace it measured at its budget goes to the kernel, the kernel's verdict on
    the trials comes back (see ``chunk._TrialEnd``).  The pace published is
    the median iteration's, as a finished chunk reports it: the first
    iteration's one-time costs, or a moment the engine lost its core, would
    otherwise tell the kernel the loop is uneven when it is not."""

    __slots__ = ("_flag", "_pace", "_stamps")

    def __init__(
        self,
        ch: shm.Channel,
        cell: str,
        engine: int,
        start: int,
        stamps: dict[int, float],
    ):
        self._pace = shm.pace_path(ch, cell, engine, start)
        self._flag = shm.verdict_path(ch, cell)
        self._stamps = stamps

    def publish(self, done: int, seconds: float, stamped: bool) -> None:
        median = median_iteration(self._stamps, time.time()) if stamped else None
        if median is not None:
            seconds = median * done
        shm.put(self._pace, shm.PACE.pack(done, seconds, stamped))

    def poll(self) -> bool | None:
        said = shm.peek(self._flag)
        return None if said is None else said == b"1"


class ShmHandBack:
    """A chunk's side of ``shm.hand_back_path`` (see ``chunk._HandBack``): the
    threshold the kernel wrote while an engine idles with nothing to hand
    out, else ``None``."""

    __slots__ = ("_path", "stopped")

    def __init__(self, ch: shm.Channel, cell: str):
        self._path = shm.hand_back_path(ch, cell)
        self.stopped = False

    def threshold(self) -> float | None:
        raw = shm.peek(self._path)
        if raw is None or len(raw) != shm.HAND_BACK.size:
            return None
        return float(shm.HAND_BACK.unpack(raw)[0])


def feedback(
    results_to: shm.Channel | None,
    cell: str,
    engine_id: int,
    start: int,
    stamps: dict[int, float],
    budget: float | None,
    stoppable: bool,
) -> tuple[ShmVerdict | None, ShmHandBack | None]:
    """A chunk's line to the kernel through its /dev/shm (engines on the
    kernel's host): a trial's verdict, and the hand-back flag."""
    shared = (
        results_to if results_to is not None and shm.reachable(results_to) else None
    )
    if shared is None:
        return None, None
    verdict = None
    if budget is not None:
        verdict = ShmVerdict(shared, cell, engine_id, start, stamps)
    return verdict, ShmHandBack(shared, cell) if stoppable else None
