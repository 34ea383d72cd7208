"""The schedule's state: its chunks, its parameters and what it has measured.

:class:`gpucell.core.schedule.Schedule` is built in layers over this one, each
module one of its jobs: the pace model (:mod:`~gpucell.core.schedule_pace`),
cutting by cost (:mod:`~gpucell.core.schedule_cost`), chunk sizing and hand-backs
(:mod:`~gpucell.core.schedule_sizing`), and the transitions the dispatcher
drives (:mod:`~gpucell.core.schedule`).  Pure: no I/O, no clock.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field

from gpucell.core.states import (
    PENDING,
    RUNNING,
    ChunkState,
)

__all__ = ["Chunk", "ScheduleFields"]

#: iterations of a chunk lost with its engine are re-run one per chunk (so an
#: iteration that kills its engine is named when it kills a second one) when
#: the lost run is at most this long; longer ones re-run in ordinary chunks
ISOLATE_MAX = 256


#: loops of at most this many iterations whose trials find them uneven have
#: the rest scheduled by a provisional profile (see Schedule.complete's
#: ``costs``): rebuilt as each trial comes back, in O(n log n)
PROVISIONAL_MAX = 10_000

#: a chunk hands its rest back to idle engines only when the rest would take
#: longer than this many dispatch overheads (and HAND_BACK_MIN_SECONDS); its
#: pieces then last at least HAND_BACK_PIECE of them each
HAND_BACK_ROUND_TRIPS = 4
HAND_BACK_MIN_SECONDS = 0.005
HAND_BACK_PIECE = 2

#: a long loop's chunks last at least 1/PROGRESS_STEPS of an engine's part
PROGRESS_STEPS = 20

#: a run of free iterations is not cut so as to leave a rest of at most
#: 1/CRUMB of the chunk cut from it: estimates of what engines hold are rounded
#: (a chunk of 2,361,111 left 1 iteration behind, sent alone)
CRUMB = 64


@dataclass
class Chunk:
    """A contiguous run of iterations ``[start, stop)`` and its fate."""

    id: int
    start: int
    stop: int
    engine: int | None = None
    state: ChunkState = PENDING
    attempt: int = 0  # 0 the first time; +1 per re-run after a lost engine
    seconds: float = 0.0  # engine-measured compute time
    trial: bool = False  # run for a time budget only (see Schedule.trial)
    stoppable: bool = False  # may hand back its rest (see Schedule.stealing)

    @property
    def size(self) -> int:
        return self.stop - self.start


@dataclass
class _EngineStats:
    iterations: int = 0
    seconds: float = 0.0
    cost: float = 0.0  # the profile's seconds for the same iterations

    @property
    def per_iteration(self) -> float | None:
        if self.iterations == 0 or self.seconds <= 0:
            return None
        return self.seconds / self.iterations

    @property
    def per_cost(self) -> float | None:
        """Engine seconds per profile second: the engine's pace against the profile."""
        if self.cost <= 0 or self.seconds <= 0:
            return None
        return self.seconds / self.cost or None  # (None if it underflows)


@dataclass
class ScheduleFields:
    """Every field of a schedule (documented on
    :class:`~gpucell.core.schedule.Schedule`) and the queries every layer reads."""

    n: int
    engines: Sequence[int]
    mode: str = "guided"
    chunksize: int | None = None
    overhead: float = 0.003
    target_overhead: float = 0.05
    depth: int = 2
    factor: float = 2.0
    hint: float | None = None
    uniform: bool = False
    heterogeneous: bool = False
    profile: Sequence[float] | None = field(default=None, repr=False)
    trial: bool = False
    trial_seconds: float = 0.05
    heard: bool = False
    chunk_seconds: float = 1.0
    kept: Sequence[tuple[int, int]] = ()
    stealing: bool = False
    profiled: bool = field(default=False, init=False)
    # the profile is the trials' estimate (see the module docstring), not a
    # last run's
    provisional: bool = field(default=False, init=False)
    chunks: list[Chunk] = field(default_factory=list)
    _cursor: int = 0
    _free: list[tuple[int, int, int]] = field(
        default_factory=list
    )  # start, stop, attempt
    _stats: dict[int, _EngineStats] = field(default_factory=dict)
    _alive: list[int] = field(default_factory=list)
    _static: dict[int, list[tuple[int, int]]] = field(default_factory=dict)
    # kept as chunks change state, so the per-assignment queries below do not
    # rescan every chunk (dynamic schedules make tens of thousands of them)
    _running: dict[int, dict[int, Chunk]] = field(default_factory=dict)
    _trials: dict[int, Chunk] = field(default_factory=dict)  # trial chunks running
    _done: dict[int, list[float]] = field(default_factory=dict)  # [its, seconds]
    _max_pace: float = 0.0  # the slowest seconds per iteration of any done chunk
    _min_pace: float = math.inf  # the fastest trial chunk's
    _paced: int = 0  # done trial chunks with a pace
    # running trial chunk id -> the pace it published at its budget (the
    # dispatcher reads it off the engine while the trial runs on): counted
    # beside done trials' paces to judge early whether the loop is uniform
    _provisional: dict[int, float] = field(default_factory=dict)
    # start of a free run of iterations -> the seconds per iteration its trial
    # measured just before it (the trial stopped there): an estimate of its cost
    _rest_pace: dict[int, float] = field(default_factory=dict)
    _rest_owner: dict[int, int] = field(default_factory=dict)  # start -> engine
    # start of a free run a running chunk handed back for idle engines -> the
    # length of the whole rest it handed back (its pieces' measure)
    _handed_back: dict[int, int] = field(default_factory=dict)
    _kept_iterations: int = 0  # done by an earlier run (``kept``)
    # iterations to re-run on one engine first (an out-of-memory retry)
    _pinned: dict[int, list[tuple[int, int, int]]] = field(default_factory=dict)
    # profiled: cost prefix sums, iterations costliest first, which are assigned
    _prefix: list[float] = field(default_factory=list, repr=False)
    _order: list[int] = field(default_factory=list, repr=False)
    _taken: bytearray = field(default_factory=bytearray, repr=False)
    _seek: int = 0  # _order[:_seek] are all assigned
    # seconds of single iterations measured by stamped trials (for a
    # provisional profile); bumped on each change, and its value at the last
    # estimate
    _measured: dict[int, float] = field(default_factory=dict, repr=False)
    _measures: int = 0
    _estimated_at: int = 0
    _back: int = 0  # and so are _order[_back + 1:]

    def outstanding(self, engine: int) -> list[Chunk]:
        return list(self._running.get(engine, {}).values())

    def _remaining(self) -> int:
        pinned = sum(b - a for q in self._pinned.values() for a, b, _ in q)
        return (self.n - self._cursor) + sum(b - a for a, b, _ in self._free) + pinned

    def _has_unassigned(self, engine: int) -> bool:
        if self._free or self._cursor < self.n or self._pinned.get(engine):
            return True
        return bool(self._static.get(engine))

    def _new(
        self, start: int, stop: int, engine: int, attempt: int, trial: bool = False
    ) -> Chunk:
        c = Chunk(len(self.chunks), start, stop, engine, RUNNING, attempt, trial=trial)
        self.chunks.append(c)
        self._running[engine][c.id] = c
        if c.trial:
            self._trials[c.id] = c
        c.stoppable = self.stealing
        return c
