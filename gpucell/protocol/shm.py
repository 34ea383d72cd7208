"""Big buffers between the kernel and the engines on its own host, through shared
memory.

Every message still travels through ipyparallel (engine → controller → client); only
the large out-of-band buffers of a chunk's result (numpy arrays, tensors: the frames
:func:`gpucell.protocol.wire.dumps` makes) are written by the engine into one file in
``/dev/shm`` and replaced in the message by their place in it.  The kernel maps the
file and unlinks it at once, so the arrays it hands the user live on those pages:
one copy in all (the engine's write), against three through the controller (two TCP
hops and the copy that makes a received frame writable).  Measured on the 2-core
host: 32 × 4 MiB came back at ~600 MiB/s through the controller (the same as
``DirectView``); through this path several times faster (``bench/bench_parallel.py``
(d)).

Inputs go the same way in the other direction: the kernel writes a big input
once, every engine on the host maps that one file copy-on-write (so N engines hold
one copy of a 1 GB dataset until one of them writes to it), and the kernel removes
the file once the engines have answered.

This is not a second transport: no socket, no protocol, no process of ours; a
message that needs it rides ipyparallel's own.  It is only used when the engine can
*see* the kernel's ``/dev/shm``: the kernel writes a probe file with a random token,
and an engine spills only if it reads that token back (a remote host, or a container
with its own ``/dev/shm``, falls back to the normal frames).  Any error on the way
(a full ``/dev/shm``, a missing file) falls back or is reported; nothing is lost.
A small ``/dev/shm`` (Docker's 64 MiB default) is not used at all, and no buffer
takes more than a quarter of the free space: the arrays the kernel keeps live there,
and other programs need it too.

The file format and the buffer functions both sides call are here; the kernel's
channel (its probe file, and sweeping leftovers) is :mod:`gpucell.cluster.shm_channel`.
"""

from __future__ import annotations

import ctypes
import mmap
import os
import pickle
import struct
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from gpucell.protocol import private

__all__ = [
    "FOLLOW",
    "HAND_BACK",
    "LEAD",
    "MARK",
    "PACE",
    "Channel",
    "Prewritten",
    "follow",
    "hand_back_path",
    "host_role",
    "lead",
    "pace_path",
    "peek",
    "put",
    "reachable",
    "release",
    "spill",
    "spilled",
    "unspill",
    "verdict_path",
]

#: First frame of a spilled message (a wire header never starts like this).
MARK = b"gpucell.shm/1"

#: Results whose big buffers total less than this travel as normal frames: below
#: it, a file's create/map/unlink costs more than the copies it saves.
MIN_BYTES = 1 << 20

#: Frames at least this big are spilled (smaller ones stay in the message).
FRAME_MIN = 64 * 1024

_ALIGN = 64
PREFIX = "gpucell-"
DEFAULT_DIR = "/dev/shm"


@dataclass(frozen=True)
class Channel:
    """What the kernel tells its engines: where to write, and the token to check."""

    token: str
    directory: str = DEFAULT_DIR
    min_bytes: int = MIN_BYTES

    @property
    def probe(self) -> str:
        return os.path.join(self.directory, f"{PREFIX}{self.token}-probe")

    def path(self, tag: str) -> str:
        return os.path.join(self.directory, f"{PREFIX}{self.token}-{tag}")


#: First frame of an input an engine is to publish in its host's /dev/shm for the
#: other engines of its host (:func:`lead`), and of the note those engines get
#: instead of the input (:func:`follow`).
LEAD = b"gpucell.host-lead/1"
FOLLOW = b"gpucell.host-follow/1"


def lead(frames: list[Any], ch: Channel, tag: str) -> list[Any]:
    """Input frames for the one engine of a host that writes them to the host's
    /dev/shm (``ch.path(tag)``) for the others (see gpucell.engine.hostcopy)."""
    return [LEAD, pickle.dumps((ch, tag), protocol=5), *frames]


def follow(ch: Channel, tag: str, leader_pid: int, leader: int) -> list[Any]:
    """What the other engines of that host get: where the input will appear, and
    which engine (id and pid on their host) writes it."""
    return [FOLLOW, pickle.dumps((ch, tag, leader_pid, leader), protocol=5)]


def host_role(frames: Sequence[Any]) -> bytes | None:
    """``LEAD``, ``FOLLOW`` or ``None`` (plain or spilled input frames)."""
    if not frames:
        return None
    head = bytes(frames[0]) if len(frames[0]) in (len(LEAD), len(FOLLOW)) else b""
    return head if head in (LEAD, FOLLOW) else None


def verdict_path(ch: Channel, cell: str) -> str:
    """Where the kernel tells a cell's trial chunks on this host what to do once
    their time budget is spent: ``b"1"`` the trials agree (the loop looks
    uniform), so a trial goes on to its chunk's end instead of sending back the
    rest (one round trip and one chunk fewer per engine); ``b"0"`` they do not,
    stop.  Written once (:func:`put`), read by :func:`peek`."""
    return ch.path(f"verdict-{cell[:16]}")


