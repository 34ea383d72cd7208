"""How a ``--background`` run is stepped without the namespace: from the
kernel's event loop between cells, from a daemon thread while a cell runs (or
always, in a terminal), and in the main thread when a cell waits for it.

While a cell runs, the kernel's event loop does not, so a loop-driven run
would starve its engines once their queued chunks were done; a thread steps
it for the cell's duration instead (:func:`during_cell`), and the event loop
takes over again after it (:func:`after_cell`).  ipyparallel 9's client is
used from any thread (``Client._send`` hands the message to its IO thread:
``IOLoop.add_callback``, thread-safe); ``BackgroundRun`` steps under a lock,
so two drivers never step the run at once while one hands over to the other.

A driver only calls :meth:`BackgroundRun.step`, which sends chunks and keeps
results in kernel memory; the merge is the main thread's, after the driver is
stopped (:meth:`BackgroundRun._stop_driver` joins a thread)."""

from __future__ import annotations

import contextlib
import signal
import threading
from collections.abc import Iterator
from typing import Any

__all__ = [
    "LoopDriver",
    "ThreadDriver",
    "after_cell",
    "during_cell",
    "interrupt_flag",
    "running_loop",
]

#: seconds between two steps of a run driven by the kernel's event loop
TICK = 0.02


class LoopDriver:
    """Steps a run from the kernel's event loop, every :data:`TICK` seconds;
    each step waits for nothing.  SIGINT is ignored by an idle kernel, so an
    interrupt never lands in a step."""

    def __init__(self, bg: Any, loop: Any) -> None:
        self.bg, self.loop, self.stopped = bg, loop, False
        self.handle = loop.call_later(TICK, self.tick)

    def tick(self) -> None:
        self.handle = None
        if self.stopped or self.bg.state != "running":
            return
        try:
            with _no_interrupt():
                self.bg.step(0.0, blocking=False)  # (a thread ending its step)
        finally:  # (step keeps its own errors; the next tick comes regardless)
            if self.bg.state == "running" and not self.stopped:
                self.handle = self.loop.call_later(TICK, self.tick)

    def stop(self) -> None:
        self.stopped = True
        if self.handle is not None:
            self.handle.cancel()
            self.handle = None


@contextlib.contextmanager
def _no_interrupt() -> Iterator[None]:
    """A step from the event loop is no place for the stop button: an idle
    kernel ignores SIGINT anyway; while an async cell awaits, a press landing
    in a step (a few ms) is dropped rather than cancelling the run."""
    previous = signal.getsignal(signal.SIGINT)
    if previous is signal.SIG_IGN or previous is None:
        yield
        return
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    try:
        yield
    finally:
        signal.signal(signal.SIGINT, previous)


class ThreadDriver:
    """Steps a run from a daemon thread (a terminal IPython has no event loop
    between prompts); only the main thread touches the namespace, after
    stopping this one."""

    def __init__(self, bg: Any) -> None:
        self.bg = bg
        self.halt = threading.Event()
        self.thread = threading.Thread(
            target=self._loop, name=f"gpucell-background-{bg.cell}", daemon=True
        )
        self.thread.start()

    def _loop(self) -> None:
        while not self.halt.is_set() and self.bg.state == "running":
            self.bg.step(None)

    def stop(self, join: bool = True) -> None:
        """Stops after its current step; ``join``: waits for that step."""
        self.halt.set()
        if join and threading.current_thread() is not self.thread:
            self.thread.join()


def running_loop() -> Any:
    """The kernel's asyncio loop when this (main) thread runs one."""
    import asyncio

    if threading.current_thread() is not threading.main_thread():
        return None
    try:
        return asyncio.get_running_loop()
    except RuntimeError:
        return None


@contextlib.contextmanager
def interrupt_flag() -> Iterator[list[int]]:
    """SIGINT recorded while the main thread waits for a run (as the
    dispatcher's stop button): acted on between steps, never mid-step."""
    pressed: list[int] = []
    if threading.current_thread() is not threading.main_thread():
        yield pressed
        return
    previous = signal.signal(signal.SIGINT, lambda signum, frame: pressed.append(1))
    try:
        yield pressed
    finally:
        signal.signal(signal.SIGINT, previous)


def during_cell(bg: Any) -> None:
    """A cell starts: a run the event loop drives is driven by a thread until
    the cell ends, so its engines get their next chunks meanwhile."""
    driver = bg._driver
    if bg.state == "running" and isinstance(driver, LoopDriver):
        driver.stop()
        bg._driver = ThreadDriver(bg)


def after_cell(bg: Any) -> None:
    """The cell ended: the event loop drives the run again.  The thread is
    not waited for (it may be in a step of up to 50 ms); the lock in
    ``BackgroundRun.step`` keeps the two from stepping at once."""
    driver = bg._driver
    loop = running_loop()
    if isinstance(driver, ThreadDriver) and loop is not None:
        driver.stop(join=False)
        bg._driver = LoopDriver(bg, loop) if bg.state == "running" else None
