"""Loops too cheap to send: run them in the kernel, as OpenMP's ``if`` clause does.

Sending a loop to the engines costs a few milliseconds however little it does (two
messages through the controller, the engines' wake-up, the results' way back).  When
the last run of the same cell on the same engines measured less work than that, in
all, running it in the kernel is the faster way to the same result: the same chunk
program and the same merge, over every iteration at once.

Only the plainest runs qualify: no CUDA in the cell or in a device it is given
(the kernel may have no GPU, or not the engines' one), no ``--seed`` (it would
reseed the kernel's generators), and no explicit engines, schedule, chunk size or
timeout (asking for those is asking for the engines).  ``GpuCell.inline_below = 0``
turns it off.
"""

from __future__ import annotations

import socket
import time
from typing import Any

from gpucell.core.provenance import ChunkRecord, LastRun

__all__ = ["run_in_kernel", "shape_of", "should_inline"]


def shape_of(value: Any, depth: int = 2) -> Any:
    """A cheap summary of a value's size: what a loop's cost scales with.

    Arrays and tensors by shape and dtype, sequences by length and their first
    and last items, strings by length.  A cell runs inline only while the values
    it reads have the shape they had when its cost was measured: the same cell
    over a bigger dataset is sent to the engines (and measured again).
    """
    t = type(value)
    shape = getattr(value, "shape", None)
    if shape is not None:  # arrays, tensors, data frames
        try:
            return (t.__name__, tuple(shape), str(getattr(value, "dtype", "")))
        except TypeError:
            pass
    if t in (str, bytes, bytearray):
        return (t.__name__, len(value))
    if t in (list, tuple) or t.__name__ in ("range", "deque"):
        n = len(value)
        if depth == 0 or n == 0:
            return (t.__name__, n)
        return (t.__name__, n, shape_of(value[0], depth - 1), shape_of(value[-1], 0))
    if t is dict:
        return ("dict", len(value))
    return t.__name__


def should_inline(
    *,
    uses_cuda: bool,
    request: Any,
    iterations: int,
    per_iteration: float | None,
    threshold: float,
) -> bool:
    """True when the cell's last measured cost says the kernel is the quicker place."""
    if threshold <= 0 or per_iteration is None or iterations == 0:
        return False
    explicit = (
        request.seed,
        request.targets,
        request.devices,
        request.schedule,
        request.chunksize,
        request.timeout,
    )
    if any(x is not None for x in explicit) or uses_cuda:
        return False
    return per_iteration * iterations < threshold


def run_in_kernel(
    program: Any, inputs: dict[str, Any], chunker: Any, record: LastRun
) -> list[Any]:
    """Run every iteration here with the engines' chunk ``program``
    (``LoopPlan.engine_program()``); fill ``record``."""
    from gpucell.engine.chunk import run_chunk

    stamps: dict[int, float] = {}
    t0, c0 = time.time(), time.perf_counter()
    record.iterations = chunker.count
    record.schedule = "kernel"
    record.inline = True
    try:
        result = run_chunk(
            program,
            inputs,
            chunker.chunk(0, chunker.count),
            0,
            device="cpu",
            stamps=stamps,
        )
    except BaseException:
        record.status = "error"
        record.wall = time.perf_counter() - c0
        raise
    compute = time.perf_counter() - c0
    record.chunks.append(
        ChunkRecord(
            start=0,
            stop=chunker.count,
            engine=-1,
            host=socket.gethostname(),
            device="kernel",
            t_start=t0,
            t_end=time.time(),
            compute=compute,
            attempt=0,
            state="done",
            iteration_starts=tuple(stamps.values()),
        )
    )
    record.wall = compute
    record.status = "ok"
    return [result]
