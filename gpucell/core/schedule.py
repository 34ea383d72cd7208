"""Which iterations go to which engine, and when (pure: no I/O, no clock).

The schedule is a small state machine the dispatcher drives: it asks for an engine's
next chunk, reports chunks done (with the engine's measured compute time) or lost
(engine died), and reads :attr:`Schedule.finished`.  Time is passed in, never read,
so the property tests can drive it with made-up speeds.

Modes
-----
guided (default)
    Guided self-scheduling: a chunk is a share of what is left, large first, small
    at the end, scaled by the engine's measured speed so a GPU beside a CPU engine
    (or mixed GPU models) finish together.
dynamic
    Fixed-size chunks handed out on demand (``chunksize``, or the calibrated
    minimum).
static
    One contiguous block per engine, decided up front.

In guided and dynamic modes no chunk is made smaller than the calibrated minimum:
the chunk size at which dispatch overhead is under ``target_overhead`` (5%) of the
chunk's compute time.

guided with a profile
    Given each iteration's seconds from the last run, chunks are cut by cost, not
    count: each is the guided share of the cost left, grown around the costliest
    iteration not yet assigned.  So chunks go out largest first (LPT), costly
    iterations early, and the loop ends on small chunks of cheap iterations
    wherever they sit in the range.  Cutting as engines ask, rather than all up
    front, keeps speed shares, re-runs of lost work and a logarithmic chunk count.
    No chunk holds more iterations than guided-by-count would give it, so a wrong
    profile (the loop changed since) costs about what having none does.

guided with a provisional profile
    A first run has no profile, but its trials (see ``trial``) measure the
    iterations they reach.  Once they find the loop uneven, the iterations not
    yet run are costed by linear interpolation, by index, between the nearest
    measured ones (flat beyond the last), and the rest is scheduled as a
    profiled loop; the estimate is redone as each trial comes back.  A loop
    whose costs rise along its range (the trials' rests each cheaper than the
    next trial's iterations, dearer than their own) is then cut by cost, its
    dearest iterations first, instead of by the pace of the trial before each
    rest.
"""

from __future__ import annotations

import math
from bisect import bisect_left, bisect_right
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from itertools import accumulate

from gpucell.core.states import (
    CANCELLED,
    DONE,
    FAILED,
    LOST,
    PENDING,
    RUNNING,
    ChunkState,
    move,
)

