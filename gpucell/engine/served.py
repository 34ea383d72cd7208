"""One task per engine per cell: the cell's later chunks, taken from the
kernel's ``/dev/shm`` folder (``gpucell.protocol.chunk_channel``).

The task the kernel queues behind an engine's first chunk of a cell (which
travels as a task, with the program and inputs).  Each chunk runs as
``worker.answer`` runs a task's, with the engine's output filed under the
chunk's own message id; the task ends when the kernel writes ``END``.

An interrupt (the stop button, ``--timeout``) lands in this task: the chunk
it stopped answers what a task would have raised, and every chunk already
queued behind it is answered ``aborted`` without running, as ipyparallel's
abort leaves queued tasks.

Runs on engines (standard library and gpucell's engine modules).
"""

from __future__ import annotations

import os
import pickle
import select
import sys
import traceback
from typing import Any

from gpucell.engine import quietidle
from gpucell.protocol import chunk_channel as cc

__all__ = ["ANSWERED", "STARTED", "serve"]

#: chunks this engine answered through the channel, serving tasks it ran (tests
#: read them)
ANSWERED = [0]
STARTED = [0]


def serve(folder: str, engine: int) -> int:
    """Answer the chunks the kernel writes for ``engine`` until ``END``; the
    number answered."""
    from gpucell.engine.worker import answer

    STARTED[0] += 1
    to_me = os.open(cc.to_engine(folder, engine), os.O_RDONLY)
    back = os.open(cc.from_engine(folder, engine), os.O_WRONLY)
    kernel = quietidle.kernel()
    saved = _parent(kernel)
    answered = 0
    try:
        while True:
            try:
                n = _read_notice(to_me)
            except KeyboardInterrupt:
                if _abort_queued(folder, to_me, back):  # nothing was running
                    return answered
                continue
            if n is None or n == cc.END:
                return answered
            reply = _run_one(folder, n, kernel, saved, answer)
            if not _write_reply(folder, back, n, reply):
                return answered  # the kernel's run is over: nobody reads it
            answered += 1
            ANSWERED[0] += 1
            if isinstance(reply, cc.Raised) and reply.ename == "KeyboardInterrupt":
                if _abort_queued(folder, to_me, back):
                    return answered
    finally:
        _restore(kernel, saved)
        os.close(to_me)
        os.close(back)


def _run_one(folder: str, n: int, kernel: Any, saved: Any, answer: Any) -> Any:
    """Request ``n``: run its chunk under its own parent; its reply."""
    try:
        with open(cc.request_path(folder, n), "rb") as f:
            request: cc.ChannelRequest = pickle.load(f)
        os.unlink(cc.request_path(folder, n))
    except FileNotFoundError:
        return cc.Aborted()  # withdrawn: the run was stopped
    parent = {
        "header": request.parent,
        "parent_header": {},
        "metadata": {},
        "content": {},
        "msg_id": request.parent["msg_id"],
        "msg_type": request.parent.get("msg_type", "apply_request"),
        "buffers": [],
    }
    _set_parent(kernel, saved, parent)
    quietidle.begin()
    try:
        frames = answer(request.task)
    except KeyboardInterrupt as e:
        return _raised(e)
    except BaseException as e:  # noqa: BLE001 - a task's error goes to the kernel
        return _raised(e)
    finally:
        for stream in (sys.stdout, sys.stderr):
            try:
                stream.flush()
            except Exception:
                pass
    printed = quietidle.sent_output()
    if printed and kernel is not None:
        # after the chunk's output: the kernel's relay knows it has all of it
        kernel._publish_status("idle", "shell", parent)
    return cc.Answered(cc.plain_frames(frames) or [], printed)


def _raised(e: BaseException) -> cc.Raised:
    text = "".join(traceback.format_exception(type(e), e, e.__traceback__))
    return cc.Raised(type(e).__name__, str(e), text)


def _read_notice(fd: int) -> int | None:
    """The next request's number (None: the kernel's end of the FIFO closed)."""
    data = b""
    while len(data) < cc.NOTICE.size:
        more = os.read(fd, cc.NOTICE.size - len(data))
        if not more:
            return None
        data += more
    return cc.unpack(data)


def _write_reply(folder: str, back: int, n: int, reply: Any) -> bool:
    """Reply ``n``, then its notice; False where the folder is gone (the
    kernel ended the run)."""
    path = cc.reply_path(folder, n)
    try:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    except FileNotFoundError:
        return False
    with os.fdopen(fd, "wb") as f:
        pickle.dump(reply, f, protocol=pickle.HIGHEST_PROTOCOL)
    try:
        os.write(back, cc.pack(n))
    except BrokenPipeError:
        return False
    return True


def _abort_queued(folder: str, to_me: int, back: int) -> bool:
    """Answer ``aborted`` to every request already queued (the run stops);
    True where the kernel's ``END`` came meanwhile."""
    while select.select([to_me], [], [], 0)[0]:
        n = _read_notice(to_me)
        if n is None or n == cc.END:
            return True
        try:
            os.unlink(cc.request_path(folder, n))
        except FileNotFoundError:
            pass
        if not _write_reply(folder, back, n, cc.Aborted()):
            return True
    return False


def _parent(kernel: Any) -> Any:
    """The serving task's own parent (ident, message), restored at its end."""
    if kernel is None:
        return None
    ident = getattr(kernel, "_shell_parent_ident", None)
    return (ident.get() if hasattr(ident, "get") else ident, kernel.get_parent("shell"))


def _set_parent(kernel: Any, saved: Any, parent: dict[str, Any]) -> None:
    if kernel is not None and saved is not None:
        kernel.set_parent(saved[0], parent, "shell")


def _restore(kernel: Any, saved: Any) -> None:
    if kernel is not None and saved is not None:
        kernel.set_parent(saved[0], saved[1], "shell")
