"""GPU results go into the chunk's shared-memory result file while the loop computes.

Without this, a chunk's big results reach ``/dev/shm`` only when the chunk ends
(:func:`gpucell.protocol.shm.spill`): every byte is written after all the compute,
and on a GPU engine that write was the larger part of a big-result cell's wait
(measured on an H100: 48 results of 16 MiB, 0.57 s of compute, then 0.31 s of
spilling).  :class:`gpucell.engine.tohost.HostCopier` already copies each CUDA
result to pinned host memory as the iteration records it; this thread waits for
each copy to land and writes it into the file at once, so the spill at the end
finds those buffers written and only adds what is left.

A buffer is known by its address and size: the wire frame of a host tensor is a
view of that tensor's memory, so the spill finds it (every tensor written ahead is
held until the spill is done, so no other buffer can take its address).  A value
that never makes it into the result (an own-row write overwritten later) only
wastes its bytes in the file.  Any failure (``/dev/shm`` full, a write error)
turns the thread off and the spill writes what it must, or falls back to normal
frames; nothing is lost.
"""

from __future__ import annotations

import os
import queue
import threading
from typing import Any

from gpucell.protocol import private, shm

__all__ = ["WriteBehind", "start"]

_STOP = object()


class WriteBehind:
    """The writer of one chunk's result file (``shm.Channel.path(tag)``)."""

    def __init__(self, path: str, limit: int) -> None:
        self.path = path
        self._limit = limit  # bytes this chunk may put in /dev/shm
        self._queue: queue.SimpleQueue[Any] = queue.SimpleQueue()
        self._thread: threading.Thread | None = None
        self._fd: int | None = None
        self.end = 0  # the file's next free (aligned) offset
        self.written: dict[tuple[int, int], int] = {}  # (address, bytes) -> offset
        self.failed = False
        self._planned = 0
        self._held: list[Any] = []

    def add(self, host: Any, event: Any) -> None:
        """Write ``host`` (a pinned CPU tensor) once ``event`` says its copy landed."""
        nbytes = host.numel() * host.element_size()
        if self.failed or nbytes < shm.FRAME_MIN:
            return
        if self._planned + nbytes > self._limit:
            return  # too big for /dev/shm's room: the spill decides at the end
        self._planned += shm.aligned(nbytes)
        # held until the chunk's writer is dropped: a freed tensor's address
        # could be reused by one that was not written ahead, which the spill
        # would then take for written (stale bytes in the result)
        self._held.append(host)
        if self._thread is None:
            self._thread = threading.Thread(
                target=self._drain, name="gpucell-writebehind", daemon=True
            )
            self._thread.start()
        self._queue.put((host, event, nbytes))

    def _drain(self) -> None:
        while True:
            item = self._queue.get()
            if item is _STOP:
                if self.failed and self._fd is not None:
                    os.close(self._fd)  # discarded: finish() will not
                    self._fd = None
                return
            if self.failed:
                continue
            host, event, nbytes = item
            try:
                event.synchronize()  # releases the GIL while the copy lands
                if self._fd is None:  # 0600, never through a planted link
                    self._fd = private.create(self.path, os.O_RDWR)
                at = self.end
                shm.write_all(self._fd, shm.raw_view(host.data_ptr(), nbytes), at)
                self.written[(host.data_ptr(), nbytes)] = at
                self.end = at + shm.aligned(nbytes)
            except Exception:  # noqa: BLE001 - the spill at the end takes over
                self.failed = True

    def finish(self) -> shm.Prewritten | None:
        """Wait for every write; what the spill may reuse, or ``None`` (nothing
        written, or a failure: then the file is gone)."""
        self._join()
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None
        if self.failed or not self.written:
            self.discard()
            return None
        return shm.Prewritten(self.path, self.end, dict(self.written))

    def discard(self) -> None:
        """The chunk failed or was interrupted: remove the file (without waiting
        for a copy that may never land)."""
        self.failed = True
        self._queue.put(_STOP)
        try:
            os.unlink(self.path)
        except OSError:
            pass

    def _join(self) -> None:
        if self._thread is not None:
            self._queue.put(_STOP)
            self._thread.join()
            self._thread = None


def start(ch: shm.Channel | None, tag: str) -> WriteBehind | None:
    """A writer for this chunk's results, when they can go through shared memory."""
    if ch is None or not shm.reachable(ch):
        return None
    limit = shm.room(ch.directory)
    if limit <= 0:
        return None
    return WriteBehind(ch.path(tag), limit)
