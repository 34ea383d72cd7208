"""The run's state, pure: :meth:`RunState.handle` takes an event and answers
with instructions (:mod:`gpucell.core.run_events`); no I/O, no clock.

It owns what a run decides: the schedule, the chunks in flight, the results,
the losses and retries, out-of-memory tries, which engine is hung, the trials'
verdict, the hand-back flag and what is kept for ``--resume``.  The dispatcher
(:mod:`gpucell.kernel.dispatch`) turns ipyparallel's results, ``/proc`` reads
and the stop button into events and carries the instructions out, so a test
drives a run with events alone (``tests/test_run_state.py``), and
``bench/sim_schedule.py`` drives the same state with simulated replies.
After dask/distributed's ``WorkerState`` (events in, instructions out; a thin
worker executes them).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from gpucell.core import run_errors as errors
from gpucell.core.provenance import iteration_seconds
from gpucell.core.run_events import (
    Blame,
    Cancel,
    Cancelled,
    ChunkFailed,
    Completed,
    EngineBack,
    EngineGone,
    EngineStalled,
    Event,
    Fail,
    Failed,
    FailUnlessRestarting,
    Fill,
    Finish,
    Flight,
    Forget,
    HandBack,
    Instruction,
    Keep,
    Kill,
    MarkDead,
    PaceHeard,
    Raised,
    Record,
    Reload,
    Replied,
    Send,
    Sent,
    Stop,
    Stopping,
    Tick,
    TrialsHeard,
    Verdict,
    VerdictGiven,
    Warn,
)
from gpucell.core.schedule import Schedule
from gpucell.core.schedule_fields import Chunk
from gpucell.core.states import CANCELLED, DONE, FAILED, LOST, RUNNING, RunStatus
from gpucell.errors import (
    ClusterError,
)
from gpucell.protocol.conversation import Timing

__all__ = [
    "HEARING_SECONDS",
    "HUNG_AFTER",
    "HUNG_FACTOR",
    "TRIAL_SECONDS",
    "RunState",
    "robust_seconds",
    "trial_costs",
]

#: an engine whose chunks run this many times longer than its measured pace
#: says (and at least HUNG_AFTER seconds) is taken as hung.  Conservative on
#: purpose: a loop whose later iterations cost far more than its first (a
#: growing model, an uneven dataset) must never have a working engine ended,
#: so the pace is the slowest any engine has shown and the floor is 10 minutes
HUNG_FACTOR = 20
HUNG_AFTER = 600.0

#: seconds a trial chunk runs before it stops starting iterations: long enough
#: to measure a pace, short enough that a slow engine is not committed to much
TRIAL_SECONDS = 0.05

#: trials are listened for every 5 ms until this long past their budget (or
#: while one was heard and the verdict is not out), then every 50 ms
HEARING_SECONDS = 1.0


@dataclass
class RunState:
    """One run's decisions.  ``retries``: how often lost iterations are re-run;
    ``near``: engines that read this host's ``/dev/shm`` (they publish paces,
    hear the verdict and the hand-back flag); ``channel``: that channel exists."""

    sched: Schedule
    retries: int = 2
    near: set[int] = field(default_factory=set)
    channel: bool = False
    flights: dict[int, Flight] = field(default_factory=dict)  # chunk id -> flight
    results: dict[int, Any] = field(default_factory=dict)  # chunk start -> result
    losses: list[tuple[int, int, int]] = field(default_factory=list)  # a, b, engine
    oom_tries: dict[tuple[int, int], int] = field(default_factory=dict)
    ends: dict[int, float] = field(default_factory=dict)  # engine -> last end
    paces_read: set[int] = field(default_factory=set)  # trial chunk ids heard
    verdict_given: bool = False
    hand_back_raised: float | None = None  # the flag's threshold while raised
    status: RunStatus = "running"
    _sending: dict[int, bool] = field(default_factory=dict)  # chunk id -> timed
    # engine -> the engine it is a restart of (one device's engines over time)
    restarted_from: dict[int, int] = field(default_factory=dict)

    @property
    def n(self) -> int:
        return self.sched.n

    @property
    def finished(self) -> bool:
        return bool(self.sched.finished)

    def handle(self, event: Event) -> list[Instruction]:
        """What ``event`` makes the run do, in order."""
        handler: Callable[[Any], list[Instruction]] = getattr(
            self, _HANDLERS[type(event)]
        )
        return handler(event)

    def in_order(self) -> list[Any]:
        """The chunk results in iteration order (for the merge)."""
        return [self.results[k] for k in sorted(self.results)]

    # -- queries -------------------------------------------------------------

    def listening(self) -> list[Chunk]:
        """Running trials on this host whose published pace is still unread."""
        if not self.channel or self.verdict_given:
            return []
        return [
            f.chunk
            for f in self.flights.values()
            if f.chunk.trial
            and f.chunk.id not in self.paces_read
            and f.chunk.engine in self.near
        ]

    def awaiting_verdict(self, now: float) -> bool:
        """A trial on this host may be running on past its budget, waiting: one
        was heard, or one was sent less than ``HEARING_SECONDS`` past its budget
        ago (a trial waits only when its rest is short, so only when its
        iterations are; polling every 5 ms through a trial of 2 s iterations
        cost the kernel 3-6% of a core)."""
        if not self.channel or self.verdict_given:
            return False
        return any(
            f.chunk.trial
            and f.chunk.engine in self.near
            and (
                f.chunk.id in self.paces_read
                or now - f.sent < TRIAL_SECONDS + HEARING_SECONDS
            )
            for f in self.flights.values()
        )

    def overdue(self, engine: int, now: float) -> str | None:
        """Why ``engine`` looks hung, or ``None``: its oldest chunk has run far
        longer than the slowest measured pace says it should (a deadlock in a
        library)."""
        flights = [f for f in self.flights.values() if f.engine == engine]
        if not flights:
            return None
        oldest = min(flights, key=lambda f: f.sent)
        pace = self.sched.slowest_pace()
        if pace is None:
            return None  # nothing measured yet: no bound to hold it to
        bound = max(HUNG_AFTER, HUNG_FACTOR * pace * sum(f.chunk.size for f in flights))
        if now - oldest.sent > bound:
            ran = now - oldest.sent
            return (
                f"its chunk has run {ran:.0f} s, more than {HUNG_FACTOR}x what its "
                "measured pace allows"
            )
        return None

    # -- sending ---------------------------------------------------------------

    def _fill(self, ev: Fill) -> list[Instruction]:
        """Every chunk the schedule hands out now (each engine keeps its next
        chunk queued); a chunk lost more often than ``retries`` fails the run."""
        out: list[Instruction] = []
        busy = {f.chunk.engine for f in self.flights.values()}
        for c in self.sched.fill():
            eid = c.engine
            assert eid is not None
            if c.attempt > self.retries:
                return [Fail(errors.lost_too_often(c))]
            # a chunk queued behind another waits on the engine, and an engine's
            # first chunk also loads the program and inputs (and the imports they
            # need): neither round trip says what dispatching a chunk costs
            self._sending[c.id] = eid not in busy and eid not in ev.unset
            busy.add(eid)
            budget = TRIAL_SECONDS if c.trial else None
            out.append(Send(c, budget, c.stoppable and eid in self.near))
        return out

    def _sent(self, ev: Sent) -> list[Instruction]:
        for cid in ev.chunks:
            timed = self._sending.pop(cid)
            c = self.sched.chunks[cid]
            self.flights[cid] = Flight(c, ev.now if timed else None, ev.now)
        return []

    # -- replies ---------------------------------------------------------------

    def _replied(self, ev: Replied) -> list[Instruction]:
        """A chunk task finished: keep its result, or find out why it has none."""
        flight = self.flights.pop(ev.chunk, None)
        if flight is None:
            return []  # cancelled or lost meanwhile
        c, timing = flight.chunk, ev.timing
        if ev.status == "unloaded":
            return self._reload(c)
        if timing.get("first", c.start) != c.start:
            # a reply matched to the wrong chunk would merge its values at the
            # wrong iterations: the cell fails, nothing merged
            return [Fail(errors.misplaced(c, timing))]
        if ev.status == "error":
            if ev.payload.get("oom"):
                retry = self._retry_out_of_memory(c, ev.payload, ev.free_memory)
                if retry:
                    return [*retry, Record(c, timing, FAILED)]
            self.sched.end(c.id, FAILED)
            return [Record(c, timing, FAILED), ChunkFailed(c, ev.payload, timing)]
        return self._finished(flight, ev.payload, timing, ev.now)

    def _raised(self, ev: Raised) -> list[Instruction]:
        flight = self.flights.pop(ev.chunk, None)
        if flight is None:
            return []
        c = flight.chunk
        self.sched.end(c.id, FAILED)
        return [
            Record(c, None, FAILED),
            Fail(errors.task_raised(c, ev.text)),
        ]

    def _finished(
        self, flight: Flight, payload: Any, timing: Timing, now: float
    ) -> list[Instruction]:
        sched, c = self.sched, flight.chunk
        assert c.engine is not None
        if c.start in self.results:  # never merged twice: a gpucell bug
            return [Fail(ClusterError(f"gpucell: chunk {c.id} came back twice"))]
        self.results[c.start] = payload
        done = timing.get("done", c.size)  # fewer when a trial stopped early
        # an unstamped chunk's pace (no stamp per iteration) is no measure of
        # how uneven the loop is beside stamped ones
        stamped = not timing.get("unstamped", False)
        # a trial's iterations, each timed: the first run's estimate of what
        # the rest of an uneven loop costs (Schedule's provisional profile)
        costs = (
            trial_costs(timing, done)
            if c.trial and stamped and sched.takes_costs
            else None
        )
        back = bool(timing.get("handed_back", False))
        # a profiled schedule compares each chunk's time with the profile's cost
        # of the same iterations: it needs the whole time, not a median estimate
        seconds = timing["compute"] if sched.profiled else robust_seconds(timing, done)
        sched.complete(
            c.id, seconds, done=done, stamped=stamped, costs=costs, handed_back=back
        )
        out: list[Instruction] = self._verdict() if c.trial else []
        if flight.timed_from is not None:
            sched.observe_overhead(
                max(0.0, now - flight.timed_from - timing["compute"])
            )
        elif c.engine in self.ends and timing["start"] > self.ends[c.engine]:
            # queued behind the engine's previous chunk: what a chunk costs is
            # the engine's dead time between the two (ipykernel's per-message
            # work, results out, the next chunk in), a few milliseconds
            sched.observe_overhead(timing["start"] - self.ends[c.engine])
        self.ends[c.engine] = timing["end"]
        return [*out, Record(c, timing, DONE), Keep(c.start, c.stop, payload)]

    def _reload(self, c: Chunk) -> list[Instruction]:
        """The engine had tidied this cell away, idle after its last chunk,
        before this chunk came: it ran nothing, and goes to the same engine
        again with the program and inputs.  Not an attempt: nothing was lost."""
        assert c.engine is not None
        self.sched.requeue(c.id, c.engine)
        return [Reload(c.engine)]

    def _retry_out_of_memory(
        self, c: Chunk, payload: Any, free: Mapping[int, float]
    ) -> list[Instruction]:
        """Device memory ran out in an iteration: once more on the same engine
        (its cache was emptied), then once on the engine with the most free
        device memory, before the cell fails with the error."""
        key = (c.start, c.stop)
        tries = self.oom_tries.get(key, 0)
        others = [e for e in self.sched.alive if e != c.engine]
        if tries >= 2 or (tries == 1 and not others):
            return []
        assert c.engine is not None
        target = c.engine if tries == 0 else _most_free(others, free)
        self.oom_tries[key] = tries + 1
        self.sched.requeue(c.id, target)
        where = "the same engine" if target == c.engine else f"engine {target}"
        return [
            Warn(
                f"iteration {payload.get('iteration')} ran out of device memory on "
                f"engine {c.engine}; retrying iterations {c.start}-"
                f"{c.stop - 1} on {where}"
            )
        ]

    # -- engines -----------------------------------------------------------------

    def _engine_gone(self, ev: EngineGone) -> list[Instruction]:
        """The engine died: its chunks go back to the schedule for the others."""
        eid = ev.engine
        lost = self.sched.lose_engine(eid)
        out: list[Instruction] = [MarkDead(eid)]
        for c in lost if not ev.job_ended else ():  # (no iteration's fault)
            self.losses.append((c.start, c.stop, eid))
        for cid in [k for k, f in self.flights.items() if f.engine == eid]:
            del self.flights[cid]
            out.append(Forget(cid, lost=True))
        out += [Record(c, None, LOST) for c in lost]
        killer = [] if ev.job_ended else self._killer(lost, eid)
        if killer:
            return out + killer
        out.append(
            Warn(
                f"engine {eid} died; re-running its {sum(c.size for c in lost)} "
                "iteration(s) on the others"
            )
        )
        if not self.sched.alive:
            ranges = self.sched.pending_ranges()
            out.append(FailUnlessRestarting(errors.every_engine_died(ranges)))
        return out

    def _killer(self, lost: list[Chunk], eid: int) -> list[Instruction]:
        """A re-run iteration, alone on its engine, ended that engine too: it is
        the cause, and running it again would end the next one."""
        for c in lost:
            if c.size != 1 or c.attempt < 1:
                continue
            # a device that keeps dying ends each of its restarts, whatever they
            # run: only another device's engine counts against the iteration
            before = [
                e
                for a, b, e in self.losses[:-1]
                if a <= c.start < b and self._device_of(e) != self._device_of(eid)
            ]
            if before:
                return [
                    Blame(f"iteration {c.start} ended its engines"),
                    Fail(errors.a_killer(c.start, before[0], eid)),
                ]
        return []

    def _device_of(self, engine: int) -> int:
        """The first engine of ``engine``'s device in this run (restarts followed)."""
        seen = set()
        while engine in self.restarted_from and engine not in seen:
            seen.add(engine)
            engine = self.restarted_from[engine]
        return engine

    def _engine_stalled(self, ev: EngineStalled) -> list[Instruction]:
        """A hung engine is ended (so no stale result can arrive later) and
        treated as lost: its chunks go to the others."""
        warn = Warn(f"engine {ev.engine} stopped answering ({ev.why}); it was ended")
        return [Kill(ev.engine), warn, *self._engine_gone(EngineGone(ev.engine))]

    def _engine_back(self, ev: EngineBack) -> list[Instruction]:
        """A restarted engine takes work in this run."""
        if ev.near:
            self.near.add(ev.engine)
        self.sched.add_engine(ev.engine)
        if ev.replaces >= 0:
            self.restarted_from[ev.engine] = ev.replaces
        if ev.replaces < 0:  # a later batch job's engine (--jobs N)
            return [Warn(f"engine {ev.engine} ({ev.device}) joined; it takes work now")]
        return [
            Warn(
                f"engine {ev.replaces} was restarted as engine {ev.engine} "
                f"({ev.device}); it takes work now"
            )
        ]

    # -- trials and hand-backs -----------------------------------------------------

    def _pace_heard(self, ev: PaceHeard) -> list[Instruction]:
        self.paces_read.add(ev.chunk)
        if ev.stamped:  # an unstamped pace is no measure of unevenness
            self.sched.observe_trial(ev.chunk, ev.done, ev.seconds)
        return []

    def _trials_heard(self, ev: TrialsHeard) -> list[Instruction]:
        return self._verdict()

    def _verdict(self) -> list[Instruction]:
        """Tell the trials once they tell whether the loop looks uniform."""
        if not self.channel or self.verdict_given:
            return []
        said = self.sched.verdict
        return [] if said is None else [Verdict(said)]

    def _verdict_given(self, ev: VerdictGiven) -> list[Instruction]:
        self.verdict_given = True
        return []

    def _tick(self, ev: Tick) -> list[Instruction]:
        """While an engine is idle with nothing left to hand out, chunks running
        on this host whose unrun rest would take longer than
        ``Schedule.hand_back_seconds`` stop after their current iteration and
        send it back to be shared out; the flag goes once every engine has work
        again."""
        if not self.channel or not self.sched.stealing:
            return []
        want = bool(self.sched.idle_engines()) and any(
            f.chunk.stoppable and f.chunk.engine in self.near
            for f in self.flights.values()
        )
        if want:
            threshold = self.sched.hand_back_seconds()
            raised = self.hand_back_raised
            if raised is None or abs(raised - threshold) > 0.25 * threshold:
                self.hand_back_raised = threshold
                return [HandBack(threshold)]
        elif self.hand_back_raised is not None:
            self.hand_back_raised = None
            return [HandBack(None)]
        return []

    # -- the end -----------------------------------------------------------------

    def _stop(self, ev: Stop) -> list[Instruction]:
        """The stop button or the timeout: cancel, nothing merged."""
        done, n = self.sched.done_iterations, self.n
        if ev.reason == "timeout":
            self.status = "timeout"
            error = errors.timed_out(ev.timeout, done, n)
        else:
            self.status = "interrupted"
            error = errors.interrupted(done, n)
        return [Cancel(), Finish(self.status), Fail(error)]

    def _failed(self, ev: Failed) -> list[Instruction]:
        self.status = "error"
        return [Cancel(), Finish("error")]

    def _cancelled(self, ev: Cancelled) -> list[Instruction]:
        """Every chunk still in flight is recorded as cancelled."""
        out: list[Instruction] = []
        for cid, flight in self.flights.items():
            c = flight.chunk
            if c.state == RUNNING:
                self.sched.end(c.id, CANCELLED)
                out.append(Record(c, None, CANCELLED))
            out.append(Forget(cid, lost=False))
        self.flights.clear()
        return out

    def _stopping(self, ev: Stopping) -> list[Instruction]:
        forgotten: list[Instruction] = [Forget(k, lost=False) for k in self.flights]
        self.flights.clear()  # the cluster's tasks went with it
        error = errors.cluster_stopped(self.sched.done_iterations, self.n)
        return [*forgotten, Fail(error)]

    def _completed(self, ev: Completed) -> list[Instruction]:
        assert self.sched.finished, "gpucell: the run ended before its loop"
        self.status = "ok"
        return [Finish("ok")]


