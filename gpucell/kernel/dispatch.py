"""Run a loop plan's chunks on the engines: the only code that talks to ipyparallel
during a ``%%gpu_parallel`` cell.

A thin executor over the pure run state (:class:`gpucell.core.run_state.RunState`):
it turns ipyparallel's results, ``/proc`` reads, the ``/dev/shm`` paces and the
stop button into events, and carries out the instructions the state answers
with (send chunks, tell the trials, end a hung engine, record, keep, warn,
fail).  It ships the program and inputs (:mod:`gpucell.kernel.shipping`), relays
output as it arrives, and never touches the user's namespace: it returns the
chunk results in iteration order and the merge does the rest.  Driven by the
blocking wait (:meth:`Run.execute`) or step by step from the kernel's event
loop (:meth:`Run.begin`, :meth:`Run.step`, :meth:`Run.abort`, :meth:`Run.end`).
"""

from __future__ import annotations

import contextlib
import queue
import sys
import time
import uuid
from collections.abc import Callable, Sequence
from typing import Any, Literal, NoReturn

from gpucell.cluster.lifecycle import GpuCluster
from gpucell.core import run_events as ev
from gpucell.core.provenance import LastRun
from gpucell.core.run_events import Flight
from gpucell.core.run_report import snapshot
from gpucell.core.run_state import (
    HEARING_SECONDS,
    HUNG_AFTER,
    HUNG_FACTOR,
    TRIAL_SECONDS,
    RunState,
)
from gpucell.core.runstate import RunSnapshot
from gpucell.core.schedule import Schedule
from gpucell.core.states import RunStatus
from gpucell.devices.host import kernel_key, process_state
from gpucell.errors import EnginesLost
from gpucell.kernel.chunk_channel import channel_for, channel_setting, route
from gpucell.kernel.executor import Executor, engine_alive, live_engines, signal_engines
from gpucell.kernel.feedback import Feedback
from gpucell.kernel.gcpause import kernel_heap_frozen
from gpucell.kernel.interrupts import interrupts_absorbed, interrupts_deferred
from gpucell.kernel.relay import OutputRelay
from gpucell.kernel.run_options import Options
from gpucell.kernel.sending import (
    WAVE_BYTES,
    Outgoing,
    cheap_to_resend,
    one_message,
    send_wave,
)
from gpucell.kernel.shipping import InputShipping
from gpucell.kernel.stopping import stop_button
from gpucell.protocol import shm, wire
from gpucell.protocol.conversation import ChunkTask, Reply
from gpucell.protocol.program import Watch

__all__ = [
    "TRIAL_SECONDS",
    "Options",
    "Run",
    "run_chunks",
    "signal_engines",
    "stop_button",
]
# (also here for the callers and tests that import them from this module)
_ALSO = (HEARING_SECONDS, HUNG_AFTER, HUNG_FACTOR, WAVE_BYTES, Flight, snapshot)


class _Interrupted(Exception):
    def __init__(self, reason: str) -> None:
        self.reason = reason


def _to_stdout(text: str) -> None:
    sys.stdout.write(text)
    sys.stdout.flush()


def _schedule(
    gc: GpuCluster, alive: list[int], n: int, options: Options, **policy: Any
) -> Schedule:
    return Schedule(
        n,
        alive,
        mode=options.schedule,
        chunksize=options.chunksize,
        hint=options.cost_hint,
        uniform=options.uniform,
        profile=options.profile,
        heterogeneous=len({(gc.engines[e].kind, gc.engines[e].name) for e in alive})
        > 1,
        trial=True,
        **policy,
    )


