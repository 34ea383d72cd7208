"""Less ipykernel bookkeeping per task on the engines gpucell starts.

An ipyparallel engine is an IPython kernel.  Around every task it flushes stdout and
stderr four times, each a round trip to its I/O thread even when nothing was
written, and it builds a log record for every debug line that its handler then
drops.  On a 2-core host that was about 0.8 ms of an engine's 2.1 ms of CPU per
trivial task (psutil and cProfile on the engines), paid again for every chunk.

It also announces every task's start ("busy" on IOPub), which nothing of
ipyparallel's reads: one more message per chunk for the engine to send, the
controller to forward and every client to parse, in the moment a cell's first
chunks all start together.

:func:`tune` removes all three (and freezes the start-up objects for the garbage
collector: see :func:`gpucell.engine.runtime.collect`), and only on engines of a
cluster gpucell started: engines we merely connect to belong to someone else and
are left as they are.  Output is
unchanged: a flush with nothing written since the last one has nothing to send,
and any other flush still runs.  Runs on engines (imported there by name).
"""

from __future__ import annotations

import logging
import sys
from typing import Any

__all__ = ["tune"]


def _skip_empty_flushes() -> None:
    """Make ``OutStream.flush`` return at once when nothing was written since the
    last flush that completed.

    "Written" is tracked by a flag that ``write`` sets (captured C-level output
    goes through ``write`` too), not by ipykernel's ``_flush_pending``: that one is
    cleared as a background flush *starts*, and a flush skipped then could let the
    reply overtake the output.  A real flush waits for everything scheduled before
    it, so clearing the flag just before one is safe.
    """
    try:
        from ipykernel.iostream import OutStream
    except ImportError:
        return
    flush, write = OutStream.flush, OutStream.write
    if getattr(flush, "_gpucell_original", None) is not None:
        return  # already tuned

    def quick_flush(self: Any) -> None:
        if self.__dict__.get("_gpucell_dirty", True) or getattr(self, "echo", None):
            self._gpucell_dirty = False
            flush(self)

    def marking_write(self: Any, string: str) -> int | None:
        self._gpucell_dirty = True
        return write(self, string)

    quick_flush._gpucell_original = flush  # type: ignore[attr-defined]
    quick_flush.__doc__ = flush.__doc__
    marking_write.__doc__ = write.__doc__
    OutStream.write = marking_write  # type: ignore[method-assign]
    OutStream.flush = quick_flush  # type: ignore[method-assign]


def _engine_app() -> Any:
    """This engine's ipyparallel ``IPEngine`` application, or ``None`` (this
    process is an ipyparallel engine: read its app, never import ipyparallel)."""
    app_module = sys.modules.get("ipyparallel.engine.app")
    IPEngine = getattr(app_module, "IPEngine", None)
    if IPEngine is None or not IPEngine.initialized():
        return None
    return IPEngine.instance()


def _quiet_loggers() -> None:
    """Raise the engine's loggers to the level their handlers already filter at,
    so dropped debug lines are not built first."""
    app = _engine_app()
    if app is None:
        return
    level = app.log_level
    if not isinstance(level, int):
        level = logging.getLevelName(str(level))
        if not isinstance(level, int):
            return
    kernel = getattr(app, "kernel", None)
    for log in (app.log, getattr(kernel, "log", None)):
        if isinstance(log, logging.Logger) and log.getEffectiveLevel() < level:
            log.setLevel(level)


def _no_busy_status() -> None:
    """Publish no "busy" status on IOPub as a task starts (the "idle" one at its
    end is kept: ipyparallel's client waits for it before a result counts as
    ready, its outputs all in).

    ipyparallel reads "busy" nowhere: its client drops it, its hub skips
    status messages.  Yet each is built, signed and sent by the engine,
    forwarded by the controller and parsed by every client: for a cell's
    first chunks, 16 engines' "busy" messages arrive together with the tasks
    they announce, on the cores those tasks need to start."""
    kernel = getattr(_engine_app(), "kernel", None)
    publish = getattr(kernel, "_publish_status", None)
    if publish is None or getattr(publish, "_gpucell_original", None) is not None:
        return

    def publish_status(status: Any, *args: Any, **kwargs: Any) -> Any:
        # (status, channel, parent=None) since ipykernel 6; a signature without
        # a channel is passed through untouched
        channel = kwargs.get("channel", args[0] if args else None)
        if status == "busy" and channel == "shell":
            return None
        return publish(status, *args, **kwargs)

    publish_status._gpucell_original = publish  # type: ignore[attr-defined]
    kernel._publish_status = publish_status  # type: ignore[union-attr]


def tune() -> None:
    """Apply all three (each does nothing where its ipykernel/ipyparallel part
    is missing or already tuned)."""
    _skip_empty_flushes()
    _quiet_loggers()
    _no_busy_status()
    from gpucell.engine.runtime import collect

    collect()  # freeze what start-up made: later collections skip it
