"""Engine-side entry points of ``%%gpu_parallel`` (imported on engines by name).

The kernel calls two functions through ipyparallel:

* :func:`load` once per engine per cell: the chunk program and the inputs that are
  not already cached on this engine (``engine/sessions``: big inputs are cached
  across cells by fingerprint, so an unchanged model or dataset travels once);
* :func:`run` per chunk, with a :class:`ChunkTask`'s fields: a thin envelope
  (``engine/envelope``) around :func:`gpucell.engine.chunk.run_chunk`, answering
  a typed :data:`Reply` as :mod:`gpucell.protocol.wire` frames (zero-copy for
  arrays and tensors).

An exception in an iteration comes back as data (``engine/failure``: type,
message, the cell-line traceback, the iteration and its loop values), so the
kernel can re-raise the user's own exception type with gpucell's context.
"""

from __future__ import annotations

import contextlib
import os
import socket
import time
from array import array
from typing import Any, NamedTuple

from gpucell.engine import checkin, hostcopy, quietidle, runtime
from gpucell.engine.chunk import CHEAP_ITERATION, Where, run_chunk
from gpucell.engine.envelope import Envelope
from gpucell.engine.failure import (
    describe_oom,
    error_payload,
    mark_unsendable,
    release_cuda_cache,
)
from gpucell.engine.feedback import ShmHandBack, median_iteration
from gpucell.engine.reseed import seeder, unreseeded_draw
from gpucell.engine.runtime import collect
from gpucell.engine.served import serve
from gpucell.engine.sessions import (
    Session,
    by_kernel,
    cached,
    cached_keys,
    cached_names,
    clear,
    cuda_target,
    load,
    release,
    session,
    set_up,
)
from gpucell.engine.streams import Tagged
from gpucell.protocol import shm, wire
from gpucell.protocol.chunks import DETAIL_MAX, ChunkResult, item_refs
from gpucell.protocol.conversation import ChunkError, ChunkTask, Reply, Status, Timing
from gpucell.protocol.program import Setup

__all__ = [
    "cached",
    "cached_names",
    "clear",
    "describe_oom",
    "leave",
    "load",
    "run",
    "answer",
    "serve",
    "tidy",
    "warm",
]

# (names tests and the kernel's older callers reach here by)
_sessions = by_kernel
_Tagged = Tagged


def _seeder(seed: int) -> Any:
    """Every generator seeded from (seed, iteration), as ``--seed`` seeds those
    a loop can reach: the serial reference of the tests."""
    return seeder(seed)


#: seconds an engine waits, idle, after a chunk before it tidies the cell away
#: (:func:`after_cell`): well above the gap between two chunks of a running cell
#: (the kernel keeps each engine's next chunk queued), well below a person's pause
AFTER_CELL_IDLE = 0.25


def after_cell(kernel: str, cell: str) -> None:
    """The engine has been idle since its last chunk of ``cell``: free what the
    cell left (its inputs' references, its program, reference cycles, cached
    CUDA blocks) without a message from the kernel.  Should another chunk of the
    same cell come after all, it is answered ``unloaded`` and the kernel sends
    it again with the program (:func:`run`).  Files this engine published for
    its host stay until the kernel's :func:`tidy`: another engine of the host
    may not have mapped them yet."""
    s = by_kernel.get(kernel)
    if s is not None and s.cell == cell and s.program is not None:
        release(s)
        collect()
    release_cuda_cache()


class ByName:
    """One of this module's functions, sent to engines by name.

    ipyparallel sends a plain function by value: its code object, defaults
    and annotations, canned in the kernel and rebuilt on the engine for every
    message (the ~30 annotations and defaults of :func:`run` alone are ~7,000
    ``isinstance`` checks per chunk on the engine).  An instance of this class
    pickles as this module's path and the function's name."""

    __slots__ = ("name",)

    def __init__(self, name: str) -> None:
        if not callable(globals().get(name)):
            raise ValueError(f"gpucell.engine.worker has no function {name!r}")
        self.name = name

    @property
    def __name__(self) -> str:  # what ipyparallel labels the task with
        return self.name

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        return globals()[self.name](*args, **kwargs)

    def __reduce__(self) -> tuple[Any, ...]:
        return (ByName, (self.name,))

    def __repr__(self) -> str:
        return f"gpucell.engine.worker.{self.name}"


