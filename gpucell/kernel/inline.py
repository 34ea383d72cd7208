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
turns it off.  When it applies is decided by :mod:`gpucell.core.costmodel`.
"""

from __future__ import annotations

import socket
import time
from typing import Any

from gpucell.core.provenance import ChunkRecord, LastRun
from gpucell.protocol.chunks import DETAIL_MAX

__all__ = ["run_in_kernel"]


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
            iteration_starts=(
                tuple(stamps.values()) if len(stamps) <= DETAIL_MAX else ()
            ),
        )
    )
    record.wall = compute
    record.status = "ok"
    return [result]