__all__ = ["Chunk", "Schedule", "missing_ranges"]


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
class Schedule:
    """Chunks of ``range(n)`` for a set of engines.

    Parameters
    ----------
    n
        Iterations in the loop.
    engines
        Engine ids that may receive work.
    mode
        ``"guided"``, ``"dynamic"`` or ``"static"``.
    chunksize
        Fixed chunk size (dynamic), or the minimum chunk size (guided).
    overhead
        Seconds one chunk costs in dispatch (round trip, serialisation); updated
        from measurements with :meth:`observe_overhead`.
    depth
        Chunks outstanding per engine: 2 keeps the next chunk queued on the engine
        so it never idles on a round trip.
    hint
        Seconds per iteration measured by an earlier run of the same cell: no
        calibration chunks are needed, and a loop whose whole work is a few
        dispatch overheads is split statically (one message per engine).
    uniform
        That earlier run found every iteration equally costly on every engine:
        guided then becomes static (one block per engine, no tail to balance).
    heterogeneous
        The engines' devices differ (a GPU beside a CPU engine, mixed GPU
        models): chunk sizes follow each engine's measured speed.  Between equal
        devices, measured differences are noise or the iterations' own varying
        costs, so work is shared equally.
    trial
        Guided calibration chunks are trials (:attr:`Chunk.trial`): an unmeasured
        engine gets its whole fair part, as two chunks sent together (the second
        queued behind the first, so the engine does not idle while the first
        one's result travels), which the dispatcher lets run for a short time
        budget each; the iterations it did not reach come back through
        ``complete(..., done=k)``.  A cheap loop then takes one round trip per
        engine instead of a calibration round first.  (For loops whose
        chunks cost little to send: the unreached part travels twice.)  Off for
        static, dynamic, fixed-``chunksize`` and profiled schedules: their chunks
        are what was asked for.
    heard
        Running trials hear the verdict (:attr:`verdict`) at their budget (the
        dispatcher reads the paces they publish and tells them: engines on the
        kernel's host): an unmeasured engine's part then goes out as one trial,
        not two.  A uniform loop's trial runs whole (one chunk per engine, as
        a re-run's static split); an uneven loop's stops at its budget and its
        rest is shared out by cost, the engine idle for one round trip.
    chunk_seconds
        A guided or dynamic chunk is cut to last at most about this long at its
        engine's measured pace (or a 1/``PROGRESS_STEPS`` share of an engine's
        part of a long loop): the progress shown, the work kept on an
        interrupt and what a lost engine costs stay fine-grained, at a few ms
        of dispatch per second of work.  (A uniform loop's rest went out as one
        chunk per engine: a 10 s cell showed 0, 5% and then 100%.)  Not for a
        fixed ``chunksize``, static or profiled schedules.
    kept
        ``(start, stop)`` ranges already done by an earlier, unfinished run of
        the same cell (``--resume``): only the other iterations are handed out,
        and they count as done.  A resumed schedule is guided or dynamic over
        what is missing (no static split, profile or trials).
    stealing
        Chunks this schedule chose (guided, or a static split chosen for a
        uniform loop; not a fixed ``chunksize`` or a mode asked for) may come
        back early with the rest handed back (``complete(..., handed_back=True)``):
        once an engine is idle with nothing left to hand out
        (:meth:`idle_engines`), the dispatcher asks running chunks whose
        unrun rest would take longer than :meth:`hand_back_seconds` to stop
        after their current iteration, and the rest is shared out among the
        engines.  A rare costly iteration, or an engine slower than its
        equals, then no longer holds its chunk's other iterations hostage
        while the other engines idle.
    profile
        Seconds of each iteration ``0..n-1`` in an earlier run of the same cell:
        guided chunks are then cut by cost and the costliest go out first (see
        the module docstring).  Ignored unless it has ``n`` finite values >= 0
        with a positive sum, and in static, dynamic or fixed-``chunksize``
        schedules; :attr:`profiled` says whether it is used.
    """

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

    def __post_init__(self) -> None:
        if self.mode not in ("guided", "dynamic", "static"):
            raise ValueError(f"unknown schedule {self.mode!r}")
        if self.chunksize is not None and self.chunksize < 1:
            raise ValueError("chunksize must be >= 1")
        if not self.engines:
            raise ValueError("a schedule needs at least one engine")
        self._alive = list(self.engines)
        self._running = {e: {} for e in self.engines}
        self._done = {e: [0, 0.0] for e in self.engines}
        if self.kept:  # resumed: no profile (its costs cover the whole loop)
            self.profile = None
        self._stats = {e: _EngineStats() for e in self.engines}
        pieces = False  # a static split chosen here (not asked for) goes in pieces
        if self.hint is not None and self.hint > 0 and not self.heterogeneous:
            # (different devices each need measuring: the hint is one pace)
            for st in self._stats.values():
                st.iterations, st.seconds = 1, self.hint
            cheap = self.n * self.hint <= 10 * self.overhead
            if self.mode == "guided" and (cheap or self.uniform):
                self.mode = "static"  # nothing to balance: send it all at once
                pieces = True
        if self.profile is not None and self.mode == "guided" and not self.chunksize:
            self._use_profile(self.profile)
        self.trial = (
            self.trial
            and self.mode == "guided"
            and not self.chunksize
            and not self.profiled
        )
        if self.kept:
            missing = missing_ranges(self.n, self.kept)
            self._kept_iterations = self.n - sum(b - a for a, b in missing)
            self._free = [(a, b, 0) for a, b in missing]
            self._cursor = self.n
            if self.mode == "static":
                self.mode = "guided"
            self.trial = False
        if self.mode == "static":
            k = len(self._alive)
            for i, e in enumerate(self._alive):
                lo, hi = i * self.n // k, (i + 1) * self.n // k
                self._static[e] = [(lo, hi)] if hi > lo else []
                if pieces and self.hint and hi > lo:
                    # chosen for a uniform loop, not asked for: each engine's
                    # block in pieces of about chunk_seconds, in order (the
                    # progress of a long re-run moves; queued two deep, the
                    # engine never waits between them)
                    parts = math.ceil((hi - lo) * self.hint / self._span(self.hint))
                    cuts = [lo + j * (hi - lo) // parts for j in range(parts + 1)]
                    self._static[e] = [
                        (a, b) for a, b in zip(cuts, cuts[1:], strict=False) if b > a
                    ]
            self._cursor = self.n
        self.stealing = (
            self.stealing and not self.chunksize and (self.mode == "guided" or pieces)
        )

    # -- queries ---------------------------------------------------------------

    @property
    def alive(self) -> list[int]:
        return list(self._alive)

    @property
    def finished(self) -> bool:
        """Every iteration is in a chunk that is done."""
        return self.done_iterations == self.n

    @property
    def done_iterations(self) -> int:
        """Iterations done, those kept from an earlier run included."""
        return self._kept_iterations + int(sum(d[0] for d in self._done.values()))

    def outstanding(self, engine: int) -> list[Chunk]:
        return list(self._running.get(engine, {}).values())

    def engine_progress(self, engine: int) -> tuple[int, float]:
        """Iterations ``engine`` finished, and their engine-measured seconds."""
        its, secs = self._done.get(engine, (0, 0.0))
        return int(its), float(secs)

    def slowest_pace(self) -> float | None:
        """The slowest seconds per iteration of any finished chunk (``None``:
        none finished yet)."""
        return self._max_pace or None

    def idle_engines(self) -> list[int]:
        """Live engines with no chunk outstanding and nothing left to hand
        them: what stopping a running chunk early would put to work."""
        return [
            e
            for e in self._alive
            if not self._running.get(e) and not self._has_unassigned(e)
        ]

    def hand_back_seconds(self) -> float:
        """A running chunk stops early for idle engines only when its unrun
        rest would take longer than this at its pace: ``HAND_BACK_ROUND_TRIPS``
        dispatch overheads, so that sharing it out gains more than the
        messages cost."""
        return max(HAND_BACK_MIN_SECONDS, HAND_BACK_ROUND_TRIPS * self.overhead)

    def pace(self, engine: int) -> float | None:
        """Measured seconds per iteration on ``engine`` (``None``: not yet)."""
        st = self._stats.get(engine)
        return None if st is None else st.per_iteration

    @property
    def looks_uniform(self) -> bool:
        """Trials spread over the range agree and the devices are equal: trial
        chunks still running may as well run whole (their rest would go back
        to the same engine)."""
        return self.trial and not self.heterogeneous and self._factor() == 1.0

    @property
    def verdict(self) -> bool | None:
        """What running trials are told: ``True`` the loop looks uniform (run
        whole), ``False`` enough trials measured it and it does not, or the
        devices differ (stop at the budget, the rest is shared out by cost),
        ``None`` not known yet."""
        if not self.trial:
            return None
        if self.looks_uniform:
            return True
        if self.heterogeneous or self._paced_count() >= min(len(self._alive), 3):
            return False
        return None

    def observe_trial(self, chunk_id: int, done: int, seconds: float) -> None:
        """A running trial chunk reached its budget after ``done`` iterations
        in ``seconds`` (a stamped measure) and runs on while the verdict is
        out: its pace counts until the chunk completes."""
        if not 0 <= chunk_id < len(self.chunks):
            return
        c = self.chunks[chunk_id]
        if c.state == RUNNING and c.trial and done > 0 and seconds > 0:
            self._provisional[c.id] = seconds / done
            if self._may_estimate():
                # its median iteration's pace, at the middle of what it ran
                # (the stamps of each iteration come when it completes)
                at = c.start + (done - 1) // 2
                if at not in self._measured:
                    self._measured[at] = seconds / done
                    self._measures += 1

    @property
    def takes_costs(self) -> bool:
        """:meth:`complete` would use a trial's ``costs`` (so the caller need
        not build a list of 10^5 seconds for a cheap loop's trial that it would
        not read)."""
        return self._may_estimate()

    def calibrating(self, engine: int) -> bool:
        """``engine``'s pace is not measured yet (its next chunk calibrates)."""
        return self._pace(engine) is None

    def _trial_for(self, engine: int) -> bool:
        return self.trial and self.calibrating(engine)

    def wants_work(self, engine: int) -> bool:
        """True when ``engine`` has fewer chunks outstanding than it should."""
        if engine not in self._alive or not self._has_unassigned(engine):
            return False
        trial = self._trial_for(engine)
        depth = self.depth if self._plenty_left() or (trial and not self.heard) else 1
        if trial and self.heard and self.outstanding(engine):
            return False  # its one trial is its whole part
        if any(c.attempt > 0 for c in self.outstanding(engine)):
            # a re-run of iterations whose engine died runs alone on its engine:
            # if this one dies too, the chunk that killed it is known
            return False
        if (
            self.trial
            and not self._trial_for(engine)
            and self._paced_count() < min(len(self._alive), 3)
            and self.outstanding(engine)
        ):
            # an engine busy with its second trial waits for enough trials to
            # tell whether the loop looks uniform before its rest is cut: cut by
            # guided shares first, a uniform loop's last pieces unbalance it
            return False
        if self._pace(engine) is None and not self._trial_for(engine):
            # one calibration chunk at a time: queueing a second before the first
            # is measured would commit work at a guessed size (and, for cheap
            # loops, cost a message more than it saves).  Trial chunks are the
            # exception: an engine's part goes out as two, both cut short by
            # time, so the second runs while the first's result travels
            depth = 1
        return len(self.outstanding(engine)) < depth

    def min_chunk(self, engine: int | None = None) -> int:
        """Smallest chunk that keeps dispatch overhead under the target.

        Per engine when it has been measured (a slow engine's chunks can be
        smaller), else from the mean over every engine.
        """
        if self.mode == "dynamic" and self.chunksize:
            return self.chunksize
        floor = self.chunksize or 1
        st = self._stats.get(engine) if engine is not None else None
        if st is not None and st.per_iteration:
            t = st.per_iteration
        else:
            its = sum(s.iterations for s in self._stats.values())
            secs = sum(s.seconds for s in self._stats.values())
            if its == 0 or secs <= 0:
                return floor
            t = secs / its
        if not self.heterogeneous:
            # Equal devices: a chunk that ran slower ran costlier iterations, and
            # the loop may have more of them (costs rising along the range).  The
            # floor comes from the costliest pace seen, or a cheap calibration
            # chunk at the start of such a loop would make every later chunk huge.
            t = max(t, self._max_pace)
        # rounded down: with the next chunk already queued the engine does not
        # wait for a round trip, so a tail of single iterations costs little
        # (a pace that underflowed to 0: iterations too cheap to measure)
        most = (
            self.n if t <= 0 else min(self.n, self.overhead / self.target_overhead / t)
        )
        return max(floor, int(most))

    # -- transitions -------------------------------------------------------------

    def next_chunk(self, engine: int) -> Chunk | None:
        """Assign ``engine`` its next chunk (or ``None`` if nothing is left)."""
        if engine not in self._alive:
            return None
        pinned = self._pinned.get(engine)
        if pinned:
            start, stop, attempt = pinned.pop(0)
            return self._new(start, stop, engine, attempt)
        if self.mode == "static":
            own = self._static.get(engine, [])
            if own:
                start, stop = own.pop(0)
                return self._new(start, stop, engine, 0)
        if self.profiled:
            return self._next_by_cost(engine)
        size = self._size_for(engine)
        trial = self._trial_for(engine)
        if self._free:
            j = self._pick_free(engine)
            start, stop, attempt = self._free.pop(j)
            pace = self._rest_pace.pop(start, None)
            owner = self._rest_owner.pop(start, None)
            handed_back = self._handed_back.pop(start, None)
            if attempt > 0 and stop - start <= ISOLATE_MAX:
                size = 1  # one iteration at a time: a second death names it
            elif handed_back is not None:
                # a rest handed back for idle engines: shared among them all,
                # in pieces worth a few dispatch overheads each
                size = self._hand_back_piece(engine, handed_back, pace)
            elif (
                pace is not None
                and not self.calibrating(engine)
                and self._factor() != 1.0
            ):
                # a guided share of the run, but never under the overhead floor:
                # shares of what is left shrink geometrically, and a tail of
                # single iterations costs a round trip each
                paced = self._size_at_pace(engine, pace, stop - start)
                size = min(size, max(paced, self.min_chunk(engine)))
            if 0 < stop - start - size <= size // CRUMB and attempt == 0:
                size = stop - start  # a crumb left behind would cost a round trip
            if stop - start > size:
                self._free.insert(j, (start + size, stop, attempt))
                if pace is not None:
                    self._rest_pace[start + size] = pace
                if owner is not None:
                    self._rest_owner[start + size] = owner
                if handed_back is not None:
                    self._handed_back[start + size] = handed_back
                stop = start + size
            return self._new(start, stop, engine, attempt, trial)
        if self._cursor >= self.n:
            return None
        start = self._cursor
        stop = min(self.n, start + size)
        self._cursor = stop
        return self._new(start, stop, engine, 0, trial)

    def fill(self) -> list[Chunk]:
        """Assign every engine the chunks it should have outstanding, round-robin
        (each engine's first chunk before anyone's second; in each round the
        engines holding fewest first, so an idle engine is never left waiting
        while a busy one queues the work), and return them."""
        self._estimate_rest()
        out: list[Chunk] = []
        progress = True
        while progress:
            progress = False
            order = sorted(self._alive, key=lambda e: len(self._running[e]))
            for e in order:
                if self.wants_work(e):
                    c = self.next_chunk(e)
                    if c is not None:
                        out.append(c)
                        progress = True
        return out

    def complete(
        self,
        chunk_id: int,
        seconds: float,
        done: int | None = None,
        stamped: bool = True,
        costs: Sequence[float] | None = None,
        handed_back: bool = False,
    ) -> None:
        """Record a chunk done, with its engine-measured compute time.

        ``done``: iterations the engine ran when it stopped a trial chunk early;
        the chunk shrinks to them and the rest goes back to be handed out first
        (ignored for other chunks: they always run whole).  ``stamped``: the
        chunk ran with a stamp per iteration (a cheap trial chunk may not:
        faster per iteration, so its pace is not compared with stamped ones'
        to judge whether the loop looks uniform).  ``costs``: the seconds of
        each iteration the chunk ran, in order, when stamped (a provisional
        profile is estimated from them: see the module docstring).
        ``handed_back``: a stoppable chunk stopped early for idle engines
        (see ``stealing``) after ``done`` iterations; its rest is shared out.
        """
        c = self.chunks[chunk_id]
        if c.state != RUNNING:
            return
        handed_back = handed_back and c.stoppable
        if (c.trial or handed_back) and done is not None and 0 < done < c.size:
            if handed_back:
                self._handed_back[c.start + done] = c.size - done
            self._free.append((c.start + done, c.stop, c.attempt))
            self._free.sort()
            if self.profiled:  # (a provisional profile: trials still ran)
                self._untake(c.start + done, c.stop)
            if seconds > 0:
                self._rest_pace[c.start + done] = seconds / done
            if c.engine is not None:
                self._rest_owner[c.start + done] = c.engine
            c.stop = c.start + done
        move(c, DONE)
        c.seconds = seconds
        if c.trial and costs is not None and self._may_estimate():
            self._keep_costs(c.start, c.size, costs)
        self._trials.pop(c.id, None)
        self._provisional.pop(c.id, None)
        if c.engine is not None:
            self._running[c.engine].pop(c.id, None)
            tally = self._done[c.engine]
            tally[0] += c.size
            tally[1] += seconds
        if c.size and seconds > 0:
            self._max_pace = max(self._max_pace, seconds / c.size)
            if c.trial and stamped:
                # the fastest pace is read off stamped trials only: other chunks
                # may run the program's unstamped variant, faster per iteration
                # for the same iterations (which is no sign of uneven costs)
                self._min_pace = min(self._min_pace, seconds / c.size)
                self._paced += 1
        if c.engine is not None and c.engine in self._stats:
            st = self._stats[c.engine]
            st.iterations += c.size
            st.seconds += seconds
            if self.profiled:
                st.cost += self._cost(c.start, c.stop)

    def end(self, chunk_id: int, state: ChunkState) -> Chunk:
        """A running chunk ends without a result: ``failed`` (an iteration raised)
        or ``cancelled`` (interrupt, timeout, another chunk's error).  Its
        iterations are not handed out again: the run is over."""
        if state not in (FAILED, CANCELLED):
            raise ValueError(f"end() takes failed or cancelled, not {state}")
        c = self.chunks[chunk_id]
        move(c, state)
        if c.engine is not None:
            self._running.get(c.engine, {}).pop(c.id, None)
        self._trials.pop(c.id, None)
        self._provisional.pop(c.id, None)
        return c

    def add_engine(self, engine: int) -> None:
        """A new engine (a restarted one) takes work from now on: what is left
        unassigned, and what dead engines left behind."""
        if engine in self._alive:
            return
        self._alive.append(engine)
        self._running.setdefault(engine, {})
        self._done.setdefault(engine, [0, 0.0])
        st = self._stats.setdefault(engine, _EngineStats())
        if self.hint is not None and self.hint > 0 and not self.heterogeneous:
            st.iterations, st.seconds = 1, self.hint

    def requeue(self, chunk_id: int, engine: int) -> Chunk:
        """A running chunk failed in a way worth one more try (its engine ran
        out of device memory): it ends ``failed`` and its iterations go to
        ``engine`` next (to any engine if that one is gone)."""
        c = self.end(chunk_id, FAILED)
        entry = (c.start, c.stop, c.attempt)
        if engine in self._alive:
            self._pinned.setdefault(engine, []).append(entry)
        else:
            self._free.append(entry)
            self._free.sort()
        return c

    def observe_overhead(self, seconds: float) -> None:
        """Update the per-chunk dispatch cost (round trip minus compute)."""
        if seconds > 0:
            self.overhead = 0.7 * self.overhead + 0.3 * seconds

    def lose_engine(self, engine: int) -> list[Chunk]:
        """``engine`` is gone: its unfinished chunks go back to the pool.

        Returns the lost chunks (for provenance and the retry limit).
        """
        if engine in self._alive:
            self._alive.remove(engine)
        lost = list(self._running.get(engine, {}).values())
        self._running[engine] = {}
        for c in lost:
            self._trials.pop(c.id, None)
            self._provisional.pop(c.id, None)
        for c in lost:
            move(c, LOST)
            self._free.append((c.start, c.stop, c.attempt + 1))
            if self.profiled:
                self._untake(c.start, c.stop)
        for start, stop in self._static.pop(engine, []):
            self._free.append((start, stop, 0))
        self._free.extend(self._pinned.pop(engine, []))
        self._free.sort()
        return lost

    def pending_ranges(self) -> list[tuple[int, int]]:
        """Iterations not yet done (for error messages about lost work)."""
        done = [(c.start, c.stop) for c in self.chunks if c.state == DONE]
        return missing_ranges(self.n, [*done, *self.kept])

    # -- internals -------------------------------------------------------------

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

    def _hand_back_piece(self, engine: int, run: int, pace: float | None) -> int:
        """A piece of a handed-back rest of ``run`` iterations: an equal share
        for every live engine (by speed, where devices differ), but lasting
        at least ``HAND_BACK_PIECE`` dispatch overheads (``pace``: seconds per
        iteration where the rest was cut off)."""
        k = max(1, len(self._alive))
        share = math.ceil(run * self._speed_share(engine) / k)
        pace = pace or self._pace(engine) or self._mean_pace()
        if self.profiled or not pace or pace <= 0:
            return max(1, min(run, share))
        least = HAND_BACK_PIECE * self.overhead / pace  # (inf: pace underflowed)
        return max(1, min(run, max(share, math.ceil(min(least, run)))))

    def _remaining(self) -> int:
        pinned = sum(b - a for q in self._pinned.values() for a, b, _ in q)
        return (self.n - self._cursor) + sum(b - a for a, b, _ in self._free) + pinned

    def _has_unassigned(self, engine: int) -> bool:
        if self._free or self._cursor < self.n or self._pinned.get(engine):
            return True
        return bool(self._static.get(engine))

    def _plenty_left(self) -> bool:
        """Queue ahead only while there is enough work that it cannot unbalance."""
        if self.mode == "static":
            return True
        k = max(1, len(self._alive))
        if self.profiled:
            left = self._remaining_cost()
            if (self.provisional and self._trials) or left < k * self._dearest():
                # once the work left is no more than one dearest iteration per
                # engine, one queued behind a running chunk could wait there
                # while other engines idle (16 engines, i x 5 ms: a re-run
                # 0.890 -> 0.92); and an estimate learns of the dearest
                # iterations late (trials still out have not measured theirs)
                return False
            return left >= 2 * k * self._floor_cost(None)
        if self._factor() == 1.0 and not self.heterogeneous:
            return True  # looks uniform: equal counts, nothing to unbalance
        left = self._remaining() + self._trial_rests()
        return left >= 2 * k * max(1, self.min_chunk())

    def _pace(self, engine: int) -> float | None:
        """Engine's measured seconds per unit of work (an iteration, or a profile
        second when profiled); ``None`` until measured."""
        st = self._stats[engine]
        return st.per_cost if self.profiled else st.per_iteration

    def _speed_share(self, engine: int) -> float:
        """Engine's speed relative to the mean of the live engines (1.0 unknown,
        or equal devices)."""
        if not self.heterogeneous:
            return 1.0
        rates: dict[int, float] = {e: r for e in self._alive if (r := self._pace(e))}
        mine = rates.get(engine)
        if not mine or len(rates) < 2:
            return 1.0
        speeds = {e: 1.0 / r for e, r in rates.items()}
        share = speeds[engine] / (sum(speeds.values()) / len(speeds))
        # Engines measured on different iterations also differ by the iterations'
        # own costs; only a clear gap (a GPU beside a CPU engine) is taken as speed.
        if 1 / 1.5 < share < 1.5:
            return 1.0
        return min(4.0, max(0.25, share))

    def _pick_free(self, engine: int) -> int:
        """Which free run goes out next: re-runs of lost work first (in order);
        then, in a loop that looks uniform, the rest of this engine's own trial
        (every engine's part was equal, so each finishing its own keeps them
        equal); else the run whose trial measured the costliest iterations, so
        a loop whose costs rise along its range does not end on its dearest
        part."""
        uniform = self._factor() == 1.0
        best, key = 0, (-1, -1, -1.0)
        for j, (start, _stop, attempt) in enumerate(self._free):
            own = uniform and self._rest_owner.get(start) == engine
            k = (
                1 if attempt > 0 else 0,
                1 if own else 0,
                self._rest_pace.get(start, -1.0),
            )
            if k > key:
                best, key = j, k
        return best

    def _factor(self) -> float:
        """Guided's divisor: ``factor``, or 1 (classic guided self-scheduling:
        fewer, larger chunks) once trials spread over the whole range all
        measured the same pace (within 25%): the loop looks uniform."""
        k = max(1, len(self._alive))
        if not self.trial or self._paced_count() < min(k, 3):
            return self.factor
        paces = self._provisional.values()
        hi, lo = max([self._max_pace, *paces]), min([self._min_pace, *paces])
        return 1.0 if hi <= 1.25 * lo else self.factor

    def _paced_count(self) -> int:
        """Stamped trial paces known: of done trials, and published by
        running ones."""
        return self._paced + len(self._provisional)

    def _size_at_pace(self, engine: int, pace: float, run: int) -> int:
        """Iterations of a free run whose trial measured ``pace`` seconds each
        that make a guided share of the work's estimated seconds left."""
        known = [self._rest_pace.get(a) for a, _b, _t in self._free]
        mean = self._mean_pace() or pace
        left = (
            sum(
                (b - a) * (p if p is not None else mean)
                for (a, b, _t), p in zip(self._free, known, strict=True)
            )
            + (self.n - self._cursor + self._trial_rests()) * mean
            + run * pace  # the run being cut
        )
        k = max(1, len(self._alive))
        share = left / (self._factor() * k) * self._speed_share(engine)
        if pace <= 0:  # (underflowed: too cheap to measure)
            return run
        return max(1, int(min(run, share / pace)))

    def _will_run(self, c: Chunk) -> int:
        """Iterations a running chunk is expected to run: all of them, or for a
        trial chunk those that fit its time budget at the pace measured so far
        (the slowest seen: the first iteration also pays warm-up)."""
        if not c.trial:
            return c.size
        pace = self._max_pace
        if pace <= 0:
            return c.size  # not measured yet, or cheap so far
        fit = self.trial_seconds / pace  # (inf for a pace that underflows)
        return max(1, c.size if fit >= c.size else math.ceil(fit))

    def _trial_rests(self) -> int:
        """Iterations of trial chunks still running that they will likely not
        reach (they come back to be handed out again)."""
        return sum(c.size - self._will_run(c) for c in self._trials.values())

    def _mean_pace(self) -> float | None:
        its = sum(st.iterations for st in self._stats.values())
        secs = sum(st.seconds for st in self._stats.values())
        return secs / its if its and secs > 0 else None

    def _size_for(self, engine: int) -> int:
        """The next chunk's size for ``engine``, cut to last at most about
        :meth:`_span` at its measured pace."""
        size = self._share_for(engine)
        pace = None if self.chunksize or self.profiled else self._pace(engine)
        if not pace or size <= 1:
            return size
        parts = math.ceil(size * pace / self._span(pace))
        return size if parts <= 1 else max(1, math.ceil(size / parts))

    def _span(self, pace: float) -> float:
        """Longest a chunk should run: ``chunk_seconds``, or for a long loop a
        ``1 / PROGRESS_STEPS`` share of an engine's whole part (so an hour's
        cell is not cut into thousands of messages)."""
        k = max(1, len(self._alive))
        whole = self.n * (self._mean_pace() or pace) / k
        return max(self.chunk_seconds, whole / PROGRESS_STEPS)

    def _share_for(self, engine: int) -> int:
        remaining = self._remaining()
        if remaining <= 0:
            return 1
        k = max(1, len(self._alive))
        # No engine takes more than its fair part of the work not yet done (left
        # to assign plus already outstanding), less what it already holds,
        # whatever the overhead floor says: cheap iterations must not leave the
        # others idle, and an engine served while the others are busy with
        # their part may take the rest.
        held = {
            e: sum(self._will_run(c) for c in self.outstanding(e)) for e in self._alive
        }
        # what trial chunks still out will not reach comes back to be shared
        remaining += self._trial_rests()
        total = remaining + sum(held.values())
        # weighted by speed only once a clear gap is established (a GPU beside a
        # CPU engine); iterations' own costs vary too much to read more into it
        part = min(1.0, self._speed_share(engine) / k)
        fair = max(1, math.ceil(total * part) - held.get(engine, 0))
        if self._factor() == 1.0 and not self.heterogeneous:
            # a loop that looks uniform: every engine ends with an equal count
            # (a fair part of what is left favours whoever asks first)
            mine = int(self._done[engine][0]) + held.get(engine, 0)
            fair = max(1, math.ceil((self.n - self._kept_iterations) / k) - mine)
            if not self.calibrating(engine):
                return max(1, min(remaining, fair))  # no tail to balance
        floor = min(self.min_chunk(engine), fair)
        if self.mode == "dynamic":
            return max(1, min(remaining, floor))
        share = remaining / (self._factor() * k) * self._speed_share(engine)
        if self.calibrating(engine):
            if self._trial_for(engine):
                # cut short on the engine: the first half of its part, then the
                # rest queued behind it (no idle round trip after the first);
                # one trial when it hears the verdict (it may run whole)
                if not self._running.get(engine) and fair > 1 and not self.heard:
                    return max(1, min(remaining, (fair + 1) // 2))
                return max(1, min(remaining, fair))
            if len(self._alive) > 1:
                # calibration: an unmeasured engine gets a small first chunk, so
                # a slow engine cannot be handed a quarter of the loop before
                # anyone knows it is slow
                share /= 4
        return max(1, min(remaining, fair, max(floor, math.ceil(share))))

    # -- profiled (cost-cut) guided ----------------------------------------------

    def _use_profile(self, profile: Sequence[float]) -> None:
        try:
            costs = list(map(float, profile))
        except (TypeError, ValueError):
            return
        total = sum(costs)
        if len(costs) != self.n or not 0 < total < math.inf or min(costs) < 0:
            return  # (a NaN makes the sum NaN)
        self._set_costs(costs)
        self._taken = bytearray(self.n)
        self._free = [(0, self.n, 0)]
        self._cursor = self.n
        mean = total / self.n
        for e in self._stats:
            # equal devices: assume the profile's pace, so no calibration chunks;
            # different devices must be measured before they get a large share
            self._stats[e] = (
                _EngineStats() if self.heterogeneous else _EngineStats(1, mean, mean)
            )

    def _set_costs(self, costs: list[float]) -> None:
        """Cost prefix sums and the seeding order of ``costs`` (one per
        iteration): the schedule is profiled from now on."""
        self.profiled = True
        self._prefix = list(accumulate(costs, initial=0.0))
        # Only iterations costing over a quarter of the smallest chunk need seeding
        # in cost order; chunks of cheaper ones are as fine-grained wherever they
        # are cut (and sorting a million cheap iterations would cost ~0.3 s).
        some = self.overhead / self.target_overhead / 4
        heavy = [i for i, x in enumerate(costs) if x > some]
        heavy.sort(key=costs.__getitem__, reverse=True)
        self._order = heavy + [i for i, x in enumerate(costs) if x <= some]
        self._seek, self._back = 0, self.n - 1

    # -- provisional profile (first runs of uneven loops) -------------------------

    def _may_estimate(self) -> bool:
        """A first run's trials may stand in for a profile: equal devices (a
        GPU's seconds beside a CPU engine's are no one cost), a guided
        schedule cut by time (not a fixed size), no real profile, the whole
        loop run here (not resumed), and few enough iterations to re-estimate
        as each trial comes back."""
        return (
            self.trial
            and self.mode == "guided"
            and not self.chunksize
            and not self.heterogeneous
            and not self.kept
            and (self.provisional or not self.profiled)
            and self.n <= PROVISIONAL_MAX
        )

    def _keep_costs(self, start: int, size: int, costs: Sequence[float]) -> None:
        """Keep a stamped chunk's iteration seconds; its first iteration also
        paid the chunk's one-time costs (imports, warm-up), so it counts no
        more than the chunk's median."""
        xs = [float(x) for x in costs[:size]]
        if not xs or not all(0 <= x < math.inf for x in xs):
            return
        xs[0] = min(xs[0], sorted(xs)[len(xs) // 2])
        for i, x in enumerate(xs):
            self._measured[start + i] = x
        self._measures += 1

    def _estimate_rest(self) -> None:
        """Once trials found the loop uneven, cost the iterations not measured
        by interpolation and schedule the rest as profiled; redone when more
        iterations were measured since."""
        if (
            not self._may_estimate()
            or self._measures == self._estimated_at
            or self._paced_count() < min(len(self._alive), 3)
            or self._factor() == 1.0  # looks uniform: the trials run whole
        ):
            return
        costs = interpolate(self.n, self._measured)
        if not 0 < sum(costs) < math.inf:
            return
        self._estimated_at = self._measures
        if self._cursor < self.n:  # (unassigned past the cursor: free now)
            self._free.append((self._cursor, self.n, 0))
            self._free.sort()
            self._cursor = self.n
        self._set_costs(costs)
        self.provisional = True
        taken = bytearray(b"\x01" * self.n)
        for a, b, _attempt in self._free:
            taken[a:b] = bytes(b - a)
        self._taken = taken
        for e, st in self._stats.items():  # each engine's pace against the estimate
            st.cost = sum(
                self._cost(c.start, c.stop)
                for c in self.chunks
                if c.engine == e and c.state == DONE
            )

    def _untake(self, start: int, stop: int) -> None:
        """Iterations ``[start, stop)`` are free again (a lost chunk's, a
        trial's rest): the seeds' search starts over."""
        self._taken[start:stop] = bytes(stop - start)
        self._seek, self._back = 0, self.n - 1

    def _cost(self, start: int, stop: int) -> float:
        return self._prefix[stop] - self._prefix[start]

    def _remaining_cost(self) -> float:
        return sum(self._cost(a, b) for a, b, _ in self._free)

    def _floor_cost(self, engine: int | None) -> float:
        """Profile seconds below which a chunk's dispatch overhead exceeds the
        target, on ``engine`` (or on the mean measured engine)."""
        pace = self._pace(engine) if engine is not None else None
        if pace is None:
            paces = [p for e in self._alive if (p := self._pace(e))]
            pace = sum(paces) / len(paces) if paces else 1.0
        return self.overhead / self.target_overhead / pace

    def _next_by_cost(self, engine: int) -> Chunk | None:
        """The guided share of the cost left, grown around the costliest
        unassigned iteration (the cheapest, for a slower or not yet measured
        engine that the costliest would hold past its share)."""
        if not self._free:
            return None
        target, fair = self._cost_target(engine)
        seed = self._seed(costliest=True)
        # an iteration this engine could not finish within its part is left to
        # the others; one not yet measured may be the slow engine
        if self._pace(engine) is None and len(self._alive) > 1:
            limit = target
        else:
            limit = fair if self._speed_share(engine) < 1 else math.inf
        if self._cost(seed, seed + 1) > limit:
            seed = self._seed(costliest=False)
        j = bisect_right(self._free, (seed, self.n + 1, 0)) - 1
        a, b, attempt = self._free[j]
        lo, hi = self._window(a, b, seed, target)
        lo, hi = self._trim(engine, a, b, seed, lo, hi)
        self._free[j : j + 1] = [
            (x, y, attempt) for x, y in ((a, lo), (hi, b)) if y > x
        ]
        self._taken[lo:hi] = b"\x01" * (hi - lo)
        return self._new(lo, hi, engine, attempt)

    def _trim(
        self, engine: int, a: int, b: int, seed: int, lo: int, hi: int
    ) -> tuple[int, int]:
        """Window ``[lo, hi)`` of free range ``[a, b)`` as it should be sent."""
        # a leftover too cheap to be worth its own message joins the chunk
        crumb = min(self._floor_cost(engine), self._cost(lo, hi)) / 4
        lo = a if self._cost(a, lo) <= crumb else lo
        hi = b if self._cost(hi, b) <= crumb else hi
        # and no chunk holds more iterations than guided-by-count would give it,
        # so a profile that calls costly iterations cheap cannot make a tail chunk
        # worse than the schedule without a profile
        k = max(1, len(self._alive))
        share = self._remaining() * self._speed_share(engine) / (self.factor * k)
        cap = max(self.min_chunk(engine), math.ceil(share))
        if hi - lo > cap:
            lo = max(lo, min(seed - (cap - 1) // 2, hi - cap))
            hi = lo + cap
        return lo, hi

    def _dearest(self) -> float:
        """The estimated cost of the dearest iteration not yet handed out."""
        if not self._free:
            return 0.0
        seed = self._seed(costliest=True)
        return self._cost(seed, seed + 1)

    def _seed(self, costliest: bool) -> int:
        """The costliest (or cheapest) unassigned iteration; there is one."""
        order, taken = self._order, self._taken
        if costliest:
            while taken[order[self._seek]]:
                self._seek += 1
            return order[self._seek]
        while taken[order[self._back]]:
            self._back -= 1
        return order[self._back]

    def _cost_target(self, engine: int) -> tuple[float, float]:
        """As :meth:`_size_for`, in profile seconds: the chunk's cost, and the
        most ``engine`` should take (its fair part of what is left)."""
        remaining = self._remaining_cost()
        k = max(1, len(self._alive))
        held = {
            e: sum(self._cost(c.start, c.stop) for c in self.outstanding(e))
            for e in self._alive
        }
        share = self._speed_share(engine)
        part = min(1.0, share / k)
        fair = (remaining + sum(held.values())) * part - held.get(engine, 0.0)
        floor = min(self._floor_cost(engine), fair)
        guided = remaining / (self.factor * k) * share
        if self._pace(engine) is None and k > 1:
            guided /= 4  # calibration, as in _size_for
        return min(remaining, fair, max(floor, guided)), fair

    def _window(self, a: int, b: int, seed: int, target: float) -> tuple[int, int]:
        """``[lo, hi)`` inside ``[a, b)``, holding ``seed``, costing about
        ``target`` (never less than the seed itself)."""
        p = self._prefix
        budget = target - self._cost(seed, seed + 1)
        if budget <= 0:
            return seed, seed + 1
        # half the budget each side; what one side cannot use goes to the other
        hi = bisect_right(p, p[seed + 1] + budget / 2, seed + 1, b + 1) - 1
        budget -= p[hi] - p[seed + 1]
        lo = bisect_left(p, p[seed] - budget, a, seed + 1)
        budget -= p[seed] - p[lo]
        hi = bisect_right(p, p[hi] + budget, hi, b + 1) - 1
        return lo, hi


def interpolate(n: int, known: dict[int, float]) -> list[float]:
    """A value for each of ``0..n-1`` from the ``known`` ones: between two
    known indices linearly, before the first and after the last the nearest
    known value (costs rising along a range are not projected past what was
    measured).  All zeros when nothing is known."""
    points = sorted((i, x) for i, x in known.items() if 0 <= i < n)
    if not points:
        return [0.0] * n
    out = [points[0][1]] * points[0][0]
    for (i0, x0), (i1, x1) in zip(points, points[1:], strict=False):
        step = (x1 - x0) / (i1 - i0)
        out.extend(x0 + step * j for j in range(i1 - i0))
    last_i, last_x = points[-1]
    out.extend([last_x] * (n - last_i))
    return out


def missing_ranges(n: int, done: Iterable[tuple[int, int]]) -> list[tuple[int, int]]:
    """The ``(start, stop)`` ranges of ``range(n)`` that ``done`` does not cover."""
    out, at = [], 0
    for a, b in sorted(done):
        if a > at:
            out.append((at, min(a, n)))
        at = max(at, b)
    if at < n:
        out.append((at, n))
    return [(a, b) for a, b in out if b > a]


def covers(chunks: Iterable[Chunk], n: int) -> bool:
    """True when the done chunks tile ``range(n)`` exactly (for tests and checks)."""
    spans = sorted((c.start, c.stop) for c in chunks if c.state == DONE)
    at = 0
    for a, b in spans:
        if a != at:
            return False
        at = b
    return at == n