def hand_back_path(ch: Channel, cell: str) -> str:
    """Where the kernel tells a cell's running chunks on this host that an
    engine is idle with nothing left to hand out (:data:`HAND_BACK`: the
    seconds a chunk's unrun rest must exceed to be worth handing back; gone
    again once every engine has work): such a chunk stops after its current
    iteration and its rest is shared out.  Written by :func:`put`, removed by
    the kernel, read by :func:`peek`."""
    return ch.path(f"handback-{cell[:16]}")


#: the hand-back flag's contents: seconds
HAND_BACK = struct.Struct("<d")


def pace_path(ch: Channel, cell: str, engine: int, start: int) -> str:
    """Where engine ``engine``'s trial chunk starting at iteration ``start``
    publishes the pace it measured when its budget ran out (:data:`PACE`), so
    the kernel can judge the trials while they run on, not only once they are
    back."""
    return ch.path(f"pace-{cell[:16]}-{engine}-{start}")


#: a published trial pace: iterations done, seconds they took, stamped (a
#: trial that ran the unstamped program is faster per iteration: not comparable)
PACE = struct.Struct("<qd?")


def put(path: str, data: bytes) -> bool:
    """Write a small file whole or not at all (a reader never sees it half
    written): to a new 0600 file under a random temporary name, never through
    a link planted there (:func:`gpucell.protocol.private.write`), then renamed
    into place.  False on error (a full /dev/shm): the reader then behaves as
    if nothing was said."""
    try:
        private.write(path, data)
        return True
    except OSError:
        return False


def peek(path: str) -> bytes | None:
    """The contents of a file :func:`put` wrote, or ``None`` while there is none
    (a link at ``path`` is not followed: ``None``)."""
    try:
        return private.read(path)
    except OSError:
        return None


def spilled(frames: Sequence[Any]) -> bool:
    """True for a message :func:`spill` made."""
    return bool(frames) and len(frames[0]) == len(MARK) and bytes(frames[0]) == MARK


def unspill(
    frames: Sequence[Any], record: Any = None, *, shared: bool = False
) -> list[Any]:
    """The message's frames, with spilled buffers mapped back in (writable views).

    Frames that were not spilled come back as they are.  A result (one reader) is
    unlinked as soon as it is mapped: its pages live as long as the arrays built
    on them.  ``shared`` is for inputs every engine maps: each maps them
    copy-on-write (the engines share the pages until one writes) and leaves the
    file to the sender's :func:`release`.  ``record.shared_bytes`` (a provenance
    record), if given, counts the bytes.
    """
    if not spilled(frames):
        return list(frames)
    path, size, places = pickle.loads(frames[1])
    rest = list(frames[2:])
    try:
        mode = os.O_RDONLY if shared else os.O_RDWR
        fd = os.open(path, mode | os.O_NOFOLLOW | os.O_CLOEXEC)
        if os.fstat(fd).st_uid != os.getuid():  # planted by another user
            os.close(fd)
            raise PermissionError(f"{path} is not a file of this user's")
    except OSError as e:
        what = "the kernel's input" if shared else "an engine's result"
        raise OSError(f"gpucell: {what} in shared memory ({path}) is gone: {e}") from e
    try:
        populate = getattr(mmap, "MAP_POPULATE", 0)
        if shared:
            # copy-on-write, and not populated: MAP_POPULATE on a writable
            # private mapping write-faults every page, so each engine would
            # copy the whole input; unpopulated, the engines share the file's
            # pages until one writes (inputs are read-only to iterations)
            mm = mmap.mmap(fd, size, flags=mmap.MAP_PRIVATE)
            advise = getattr(mm, "madvise", None)
            if advise is not None and hasattr(mmap, "MADV_WILLNEED"):
                advise(mmap.MADV_WILLNEED)  # read ahead, without copying
        else:
            mm = mmap.mmap(fd, size, flags=mmap.MAP_SHARED | populate)
    finally:
        os.close(fd)
        if not shared:
            try:
                os.unlink(path)
            except OSError:
                pass
    if record is not None:
        record.shared_bytes += size
    view = memoryview(mm)
    for index, offset, nbytes in places:  # index among the buffers, after the
        rest[2 + index] = view[offset : offset + nbytes]  # header and payload
    return rest


_seen: dict[str, bool] = {}


def reachable(ch: Channel) -> bool:
    """True when this process sees the kernel's probe (same host, same /dev/shm)."""
    ok = _seen.get(ch.token)
    if ok is None:
        try:
            # the first line is the token (the second says whose it is)
            head = private.read(ch.probe, 256)
            ok = head.split(b"\n", 1)[0] == ch.token.encode()
        except OSError:
            ok = False
        _seen[ch.token] = ok
    return ok


@dataclass(frozen=True)
class Prewritten:
    """A result file an engine wrote while its chunk ran
    (:mod:`gpucell.engine.writebehind`): where each buffer already is."""

    path: str
    end: int  # the next free (aligned) offset
    written: dict[tuple[int, int], int] = field(default_factory=dict)


