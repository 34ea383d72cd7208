"""One copy of an input per host, for engines that cannot map the kernel's /dev/shm.

Engines on another host (or in another container) receive inputs through the
controller.  Sent to each engine, a 2 GiB input would cross the network once per
engine and sit in each engine's private memory.  Instead the kernel sends it to
one engine of each such host (the *leader*, ``shm.lead``), which writes it to its
host's /dev/shm and maps it from there; the other engines of that host get only a
note (``shm.follow``) and map the same file once it is published, copy-on-write
and unpopulated as for inputs from the kernel's own host.

Publishing is atomic: the data file is written first, then a small descriptor
(the spilled message, big buffers emptied) is written under a temporary name
and renamed, so a follower never maps half an input.  A leader that cannot write
(``/dev/shm`` full or too small) publishes a failure note instead, and its
followers fail their chunk with that reason; a follower whose leader died before
publishing says so.  After the cell every engine of the host removes the files
(the kernel's ``tidy``: whichever comes first, so a leader that died leaves
nothing behind), or at its next cell if that tidy never came.
"""

from __future__ import annotations

import atexit
import os
import pickle
import time
from typing import Any

from gpucell.devices.host import pid_running
from gpucell.protocol import private, shm

__all__ = ["receive", "unpublish"]

#: a follower waits this long for its leader (alive) to publish an input
WAIT_SECONDS = 600.0

#: kernel key -> (cell, paths this engine published for it)
_published: dict[str, tuple[str, list[str]]] = {}


def _ready(path: str) -> str:
    return path + ".ready"


def _failed(path: str) -> str:
    return path + ".failed"


def _write_atomically(path: str, data: bytes) -> None:
    """0600, under a random temporary name, never through a planted link."""
    private.write(path, data)


def receive(frames: list[Any], cell: str, kernel: str = "") -> list[Any]:
    """The input frames this engine loads: as sent, or spilled to (leader) or
    mapped from (follower) its host's /dev/shm."""
    role = shm.host_role(frames)
    if role is None:
        return frames
    if role == shm.LEAD:
        return _lead(frames, _remembered(cell, kernel))
    return _follow(frames, _remembered(cell, kernel))


def _remembered(cell: str, kernel: str) -> list[str]:
    """The list of files to remove after ``cell`` (every engine of the host
    removes them at its tidy: whichever comes first, even if the leader died)."""
    old_cell, paths = _published.get(kernel, (cell, []))
    if old_cell != cell:  # an earlier cell's tidy never came (it failed)
        unpublish(kernel)
        paths = []
    _published[kernel] = (cell, paths)
    return paths


def _lead(frames: list[Any], paths: list[str]) -> list[Any]:
    ch, tag = pickle.loads(frames[1])
    payload = list(frames[2:])
    path = ch.path(tag)
    spilled = shm.spill(payload, ch, tag, own=True)
    if not shm.spilled(spilled):
        room = shm.room(ch.directory) >> 20
        reason = (
            f"engine pid {os.getpid()} could not write the input to "
            f"{ch.directory} on this host ({room} MiB of it usable)"
        )
        _write_atomically(_failed(path), reason.encode())
        paths.append(_failed(path))
        return payload  # this engine uses what it received
    paths += [path, _ready(path)]
    note = [bytes(memoryview(f)) for f in spilled]
    _write_atomically(_ready(path), pickle.dumps(note, protocol=5))
    return spilled  # mapped like the others' (what was received can go)


def _follow(frames: list[Any], paths: list[str]) -> list[Any]:
    ch, tag, leader_pid, leader = pickle.loads(frames[1])
    path = ch.path(tag)
    paths += [path, _ready(path), _failed(path)]
    deadline = time.monotonic() + WAIT_SECONDS
    pause = 0.002
    while True:
        try:
            return list(pickle.loads(private.read(_ready(path))))
        except FileNotFoundError:
            pass
        try:
            reason = private.read(_failed(path)).decode(errors="replace")
            raise RuntimeError(
                f"gpucell: engine {leader} was to share an input with the engines "
                f"of this host, but {reason}. Free /dev/shm there, or set "
                "`%config GpuCell.shared_memory = False` to send every engine "
                "its own copy."
            )
        except FileNotFoundError:
            pass
        alive = pid_running(leader_pid)
        if not alive or time.monotonic() > deadline:
            what = "did not answer in time" if alive else "died"
            raise RuntimeError(
                f"gpucell: engine {leader}, which was to share an input with the "
                f"engines of this host through {ch.directory}, {what} before "
                "publishing it. Run the cell again."
            )
        time.sleep(pause)
        pause = min(0.05, pause * 2)


def unpublish(kernel: str = "") -> None:
    """Remove the files this engine published for ``kernel`` (every engine of
    its host that was to map them has: the cell is over)."""
    _cell, paths = _published.pop(kernel, ("", []))
    for p in paths:
        try:
            os.unlink(p)
        except OSError:
            pass


@atexit.register
def _unpublish_all() -> None:  # an engine stopped mid-cell leaves nothing behind
    for kernel in list(_published):
        unpublish(kernel)
