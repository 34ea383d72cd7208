"""No full garbage collection of the kernel's heap while a cell's chunks are
in flight.

A full (generation 2) collection scans every object the kernel holds: 50 ms
in a notebook kernel with gpucell, numpy and ipyparallel loaded, measured
landing in the first wave's send (``bench/bench_chunk_cost.py --first``).  It
holds the GIL, so ipyparallel's IO thread can neither send the wave nor take
replies meanwhile: every engine waits.  :func:`kernel_heap_frozen` moves the
objects that exist when the run starts out of the collector's sight
(``gc.freeze``) and back when it ends (``gc.unfreeze``), so collections during
the run scan only what the run made.  Nothing is lost: a cycle that died
before the run is collected by the next full collection after it.
"""

from __future__ import annotations

import contextlib
import gc
from collections.abc import Iterator

__all__ = ["kernel_heap_frozen"]


@contextlib.contextmanager
def kernel_heap_frozen() -> Iterator[bool]:
    """Freeze the heap for the block (yields whether it did).  Left alone
    where the notebook disabled the collector or froze objects itself
    (unfreezing would release its own)."""
    if not gc.isenabled() or gc.get_freeze_count():
        yield False
        return
    gc.freeze()
    try:
        yield True
    finally:
        gc.unfreeze()