class Run(InputShipping, Executor):
    """One cell's chunks on the engines: a :class:`RunState` (``state``) and
    the I/O that feeds it and carries out what it says.

    ``gc`` is anything shaped like :class:`gpucell.cluster.lifecycle.GpuCluster`
    (engines, client, ``view()``, ``mark_dead()``, the input cache and the
    shared-memory channel); tests drive a Run with a fake one.  ``programs``:
    the engine program per engine; ``inputs``: what the body reads (sent when
    an engine's cached copy differs); ``chunk_of(start, stop)``: the chunk
    object; ``record``: provenance, filled in as chunks end; ``relay``: where
    engine output goes; ``progress``: called with a snapshot every
    ``progress_period`` s and at the end; ``telemetry``: the cluster's
    sampler; ``watch``: what the engines check around each chunk; ``kept``:
    ranges done by an earlier run (``--resume``), ``on_chunk`` keeps new ones.
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
        self._told_before = len(getattr(gc, "warnings", ()))  # (_no_engine_left)
        # the notebook's: functions the loop's code made get it as globals
        self.namespace = namespace
        self.kept = tuple(kept)
        self.on_chunk = on_chunk
        # cached inputs whose kernel object is gone (``del big``): dropped
        self.drop_inputs = drop_inputs
        self.cache_bytes = int(cache_bytes)
        self.watch: Watch = watch or {"names": [], "items": False, "modes": []}
        self.programs, self.inputs, self.n = programs, inputs, n
        self.chunk_of, self.options, self.record = chunk_of, options, record
        self.echo, self.progress = echo, progress
        self.progress_period = progress_period
        self.telemetry = telemetry
        self.cell = uuid.uuid4().hex
        self.quiet_idle = self.quiet_idle_setting()
        self.alive = live_engines(gc, targets, record, echo)
        restarts = getattr(gc, "restarts", None)
        if not self.alive and restarts is not None and restarts.pending:
            self._wait_for_restarts(restarts, echo)
        if not self.alive:
            raise EnginesLost(
                "No live engine among the selected ones; check `%gpu_cluster status` "
                "and restart the cluster."
            )
        record.engines = tuple(self.alive)
        record.iterations = n
        self._io_state()
        self.state = self._run_state()
        record.schedule = self.sched.mode + (
            " (profiled)" if self.sched.profiled else ""
        )
        self.views = {eid: gc.view(eid) for eid in self.alive}
        self.output = OutputRelay(gc.client, relay or _to_stdout, self.kept)
        self.t0 = time.perf_counter()
        self._last_progress = 0.0

    def _io_state(self) -> None:
        """What the executor holds: tasks in flight, shipping, the channel."""
        # task -> its chunk id; tasks as they finish, put by their done-callbacks
        # (ipyparallel's IO thread): the wait loop takes what is there, where
        # waiting on every task in flight set up a waiter on each, per wake-up
        self.tasks: dict[Any, int] = {}
        self._task_of: dict[int, Any] = {}
        self.ready: queue.SimpleQueue[Any] = queue.SimpleQueue()
        self._msg_ids: list[str] = []  # this cell's tasks, forgotten at its end
        # engine -> (program, input names, fingerprints), input frames: travels
        # with the engine's first chunk
        self.setups: dict[int, tuple[Any, Any]] = {}
        self.mapped: dict[tuple[str, ...], list[Any]] = {}  # inputs in /dev/shm
        # (host, input names) -> (engine, its pid, tag): who publishes them there
        self.leaders: dict[tuple[str, tuple[str, ...]], tuple[int, int, str]] = {}
        self.host_share: dict[int, tuple[tuple[str, ...], int]] = {}
        self.channel = self.gc.results_channel()
        self.feedback = Feedback(self.channel, self.cell)
        self.chunk_channel: Any = None  # opened as the first chunks go
        self._channel_wanted = self.channel is not None and channel_setting()

    def _run_state(self) -> RunState:
        gc, channel = self.gc, self.channel
        near = {e for e in self.alive if gc.sees_shm(e)}  # publish paces
        sched = _schedule(
            gc,
            self.alive,
            self.n,
            self.options,
            # every engine hears the verdict on the trials: one trial each
            heard=channel is not None and set(self.alive) <= near,
            kept=self.kept,
            # chunks on this host hand their rest back to idle engines
            stealing=channel is not None and bool(near),
        )
        if sched.trial and not cheap_to_resend(self.chunk_of, self.n):
            # (probed only for schedules that would send trial chunks at all)
            sched.trial = False
        return RunState(
            sched, self.options.retries, near=near, channel=channel is not None
        )

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

    # -- events in -------------------------------------------------------------------

    def submit(self) -> None:
        """Send every chunk the schedule hands out now."""
        from gpucell.engine import worker

        answer = self.state.handle(ev.Fill(unset=frozenset(self.setups)))
        sends = [i for i in answer if isinstance(i, ev.Send)]
        self._do([i for i in answer if not isinstance(i, ev.Send)])
        outgoing: list[Outgoing] = [(s.chunk, self._task(s), True) for s in sends]
        if self._channel_wanted:  # (once: the engines on this host now)
            self._channel_wanted = False
            self.chunk_channel = channel_for(self.gc, self.alive)
        outgoing, routed, opening = route(self.chunk_channel, outgoing)
        wave = one_message(outgoing)
        sent = send_wave(self.gc.client, wave) if wave else []
        sent += [
            (c, self.views[c.engine].apply_async(worker.RUN, *args), timed)
            for c, args, timed in outgoing[len(wave) :]
        ]
        if self.chunk_channel is not None:  # (serving tasks behind first chunks)
            sent += self.chunk_channel.send_all(opening, routed, self.views)
        for c, ar, _timed in sent:
            self.tasks[ar] = c.id
            self._task_of[c.id] = ar
            ar.add_done_callback(self.ready.put)
            self._msg_ids.extend(ar.msg_ids)
            self.output.watch(ar, c)
        if sent:
            self._tell(ev.Sent(tuple(c.id for c, _ar, _t in sent), time.perf_counter()))

    def _task(self, send: ev.Send) -> ChunkTask:
        """``worker.run``'s arguments for ``send`` (the engine's setup rides
        its first chunk)."""
        c = send.chunk
        eid = c.engine
        assert eid is not None
        frames = wire.dumps(self.chunk_of(c.start, c.stop))
        setup, input_frames = self.setups.pop(eid, (None, None))
        share = self.host_share.pop(eid, None)
        if share is not None and input_frames is not None:
            input_frames = self._once_per_host(eid, *share, input_frames)
        return ChunkTask(
            self.cell,
            frames,
            c.start,
            eid,
            self.options.seed,
            setup,
            input_frames,
            self.channel,
            send.budget,
            kernel_key(),
            send.stoppable,
            self.options.reseed,
            self.quiet_idle,
        )

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
        # (a task cancelled or lost meanwhile has left flight: nothing to do)
        return [ar for ar in out if ar in self.tasks]

    def on_done(self, ar: Any) -> None:
        """A chunk task finished: its reply, decoded, is an event."""
        from ipyparallel.error import EngineError, RemoteError

        cid = self.tasks.pop(ar, None)
        if cid is None or cid not in self.state.flights:
            return
        self._task_of.pop(cid, None)
        self.output.finished(ar)
        eid = self.state.flights[cid].engine
        try:
            # wait() can report a future whose result is set a moment before
            # ipyparallel marks it ready: allow that moment
            frames = ar.get(timeout=5)
        except EngineError:
            return self.on_lost(eid)
        except RemoteError as e:
            if not engine_alive(self.gc, eid):
                return self.on_lost(eid)
            return self._tell(
                ev.Raised(cid, f"{e.ename}: {e.evalue}\n{e.traceback or ''}")
            )
        frames = shm.unspill(frames, self.record)
        reply: Reply = wire.loads(
            frames, items=self._own_item, cell_globals=self.namespace
        )
        status, payload, timing = reply
        if timing.get("quiet"):
            self.output_complete(ar)
        cached = timing.get("cached")
        if cached is not None:
            # what the engine caches now, as it says (never assumed)
            self.gc.input_cache[eid] = dict(cached)
        free = self._free_memory() if status == "error" and payload.get("oom") else {}
        event = ev.Replied(cid, status, payload, timing, time.perf_counter(), free)
        if status != "ok":
            return self._tell(event)
        # a finished chunk is recorded whole: its result, its schedule state,
        # its provenance and its kept copy (an interrupt waits until then)
        with interrupts_deferred("a finished chunk was recorded"):
            self._tell(event)

    def _own_item(self, iteration: int, path: tuple[Any, ...]) -> Any:
        """The kernel's own item of ``iteration`` that a result holds (the
        engine sent a reference: ``protocol.chunks.item_refs``)."""
        from gpucell.protocol.chunks import item_at

        return item_at(self.chunk_of(iteration, iteration + 1), path)

    def _free_memory(self) -> dict[int, float]:
        """Free device memory per live engine, from the last telemetry sample."""
        free: dict[int, float] = {}
        sample = getattr(self.telemetry, "latest", None)
        if not callable(sample):
            return free
        for eid in self.sched.alive:
            try:
                s = sample(eid)
            except Exception:
                continue
            if s is not None:
                free[eid] = float(s.memory_total - s.memory_used)
        return free

    def on_lost(self, eid: int) -> None:
        """Engine ``eid`` died: its chunks go back to the schedule for the others."""
        if self.chunk_channel is not None:
            self.chunk_channel.engine_gone(eid)
        self._check_stopping()
        restarts = self._restarts()
        batch = getattr(restarts, "batch", None)  # a job Slurm ended: no one's fault
        ended = batch is not None and batch.lost(self.gc, restarts, eid)
        self._tell(ev.EngineGone(eid, job_ended=ended))

    def _check_stopping(self) -> None:
        if getattr(self.gc, "stopping", False):
            self._tell(ev.Stopping())

    def _hear_trials(self) -> None:
        """Read the paces running trials on this host published at their
        budget (they run on meanwhile); the verdict once they tell."""
        if self.channel is None or self.state.verdict_given:
            return
        for heard in self.feedback.paces(self.state.listening()):
            self._tell(heard)
        self._tell(ev.TrialsHeard())

    def _check_engines(self, now: float) -> None:
        """Lost, hung and restarted engines (every 0.2 s, or with nothing in
        flight)."""
        check = getattr(self.gc, "check_controller", None)
        if check is not None:
            check()
        self._join_restarted()
        for eid in self.sched.alive:
            if not engine_alive(self.gc, eid):
                self.on_lost(eid)
            elif (why := self._hung(eid, now)) is not None:
                self._check_stopping()
                self._tell(ev.EngineStalled(eid, why))

    def _hung(self, eid: int, now: float) -> str | None:
        """Why engine ``eid`` no longer answers: its process is stopped
        (SIGSTOP, a debugger), or the state finds its chunk overdue."""
        info = self.gc.engines.get(eid)
        if info is not None and info.local and process_state(info.pid) == "T":
            return "its process is stopped (SIGSTOP or a debugger)"
        return self.state.overdue(eid, now)

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
        if restarts is None or not (
            restarts.pending or restarts.joining or getattr(restarts, "batch", None)
        ):
            return
        for r, info in restarts.step(self.gc):
            eid = info.id
            self._adopt_program(r.dead, eid)
            self.alive.append(eid)
            self.views[eid] = self.gc.view(eid)
            self._setup_engine(eid)
            self.record.engines = (*self.record.engines, eid)
            self._tell(ev.EngineBack(eid, r.dead, info.device, self.gc.sees_shm(eid)))

    # -- instructions out ------------------------------------------------------------

    def _do_reload(self, ins: ev.Reload) -> None:
        self.record.reloads += 1
        if ins.engine not in self.setups:
            self._setup_engine(ins.engine)

    def _do_finish(self, ins: ev.Finish) -> None:
        self.record.status = ins.status
        self.record.wall = time.perf_counter() - self.t0
        self.report(force=True)

    # -- the display -------------------------------------------------------------------

    def snapshot(self, status: RunStatus | None = None) -> RunSnapshot:
        """The run as the display shows it now."""
        restarts = self._restarts()
        return snapshot(
            self.gc.engines,
            self.alive,
            self.sched,
            time.perf_counter() - self.t0,
            status or self.status,
            restarting={r.dead for r in restarts.pending} if restarts else (),
            replaces=self.state.restarted_from,
        )

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

    # -- the drive ---------------------------------------------------------------------

    def execute(self) -> list[Any]:
        """Ship, submit and wait until every iteration is done; the chunk results
        in iteration order.  On an interrupt, a timeout or an error, outstanding
        work is cancelled, engines are left idle and nothing is returned."""
        # (no full collection of the kernel's heap holds the GIL meanwhile)
        with stop_button() as pressed, kernel_heap_frozen():
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

    def step(self, wait: float | None = None) -> None:
        """One turn of the run: take what finished (waiting at most ``wait``
        seconds, by default 5 ms while trials await a verdict, else 50 ms),
        notice lost, hung and restarted engines, send what is next.  Raises
        what ends the run early (a timeout, lost engines, an iteration's
        error); the caller passes it to :meth:`abort`."""
        deadline = getattr(self, "_deadline", None)
        if deadline is not None and time.perf_counter() > deadline:
            raise _Interrupted("timeout")
        self._check_stopping()
        if wait is None:  # trials waiting on a verdict are heard every 5 ms
            awaiting = self.state.awaiting_verdict(time.perf_counter())
            wait = 0.005 if awaiting else 0.05
        done = self._take_ready(wait)
        self.output.poll(self.inflight)
        if self.telemetry is not None:
            self.telemetry.poll(self.inflight)
        for ar in done:
            self.on_done(ar)
        self._hear_trials()
        now = time.perf_counter()
        if now - self._last_check > 0.2 or not self.tasks:
            self._last_check = now
            self._check_engines(now)
        self.submit()
        self._tell(ev.Tick())
        self.report()
        if not self.tasks and not self.sched.finished:
            restarts = self._restarts()
            if restarts is not None and restarts.pending:
                time.sleep(0.05)
                return  # an engine is coming back for the rest
            raise EnginesLost(self._no_engine_left())

    def abort(self, error: BaseException) -> NoReturn:
        """The run ends early: outstanding work is cancelled, engines left
        idle, nothing returned; raises what the user sees (a timeout, an
        interrupt, or ``error`` itself)."""
        stop = error
        if isinstance(error, KeyboardInterrupt):
            stop = _Interrupted("interrupt")
        try:
            with interrupts_absorbed():  # (a press again while stopping)
                if isinstance(stop, _Interrupted):
                    timeout = stop.reason == "timeout"
                    reason: Literal["interrupt", "timeout"] = (
                        "timeout" if timeout else "interrupt"
                    )
                    self._tell(ev.Stop(reason, self.options.timeout))
                self._tell(ev.Failed())
            raise error
        finally:
            self._release()

    def end(self) -> list[Any]:
        """Every iteration is done: the chunk results in iteration order."""
        self._release()
        self._tell(ev.Completed())
        self._tidy_engines()
        return self.state.in_order()

    # -- after the run ---------------------------------------------------------------


def run_chunks(gc: GpuCluster, targets: Sequence[int], **kwargs: Any) -> list[Any]:
    """Run every iteration of ``range(n)`` on ``targets``; return chunk results in
    iteration order (the arguments are :class:`Run`'s)."""
    run = Run(gc, targets, **kwargs)
    run.ship_inputs()
    return run.execute()


_engine_alive = engine_alive
# the private names kernel/distributed.py imported, until it uses the public ones
_signal_engines = signal_engines
_stop_button = stop_button
