"""The dispatcher's hands: how a :class:`gpucell.kernel.dispatch.Run` carries out
the run state's instructions (:mod:`gpucell.core.run_events`) against the
cluster, ``/dev/shm``, the engines' processes and the run's record, and lets go
of what the run held once it ends.  A mixin of ``Run``, whose state it reads.
"""

from __future__ import annotations

import concurrent.futures
import logging
import os
import signal
from collections.abc import Callable, Sequence
from typing import Any, NoReturn

from gpucell.cluster.lifecycle import GpuCluster
from gpucell.core import run_events as ev
from gpucell.core.provenance import LastRun
from gpucell.core.run_events import Flight, Instruction
from gpucell.core.run_report import chunk_record
from gpucell.core.run_state import RunState
from gpucell.core.schedule import Schedule
from gpucell.core.states import DONE, LOST, RunStatus
from gpucell.devices.host import kernel_key, pid_running
from gpucell.kernel.chunk_errors import raise_iteration_error
from gpucell.kernel.feedback import Feedback
from gpucell.protocol import shm

__all__ = ["Executor", "engine_alive", "live_engines", "signal_engines"]

#: the dispatcher's decisions in a run (a lost engine's chunks sent again, a
#: stalled engine ended, a chunk that failed, device memory retries, the stop),
#: for users who ask: ``logging.getLogger("gpucell")`` with a handler and a level
log = logging.getLogger(__name__)


def engine_alive(gc: GpuCluster, eid: int) -> bool:
    """Local engines by pid (noticed within ~0.2 s); others by registration
    (the controller's heartbeat)."""
    info = gc.engines.get(eid)
    if eid in gc.dead or eid not in gc.client.ids:
        return False
    if info is None or not info.local:
        return True
    return pid_running(info.pid)


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


def live_engines(
    gc: GpuCluster, targets: Sequence[int], record: LastRun, echo: Callable[[str], None]
) -> list[int]:
    """The selected engines alive now; the dead are marked and restarted."""
    alive = [e for e in targets if engine_alive(gc, e)]
    gone = [e for e in targets if e not in alive]
    restarts = getattr(gc, "restarts", None)
    for eid in gone:  # (restarting before dead: displays never read it just dead)
        if restarts is not None:
            restarts.begin(gc, eid)  # joins this cell when it is back
        gc.mark_dead(eid)  # died since the last cell: status says so now
    if gone and alive:
        which = ", ".join(map(str, gone))
        msg = (
            f"engine{'s' if len(gone) > 1 else ''} {which} died since the last "
            f"cell; running on {len(alive)} of {len(targets)} selected "
            "engines (`%gpu_cluster status`)"
        )
        log.warning("%s", msg)
        record.warnings.append(msg)
        echo(f"gpucell: warning: {msg}")
    return alive


