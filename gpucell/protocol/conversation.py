"""The kernel–engine conversation for one chunk, as types both sides import.

The kernel applies ``engine.worker.run`` with a :class:`ChunkTask`'s fields
(positional: ipyparallel sends a top-level argument's buffers zero-copy); the
engine answers wire frames of a :data:`Reply`: a status, then the chunk's
result (``ok``), a :class:`ChunkError` (``error``) or nothing (``unloaded``:
the engine tidied the cell away and needs its setup again), then the
:class:`Timing` of the chunk.  A field read that either side does not write
is a type error at check time (mypy runs over both ends: tests/test_typing.py).

Standard library only.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Literal, NamedTuple, TypedDict

__all__ = ["ChunkError", "ChunkTask", "Reply", "Status", "Timing"]


class ChunkTask(NamedTuple):
    """``worker.run``'s arguments for one chunk, in its order."""

    cell: str  # the cell's key: which loaded program and inputs
    chunk_frames: list[Any]  # wire frames of the chunk object (its items)
    start: int  # the chunk's first iteration
    engine_id: int
    seed: int | None  # --seed: every iteration seeded from (seed, iteration)
    setup: Any  # program.Setup on an engine's first chunk of a cell, else None
    input_frames: list[Any] | None  # the inputs this engine lacks (first chunk)
    results_to: Any  # shm.Channel for the result's big buffers, if reachable
    budget: float | None  # a trial: start no iteration after this many seconds
    kernel: str  # whose program and inputs (several kernels may share engines)
    stoppable: bool  # may stop early to hand its rest to idle engines
    # --seed: the generators the loop can reach (core/seeding); None: all
    reseed: tuple[str, ...] | None = None
    # GpuCell.quiet_idle: no "idle" status after a chunk that sent no output
    # (engine/quietidle); the reply says so in its timing's "quiet"
    quiet_idle: bool = False


class _TimingOptional(TypedDict, total=False):
    quiet: bool  # no "idle" status follows (engine/quietidle, GpuCell.quiet_idle)


class Timing(_TimingOptional):
    """When and how a chunk ran, as the engine saw it."""

    start: float  # time.time() as the chunk began (after setup)
    entered: float  # time.time() as worker.run was entered
    end: float
    compute: float  # seconds running the iterations (perf_counter)
    starts: Sequence[float]  # each iteration's start, when the run keeps detail
    median: float | None  # seconds of a typical iteration here, if known
    done: int  # iterations run (fewer than sent when a trial or hand-back stopped)
    handed_back: bool  # stopped early to hand its rest to idle engines
    unstamped: bool  # ran without per-iteration stamps (a cheap loop)
    host: str
    pid: int
    first: int  # the chunk's first iteration: the kernel checks it is the one sent
    cached: dict[str, Any] | None  # input -> cache key the engine holds now
    drew: list[str]  # process-wide generators the chunk drew from (no --seed)


class ChunkError(TypedDict):
    """An iteration's exception, as data the kernel re-raises with context."""

    changed: list[tuple[str, str]] | None  # inputs changed in place (checkin)
    readonly: bool  # a write into a read-only input array
    type: str
    module: str
    message: str
    traceback: str  # with the cell's own lines
    iteration: int
    item: str  # the iteration's loop values, shortened
    exception: list[Any] | None  # wire frames of the exception, if it pickles
    oom: str | None  # a note when the device ran out of memory


#: what a chunk's answer says happened
Status = Literal["ok", "error", "unloaded"]

#: the engine's answer: (status, result | ChunkError | {"cached": ...}, Timing)
Reply = tuple[Status, Any, Timing]
