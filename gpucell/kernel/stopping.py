"""The stop button while a run waits: a flag the wait loop acts on."""

from __future__ import annotations

import contextlib
import signal
import threading
from collections.abc import Iterator
from typing import Any

__all__ = ["stop_button"]


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