def _engine_id() -> int | None:
    from IPython import get_ipython

    me = getattr(getattr(get_ipython(), "kernel", None), "engine_id", None)
    return me if isinstance(me, int) else None


def tidy_each(drops: dict[int, list[str]], kernel: str = "") -> None:
    """:func:`tidy` sent to several engines as one task (one message to build
    in the kernel, not one per engine): each finds its own ``drop`` by its id."""
    me = _engine_id()
    tidy(drops.get(me, []) if me is not None else [], kernel)


def run_each(table: dict[int, tuple[Any, ...]]) -> list[Any]:
    """:func:`run` sent to several engines as one task (a cell's first chunks):
    each runs its own chunk, found by its engine id."""
    me = _engine_id()
    if me is None or me not in table:
        raise RuntimeError(
            f"gpucell: engine {me} was sent a cell's first chunks without its own"
        )
    return run(*table[me])


def tidy(drop: list[str] | None = None, kernel: str = "") -> None:
    """After a cell, while the engine is idle: forget the cached inputs the
    kernel no longer holds (``drop``) and what this cell left behind (its
    program's namespace, reference cycles, cached CUDA blocks), so the memory
    returns now rather than when the next collection happens to run."""
    s = by_kernel.get(kernel)  # none: nothing of this kernel's is left here
    dropped = False
    if s is not None:
        for name in drop or ():
            dropped = s.cache.pop(name, None) is not None or dropped
        release(s)
    hostcopy.unpublish(kernel)  # the host's engines all mapped it by now
    collect(full=dropped)
    release_cuda_cache()


def leave(kernel: str = "") -> None:
    """A kernel disconnects from engines it does not own: take back what gpucell
    left in them for it (cached inputs; the telemetry sampler thread once no
    kernel is left)."""
    clear(kernel)
    from gpucell.engine import telemetry

    if not by_kernel:
        telemetry.stop()
    collect(full=True)


def run(
    cell: str,
    chunk_frames: list[Any],
    start: int,
    engine_id: int,
    seed: int | None = None,
    setup: Setup | None = None,
    input_frames: list[Any] | None = None,
    results_to: shm.Channel | None = None,
    budget: float | None = None,
    kernel: str = "",
    stoppable: bool = False,
    reseed: tuple[str, ...] | None = None,
    quiet_idle: bool = False,
) -> list[Any]:
    """Run one chunk; return wire frames of its :data:`Reply`.

    The arguments are a :class:`ChunkTask`'s fields, positional as the kernel
    sends them (ipyparallel ships a top-level argument's buffers zero-copy:
    the chunk's and the inputs' frames); the task's fields say what each is.
    """
    return answer(
        ChunkTask(
            cell,
            chunk_frames,
            start,
            engine_id,
            seed,
            setup,
            input_frames,
            results_to,
            budget,
            kernel,
            stoppable,
            reseed,
            quiet_idle,
        )
    )


class _Outcome(NamedTuple):
    """What the iterations left: the reply's status and payload, the
    generators drawn from, and what the engine caches (a setup's answer)."""

    status: Status
    payload: ChunkResult | ChunkError
    drew: list[str]
    loaded: dict[str, Any] | None


