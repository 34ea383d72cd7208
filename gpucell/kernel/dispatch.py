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
import os
import signal
import socket
import sys
import time
import uuid
import warnings
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from gpucell.cluster.lifecycle import GpuCluster
from gpucell.core.provenance import ChunkRecord, LastRun
from gpucell.core.runstate import (
    BUSY,
    DEAD,
    IDLE,
    RETRYING,
    EngineProgress,
    RunSnapshot,
)
from gpucell.core.schedule import Chunk, Schedule
from gpucell.errors import CellTimeout, EnginesLost, InputNotSendable, IterationError
from gpucell.protocol import fingerprint, shm, wire

__all__ = ["Options", "run_chunks"]


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


_HOST = socket.gethostname()


def _engine_alive(gc: GpuCluster, eid: int) -> bool:
    """Local engines by pid (noticed within ~0.2 s); remote ones by registration
    (the controller's heartbeat)."""
    info = gc.engines.get(eid)
    if eid in gc.dead or eid not in gc.client.ids:
        return False
    if info is None or info.host != _HOST:
        return True
    return _pid_running(info.pid)


def _pid_running(pid: int) -> bool:
    """True while ``pid`` exists and is not a zombie (one /proc read)."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            stat = f.read()
        return stat[stat.rindex(b")") + 2 : stat.rindex(b")") + 3] != b"Z"
    except FileNotFoundError:
        return False
    except (OSError, ValueError):  # no /proc (macOS): ask the OS
        try:
            os.kill(pid, 0)
            return True
        except OSError:
            return False


#: seconds a trial chunk runs before it stops starting iterations: long enough
#: to measure a pace, short enough that a slow engine is not committed to much
TRIAL_SECONDS = 0.05
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


def _signal_engines(gc: GpuCluster, eids: Sequence[int], sig: int) -> None:
    """Interrupt running work: signal local engine pids, ask the nanny otherwise."""
    remote = []
    for eid in eids:
        info = gc.engines.get(eid)
        if info is not None and info.host == _HOST:
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


def run_chunks(
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
) -> list[Any]:
    """Run every iteration of ``range(n)`` on ``targets``; return chunk results in
    iteration order.

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
        A :class:`gpucell.kernel.telemetry.ClusterTelemetry`: remote engines start their
        sampler with the cell, and their samples are collected from the in-flight
        tasks here (the display reads them with ``sample()``).
    """
    from gpucell.engine import worker

    relay = relay or (lambda s: (sys.stdout.write(s), sys.stdout.flush()))
    client = gc.client
    cell = uuid.uuid4().hex
    alive = [e for e in targets if _engine_alive(gc, e)]
    if not alive:
        raise EnginesLost(
            "No live engine among the selected ones; check `%gpu_cluster status` "
            "and restart the cluster."
        )
    record.engines = tuple(alive)
    record.iterations = n

    # ---- ship program + inputs (cached on engines by fingerprint) -------------
    keys = {name: fingerprint.fingerprint(v) for name, v in inputs.items()}
    cache = gc.input_cache
    channel = gc.results_channel()
    encoded: dict[tuple[str, ...], list[Any]] = {}
    mapped: dict[tuple[str, ...], list[Any]] = {}  # the same, spilled to /dev/shm
    setups: dict[int, tuple[Any, ...]] = {}  # travels with the engine's first chunk
    for eid in alive:
        have = cache.get(eid, {})
        send = tuple(
            sorted(
                name
                for name in inputs
                if keys[name] is None or have.get(name) != keys[name]
            )
        )
        if send not in encoded:
            try:
                encoded[send] = _encode_inputs({k: inputs[k] for k in send})
            except InputNotSendable as e:
                record.status = "error"
                record.errors.append(str(e))
                raise
        frames = encoded[send]
        nbytes = wire.frames_nbytes(frames)
        if channel is not None and nbytes >= channel.min_bytes:
            if send not in mapped:  # written once, mapped by every local engine
                mapped[send] = shm.spill(frames, channel, f"in-{cell[:12]}-{eid}")
            if shm.spilled(mapped[send]) and gc.sees_shm(eid):
                frames = mapped[send]
                record.shared_bytes += nbytes
        setups[eid] = ((programs[eid], sorted(inputs), keys), frames)
        cache.pop(eid, None)  # unknown until this engine's first chunk answers

    if telemetry is not None:
        telemetry.start_remote(client)
    sched = Schedule(
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
    )
    if sched.trial and not _cheap_to_resend(chunk_of, n):
        # (probed only for schedules that would send trial chunks at all)
        sched.trial = False
    record.schedule = sched.mode + (" (profiled)" if sched.profiled else "")
    views = {eid: gc.view(eid) for eid in alive}
    inflight: dict[Any, tuple[Chunk, float | None]] = {}
    ends: dict[int, float] = {}
    results: dict[int, Any] = {}
    output = _OutputRelay(client, relay)
    t0 = time.perf_counter()
    deadline = t0 + options.timeout if options.timeout else None
    last_check = 0.0
    last_progress = [0.0]

    def report(status: str = "running", force: bool = False) -> None:
        now = time.perf_counter()
        if progress is None or (not force and now - last_progress[0] < progress_period):
            return
        last_progress[0] = now
        try:
            progress(snapshot(gc, alive, sched, now - t0, status))
        except Exception as e:  # the display must never break the loop
            record.warnings.append(f"progress display failed: {e!r}")

    def submit() -> None:
        for c in sched.fill():
            eid = c.engine
            if c.attempt > options.retries:
                raise EnginesLost(
                    f"Iterations {c.start}-{c.stop - 1} were lost {c.attempt} times "
                    "(the engines running them died). Nothing was merged. If an "
                    "iteration kills its engine (out of memory, a crash), fix it, or "
                    "raise --retries."
                )
            frames = wire.dumps(chunk_of(c.start, c.stop))
            queued_behind = any(ch.engine == eid for ch, _ in inflight.values())
            setup, input_frames = setups.pop(eid, (None, None))
            ar = views[eid].apply_async(
                worker.run,
                cell,
                frames,
                c.start,
                eid,
                options.seed,
                setup,
                input_frames,
                channel,
                TRIAL_SECONDS if c.trial else None,
            )
            # a chunk queued behind another waits on the engine, and an engine's
            # first chunk also loads the program and inputs (and the imports they
            # need): neither round trip says what dispatching a chunk costs
            timed = not queued_behind and setup is None
            inflight[ar] = (c, time.perf_counter() if timed else None)
            output.watch(ar)

    def lose(eid: int) -> None:
        lost = sched.lose_engine(eid)
        gc.mark_dead(eid)
        for ar in [a for a, (c, _) in inflight.items() if c.engine == eid]:
            inflight.pop(ar)
        for c in lost:
            record.chunks.append(_record(c, gc, None, "lost"))
        msg = (
            f"engine {eid} died; re-running its {sum(c.size for c in lost)} "
            "iteration(s) on the others"
        )
        record.warnings.append(msg)
        echo(f"gpucell: warning: {msg}")
        if not sched.alive:
            ranges = ", ".join(f"{a}-{b - 1}" for a, b in sched.pending_ranges())
            raise EnginesLost(
                f"Every engine died; iterations {ranges} never completed. Nothing "
                "was merged. Restart the cluster (`%gpu_cluster stop` then `start`)."
            )

    try:
        try:
            submit()
            while not sched.finished:
                if deadline is not None and time.perf_counter() > deadline:
                    raise _Interrupted("timeout")
                done, _ = concurrent.futures.wait(
                    list(inflight), timeout=0.05, return_when="FIRST_COMPLETED"
                )
                output.poll(inflight)
                if telemetry is not None:
                    telemetry.poll(inflight)
                for ar in done:
                    if ar not in inflight:
                        continue
                    chunk, t_sub = inflight.pop(ar)
                    output.finished(ar)
                    _finish(ar, chunk, t_sub, sched, results, record, gc, lose, ends)
                now = time.perf_counter()
                if now - last_check > 0.2 or not inflight:
                    last_check = now
                    for eid in sched.alive:
                        if not _engine_alive(gc, eid):
                            lose(eid)
                submit()
                report()
                if not inflight and not sched.finished:
                    raise EnginesLost("No work in flight and the loop is not finished.")
        except KeyboardInterrupt:
            raise _Interrupted("interrupt") from None
    except _Interrupted as stop:
        _cancel(gc, inflight, options.interrupt_grace)
        record.status = "timeout" if stop.reason == "timeout" else "interrupted"
        record.wall = time.perf_counter() - t0
        report(record.status, force=True)
        if stop.reason == "timeout":
            raise CellTimeout(
                f"%%gpu_parallel --timeout {options.timeout:g} s reached after "
                f"{sched.done_iterations} of {n} iterations; outstanding work was "
                "cancelled and nothing was merged."
            ) from None
        raise KeyboardInterrupt(
            f"gpucell: interrupted after {sched.done_iterations} of {n} iterations; "
            "engines stopped their work, nothing was merged"
        ) from None
    except BaseException:
        _cancel(gc, inflight, options.interrupt_grace)
        record.wall = time.perf_counter() - t0
        record.status = "error"
        report("error", force=True)
        raise
    finally:
        output.flush(inflight)
        for frames in mapped.values():  # every engine that maps it has it mapped
            shm.release(frames)
        if channel is not None and (record.status != "running" or record.warnings):
            gc.sweep_results()  # results abandoned by a failure, or a lost engine
    record.wall = time.perf_counter() - t0
    record.status = "ok"
    report("ok", force=True)
    return [results[k] for k in sorted(results)]


def _encode_inputs(values: dict[str, Any]) -> list[Any]:
    """Wire frames of the inputs, or an error naming each one that cannot travel."""
    if not values:
        return []
    try:
        return wire.dumps(values)
    except Exception:
        pass
    bad = []
    for name, value in values.items():
        try:
            wire.dumps(value)
        except Exception as e:
            bad.append(f"`{name}` ({type(value).__name__}): {e}")
    if not bad:  # only the combination failed; re-raise the original problem
        return wire.dumps(values)
    raise InputNotSendable(
        "%%gpu_parallel cannot send what the loop reads to the engines: "
        + "; ".join(bad)
        + ". Create such objects inside the loop (each engine gets its own), pass "
        "what they hold instead, or run the cell without %%gpu_parallel. Nothing ran."
    )


def snapshot(
    gc: GpuCluster, engines: Sequence[int], sched: Schedule, elapsed: float, status: str
) -> RunSnapshot:
    """The run as the display shows it (pure function of the schedule)."""
    rows = []
    for eid in engines:
        info = gc.engines.get(eid)
        done_its, done_secs = sched.engine_progress(eid)
        running = sched.outstanding(eid)
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
    chunk: Chunk, gc: GpuCluster, timing: dict[str, Any] | None, state: str
) -> ChunkRecord:
    info = gc.engines.get(chunk.engine) if chunk.engine is not None else None
    timing = timing or {}
    return ChunkRecord(
        start=chunk.start,
        stop=chunk.stop,
        engine=chunk.engine if chunk.engine is not None else -1,
        host=timing.get("host", info.host if info else ""),
        device=info.device if info else "",
        t_start=timing.get("start", 0.0),
        t_end=timing.get("end", 0.0),
        compute=timing.get("compute", 0.0),
        attempt=chunk.attempt,
        state=state,
        iteration_starts=tuple(timing.get("starts", ())),
    )


def _robust_seconds(timing: dict[str, Any], size: int) -> float:
    """A chunk's compute time for the schedule's speed estimates.

    The median iteration (which the engine computes for chunks of 3 or more)
    times the iteration count: an engine's first iteration also pays one-time
    costs (first imports, warm-up) that would make it look slow.
    """
    median = timing.get("median")
    if median is not None and size >= 3:
        return float(median) * size
    return float(timing["compute"])


#: seconds an unfinished line from a running task waits for the rest of it
PARTIAL_LINE_WAIT = 1.0


def _whole_lines(text: str, final: bool) -> str:
    """``text`` up to its last newline (all of it when ``final``)."""
    return text if final else text[: text.rfind("\n") + 1]


class _OutputRelay:
    """Forward engine output to the cell as it arrives, losing none.

    Reads each task's ipyparallel ``Metadata`` (stdout, stderr, rich outputs) that
    the client fills from IOPub; kept by reference from submission, so reading it
    is a dict lookup (``AsyncResult.stdout`` re-parses dates on every access).
    A task's result can arrive before its last output (they travel on different
    channels), so finished tasks stay here until ipyparallel says their output is
    complete; :meth:`flush` waits briefly for the stragglers at the end.
    """

    def __init__(self, client: Any, relay: Callable[[str], None]) -> None:
        self._client = client
        self._relay = relay
        self._md: dict[Any, Any] = {}
        self._printed: dict[Any, tuple[int, int]] = {}
        self._draining: list[Any] = []
        self._partial_since: dict[Any, float] = {}  # a line waiting for its end
        self._open_line: Any = None  # the task whose relayed line has no end yet

    def watch(self, ar: Any) -> None:
        # the task's own record, which its future holds: the client drops its
        # copy once a task has finished, and a one-iteration chunk can finish
        # before apply_async's caller runs again (output was lost that way)
        md = ar.metadata
        if isinstance(md, list):
            md = md[0] if md else None
        if md is not None:
            self._md[ar] = md
            self._printed[ar] = (0, 0)

    def _forward(self, ar: Any, final: bool = False) -> None:
        """Relay what ``ar`` wrote since the last call: whole lines only while it
        runs (a line can arrive in pieces, and another engine's line must not
        land inside it), the rest once it is complete or has waited
        :data:`PARTIAL_LINE_WAIT`."""
        md = self._md.get(ar)
        if md is None:
            return
        out, err = md.get("stdout") or "", md.get("stderr") or ""
        k_out, k_err = self._printed[ar]
        if not final and (out[-1:] not in ("", "\n") or err[-1:] not in ("", "\n")):
            # a progress line (dots, a \r counter) still shows, a second late
            since = self._partial_since.setdefault(ar, time.perf_counter())
            final = time.perf_counter() - since >= PARTIAL_LINE_WAIT
        new_out = _whole_lines(out[k_out:], final)
        new_err = _whole_lines(err[k_err:], final)
        if final:
            self._partial_since.pop(ar, None)
        if new_out:
            if self._open_line not in (None, ar):
                new_out = "\n" + new_out  # another task's line was left open
            self._open_line = None if new_out.endswith("\n") else ar
            self._relay(new_out)
        if new_err:
            sys.stderr.write(new_err)
            sys.stderr.flush()
        self._printed[ar] = (k_out + len(new_out), k_err + len(new_err))

    def _complete(self, ar: Any) -> None:
        self._forward(ar, final=True)
        md = self._md.pop(ar, None)
        self._printed.pop(ar, None)
        self._partial_since.pop(ar, None)
        if md is not None:
            _display_outputs(md.get("outputs") or [])

    def poll(self, running: Any) -> None:
        for ar in running:
            self._forward(ar)
        for ar in list(self._draining):
            if ar.wait_for_output(0):
                self._draining.remove(ar)
                self._complete(ar)
            else:
                self._forward(ar)

    def finished(self, ar: Any) -> None:
        self._draining.append(ar)

    def flush(self, running: Any, timeout: float = 1.0) -> None:
        end = time.perf_counter() + timeout
        for ar in [*self._draining, *running]:
            if ar.done():
                ar.wait_for_output(max(0.0, end - time.perf_counter()))
            self._complete(ar)
        self._draining.clear()


def _finish(ar, chunk, t_sub, sched, results, record, gc, lose, ends) -> None:
    """Handle one finished chunk task (``ends``: engine -> its last chunk's end,
    engine clock)."""
    from ipyparallel.error import EngineError, RemoteError

    try:
        # wait() can report a future whose result is set a moment before
        # ipyparallel marks it ready: allow that moment
        frames = ar.get(timeout=5)
    except EngineError:
        lose(chunk.engine)
        return
    except RemoteError as e:
        if not _engine_alive(gc, chunk.engine):
            lose(chunk.engine)
            return
        raise IterationError(
            f"gpucell: engine {chunk.engine} failed running iterations "
            f"{chunk.start}-{chunk.stop - 1}: {e.ename}: {e.evalue}\n"
            f"{e.traceback or ''}"
        ) from None
    frames = shm.unspill(frames, record)
    status, payload, timing = wire.loads(frames)
    if timing.get("cached") is not None:
        # what the engine caches now, as it says (never assumed)
        gc.input_cache[chunk.engine] = dict(timing["cached"])
    if status == "error":
        record.chunks.append(_record(chunk, gc, timing, "failed"))
        _raise_iteration_error(payload, chunk, gc, record)
    results[chunk.start] = payload
    done = timing.get("done", chunk.size)  # fewer when a trial chunk stopped early
    # a profiled schedule compares each chunk's time with the profile's cost of
    # the same iterations: it needs the whole time, not a median-based estimate
    if sched.profiled:
        sched.complete(chunk.id, timing["compute"], done=done)
    else:
        sched.complete(chunk.id, _robust_seconds(timing, done), done=done)
    if t_sub is not None:
        sched.observe_overhead(
            max(0.0, time.perf_counter() - t_sub - timing["compute"])
        )
    elif chunk.engine in ends and timing["start"] > ends[chunk.engine]:
        # queued behind the engine's previous chunk: what a chunk costs is the
        # engine's dead time between the two (ipykernel's per-message work,
        # results out, the next chunk in), a few milliseconds
        sched.observe_overhead(timing["start"] - ends[chunk.engine])
    ends[chunk.engine] = timing["end"]
    record.chunks.append(_record(chunk, gc, timing, "done"))


def _display_outputs(outputs: list[Any]) -> None:
    """Rich outputs (display()) from the chunk reach the cell's output."""
    if not outputs:
        return
    try:
        from IPython.display import publish_display_data
    except ImportError:
        return
    for out in outputs:
        if isinstance(out, dict) and "data" in out:
            publish_display_data(out["data"], out.get("metadata", {}))


