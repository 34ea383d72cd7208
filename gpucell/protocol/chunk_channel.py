"""A cell's chunks to a local engine without a task each (``GpuCell.chunk_channel``).

Why: as one ipyparallel task per chunk, a cheap chunk costs ~2.5 ms of CPU in
ipyparallel's transport across kernel, controller and engine
(bench/reports/stream-proto-2026-11-27.md).  An engine on the kernel's host
instead runs one task per cell, ``engine.served.serve``, that takes the
cell's later chunks from a folder in ``/dev/shm`` (host-local, as inputs and
chunk bounds already travel) and answers each there.

The conversation, per engine, in a 0700 folder of the kernel's:

- the kernel writes request ``n`` (a :class:`ChannelRequest`, pickled) to the
  file ``req-<n>``, then ``n`` as 8 bytes to the FIFO ``to-<engine>``;
- the engine reads ``n``, takes the file (removes it), runs the chunk as a
  task would (``worker.answer``), writes its :data:`ChannelReply` to
  ``rep-<n>``, then ``n`` to the FIFO ``from-<engine>``;
- :data:`END` on ``to-<engine>`` ends the engine's task (the run is over).

A request whose file is gone when the engine reads its number was withdrawn
(the run was stopped): it is answered ``aborted`` without running.  What the
chunk prints goes out on the engine's IOPub as a task's output does, filed
under the request's own message id (``parent``), so the kernel's relay reads
each chunk's output as it reads a task's.

Standard library only.
"""

from __future__ import annotations

import os
import struct
from typing import Any, Literal, NamedTuple

from gpucell.protocol.conversation import ChunkTask

__all__ = [
    "END",
    "NOTICE",
    "ChannelReply",
    "ChannelRequest",
    "from_engine",
    "pack",
    "plain_frames",
    "reply_path",
    "request_path",
    "to_engine",
    "unpack",
]

#: the notice of a request or a reply: its number, little-endian
NOTICE = struct.Struct("<Q")

#: the number that ends the engine's task
END = 2**64 - 1


class ChannelRequest(NamedTuple):
    """One chunk, as its task's arguments, and whose output it is."""

    task: ChunkTask
    parent: dict[str, Any]  # the message header its output is filed under


class Answered(NamedTuple):
    """The chunk ran: ``worker.answer``'s frames (a :data:`Reply`)."""

    frames: list[bytes]
    printed: bool  # it sent output on IOPub: an "idle" for ``parent`` follows
    kind: Literal["answered"] = "answered"


class Raised(NamedTuple):
    """``worker.answer`` raised, as a task would have (``RemoteError``)."""

    ename: str
    evalue: str
    traceback: str
    kind: Literal["raised"] = "raised"


class Aborted(NamedTuple):
    """Withdrawn before it ran (the run was stopped)."""

    kind: Literal["aborted"] = "aborted"


ChannelReply = Answered | Raised | Aborted


def to_engine(folder: str, engine: int) -> str:
    return os.path.join(folder, f"to-{engine}")


def from_engine(folder: str, engine: int) -> str:
    return os.path.join(folder, f"from-{engine}")


def request_path(folder: str, n: int) -> str:
    return os.path.join(folder, f"req-{n}")


def reply_path(folder: str, n: int) -> str:
    return os.path.join(folder, f"rep-{n}")


def pack(n: int) -> bytes:
    return NOTICE.pack(n)


def unpack(data: bytes) -> int:
    return int(NOTICE.unpack(data)[0])


def plain_frames(frames: list[Any] | None) -> list[Any] | None:
    """``frames`` as bytes (a pickle cannot hold a memoryview); ``None`` kept."""
    if frames is None:
        return None
    return [f if isinstance(f, bytes) else bytes(f) for f in frames]