def answer(task: ChunkTask) -> list[Any]:
    """Run the chunk ``task`` names; its :data:`Reply` as wire frames (the
    result's big buffers through /dev/shm where the kernel can map them)."""
    entered = time.time()
    runtime.busy()  # what waits for an idle engine waits on
    loaded = None
    st = session(task.kernel)
    if task.setup is None and st.cell == task.cell and st.program is None:
        # this engine tidied the cell away while idle (after_cell): the kernel
        # sends this chunk again with the program and inputs
        unloaded: Reply = ("unloaded", None, _unloaded_timing(st, task.start, entered))
        return wire.dumps(unloaded)
    if task.quiet_idle:
        quietidle.begin()
    if task.setup is not None:
        if st.program is not None:  # the last cell ended a moment ago
            release(st)
            collect()
        loaded = set_up(task.cell, task.setup, task.input_frames or [], task.kernel)
    chunk_obj = wire.loads(task.chunk_frames, cuda_to=cuda_target())
    if task.cell != st.cell:
        raise RuntimeError(
            f"gpucell: engine has cell {st.cell!r} loaded, not {task.cell!r} "
            "(was the engine restarted?)"
        )
    where = Where({}, task.start)
    device = "cuda" if os.environ.get("GPUCELL_DEVICE_KIND") == "gpu" else "cpu"
    with Envelope(st, task, chunk_obj, where, device) as env:
        done = _iterations(task, st, env, chunk_obj, loaded)
    if done.status == "ok" and where.done():
        st.iteration_mean = env.compute / where.done()
    timing = _chunk_timing(
        where,
        where.stamps,
        (entered, env.t0, env.end, env.compute),
        task.start,
        env.hand_back,
        done.loaded,
    )
    timing["drew"] = done.drew
    if task.quiet_idle:
        timing["quiet"] = quietidle.finish()
    reply: Reply = (done.status, done.payload, timing)
    spilled = _reply(
        reply, chunk_obj, task.start, where, env.behind, task.results_to, env.tag
    )
    runtime.busy()
    # if this was the engine's last chunk of the cell, what the cell left goes
    # once the engine has been idle a moment: no message from the kernel needed
    kernel, cell = task.kernel, task.cell
    runtime.when_idle(
        f"after cell {kernel}", AFTER_CELL_IDLE, lambda: after_cell(kernel, cell)
    )
    return spilled


def _iterations(
    task: ChunkTask,
    st: Session,
    env: Envelope,
    chunk_obj: Any,
    loaded: dict[str, Any] | None,
) -> _Outcome:
    """The chunk's iterations inside its envelope; an iteration's exception
    (or an input it changed) becomes the reply's ``error`` payload."""
    where = env.where
    drew: list[str] = []
    try:
        with env.running() as logged:
            result = run_chunk(
                st.program,
                st.inputs,
                chunk_obj,
                task.start,
                seed_fn=(
                    seeder(task.seed, task.reseed) if task.seed is not None else None
                ),
                device=env.device,
                stamps=where.stamps,
                to_host=env.to_host,
                deadline=None if task.budget is None else env.c0 + task.budget,
                where=where,
                cheap=(
                    st.iteration_mean is not None
                    and st.iteration_mean < CHEAP_ITERATION
                ),
                verdict=env.verdict,
                hand_back=env.hand_back,
            )
        result.logs = logged.records
        if env.opened is not None:
            result.files = env.opened.files
        drew = env.drew()
        if task.seed is not None and drew:
            raise unreseeded_draw(drew)
        changed = env.check_out(result) + env.settings_changed
        if changed:
            for name, _what in changed:
                st.cache.pop(name, None)  # the next cell gets a fresh copy
            loaded = {"cached": cached_keys(st)}
            raise checkin.Changed(changed)
        return _Outcome("ok", result, drew, loaded)
    except KeyboardInterrupt:
        raise
    except BaseException as exc:  # noqa: BLE001 - it goes back to the kernel
        payload = error_payload(exc, where, task.start, chunk_obj)
        if payload["oom"]:
            release_cuda_cache()  # the kernel may retry here: start it clean
        return _Outcome("error", payload, drew, loaded)


def _unloaded_timing(st: Session, start: int, entered: float) -> Timing:
    """An ``unloaded`` answer's timing: nothing ran; what the engine caches."""
    now = time.time()
    return {
        "start": now,
        "entered": entered,
        "end": now,
        "compute": 0.0,
        "starts": [],
        "median": 0.0,
        "done": 0,
        "handed_back": False,
        "unstamped": False,
        "host": socket.gethostname(),
        "pid": os.getpid(),
        "first": start,
        "cached": cached_keys(st),
        "drew": [],
    }


