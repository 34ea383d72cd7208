"""No "idle" status message after a chunk that sent no output (``GpuCell.quiet_idle``).

Why: after every task an ipyparallel engine publishes "idle" on IOPub; the
client waits for it only to know that the task's output (stdout, stderr,
displays) has all arrived.  The engine sends it, the controller forwards it and
parses it, the client parses it: bench/reports/first-cell-2026-11-27.md measured
~0.2 ms of engine CPU and ~0.15-0.2 ms of the controller's per task.  For a chunk
that published nothing on IOPub there is nothing to wait for: the engine says so
in the chunk's reply (``timing["quiet"]``) and leaves the "idle" out; the kernel
marks that task's output complete itself (``kernel/dispatch``).

Output is seen as the engine's session sends it: any IOPub message of the
request other than a status (a stream, a display, a comm message) keeps its
"idle".  Only requests the kernel asked for this (``ChunkTask.quiet_idle``) are
touched; every other task, a user's own included, is left as it was.  Runs on
engines (standard library only).
"""

from __future__ import annotations

import sys
from typing import Any

__all__ = ["begin", "finish", "kernel", "sent_output"]

#: the request being watched: [msg_id, whether it sent output], or None
_watched: list[Any] = [None, False]
#: msg_id of a request whose "idle" is left out
_skip: list[Any] = [None]
_installed: list[bool] = [False]
#: "idle" messages left out on this engine (tests read it)
skipped: list[int] = [0]


def _kernel() -> Any:
    """This engine's kernel (None outside an ipyparallel engine)."""
    app = getattr(sys.modules.get("ipyparallel.engine.app"), "IPEngine", None)
    if app is None or not app.initialized():
        return None
    return getattr(app.instance(), "kernel", None)


def _parent_id(kernel: Any) -> Any:
    try:
        return kernel.get_parent("shell")["header"]["msg_id"]
    except Exception:
        return None


def _install(kernel: Any) -> bool:
    """Wrap the kernel's session ``send`` (to see a request's output) and its
    ``_publish_status`` (to leave out a quiet request's "idle"), once."""
    session = getattr(kernel, "session", None)
    publish = getattr(kernel, "_publish_status", None)
    if session is None or publish is None:
        return False
    send = session.send

    def watching_send(stream: Any, msg_or_type: Any, *a: Any, **k: Any) -> Any:
        w = _watched
        if w[0] is not None and not w[1]:
            kind = msg_or_type if isinstance(msg_or_type, str) else None
            if kind is None and isinstance(msg_or_type, dict):
                kind = msg_or_type.get("header", {}).get("msg_type")
            if kind not in ("status", "apply_reply"):
                w[1] = True
        return send(stream, msg_or_type, *a, **k)

    def publish_status(status: Any, *a: Any, **k: Any) -> Any:
        if status == "idle" and _skip[0] is not None:
            skip, _skip[0] = _skip[0], None
            parent = k.get("parent", a[1] if len(a) > 1 else None)
            mid = (parent or {}).get("header", {}).get("msg_id") or _parent_id(kernel)
            if mid == skip and not _watched[1]:
                _watched[0] = None
                skipped[0] += 1
                return None
        _watched[0] = None
        return publish(status, *a, **k)

    session.send = watching_send
    kernel._publish_status = publish_status
    return True


def begin() -> None:
    """A chunk the kernel asked to be quiet starts: watch its request's output."""
    kernel = _kernel()
    if kernel is None:
        return
    if not _installed[0]:
        _installed[0] = _install(kernel)
    if _installed[0]:
        _watched[0], _watched[1] = _parent_id(kernel), False
        _skip[0] = None


def _output_pending() -> bool:
    """Output on its way that the session has not sent yet: written to a
    stream and not flushed, or C-level output still in the pipe ipykernel
    reads the process's file descriptors 1 and 2 from (its reader thread
    writes it to the stream later, on its own time)."""
    import select

    for stream in (sys.stdout, sys.stderr):
        if stream.__dict__.get("_gpucell_dirty"):  # (engine/tuning marks writes)
            return True
        fid = getattr(stream, "_fid", None)
        if isinstance(fid, int):
            try:
                if select.select([fid], [], [], 0)[0]:
                    return True
            except (OSError, ValueError):
                return True
    return False


def finish() -> bool:
    """The chunk is over (its output flushed): True where it sent nothing on
    IOPub and nothing is on its way, so its "idle" is left out and the reply
    says so."""
    mid = _watched[0]
    if mid is None or _watched[1] or _output_pending():
        return False
    _skip[0] = mid
    return True


def kernel() -> Any:
    """This engine's kernel (None outside an ipyparallel engine)."""
    return _kernel()


def sent_output() -> bool:
    """A chunk served without a task of its own (``engine/served``) is over,
    its output flushed: whether it sent any on IOPub or some is on its way
    (then an "idle" must follow it).  The watch :func:`begin` set ends."""
    mid, sent = _watched
    _watched[0] = None
    return mid is None or bool(sent) or _output_pending()
