"""An engine that dies between cells is restarted at once, from the kernel's
own event loop.

Without this, a death between cells was noticed only by the next cell or
``%gpu_cluster status``: until then the monitor, the widget and the Lab panel
showed the device ``dead``.  Their threads cannot start the restart: the
ipyparallel client (and ipyparallel's ``Cluster``) belong to the main thread.
In an ipykernel the main thread runs an asyncio loop between cells, so a
callback on it (``loop.call_later``) looks every :data:`PERIOD` seconds for
gone engines (one /proc read per engine on this host, the client's registered
ids for the others: its IO thread keeps them) and, when there is one, begins
its restart and advances it every :data:`FAST` seconds until the new engine is
back.  It does nothing while a cell runs (the cell's run handles its engines,
and an async cell's awaits are no place to change the cluster under it) or
while a ``--background`` run is pending (its driver steps the restarts and
takes the new engine into the run).

What the restarts say while no cell runs (an engine back, a device's budget
spent, restarts given up) is kept, not printed: printed between cells, it would
land in the last cell's output, above the fold, where nobody looks.  The next
gpucell cell or ``%gpu_cluster`` line says it first, one line each ("since the
last cell: ..."; :func:`said_between`); the ``gpucell`` logger has it at once,
the panel and the monitor show the devices' states live.

A terminal IPython runs no loop between prompts: there the next cell or
``%gpu_cluster status`` starts the restart, as before.
"""

from __future__ import annotations

import asyncio
import logging
import sys
import threading
from typing import Any

__all__ = ["FAST", "PERIOD", "Watch", "forget", "said_between", "watch"]

log = logging.getLogger(__name__)

#: seconds between two looks for gone engines while nothing restarts
PERIOD = 0.5
#: seconds between two steps while a restart is under way
FAST = 0.1

_active: Watch | None = None
#: what the restarts said while no cell ran, oldest first, until a cell takes it
_between: list[str] = []


class Watch:
    """The looks of one cluster, rescheduled on ``loop`` until the cluster
    stops or is replaced."""

    def __init__(self, gc: Any, loop: asyncio.AbstractEventLoop) -> None:
        self.gc, self.loop = gc, loop
        self.stopped = False
        self.looks = 0
        self.errors = 0
        self.handle: asyncio.TimerHandle | None = loop.call_later(PERIOD, self.tick)

    def tick(self) -> None:
        self.handle = None
        if self.stopped or not _current(self.gc):
            self.stopped = True
            return
        try:
            if _kernel_idle():
                self.look()
        except (Exception, KeyboardInterrupt) as e:  # the next look tries again
            self.errors += 1
            log.debug("restart watch: %r", e)
        if not self.stopped:  # (a batch job still queued is no reason to hurry)
            r = self.gc.restarts
            fast = bool(r.pending or r.arrivals)
            self.handle = self.loop.call_later(FAST if fast else PERIOD, self.tick)

    def look(self) -> None:
        """One look: deaths noticed and their restarts begun; restarts under
        way advanced (each step waits for nothing but a launch)."""
        gc = self.gc
        self.looks += 1
        if gc.stopping or not gc.controller_alive():
            return  # the next cell or status says the controller is gone
        r = gc.restarts
        echo, r.echo = r.echo, _between.append  # (a cell would print it: kept)
        try:
            r.notice(gc)
            back = r.step(gc) if r.busy() else []
        finally:
            r.echo = echo
        for done, _ in back:
            if done.dead >= 0:  # (a batch job's engine joining replaces none)
                _between.append(
                    f"engine {done.dead} ({done.label}) was restarted: it is "
                    f"engine {done.new_id} now"
                )

    def stop(self) -> None:
        self.stopped = True
        if self.handle is not None:
            self.handle.cancel()
            self.handle = None


def watch(gc: Any) -> Watch | None:
    """Watch ``gc`` from the kernel's event loop, when this (main) thread runs
    one (an ipykernel's cell, a panel request); ``None`` in a terminal.
    Watching it already, the same watch."""
    global _active
    if _active is not None and _active.gc is gc and not _active.stopped:
        return _active
    forget()
    if threading.current_thread() is not threading.main_thread():
        return None
    try:
        loop = asyncio.get_running_loop()
    except RuntimeError:
        return None
    _active = Watch(gc, loop)
    return _active


def said_between() -> list[str]:
    """What the restarts said since the last cell (taken: said once)."""
    said = _between[:]
    del _between[: len(said)]
    return said


def forget() -> None:
    """Stop watching (the cluster stopped)."""
    global _active
    w, _active = _active, None
    if w is not None:
        w.stop()


def _current(gc: Any) -> bool:
    from gpucell.cluster import lifecycle

    return not gc.stopping and lifecycle.current_or_none() is gc


def _kernel_idle() -> bool:
    """No cell runs (IPython sets the display hook's ``exec_result`` for the
    cell's duration) and no background run is pending.  Read from
    ``sys.modules``: the cluster machinery never imports the kernel's."""
    ipython = sys.modules.get("IPython")
    shell = ipython.get_ipython() if ipython is not None else None
    hook = getattr(shell, "displayhook", None)
    if getattr(hook, "exec_result", None) is not None:
        return False
    session = sys.modules.get("gpucell.kernel.session")
    return session is None or not session.current().pending
