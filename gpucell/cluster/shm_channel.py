"""The kernel's shared-memory channel: opened with the cluster, closed when it stops.

Leftovers (a result abandoned by an interrupted or failed cell, or written by an
engine that died) are removed after such a cell and when the cluster stops; files
of kernels that died are removed when the next channel opens.  The file format and
the buffer functions are :mod:`gpucell.protocol.shm`.
"""

from __future__ import annotations

import atexit
import os
import time
import uuid

from gpucell.devices.host import pid_running
from gpucell.protocol import private
from gpucell.protocol.shm import DEFAULT_DIR, PREFIX, Channel

__all__ = [
    "STALE_AFTER",
    "close_channel",
    "open_channel",
    "open_for_cluster",
    "release",
    "sweep",
    "sweep_stale",
]


def open_channel(directory: str = DEFAULT_DIR) -> Channel | None:
    """Create a channel (its probe file), or ``None`` where there is no usable
    shared-memory directory."""
    if not os.path.isdir(directory) or not os.access(directory, os.W_OK):
        return None
    sweep_stale(directory)
    ch = Channel(f"{os.getpid()}-{uuid.uuid4().hex[:12]}", directory)
    try:
        fd = private.create(ch.probe)  # 0600, O_EXCL|O_NOFOLLOW
        try:
            os.write(fd, ch.token.encode() + b"\n" + _owner())
        finally:
            os.close(fd)
    except OSError:
        return None
    return ch


def close_channel(ch: Channel | None) -> None:
    """Remove the probe and every file of the channel left behind."""
    if ch is None:
        return
    sweep(ch)
    try:
        os.unlink(ch.probe)
    except OSError:
        pass


def sweep(ch: Channel | None) -> int:
    """Remove the channel's result files no one will read (not the probe)."""
    if ch is None:
        return 0
    head = f"{PREFIX}{ch.token}-"
    probe = os.path.basename(ch.probe)
    removed = 0
    try:
        names = os.listdir(ch.directory)
    except OSError:
        return 0
    for name in names:
        if name.startswith(head) and name != probe:
            try:
                os.unlink(os.path.join(ch.directory, name))
                removed += 1
            except OSError:
                pass
    return removed


#: Files of a dead kernel younger than this are left alone: a kernel in another
#: pid namespace sharing this /dev/shm (containers with ``--ipc=host``) may own them.
STALE_AFTER = 600.0


def _owner() -> bytes:
    """Which machine boot and pid namespace this kernel's pids belong to."""
    from gpucell.devices.host import identity

    me = identity()
    return f"{me['boot_id']} {me['pidns']}".encode()


def _ours(directory: str, name: str) -> bool:
    """The channel of file ``name`` was opened by a kernel whose pids are ours
    (its probe says so): its pid being gone then proves the kernel is gone."""
    token = name[len(PREFIX) :].split("-", 2)
    if len(token) < 2:
        return False
    probe = os.path.join(directory, f"{PREFIX}{token[0]}-{token[1]}-probe")
    try:
        owner = private.read(probe, 512).split(b"\n", 1)[1]
    except (OSError, IndexError):
        return False
    mine = _owner()
    known = all(mine.split(b" ")) and len(mine.split(b" ")) == 2
    return known and owner == mine


def sweep_stale(directory: str = DEFAULT_DIR) -> int:
    """Remove files of channels whose kernel process is gone (it was killed):
    at once when its probe shows it ran in our pid space, else after
    :data:`STALE_AFTER` (another container sharing /dev/shm may own them)."""
    removed = 0
    try:
        names = os.listdir(directory)
    except OSError:
        return 0
    now = time.time()
    ours = {n for n in names if n.startswith(PREFIX) and _ours(directory, n)}
    for name in sorted(names, key=lambda n: n.endswith("-probe")):  # probes last
        if not name.startswith(PREFIX):
            continue
        pid = name[len(PREFIX) :].split("-", 1)[0]
        if not pid.isdigit() or pid_running(int(pid)):
            continue
        path = os.path.join(directory, name)
        try:
            if name not in ours and now - os.stat(path).st_mtime < STALE_AFTER:
                continue
            os.unlink(path)
            removed += 1
        except OSError:
            pass
    return removed


_open_channels: set[Channel] = set()  # closed at exit if their cluster never stops


def open_for_cluster() -> Channel | None:
    """A cluster's channel, closed at exit if the cluster is never stopped."""
    channel = open_channel()
    if channel is not None:
        if not _open_channels:
            atexit.register(_release_all)
        _open_channels.add(channel)
    return channel


def release(channel: Channel | None) -> None:
    """Close a cluster's channel (``None``: nothing to do)."""
    if channel is not None:
        close_channel(channel)
        _open_channels.discard(channel)


def _release_all() -> None:
    for channel in list(_open_channels):
        release(channel)