def _chunk_timing(
    where: Where,
    stamps: dict[int, float],
    clocks: tuple[float, float, float, float],
    start: int,
    hand_back: ShmHandBack | None,
    loaded: dict[str, Any] | None,
) -> Timing:
    """``clocks``: entered, started, ended (time.time) and compute seconds."""
    entered, t0, end, compute = clocks
    return {
        "start": t0,
        "entered": entered,
        "end": end,
        "compute": compute,
        # per-iteration stamps travel only for chunks a run's detail can keep,
        # as one buffer of doubles: a cheap loop's trial stamps 10^5 iterations,
        # and as a list of floats they took ~5 ms to pickle here and as long
        # to unpickle in the kernel, on a first run's critical path
        "starts": array("d", stamps.values()) if len(stamps) <= DETAIL_MAX else [],
        "median": (
            compute / max(where.done(), 1)  # unstamped: the mean is what is known
            if where.unstamped
            else median_iteration(stamps, end)
        ),
        "done": where.done(),
        "handed_back": hand_back is not None and hand_back.stopped,
        "unstamped": where.unstamped,
        "host": socket.gethostname(),
        "pid": os.getpid(),
        "first": start,  # which chunk this is: the kernel checks it is the one it sent
        "cached": loaded["cached"] if loaded is not None else None,
        "drew": [],
    }


def _reply(
    reply: Reply,
    chunk_obj: Any,
    start: int,
    where: Where,
    behind: Any,
    results_to: shm.Channel | None,
    tag: str,
) -> list[Any]:
    """The reply's wire frames, big buffers through /dev/shm where the kernel
    can map them (a result written behind as the loop ran is kept)."""
    status, payload, timing = reply
    prewritten = None
    if behind is not None:
        if status == "ok":
            prewritten = behind.finish()
        else:
            behind.discard()
    # results that hold the loop's own items (`out.append(p)`) name them, and
    # the kernel puts its own there: serially they are the same objects
    refs = item_refs(chunk_obj, start) if status == "ok" else None
    try:
        frames = wire.dumps(reply, items=refs, cell_globals=where.namespace)
    except Exception:
        if prewritten is not None:
            shm.discard(prewritten)
        if status != "ok":
            raise
        # a loop-local whose last value cannot travel (a closed file, a
        # generator, a lock) must not fail a loop whose results are fine: the
        # kernel leaves that name as it was, and says so
        mark_unsendable(payload)
        frames = wire.dumps(reply, items=refs, cell_globals=where.namespace)
        prewritten = None
    return shm.spill(frames, results_to, tag, prewritten)


def warm(names: list[str]) -> None:
    """Sent once as engines register (``cluster/engines.preimport``), ahead of
    any cell: the heavy libraries the kernel has (:func:`runtime.preimport`),
    then what an engine's first chunk otherwise paid on the cell's critical
    path and a re-run does not (bench/bench_chunk_cost.py --cold, 8 engines:
    ~1.6 ms of CPU an engine, most of it finding where the generators keep
    their state, ``rngstate``; the rest first calls of the wire, the log
    capture and the reply's pickling).  Nothing a cell can see changes: the
    generators are only read, nothing is cached for a kernel."""
    runtime.preimport(names)
    with contextlib.suppress(Exception):  # a head start, never a failure
        _first_chunk_paths()


def _first_chunk_paths() -> None:
    """One pass over a chunk's own paths with nothing in them."""
    from gpucell.engine import logs, rngstate

    rngstate.drew(rngstate.states())
    where = Where({}, 0)
    chunk_obj = wire.loads(wire.dumps(("range", range(0, 1))))
    with logs.Capture(None):
        pass
    payload = ChunkResult(start=0, count=1, gathers={"_": [0]})
    timing = _chunk_timing(where, {0: 0.0}, (0.0, 0.0, 0.0, 0.0), 0, None, None)
    frames = wire.dumps(("ok", payload, timing), items=item_refs(chunk_obj, 0))
    wire.loads(frames)


#: the functions the kernel sends for every chunk and cell, by name (ByName)
RUN = ByName("run")
SERVE = ByName("serve")
RUN_EACH = ByName("run_each")
TIDY = ByName("tidy")
TIDY_EACH = ByName("tidy_each")
