"""Run a loop plan's chunks on the engines: the only code that talks to ipyparallel
during a ``%%gpu_parallel`` cell.

It ships the program and inputs (once per engine, cached across cells), feeds each
engine chunks from :class:`gpucell.core.schedule.Schedule` with the next one already
queued, relays output as it arrives, and gathers results.  It survives an engine
dying (its chunks go to the others), honours interrupts and timeouts (queued work
is aborted, running work is signalled, engines end idle), and raises an iteration's
exception with its context.  It never touches the user's namespace: it returns the
chunk results in iteration order and the merge does the rest.
"""

from __future__ import annotations

import concurrent.futures
import contextlib
import os
import queue
import signal
import sys
import threading
import time
import uuid
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any, NoReturn

from gpucell.cluster.lifecycle import GpuCluster
from gpucell.core.provenance import ChunkRecord, LastRun, iteration_seconds
from gpucell.core.runstate import EngineProgress, RunSnapshot
from gpucell.core.schedule import Chunk, Schedule
from gpucell.core.states import (
    BUSY,
    CANCELLED,
    DEAD,
    DONE,
    FAILED,
    IDLE,
    LOST,
    RETRYING,
    RUNNING,
    ChunkState,
    EngineState,
    RunStatus,
)
from gpucell.devices.host import kernel_key, pid_running, process_state
from gpucell.errors import (
    CellTimeout,
    ClusterError,
    ClusterStopped,
    EnginesLost,
    IterationError,
)
from gpucell.kernel.chunk_errors import raise_iteration_error
from gpucell.kernel.interrupts import interrupts_deferred
from gpucell.kernel.relay import OutputRelay
from gpucell.kernel.shipping import InputShipping
from gpucell.protocol import shm, wire
from gpucell.protocol.conversation import ChunkError, ChunkTask, Reply, Timing
from gpucell.protocol.program import Watch

__all__ = [
    "TRIAL_SECONDS",
    "Flight",
    "Options",
    "Run",
    "run_chunks",
    "signal_engines",
    "stop_button",
]


@dataclass(frozen=True)
class Options:
    """The knobs of one run (from the magic line and the GpuCell settings)."""

    schedule: str = "guided"
    chunksize: int | None = None
    seed: int | None = None
    timeout: float | None = None
    retries: int = 2
    interrupt_grace: float = 2.0
    cost_hint: float | None = None  # seconds per iteration, from an earlier run
    uniform: bool = False  # that run's iterations all took the same time
    profile: tuple[float, ...] | None = None  # that run's seconds per iteration


class _Interrupted(Exception):
    def __init__(self, reason: str) -> None:
        self.reason = reason


def _engine_alive(gc: GpuCluster, eid: int) -> bool:
    """Local engines by pid (noticed within ~0.2 s); others by registration
    (the controller's heartbeat)."""
    info = gc.engines.get(eid)
    if eid in gc.dead or eid not in gc.client.ids:
        return False
    if info is None or not info.local:
        return True
    return pid_running(info.pid)


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
#: trial chunks send an engine its whole part, and what it did not reach is sent
#: again: only where a loop's chunk objects are this small in all
_RESEND_BYTES = 1 << 20