def _raise_iteration_error(
    payload: dict[str, Any], chunk: Chunk, gc: GpuCluster, record: LastRun
) -> None:
    info = gc.engines.get(chunk.engine)
    where = (
        f"iteration {payload['iteration']} (loop values {payload['item']}) on engine "
        f"{chunk.engine}"
        + (f" ({info.host}, {info.device} {info.name})" if info else "")
    )
    context = (
        f"gpucell: raised in {where}. Nothing from the loop was merged; the prelude "
        "ran.\nRemote traceback (cell lines):\n" + payload["traceback"].rstrip()
    )
    if payload.get("oom"):
        context += "\n" + payload["oom"]
    record.errors.append(context)
    exc: BaseException | None = None
    if payload.get("exception"):
        try:
            exc = wire.loads(payload["exception"])
        except Exception:
            exc = None
    if isinstance(exc, BaseException):
        exc.__traceback__ = None
        if hasattr(exc, "add_note"):
            exc.add_note(context)
        else:  # pragma: no cover - Python 3.10
            warnings.warn(context, stacklevel=2)
        raise exc
    raise IterationError(f"{payload['type']}: {payload['message']}\n{context}")


def _cancel(gc: GpuCluster, inflight: dict[Any, Any], grace: float) -> None:
    """Abort queued chunk tasks, signal running ones, wait until engines are idle.

    Every engine with an unfinished task is signalled, whether or not its
    "started" notice has arrived yet: an idle engine ignores SIGINT, and waiting
    for the notice could leave a running chunk to finish on its own.
    """
    if not inflight:
        return
    client = gc.client
    ars = list(inflight)
    msg_ids = [m for ar in ars for m in ar.msg_ids]
    try:
        client.abort(msg_ids, block=False)
    except Exception:
        pass
    running = sorted({c.engine for ar, (c, _) in inflight.items() if not ar.done()})
    if running:
        _signal_engines(gc, running, signal.SIGINT)
    concurrent.futures.wait(ars, timeout=grace)
    still = [ar for ar in ars if not ar.done()]
    if still:  # a C extension ignoring SIGINT: signal again once
        _signal_engines(
            gc, sorted({inflight[ar][0].engine for ar in still}), signal.SIGINT
        )
        concurrent.futures.wait(still, timeout=grace)
    inflight.clear()
