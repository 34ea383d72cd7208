"""Hold the stop button off while the merge writes the namespace, and while a
run is being stopped.

The merge is all or nothing: validated first (an interrupt there changes nothing),
then applied.  An interrupt that lands while it applies would leave a torn
namespace (the gathered list complete, the ``+=`` reduction still 0), the one
place the promise could break.  So SIGINT is recorded while the commit runs and
raised as soon as it is done: the namespace then holds the whole loop's results,
as a serial cell interrupted just after its loop would.
"""

from __future__ import annotations

import contextlib
import signal
import threading
from collections.abc import Iterator
from typing import Any


@contextlib.contextmanager
def interrupts_deferred(what: str) -> Iterator[None]:
    """Run the block whole; an interrupt during it is raised after it (``what``:
    the block, in words, for the message).

    Only the main thread receives SIGINT, so elsewhere this is a no-op.
    """
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    pending: list[Any] = []

    def remember(signum: int, frame: Any) -> None:
        pending.append(signum)

    previous = signal.signal(signal.SIGINT, remember)
    try:
        yield
    finally:
        signal.signal(signal.SIGINT, previous)
    if pending:
        raise KeyboardInterrupt(
            f"gpucell: interrupted while {what}; the interrupt waited until it was "
            "done."
        )


@contextlib.contextmanager
def interrupts_absorbed() -> Iterator[None]:
    """Run the block with the stop button pressed again taking no effect: a
    run being stopped (its chunks cancelled, engines waited for, at most
    twice ``GpuCell.interrupt_grace``) is already answering a press, and a
    second one landing in it left the engines running and the run's record
    unfinished.  Main thread only, as above."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    previous = signal.signal(signal.SIGINT, lambda signum, frame: None)
    try:
        yield
    finally:
        signal.signal(signal.SIGINT, previous)