def _cheap_to_resend(chunk_of: Callable[[int, int], Any], n: int) -> bool:
    """The whole loop's chunk objects would be small on the wire (a range of any
    length, or a short list of small items): estimated from what its 9th to 16th
    iterations add to a chunk of its first 8."""
    if n <= 0:
        return False
    small, large = max(1, min(n, 16) // 2), min(n, 16)
    try:
        at_small, at_large = (
            wire.frames_nbytes(wire.dumps(chunk_of(0, m))) for m in (small, large)
        )
    except Exception:
        return False
    per_item = max(0, at_large - at_small) / max(1, large - small)
    return at_small + per_item * n <= _RESEND_BYTES


def signal_engines(gc: GpuCluster, eids: Sequence[int], sig: int) -> None:
    """Interrupt running work: signal local engine pids, ask the nanny otherwise."""
    remote = []
    for eid in eids:
        info = gc.engines.get(eid)
        if info is not None and info.local:
            try:
                os.kill(info.pid, sig)
            except OSError:
                pass
        else:
            remote.append(eid)
    if remote:
        try:
            gc.client.send_signal(sig, targets=remote, block=False)
        except Exception:
            pass


@dataclass
class Flight:
    """A chunk task in flight: what it carries and when it left."""

    chunk: Chunk
    # perf_counter at submission when the round trip measures a chunk's dispatch
    # cost (the engine had nothing queued and its program was loaded), else None
    timed_from: float | None
    sent: float = 0.0  # perf_counter when it was submitted

    @property
    def engine(self) -> int:
        """The engine the chunk was sent to (always set once it is in flight)."""
        assert self.chunk.engine is not None
        return self.chunk.engine


def _to_stdout(text: str) -> None:
    sys.stdout.write(text)
    sys.stdout.flush()


class Run(InputShipping):
    """One cell's chunks on the engines, as an object whose state a test can build
    and inspect: which chunks are in flight, what came back, what was lost.

    The wait loop (:meth:`execute`) only calls the transitions: :meth:`ship_inputs`
    once, then :meth:`submit`, :meth:`on_done` for each finished task,
    :meth:`on_lost` for each engine found dead, :meth:`cancel` when the run stops
    early, and :meth:`snapshot` for the display.  Chunk states change through
    :func:`gpucell.core.states.move` only (in the schedule and here), and every
    chunk that ends (done, lost, failed, cancelled) is recorded in ``record``.

    ``gc`` is anything shaped like :class:`gpucell.cluster.lifecycle.GpuCluster`
    (engines, client, ``view()``, ``mark_dead()``, the input cache and the
    shared-memory channel); tests drive a Run with a fake one.

    Parameters
    ----------
    programs
        The engine program per engine id (CPU engines may get a CUDA-rewritten one).
    inputs
        ``{name: value}`` the body reads; sent to an engine only when its cached
        copy's fingerprint differs.
    chunk_of
        ``chunk_of(start, stop)`` returns the chunk object for those iterations.
    record
        Provenance, filled in as chunks finish (also on failure).
    relay
        Where engine output goes (``sys.stdout.write`` by default).
    progress
        Called with a :class:`~gpucell.core.runstate.RunSnapshot` every
        ``progress_period`` seconds and once at the end (the live display).
    telemetry
        A :class:`gpucell.kernel.telemetry.ClusterTelemetry`: remote engines start
        their sampler with the cell, and their samples are collected from the
        in-flight tasks here (the display reads them with ``sample()``).
    watch
        The inputs (and whether the chunk's items) the engines check before and
        after each chunk (``LoopPlan.watched()``; see gpucell.engine.checkin).
    """

    def __init__(
        self,
        gc: GpuCluster,
        targets: Sequence[int],
        *,
        programs: dict[int, Any],
        inputs: dict[str, Any],
        n: int,
        chunk_of: Callable[[int, int], Any],
        options: Options,
        record: LastRun,
        echo: Callable[[str], None] = print,
        relay: Callable[[str], None] | None = None,
        progress: Callable[[RunSnapshot], None] | None = None,
        progress_period: float = 0.3,
        telemetry: Any = None,
        watch: Watch | None = None,
        kept: Sequence[tuple[int, int]] = (),
        on_chunk: Callable[[int, int, Any], None] | None = None,
        drop_inputs: Callable[[str], bool] = lambda name: False,
        cache_bytes: int = 8 << 30,
        namespace: dict[str, Any] | None = None,
    ) -> None:
        self.gc = gc
        # the notebook's: functions the loop's code made get it as globals
        self.namespace = namespace
        self.kept = tuple(kept)
        self.on_chunk = on_chunk
        # cached inputs whose kernel object is gone (``del big``): dropped
        self.drop_inputs = drop_inputs
        self.cache_bytes = int(cache_bytes)
        self.watch: Watch = watch or {"names": [], "items": False}
        self.programs = programs
        self.inputs = inputs
        self.n = n
        self.chunk_of = chunk_of
        self.options = options
        self.record = record
        self.echo = echo
        self.progress = progress
        self.progress_period = progress_period
        self.telemetry = telemetry
        self.cell = uuid.uuid4().hex
        self.status: RunStatus = "running"
        self.alive = [e for e in targets if _engine_alive(gc, e)]
        gone = [e for e in targets if e not in self.alive]
        restarts = getattr(gc, "restarts", None)
        for eid in gone:
            gc.mark_dead(eid)  # died since the last cell: status says so now
            if restarts is not None:
                restarts.begin(gc, eid)  # joins this cell when it is back
        if gone and self.alive:
            which = ", ".join(map(str, gone))
            msg = (
                f"engine{'s' if len(gone) > 1 else ''} {which} died since the last "
                f"cell; running on {len(self.alive)} of {len(targets)} selected "
                "engines (`%gpu_cluster status`)"
            )
            record.warnings.append(msg)
            echo(f"gpucell: warning: {msg}")
        if not self.alive and restarts is not None and restarts.pending:
            self._wait_for_restarts(restarts, echo)
        if not self.alive:
            raise EnginesLost(
                "No live engine among the selected ones; check `%gpu_cluster status` "
                "and restart the cluster."
            )
        record.engines = tuple(self.alive)
        record.iterations = n
        self.inflight: dict[Any, Flight] = {}
        # tasks as they finish, put by their done-callbacks (ipyparallel's IO
        # thread): the wait loop takes what is there, where waiting on every
        # task in flight set up and tore down a waiter on each, per wake-up
        self.ready: queue.SimpleQueue[Any] = queue.SimpleQueue()
        self.losses: list[tuple[int, int, int]] = []  # (start, stop, engine) lost
        self.oom_tries: dict[tuple[int, int], int] = {}
        self._msg_ids: list[str] = []  # this cell's tasks, forgotten at its end
        self.results: dict[int, Any] = {}  # chunk start -> its result
        self.ends: dict[int, float] = {}  # engine -> its last chunk's end (its clock)
        # engine -> (program, input names, fingerprints), input frames: travels
        # with the engine's first chunk
        self.setups: dict[int, tuple[Any, Any]] = {}
        self.mapped: dict[tuple[str, ...], list[Any]] = {}  # inputs in /dev/shm
        # the verdict on this cell's trials, written once they tell (see
        # _hear_trials); trial chunks whose published pace was read
        self.verdict_file: str | None = None
        self.paces_read: set[int] = set()
        # the hand-back flag's threshold while raised (see _call_for_rests)
        self.hand_back_raised: float | None = None
        self.near = {e for e in self.alive if gc.sees_shm(e)}  # publish paces
        # (host, input names) -> (engine, its pid, tag): who publishes them there
        self.leaders: dict[tuple[str, tuple[str, ...]], tuple[int, int, str]] = {}
        self.host_share: dict[int, tuple[tuple[str, ...], int]] = {}
        self.channel = gc.results_channel()
        self.sched = Schedule(
            n,
            self.alive,
            mode=options.schedule,
            chunksize=options.chunksize,
            hint=options.cost_hint,
            uniform=options.uniform,
            profile=options.profile,
            heterogeneous=len(
                {(gc.engines[e].kind, gc.engines[e].name) for e in self.alive}
            )
            > 1,
            trial=True,
            # every engine hears the verdict on the trials: one trial each
            heard=self.channel is not None and set(self.alive) <= self.near,
            kept=self.kept,
            # chunks on this host hand their rest back to idle engines
            stealing=self.channel is not None and bool(self.near),
        )
        if self.sched.trial and not _cheap_to_resend(chunk_of, n):
            # (probed only for schedules that would send trial chunks at all)
            self.sched.trial = False
        record.schedule = self.sched.mode + (
            " (profiled)" if self.sched.profiled else ""
        )
        self.views = {eid: gc.view(eid) for eid in self.alive}
        self.output = OutputRelay(gc.client, relay or _to_stdout, self.kept)
        self.t0 = time.perf_counter()
        self._last_progress = 0.0

    def _wait_for_restarts(self, restarts: Any, echo: Callable[[str], None]) -> None:
        """Every selected engine died since the last cell and is being
        restarted: wait for them (bounded by the start timeout) rather than
        fail a cell the cluster can run in a few seconds."""
        from gpucell import config

        echo("gpucell: every selected engine died; waiting for their restarts")
        deadline = time.monotonic() + config.settings().start_timeout
        while not self.alive and restarts.pending and time.monotonic() < deadline:
            for r, info in restarts.step(self.gc):
                self._adopt_program(r.dead, info.id)
                self.alive.append(info.id)
            time.sleep(0.05)

    # -- transitions -----------------------------------------------------------

    def _hear_trials(self) -> None:
        """Read the paces that running trials on this host published at their
        budget (``shm.pace_path``; they run on meanwhile), and once the trials
        tell whether the loop looks uniform, say so (``shm.verdict_path``):
        ``1`` run whole, ``0`` stop and send the rest back."""
        if self.channel is None or self.verdict_file is not None:
            return
        for flight in list(self.inflight.values()):
            c = flight.chunk
            if not c.trial or c.id in self.paces_read or c.engine not in self.near:
                continue
            raw = shm.peek(shm.pace_path(self.channel, self.cell, c.engine, c.start))
            if raw is None or len(raw) != shm.PACE.size:
                continue
            self.paces_read.add(c.id)
            done, seconds, stamped = shm.PACE.unpack(raw)
            if stamped:  # an unstamped pace is no measure of unevenness
                self.sched.observe_trial(c.id, done, seconds)
        self._give_verdict()

    def _give_verdict(self) -> None:
        if self.channel is None or self.verdict_file is not None:
            return
        said = self.sched.verdict
        if said is None:
            return
        path = shm.verdict_path(self.channel, self.cell)
        if shm.put(path, b"1" if said else b"0"):
            self.verdict_file = path  # (not written: trials stop as usual)

    def _call_for_rests(self) -> None:
        """While an engine is idle with nothing left to hand out, chunks running
        on this host whose unrun rest would take longer than
        ``Schedule.hand_back_seconds`` stop after their current iteration and
        send it back to be shared out (``shm.hand_back_path``); the flag goes
        once every engine has work again."""
        if self.channel is None or not self.sched.stealing:
            return
        want = bool(self.sched.idle_engines()) and any(
            f.chunk.stoppable and f.chunk.engine in self.near
            for f in self.inflight.values()
        )
        path = shm.hand_back_path(self.channel, self.cell)
        if want:
            threshold = self.sched.hand_back_seconds()
            raised = self.hand_back_raised
            if raised is None or abs(raised - threshold) > 0.25 * threshold:
                shm.put(path, shm.HAND_BACK.pack(threshold))
                self.hand_back_raised = threshold
        elif self.hand_back_raised is not None:
            with contextlib.suppress(OSError):
                os.unlink(path)
            self.hand_back_raised = None

    def _awaiting_verdict(self) -> bool:
        """A trial on this host may be running on past its budget, waiting: one
        was heard, or one was sent less than ``HEARING_SECONDS`` past its budget
        ago (a trial waits only when its rest is short, so only when its
        iterations are; polling every 5 ms through a trial of 2 s iterations
        cost the kernel 3-6% of a core)."""
        if self.channel is None or self.verdict_file is not None:
            return False
        now = time.perf_counter()
        return any(
            f.chunk.trial
            and f.chunk.engine in self.near
            and (
                f.chunk.id in self.paces_read
                or now - f.sent < TRIAL_SECONDS + HEARING_SECONDS
            )
            for f in self.inflight.values()
        )

    def _forget_trials(self) -> None:
        """The verdict and the paces go with the run."""
        if self.channel is None:
            return
        paths = [
            shm.pace_path(self.channel, self.cell, c.engine, c.start)
            for c in self.sched.chunks
            if c.trial and c.engine in self.near
        ]
        paths.append(shm.verdict_path(self.channel, self.cell))
        paths.append(shm.hand_back_path(self.channel, self.cell))
        for path in paths:
            with contextlib.suppress(OSError):
                os.unlink(path)

    def _restarts(self) -> Any:
        return getattr(self.gc, "restarts", None)

    def _tidy_engines(self) -> None:
        """Engines free what a cell left by themselves once idle
        (``worker.after_cell``); a message is sent only for what they cannot
        decide alone: cached inputs whose kernel object is gone, and the
        /dev/shm files engines on another host published for each other (all
        of them mapped by now).  The kernel does not wait.  (A tidy task per
        engine after every cell cost back-to-back cells on 8 engines ~12 ms.)"""
        from gpucell.engine import worker

        if self.status != "ok":
            return  # after a failure an engine may still be busy or hung
        alive = list(self.sched.alive)
        drops = {e: self.gc.forget_cached(e, self.drop_inputs) for e in alive}
        targets = alive if self.leaders else [e for e in alive if drops[e]]
        if not targets:
            return
        try:  # one task for all (its message is built once)
            self.gc.client.direct_view(targets).apply_async(
                worker.TIDY_EACH, drops, kernel_key()
            )
        except Exception:
            pass

    def _forget_tasks(self) -> None:
        """The client keeps every task's result and metadata for ever (its
        history); this cell's are merged or dropped now, so it lets them go."""
        client = self.gc.client
        ids = [m for m in self._msg_ids if m in getattr(client, "results", {})]
        for m in ids:
            client.results.pop(m, None)
            client.metadata.pop(m, None)
        history = getattr(client, "history", None)
        if isinstance(history, list) and ids:
            gone = set(ids)
            history[:] = [m for m in history if m not in gone]
        self._msg_ids.clear()

    def _adopt_program(self, dead: int, eid: int) -> None:
        """A restarted engine runs the program of the engine it replaces (same
        device, so the same CUDA rewriting)."""
        if dead in self.programs:
            self.programs[eid] = self.programs[dead]
        elif self.programs:
            self.programs[eid] = next(iter(self.programs.values()))

    def _join_restarted(self) -> None:
        """Engines restarted after dying take work in this cell as they come back."""
        restarts = self._restarts()
        if restarts is None or not restarts.pending:
            return
        for r, info in restarts.step(self.gc):
            eid = info.id
            self._adopt_program(r.dead, eid)
            self.alive.append(eid)
            if self.gc.sees_shm(eid):
                self.near.add(eid)
            self.views[eid] = self.gc.view(eid)
            self._setup_engine(eid)
            self.sched.add_engine(eid)
            self.record.engines = (*self.record.engines, eid)
            msg = (
                f"engine {r.dead} was restarted as engine {eid} ({info.device}); "
                "it takes work now"
            )
            self.record.warnings.append(msg)
            self.echo(f"gpucell: {msg}")

    def submit(self) -> None:
        """Send every chunk the schedule hands out now (each engine keeps its next
        chunk queued)."""
        from gpucell.engine import worker

        options = self.options
        outgoing: list[tuple[Any, _RunArgs, bool]] = []
        busy = {f.chunk.engine for f in self.inflight.values()}
        for c in self.sched.fill():
            eid = c.engine
            assert eid is not None
            if c.attempt > options.retries:
                raise EnginesLost(
                    f"Iterations {c.start}-{c.stop - 1} were lost {c.attempt} times "
                    "(the engines running them died). Nothing was merged. If an "
                    "iteration kills its engine (out of memory, a crash), fix it, or "
                    "raise --retries."
                )
            frames = wire.dumps(self.chunk_of(c.start, c.stop))
            setup, input_frames = self.setups.pop(eid, (None, None))
            share = self.host_share.pop(eid, None)
            if share is not None and input_frames is not None:
                input_frames = self._once_per_host(eid, *share, input_frames)
            args = _RunArgs(
                self.cell,
                frames,
                c.start,
                eid,
                options.seed,
                setup,
                input_frames,
                self.channel,
                TRIAL_SECONDS if c.trial else None,
                kernel_key(),
                c.stoppable and eid in self.near,
            )
            # a chunk queued behind another waits on the engine, and an engine's
            # first chunk also loads the program and inputs (and the imports they
            # need): neither round trip says what dispatching a chunk costs
            timed = eid not in busy and setup is None
            busy.add(eid)
            outgoing.append((c, args, timed))
        wave = _one_message(outgoing)
        sent = self._send_wave(wave) if wave else []
        sent += [
            (c, self.views[c.engine].apply_async(worker.RUN, *args), timed)
            for c, args, timed in outgoing[len(wave) :]
        ]
        now = time.perf_counter()
        for c, ar, timed in sent:
            self.inflight[ar] = Flight(c, now if timed else None, now)
            ar.add_done_callback(self.ready.put)
            self._msg_ids.extend(ar.msg_ids)
            self.output.watch(ar, c)

    def _send_wave(self, wave: list[tuple[Any, _RunArgs, bool]]) -> list[Any]:
        """Several engines' chunks as one task (``worker.run_each``): ipyparallel
        serialises its arguments once and sends them to each engine, where 16
        ``apply_async`` calls, each pickling its own, kept the kernel busy 7-9 ms
        (25 ms while the first engines already ran) and the last engine waiting.
        Each engine's reply is its own AsyncResult (``AsyncResult.split``, in
        target order), as if sent alone."""
        from gpucell.engine import worker

        eids = [c.engine for c, _args, _timed in wave]
        table = {c.engine: _plain(args) for c, args, _timed in wave}
        big = self.gc.client.direct_view(eids).apply_async(worker.RUN_EACH, table)
        return [
            (c, ar, timed)
            for (c, _args, timed), ar in zip(wave, big.split(), strict=True)
        ]

    def _take_ready(self, wait: float) -> list[Any]:
        """Tasks in flight that finished: waits up to ``wait`` seconds for
        the first, then takes every other already there."""
        try:
            out = [self.ready.get(timeout=wait)]
        except queue.Empty:
            return []
        with contextlib.suppress(queue.Empty):
            while True:
                out.append(self.ready.get_nowait())
        # (a task cancelled or lost meanwhile has left inflight: nothing to do)
        return [ar for ar in out if ar in self.inflight]

    def on_done(self, ar: Any) -> None:
        """A chunk task finished: keep its result, or find out why it has none."""
        from ipyparallel.error import EngineError, RemoteError

        flight = self.inflight.pop(ar, None)
        if flight is None:
            return
        self.output.finished(ar)
        chunk, gc, record, sched = flight.chunk, self.gc, self.record, self.sched
        assert chunk.engine is not None
        try:
            # wait() can report a future whose result is set a moment before
            # ipyparallel marks it ready: allow that moment
            frames = ar.get(timeout=5)
        except EngineError:
            self.on_lost(chunk.engine)
            return
        except RemoteError as e:
            if not _engine_alive(gc, chunk.engine):
                self.on_lost(chunk.engine)
                return
            sched.end(chunk.id, FAILED)
            record.chunks.append(_record(chunk, gc, None, FAILED))
            raise IterationError(
                f"gpucell: engine {chunk.engine} failed running iterations "
                f"{chunk.start}-{chunk.stop - 1}: {e.ename}: {e.evalue}\n"
                f"{e.traceback or ''}"
            ) from None
        frames = shm.unspill(frames, record)
        reply: Reply = wire.loads(
            frames, items=self._own_item, cell_globals=self.namespace
        )
        status, payload, timing = reply
        cached = timing.get("cached")
        if cached is not None:
            # what the engine caches now, as it says (never assumed)
            gc.input_cache[chunk.engine] = dict(cached)
        if status == "unloaded":
            self._reload(chunk)
            return
        if timing.get("first", chunk.start) != chunk.start:
            # a reply matched to the wrong chunk would merge its values at the
            # wrong iterations: the cell fails, nothing merged
            raise ClusterError(
                f"gpucell: engine {chunk.engine} answered for iterations from "
                f"{timing['first']} where iterations {chunk.start}-{chunk.stop - 1} "
                "were sent; nothing was merged. Please report this."
            )
        if status == "error":
            if payload.get("oom") and self._retry_out_of_memory(chunk, payload):
                record.chunks.append(_record(chunk, gc, timing, FAILED))
                return
            sched.end(chunk.id, FAILED)
            record.chunks.append(_record(chunk, gc, timing, FAILED))
            raise_iteration_error(payload, chunk, gc, record)
        # a finished chunk is recorded whole: its result, its schedule state,
        # its provenance and its kept copy (an interrupt waits until then)
        with interrupts_deferred("a finished chunk was recorded"):
            self._finished(flight, chunk, payload, timing)

    def _own_item(self, iteration: int, path: tuple[Any, ...]) -> Any:
        """The kernel's own item of ``iteration`` that a result holds (the
        engine sent a reference: ``protocol.chunks.item_refs``)."""
        from gpucell.protocol.chunks import item_at

        return item_at(self.chunk_of(iteration, iteration + 1), path)

    def _finished(
        self, flight: Flight, chunk: Any, payload: Any, timing: Timing
    ) -> None:
        gc, record, sched = self.gc, self.record, self.sched
        record.drew.update(timing.get("drew") or ())
        self.results[chunk.start] = payload
        done = timing.get("done", chunk.size)  # fewer when a trial stopped early
        # a profiled schedule compares each chunk's time with the profile's cost
        # of the same iterations: it needs the whole time, not a median estimate
        # an unstamped chunk's pace (no stamp per iteration) is no measure of
        # how uneven the loop is beside stamped ones
        stamped = not timing.get("unstamped", False)
        # a trial's iterations, each timed: the first run's estimate of what
        # the rest of an uneven loop costs (Schedule's provisional profile)
        costs = (
            _iteration_seconds(timing, done)
            if chunk.trial and stamped and sched.takes_costs
            else None
        )
        # a chunk that stopped early to hand its rest to idle engines
        back = bool(timing.get("handed_back", False))
        if sched.profiled:
            sched.complete(
                chunk.id,
                timing["compute"],
                done=done,
                stamped=stamped,
                costs=costs,
                handed_back=back,
            )
        else:
            seconds = _robust_seconds(timing, done)
            sched.complete(
                chunk.id,
                seconds,
                done=done,
                stamped=stamped,
                costs=costs,
                handed_back=back,
            )
        if back:
            record.hand_backs += 1
        if chunk.trial:
            self._give_verdict()
        if flight.timed_from is not None:
            sched.observe_overhead(
                max(0.0, time.perf_counter() - flight.timed_from - timing["compute"])
            )
        elif chunk.engine in self.ends and timing["start"] > self.ends[chunk.engine]:
            # queued behind the engine's previous chunk: what a chunk costs is
            # the engine's dead time between the two (ipykernel's per-message
            # work, results out, the next chunk in), a few milliseconds
            sched.observe_overhead(timing["start"] - self.ends[chunk.engine])
        self.ends[chunk.engine] = timing["end"]
        record.add_chunk(_record(chunk, gc, timing, DONE))
        if self.on_chunk is not None:
            try:  # kept for --resume (and written to --checkpoint)
                self.on_chunk(chunk.start, chunk.stop, payload)
            except Exception as e:
                msg = f"could not keep iterations {chunk.start}-{chunk.stop - 1}: {e}"
                record.warnings.append(msg)
                self.echo(f"gpucell: warning: {msg}")

    def _hung(self, eid: int, now: float) -> str | None:
        """Why engine ``eid`` no longer answers, or ``None``: its process is
        stopped (SIGSTOP, a debugger), or its oldest chunk has run far longer
        than its measured pace says it should (a deadlock in a library)."""
        info = self.gc.engines.get(eid)
        if info is not None and info.local and process_state(info.pid) == "T":
            return "its process is stopped (SIGSTOP or a debugger)"
        flights = [f for f in self.inflight.values() if f.engine == eid]
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

    def _end_hung(self, eid: int, why: str) -> None:
        """A hung engine is ended (so no stale result can arrive later) and
        treated as lost: its chunks go to the others."""
        info = self.gc.engines.get(eid)
        if info is not None and info.local:
            for sig in (signal.SIGKILL, signal.SIGCONT):
                try:
                    os.kill(info.pid, sig)
                except OSError:
                    pass
        msg = f"engine {eid} stopped answering ({why}); it was ended"
        self.record.warnings.append(msg)
        self.echo(f"gpucell: warning: {msg}")
        self.on_lost(eid)

    def _reload(self, chunk: Any) -> None:
        """The engine had tidied this cell away, idle after its last chunk
        (``worker.after_cell``), before this chunk came: it ran nothing, and
        goes to the same engine again with the program and the inputs its cache
        lacks.  Not an attempt: nothing was lost."""
        assert chunk.engine is not None
        self.record.reloads += 1
        self.sched.requeue(chunk.id, chunk.engine)
        if chunk.engine not in self.setups:
            self._setup_engine(chunk.engine)

    def _retry_out_of_memory(self, chunk: Any, payload: ChunkError) -> bool:
        """Device memory ran out in an iteration: once more on the same engine
        (its cache was emptied), then once on the engine with the most free
        device memory, before the cell fails with the error."""
        key = (chunk.start, chunk.stop)
        tries = self.oom_tries.get(key, 0)
        others = [e for e in self.sched.alive if e != chunk.engine]
        if tries >= 2 or (tries == 1 and not others):
            return False
        target = chunk.engine if tries == 0 else self._most_free_memory(others)
        self.oom_tries[key] = tries + 1
        self.sched.requeue(chunk.id, target)
        where = "the same engine" if target == chunk.engine else f"engine {target}"
        msg = (
            f"iteration {payload.get('iteration')} ran out of device memory on "
            f"engine {chunk.engine}; retrying iterations {chunk.start}-"
            f"{chunk.stop - 1} on {where}"
        )
        self.record.warnings.append(msg)
        self.echo(f"gpucell: warning: {msg}")
        return True

    def _most_free_memory(self, engines: list[int]) -> int:
        """The engine whose device has the most free memory now (the last
        telemetry sample), else the first."""
        best, most = engines[0], -1.0
        sample = getattr(self.telemetry, "latest", None)
        for eid in engines:
            free = None
            if callable(sample):
                try:
                    s = sample(eid)
                    free = None if s is None else s.memory_total - s.memory_used
                except Exception:
                    free = None
            if free is not None and free > most:
                best, most = eid, float(free)
        return best

    def _name_a_killer(self, lost: list[Any], eid: int) -> None:
        """A re-run iteration, alone on its engine, ended that engine too: it is
        the cause, and running it again would end the next one."""
        for c in lost:
            if c.size != 1 or c.attempt < 1:
                continue
            before = [
                e for a, b, e in self.losses[:-1] if a <= c.start < b and e != eid
            ]
            if before:
                self.record.errors.append(f"iteration {c.start} ended its engines")
                raise EnginesLost(
                    f"iteration {c.start} ended engine {before[0]} and then engine "
                    f"{eid}: it is not retried again (it would end the next one). "
                    "Nothing was merged; the chunks that finished are kept, so "
                    "`%%gpu_parallel --resume` runs only the rest once it is "
                    "fixed. Run that iteration alone (serially) to see why: out of "
                    "memory, a crash in a library, os._exit..."
                )

    def _check_stopping(self) -> None:
        if getattr(self.gc, "stopping", False):
            self.inflight.clear()  # the cluster's tasks went with it
            raise ClusterStopped(
                "%%gpu_parallel: the cluster was stopped while the cell ran "
                f"(after {self.sched.done_iterations} of {self.n} iterations): "
                "nothing was merged. Start a cluster and run the cell again "
                "(`--resume` runs only the iterations that did not finish)."
            )

    def on_lost(self, eid: int) -> None:
        """Engine ``eid`` died: its chunks go back to the schedule for the others."""
        self._check_stopping()
        lost = self.sched.lose_engine(eid)
        self.gc.mark_dead(eid)
        restarts = self._restarts()
        if restarts is not None:
            restarts.begin(self.gc, eid)
        for c in lost:
            self.losses.append((c.start, c.stop, eid))
        for ar in [a for a, f in self.inflight.items() if f.chunk.engine == eid]:
            self.inflight.pop(ar)
            self.output.lost(ar)
        for c in lost:
            self.record.chunks.append(_record(c, self.gc, None, LOST))
        self._name_a_killer(lost, eid)
        msg = (
            f"engine {eid} died; re-running its {sum(c.size for c in lost)} "
            "iteration(s) on the others"
        )
        self.record.warnings.append(msg)
        self.echo(f"gpucell: warning: {msg}")
        restarting = restarts is not None and bool(restarts.pending)
        if not self.sched.alive and not restarting:
            ranges = ", ".join(f"{a}-{b - 1}" for a, b in self.sched.pending_ranges())
            raise EnginesLost(
                f"Every engine died; iterations {ranges} never completed. Nothing "
                "was merged. Restart the cluster (`%gpu_cluster stop` then `start`)."
            )

    def cancel(self) -> None:
        """Abort queued chunk tasks, signal running ones, wait until engines are
        idle; every chunk still in flight is recorded as cancelled.

        Every engine with an unfinished task is signalled, whether or not its
        "started" notice has arrived yet: an idle engine ignores SIGINT, and
        waiting for the notice could leave a running chunk to finish on its own.
        """
        inflight, gc = self.inflight, self.gc
        if not inflight:
            return
        grace = self.options.interrupt_grace
        ars = list(inflight)
        try:
            gc.client.abort([m for ar in ars for m in ar.msg_ids], block=False)
        except Exception:
            pass
        running = sorted({f.engine for ar, f in inflight.items() if not ar.done()})
        if running:
            signal_engines(gc, running, signal.SIGINT)
        concurrent.futures.wait(ars, timeout=grace)
        still = [ar for ar in ars if not ar.done()]
        if still:  # a C extension ignoring SIGINT: signal again once
            signal_engines(
                gc, sorted({inflight[ar].engine for ar in still}), signal.SIGINT
            )
            concurrent.futures.wait(still, timeout=grace)
        for flight in inflight.values():
            c = flight.chunk
            if c.state == RUNNING:
                self.sched.end(c.id, CANCELLED)
                self.record.chunks.append(_record(c, gc, None, CANCELLED))
        inflight.clear()

    def snapshot(self, status: RunStatus | None = None) -> RunSnapshot:
        """The run as the display shows it now."""
        return snapshot(
            self.gc,
            self.alive,
            self.sched,
            time.perf_counter() - self.t0,
            status or self.status,
        )

    # -- the wait loop -----------------------------------------------------------

    def report(self, force: bool = False) -> None:
        now = time.perf_counter()
        if self.progress is None or (
            not force and now - self._last_progress < self.progress_period
        ):
            return
        self._last_progress = now
        try:
            self.progress(self.snapshot())
        except Exception as e:  # the display must never break the loop
            self.record.warnings.append(f"progress display failed: {e!r}")

    def _finish(self, status: RunStatus) -> None:
        self.status = self.record.status = status
        self.record.wall = time.perf_counter() - self.t0
        self.report(force=True)

    def execute(self) -> list[Any]:
        """Ship, submit and wait until every iteration is done; the chunk results
        in iteration order.  On an interrupt, a timeout or an error, outstanding
        work is cancelled, engines are left idle and nothing is returned."""
        with stop_button() as pressed:
            return self._execute(pressed)

    def _execute(self, pressed: list[int]) -> list[Any]:
        """The blocking drive: :meth:`begin`, :meth:`step` until finished,
        :meth:`end`.  (A caller on the kernel's event loop makes the same
        calls from callbacks instead.)"""
        try:
            self.begin()
            while not self.sched.finished:
                if pressed:
                    pressed.clear()
                    raise _Interrupted("interrupt")
                self.step()
        except BaseException as e:
            self.abort(e)
        return self.end()

    def begin(self) -> None:
        """Send the first chunks (the inputs ride along)."""
        options = self.options
        self._deadline = self.t0 + options.timeout if options.timeout else None
        self._last_check = 0.0
        self.submit()

    @property
    def finished(self) -> bool:
        return bool(self.sched.finished)

    def step(self, wait: float | None = None) -> None:
        """One turn of the run: take what finished (waiting at most ``wait``
        seconds, by default 5 ms while trials await a verdict, else 50 ms),
        notice lost, hung and restarted engines, send what is next.  Raises
        what ends the run early (a timeout, lost engines, an iteration's
        error); the caller passes it to :meth:`abort`."""
        sched = self.sched
        deadline = getattr(self, "_deadline", None)
        if deadline is not None and time.perf_counter() > deadline:
            raise _Interrupted("timeout")
        self._check_stopping()
        if wait is None:  # trials waiting on a verdict are heard every 5 ms
            wait = 0.005 if self._awaiting_verdict() else 0.05
        done = self._take_ready(wait)
        self.output.poll(self.inflight)
        if self.telemetry is not None:
            self.telemetry.poll(self.inflight)
        for ar in done:
            self.on_done(ar)
        self._hear_trials()
        now = time.perf_counter()
        if now - self._last_check > 0.2 or not self.inflight:
            self._last_check = now
            check = getattr(self.gc, "check_controller", None)
            if check is not None:
                check()
            self._join_restarted()
            for eid in sched.alive:
                if not _engine_alive(self.gc, eid):
                    self.on_lost(eid)
                elif (why := self._hung(eid, now)) is not None:
                    self._end_hung(eid, why)
        self.submit()
        self._call_for_rests()
        self.report()
        restarts = self._restarts()
        if not self.inflight and not sched.finished:
            if restarts is not None and restarts.pending:
                time.sleep(0.05)
                return  # an engine is coming back for the rest
            raise EnginesLost("No work in flight and the loop is not finished.")

    def abort(self, error: BaseException) -> NoReturn:
        """The run ends early: outstanding work is cancelled, engines left
        idle, nothing returned; raises what the user sees (a timeout, an
        interrupt, or ``error`` itself)."""
        options, sched = self.options, self.sched
        stop = error
        if isinstance(error, KeyboardInterrupt):
            stop = _Interrupted("interrupt")
        try:
            if isinstance(stop, _Interrupted):
                self.cancel()
                self._finish("timeout" if stop.reason == "timeout" else "interrupted")
                if stop.reason == "timeout":
                    raise CellTimeout(
                        f"%%gpu_parallel --timeout {options.timeout:g} s reached "
                        f"after {sched.done_iterations} of {self.n} iterations; "
                        "outstanding work was cancelled and nothing was merged."
                    ) from None
                raise KeyboardInterrupt(
                    f"gpucell: interrupted after {sched.done_iterations} of "
                    f"{self.n} iterations; engines stopped their work, nothing "
                    "was merged"
                ) from None
            self.cancel()
            self._finish("error")
            raise error
        finally:
            self._release()

    def end(self) -> list[Any]:
        """Every iteration is done: the chunk results in iteration order."""
        self._release()
        self._finish("ok")
        self._tidy_engines()
        return [self.results[k] for k in sorted(self.results)]

    def _release(self) -> None:
        """What the run holds beyond its end, let go (once)."""
        if getattr(self, "_released", False):
            return
        self._released = True
        self.output.flush(self.inflight)
        self._forget_tasks()
        for frames in self.mapped.values():  # every engine maps it by now
            shm.release(frames)
        self._forget_trials()
        if self.channel is not None and (
            self.status != "running" or self.record.warnings
        ):
            self.gc.sweep_results()  # results abandoned by a failure or a loss


@contextlib.contextmanager
def stop_button() -> Iterator[list[int]]:
    """SIGINT (the stop button) recorded while a run waits, and acted on by its
    wait loop: a KeyboardInterrupt raised wherever the signal lands can be
    swallowed (inside a C finaliser such as pyzmq's ``Frame.__dealloc__``), a
    flag cannot.  A press the loop did not act on (it came as the run ended)
    is passed on as a KeyboardInterrupt once the previous handler is back."""
    pressed: list[int] = []
    if threading.current_thread() is not threading.main_thread():
        yield pressed
        return

    def on_sigint(signum: int, frame: Any) -> None:
        pressed.append(signum)

    previous = signal.signal(signal.SIGINT, on_sigint)
    try:
        yield pressed
    finally:
        signal.signal(signal.SIGINT, previous)
    if pressed:
        raise KeyboardInterrupt("gpucell: interrupted as the run ended")


#: a first wave of chunks goes as one message to every engine only while all of
#: them together are this small (each engine receives every engine's part)
WAVE_BYTES = 256 << 10


#: ``worker.run``'s arguments for one chunk (the conversation's own type)
_RunArgs = ChunkTask


def _one_message(
    outgoing: list[tuple[Any, _RunArgs, bool]],
) -> list[tuple[Any, _RunArgs, bool]]:
    """The leading chunks of ``outgoing`` that can travel as one message: one per
    engine, two or more, and small together (chunk, inputs and program); empty
    when they cannot (then each goes alone, in order)."""
    wave: list[tuple[Any, _RunArgs, bool]] = []
    engines: set[int] = set()
    total = 0
    for item in outgoing:
        c, args = item[0], item[1]
        if c.engine in engines:
            break
        total += wire.frames_nbytes(args.chunk_frames)
        total += wire.frames_nbytes(args.input_frames or [])
        if args.setup is not None:
            total += len(str(args.setup.get("program", "")))
        engines.add(c.engine)
        wave.append(item)
    return wave if len(wave) > 1 and total <= WAVE_BYTES else []


def _plain(args: _RunArgs) -> tuple[Any, ...]:
    """``worker.run``'s arguments as a plain tuple with frames as bytes: inside
    the one message they are pickled (on engines that need not import this
    module), and pickle takes no memoryview."""

    def flat(frames: Any) -> Any:
        if frames is None:
            return None
        return [f if isinstance(f, bytes) else bytes(memoryview(f)) for f in frames]

    return tuple(
        args._replace(
            chunk_frames=flat(args.chunk_frames), input_frames=flat(args.input_frames)
        )
    )


def run_chunks(gc: GpuCluster, targets: Sequence[int], **kwargs: Any) -> list[Any]:
    """Run every iteration of ``range(n)`` on ``targets``; return chunk results in
    iteration order (the arguments are :class:`Run`'s)."""
    run = Run(gc, targets, **kwargs)
    run.ship_inputs()
    return run.execute()


def snapshot(
    gc: GpuCluster,
    engines: Sequence[int],
    sched: Schedule,
    elapsed: float,
    status: RunStatus,
) -> RunSnapshot:
    """The run as the display shows it (pure function of the schedule)."""
    rows = []
    for eid in engines:
        info = gc.engines.get(eid)
        done_its, done_secs = sched.engine_progress(eid)
        running = sched.outstanding(eid)
        state: EngineState
        if eid not in sched.alive:
            state = DEAD
        elif any(c.attempt > 0 for c in running):
            state = RETRYING
        elif running and status == "running":
            state = BUSY
        else:
            state = IDLE
        rows.append(
            EngineProgress(
                engine=eid,
                host=info.host if info else "",
                device=info.device if info else "",
                name=info.name if info else "",
                pid=info.pid if info else 0,
                kind=info.kind if info else "cpu",
                index=info.index if info else -1,
                done=done_its,
                busy_seconds=done_secs,
                state=state,
            )
        )
    return RunSnapshot(
        total=sched.n,
        done=sched.done_iterations,
        elapsed=elapsed,
        engines=tuple(rows),
        status=status,
    )


def _record(
    chunk: Chunk, gc: GpuCluster, timing: Timing | None, state: ChunkState
) -> ChunkRecord:
    info = gc.engines.get(chunk.engine) if chunk.engine is not None else None
    return ChunkRecord(
        start=chunk.start,
        stop=chunk.stop,
        engine=chunk.engine if chunk.engine is not None else -1,
        host=timing["host"] if timing else (info.host if info else ""),
        device=info.device if info else "",
        t_start=timing["start"] if timing else 0.0,
        t_end=timing["end"] if timing else 0.0,
        compute=timing["compute"] if timing else 0.0,
        attempt=chunk.attempt,
        state=state,
        iteration_starts=tuple(timing["starts"]) if timing else (),
    )


def _iteration_seconds(timing: Timing, done: int) -> list[float] | None:
    """Each iteration's seconds, from the engine's stamp at each start and the
    chunk's end (``None`` when the chunk was not stamped throughout)."""
    starts = timing.get("starts") or []
    if done < 1 or len(starts) != done:
        return None
    return iteration_seconds(starts, timing["end"])


def _robust_seconds(timing: Timing, size: int) -> float:
    """A chunk's compute time for the schedule's speed estimates.

    The median iteration (which the engine computes for chunks of 3 or more)
    times the iteration count: an engine's first iteration also pays one-time
    costs (first imports, warm-up) that would make it look slow.
    """
    median = timing.get("median")
    if median is not None and size >= 3:
        return float(median) * size
    return float(timing["compute"])


# the private names kernel/distributed.py imported, until it uses the public ones
_signal_engines = signal_engines
_stop_button = stop_button