def spill(
    frames: list[Any],
    ch: Channel | None,
    tag: str,
    prewritten: Prewritten | None = None,
    *,
    own: bool = False,
) -> list[Any]:
    """Write the big buffers among ``frames[2:]`` to one shared-memory file.

    Returns ``[MARK, place, *frames]`` with the spilled frames emptied, or
    ``frames`` unchanged when the channel is unusable here, the buffers are small,
    or the write fails (``/dev/shm`` full): the caller sends what it gets.
    ``prewritten``: the file already holds some of the buffers; only the others
    are written, after them (and on any failure the file is removed).  ``own``:
    the file is for this host's own readers (an engine publishing an input for
    the engines beside it), so the kernel's probe need not be visible here.
    """
    if ch is None or len(frames) <= 2:
        if prewritten is not None:
            _unlink(prewritten.path)
        return frames
    big = [
        (i, memoryview(f).cast("B"))
        for i, f in enumerate(frames[2:])
        if memoryview(f).nbytes >= FRAME_MIN
    ]
    if prewritten is not None and not any(
        _key(v) in prewritten.written for _, v in big
    ):
        discard(prewritten)  # none of it made it into the result
        prewritten = None
    if prewritten is None:
        total = sum(v.nbytes for _, v in big)
        seen = own or reachable(ch)
        if total < ch.min_bytes or not seen or not _room(ch.directory, total):
            return frames
        path, offset, new = ch.path(tag), 0, True
    else:
        path, offset, new = prewritten.path, prewritten.end, False
    places, todo = [], []
    for i, v in big:
        at = None if prewritten is None else prewritten.written.get(_key(v))
        if at is None:
            at = offset
            todo.append((v, at))
            offset += aligned(v.nbytes)
        places.append((i, at, v.nbytes))
    if prewritten is not None and not _room(
        ch.directory, sum(v.nbytes for v, _ in todo)
    ):
        _unlink(path)
        return frames
    try:
        # a new file: 0600, O_EXCL|O_NOFOLLOW (a planted link is never
        # followed); the prewritten one: ours, and not through a link either
        fd = (
            private.create(path, os.O_RDWR)
            if new
            else os.open(path, os.O_RDWR | os.O_NOFOLLOW | os.O_CLOEXEC)
        )
    except OSError:
        if prewritten is not None:
            _unlink(path)
        return frames
    try:
        try:
            for v, at in todo:
                write_all(fd, v, at)
            # the size the kernel maps (a full /dev/shm failed a write above)
            os.ftruncate(fd, offset)
        finally:
            os.close(fd)
    except OSError:
        _unlink(path)
        return frames
    rest = list(frames[2:])
    for i, _ in big:
        rest[i] = b""
    place = pickle.dumps((path, offset, places), protocol=5)
    return [MARK, place, *frames[:2], *rest]


def discard(prewritten: Prewritten) -> None:
    """Remove a prewritten file that will not be sent."""
    _unlink(prewritten.path)


def aligned(nbytes: int) -> int:
    """``nbytes`` rounded up to the file's buffer alignment."""
    return -(-nbytes // _ALIGN) * _ALIGN


def raw_view(address: int, nbytes: int) -> memoryview:
    """A byte view of ``nbytes`` of this process's memory at ``address`` (a
    tensor's data); the caller keeps the owner alive while it is used."""
    return memoryview((ctypes.c_char * nbytes).from_address(address)).cast("B")


def _key(view: memoryview) -> tuple[int, int]:
    """(address, size) of a writable buffer (the views of tensors the engine
    wrote ahead are); read-only ones never match."""
    try:
        return ctypes.addressof(ctypes.c_char.from_buffer(view)), view.nbytes
    except TypeError:
        return -1, view.nbytes


def _unlink(path: str) -> None:
    try:
        os.unlink(path)
    except OSError:
        pass


def release(frames: Sequence[Any]) -> None:
    """Remove the file behind a spilled message (an input, once every engine that
    was to map it has answered); engines that mapped it keep their pages."""
    if spilled(frames):
        try:
            os.unlink(pickle.loads(frames[1])[0])
        except OSError:
            pass


#: A shared-memory directory smaller than this (Docker's default is 64 MiB) is left
#: to whatever else needs it (PyTorch's DataLoader workers do).
MIN_DIR_BYTES = 1 << 30


def room(directory: str) -> int:
    """Bytes of ``directory`` gpucell may fill without crowding others: none in a
    small /dev/shm, else a quarter of what is free (results the kernel holds stay
    there)."""
    try:
        st = os.statvfs(directory)
    except OSError:
        return 0
    total, free = st.f_blocks * st.f_frsize, st.f_bavail * st.f_frsize
    return free // 4 if total >= MIN_DIR_BYTES else 0


def _room(directory: str, nbytes: int) -> bool:
    limit = room(directory)
    return limit > 0 and nbytes <= limit


def write_all(fd: int, view: memoryview, at: int) -> None:
    done = 0
    while done < view.nbytes:
        done += os.pwrite(fd, view[done:], at + done)