class Executor:
    """Carrying out instructions, and the run's end (see ``Run``)."""

    # (filled by Run.__init__; declared for the type checker)
    gc: Any
    record: LastRun
    state: RunState
    feedback: Feedback
    tasks: dict[Any, int]
    _task_of: dict[int, Any]
    _msg_ids: list[str]
    chunk_channel: Any  # kernel/chunk_channel.ChunkChannel, or None
    output: Any
    options: Any
    on_chunk: Callable[[int, int, Any], None] | None
    echo: Callable[[str], None]
    channel: Any
    mapped: dict[tuple[str, ...], list[Any]]
    leaders: dict[tuple[str, tuple[str, ...]], tuple[int, int, str]]
    drop_inputs: Callable[[str], bool]
    _told_before: int  # the cluster's warnings when the run began

    @property
    def sched(self) -> Schedule:
        return self.state.sched

    @staticmethod
    def quiet_idle_setting() -> bool:
        return quiet_idle_setting()

    def output_complete(self, ar: Any) -> None:
        """A quiet chunk's reply came: no "idle" follows (``output_complete``)."""
        output_complete(self.gc.client, ar)

    @property
    def results(self) -> dict[int, Any]:
        return self.state.results

    @property
    def status(self) -> RunStatus:
        return self.state.status

    @status.setter
    def status(self, value: RunStatus) -> None:
        self.state.status = value

    @property
    def finished(self) -> bool:
        return self.state.finished

    @property
    def inflight(self) -> dict[Any, Flight]:
        """Task -> its flight, for every task still in flight."""
        flights = self.state.flights
        return {ar: flights[c] for ar, c in self.tasks.items() if c in flights}

    def _tell(self, event: ev.Event) -> None:
        """Tell the state ``event`` and carry out what it answers."""
        if isinstance(event, ev.Stop):
            log.warning(
                "the run is stopped (%s): nothing is merged; chunks in flight "
                "are cancelled",
                "the stop button"
                if event.reason == "interrupt"
                else f"its --timeout of {event.timeout} s passed",
            )
        self._do(self.state.handle(event))

    def _do(self, instructions: list[Instruction]) -> None:
        """Carry out ``instructions`` in order (a failure raises)."""
        for ins in instructions:
            getattr(self, _EXECUTORS[type(ins)])(ins)

    def _do_verdict(self, ins: ev.Verdict) -> None:
        if self.feedback.say_verdict(ins.uniform):
            self._tell(ev.VerdictGiven())

    def _do_hand_back(self, ins: ev.HandBack) -> None:
        self.feedback.hand_back(ins.threshold)

    def _do_kill(self, ins: ev.Kill) -> None:
        info = self.gc.engines.get(ins.engine)
        log.warning(
            "engine %d (%s) is ended: it stopped answering",
            ins.engine,
            _who(info),
        )
        if info is not None and info.local:
            for sig in (signal.SIGKILL, signal.SIGCONT):
                try:
                    os.kill(info.pid, sig)
                except OSError:
                    pass

    def _do_mark_dead(self, ins: ev.MarkDead) -> None:
        restarts = self._restarts()
        if restarts is not None:  # (first: the panel's thread never sees it just dead)
            restarts.begin(self.gc, ins.engine)
        self.gc.mark_dead(ins.engine)

    def _do_forget(self, ins: ev.Forget) -> None:
        ar = self._task_of.pop(ins.chunk, None)
        if ar is not None:
            self.tasks.pop(ar, None)
            if ins.lost:
                self.output.lost(ar)

    def _do_cancel(self, ins: ev.Cancel) -> None:
        self.cancel()

    def _do_record(self, ins: ev.Record) -> None:
        c, timing, record = ins.chunk, ins.timing, self.record
        if ins.state == LOST:
            log.warning(
                "iterations %d-%d were lost with engine %d; they are sent again "
                "to the engines left (attempt %d)",
                c.start,
                c.stop - 1,
                c.engine,
                c.attempt + 2,
            )
        rec = chunk_record(c, self.gc.engines.get(c.engine), timing, ins.state)
        if ins.state == DONE and timing is not None:
            record.drew.update(timing.get("drew") or ())
            if timing.get("handed_back", False):
                record.hand_backs += 1
            record.add_chunk(rec)
        else:
            record.chunks.append(rec)

    def _do_keep(self, ins: ev.Keep) -> None:
        if self.on_chunk is None:
            return
        try:  # kept for --resume (and written to --checkpoint)
            self.on_chunk(ins.start, ins.stop, ins.payload)
        except Exception as e:
            self._do_warn(
                ev.Warn(f"could not keep iterations {ins.start}-{ins.stop - 1}: {e}")
            )

    def _do_warn(self, ins: ev.Warn) -> None:
        log.warning("%s", ins.text)
        self.record.warnings.append(ins.text)
        self.echo(f"gpucell: warning: {ins.text}")

    def _do_blame(self, ins: ev.Blame) -> None:
        self.record.errors.append(ins.text)

    def _do_chunk_failed(self, ins: ev.ChunkFailed) -> NoReturn:
        c, p = ins.chunk, ins.payload
        log.warning(
            "iterations %d-%d failed on engine %d: iteration %s (loop values %s) "
            "raised %s: %s; the run stops and nothing is merged",
            c.start,
            c.stop - 1,
            c.engine,
            p.get("iteration"),
            p.get("item"),
            p.get("type"),
            p.get("message"),
        )
        raise_iteration_error(
            ins.payload, ins.chunk, self.gc, self.record, self._unfinished_before(ins)
        )
        raise AssertionError("unreachable")  # (raise_iteration_error raises)

    def _no_engine_left(self) -> str:
        """Why the run cannot go on, with what the cluster said since it began
        (a restart given up, a batch job cancelled while pending)."""
        told = list(getattr(self.gc, "warnings", ()))[self._told_before :]
        why = "".join(f"\n- {t}" for t in told[-3:])
        return (
            "No engine is left to run the rest of the loop, and none is coming "
            "back" + (f":{why}" if why else ".") + "\nStart engines again "
            "(`%gpu_cluster stop`, then `start`) and run the cell again, with "
            "`--resume` where gpucell said it kept finished iterations."
        )

    def _unfinished_before(self, ins: ev.ChunkFailed) -> list[tuple[int, int]]:
        """Iterations before the one that raised that had not finished on other
        engines: serially one of them might have raised first."""
        k, c = ins.payload.get("iteration"), ins.chunk
        if not isinstance(k, int):
            return []
        # the failed chunk's own iterations before k ran, on this engine, first
        return [
            (lo, min(hi, c.start))
            for lo, hi in self.sched.pending_ranges()
            if lo < min(hi, c.start)
        ]

    def _do_fail(self, ins: ev.Fail) -> NoReturn:
        log.warning("the run fails: %s", _first_line(ins.error))
        raise ins.error

    def _do_fail_unless_restarting(self, ins: ev.FailUnlessRestarting) -> None:
        restarts = self._restarts()
        if restarts is None or not restarts.pending:
            log.warning("the run fails: %s", _first_line(ins.error))
            raise ins.error
        log.warning(
            "every engine of the run is gone; the run waits for %d restart(s)",
            len(restarts.pending),
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
        log.info(
            "cancelling %d chunk(s) in flight on engine(s) %s",
            len(ars),
            ", ".join(map(str, sorted({f.engine for f in inflight.values()}))),
        )
        try:
            gc.client.abort([m for ar in ars for m in ar.msg_ids], block=False)
        except Exception:
            pass
        running = sorted({f.engine for ar, f in inflight.items() if not ar.done()})
        if running:
            signal_engines(gc, running, signal.SIGINT)
        if not getattr(gc, "controller_alive", lambda: True)():
            # no reply can arrive without the controller: waiting cost 2 x grace
            self._tell(ev.Cancelled())
            return
        concurrent.futures.wait(ars, timeout=grace)
        still = [ar for ar in ars if not ar.done()]
        if still:  # a C extension ignoring SIGINT: signal again once
            signal_engines(
                gc, sorted({inflight[ar].engine for ar in still}), signal.SIGINT
            )
            concurrent.futures.wait(still, timeout=grace)
        self._tell(ev.Cancelled())

    def _restarts(self) -> Any:
        return getattr(self.gc, "restarts", None)

    def _release(self) -> None:
        """What the run holds beyond its end, let go (once)."""
        if getattr(self, "_released", False):
            return
        self._released = True
        self.output.flush(self.inflight)
        self._close_chunk_channel()
        self._forget_tasks()
        for frames in self.mapped.values():  # every engine maps it by now
            shm.release(frames)
        self.feedback.forget(
            c for c in self.sched.chunks if c.trial and c.engine in self.state.near
        )
        if self.channel is not None and (
            self.status != "running" or self.record.warnings
        ):
            self.gc.sweep_results()  # results abandoned by a failure or a loss

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

    def _close_chunk_channel(self) -> None:
        """The engines' serving tasks end; the client forgets the channel's
        chunks now and each serving task once its output is complete (its
        "idle", which the client reads only while it has the task's metadata:
        forgotten at its reply, the task's output stayed awaited for ever)."""
        channel = getattr(self, "chunk_channel", None)
        if channel is None:
            return
        channel.close()
        channel.forget(self._msg_ids)
        client = self.gc.client
        for ar in channel.serving_tasks():
            output = getattr(ar, "_output_future", None) or ar
            output.add_done_callback(
                lambda _f, ar=ar, client=client: _forget_now(client, ar)
            )

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
        if getattr(self, "quiet_idle", False):
            settle_quiet(client, self._msg_ids)
        self._msg_ids.clear()


def _forget_now(client: Any, ar: Any) -> None:
    """A finished task's result and metadata, dropped from the client."""
    for m in getattr(ar, "msg_ids", ()):
        client.results.pop(m, None)
        client.metadata.pop(m, None)


def _who(info: Any) -> str:
    """``cpu1 on node2, pid 4242``: an engine as its logs and status name it."""
    if info is None:
        return "gone"
    return f"{info.device} on {info.host}, pid {info.pid}"


def _first_line(error: BaseException) -> str:
    text = str(error).strip()
    return f"{type(error).__name__}: {text.splitlines()[0] if text else ''}"


#: instruction type -> the Run method that carries it out
_EXECUTORS: dict[type, str] = {
    ev.Reload: "_do_reload",
    ev.Verdict: "_do_verdict",
    ev.HandBack: "_do_hand_back",
    ev.Kill: "_do_kill",
    ev.MarkDead: "_do_mark_dead",
    ev.Forget: "_do_forget",
    ev.Cancel: "_do_cancel",
    ev.Record: "_do_record",
    ev.Keep: "_do_keep",
    ev.Warn: "_do_warn",
    ev.Blame: "_do_blame",
    ev.ChunkFailed: "_do_chunk_failed",
    ev.Fail: "_do_fail",
    ev.FailUnlessRestarting: "_do_fail_unless_restarting",
    ev.Finish: "_do_finish",
}


def quiet_idle_setting() -> bool:
    """``GpuCell.quiet_idle``: ask engines to leave out a silent chunk's
    "idle" status (engine/quietidle)."""
    from gpucell import config

    return bool(config.settings().quiet_idle)


def settle_quiet(client: Any, msg_ids: Sequence[str]) -> None:
    """The run is over: a quiet task whose reply it never decoded (a cancelled
    run's, one still in flight) may get no "idle", so its output counts as
    complete once its result is in.  The run relays no more output of its
    tasks by now (``OutputRelay.flush``), so nothing is lost that it kept."""
    outputs = getattr(client, "_output_futures", {})
    results = getattr(client, "_futures", {})
    for mid in msg_ids:
        out, res = outputs.get(mid), results.get(mid)
        if out is None or out.done():
            continue
        if res is None or res.done():
            _resolve(out)
        else:
            res.add_done_callback(lambda _f, out=out: _resolve(out))


def _resolve(fut: Any) -> None:
    if not fut.done():
        try:
            fut.set_result(None)
        except Exception:  # (resolved meanwhile, by its "idle")
            pass


def output_complete(client: Any, ar: Any) -> None:
    """The engine sent no output for ``ar``'s chunk and no "idle" follows:
    resolve the task's output future as that "idle" would (ipyparallel's
    client then marks the output ready and purges the task as usual)."""
    futures = getattr(client, "_output_futures", {})
    for mid in getattr(ar, "msg_ids", ()):
        fut = futures.get(mid)
        if fut is not None:
            _resolve(fut)
