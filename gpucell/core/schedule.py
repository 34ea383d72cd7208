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
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from gpucell.core.schedule_cost import interpolate
from gpucell.core.schedule_fields import (
    CRUMB,
    HAND_BACK_MIN_SECONDS,
    HAND_BACK_PIECE,
    HAND_BACK_ROUND_TRIPS,
    ISOLATE_MAX,
    PROGRESS_STEPS,
    PROVISIONAL_MAX,
    Chunk,
    _EngineStats,
)
from gpucell.core.schedule_sizing import ChunkSizing
from gpucell.core.states import (
    CANCELLED,
    DONE,
    FAILED,
    LOST,
    RUNNING,
    ChunkState,
    move,
)

__all__ = [
    "CRUMB",
    "HAND_BACK_MIN_SECONDS",
    "HAND_BACK_PIECE",
    "HAND_BACK_ROUND_TRIPS",
    "ISOLATE_MAX",
    "PROGRESS_STEPS",
    "PROVISIONAL_MAX",
    "Chunk",
    "Schedule",
    "covers",
    "interpolate",
    "missing_ranges",
]


@dataclass
class Schedule(ChunkSizing):
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

    def engine_progress(self, engine: int) -> tuple[int, float]:
        """Iterations ``engine`` finished, and their engine-measured seconds."""
        its, secs = self._done.get(engine, (0, 0.0))
        return int(its), float(secs)

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