_HANDLERS: dict[type, str] = {
    Fill: "_fill",
    Sent: "_sent",
    Replied: "_replied",
    Raised: "_raised",
    EngineGone: "_engine_gone",
    EngineStalled: "_engine_stalled",
    EngineBack: "_engine_back",
    PaceHeard: "_pace_heard",
    TrialsHeard: "_trials_heard",
    VerdictGiven: "_verdict_given",
    Tick: "_tick",
    Stop: "_stop",
    Failed: "_failed",
    Cancelled: "_cancelled",
    Stopping: "_stopping",
    Completed: "_completed",
}


def _most_free(engines: list[int], free: Mapping[int, float]) -> int:
    """The engine whose device has the most free memory, else the first."""
    best, most = engines[0], -1.0
    for eid in engines:
        f = free.get(eid)
        if f is not None and f > most:
            best, most = eid, float(f)
    return best


def trial_costs(timing: Timing, done: int) -> list[float] | None:
    """Each iteration's seconds, from the engine's stamp at each start and the
    chunk's end (``None`` when the chunk was not stamped throughout)."""
    starts = timing.get("starts") or []
    if done < 1 or len(starts) != done:
        return None
    return iteration_seconds(starts, timing["end"])


def robust_seconds(timing: Timing, size: int) -> float:
    """A chunk's compute time for the schedule's speed estimates.

    The median iteration (which the engine computes for chunks of 3 or more)
    times the iteration count: an engine's first iteration also pays one-time
    costs (first imports, warm-up) that would make it look slow.
    """
    median = timing.get("median")
    if median is not None and size >= 3:
        return float(median) * size
    return float(timing["compute"])
