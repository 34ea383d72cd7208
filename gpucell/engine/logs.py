"""Logging from a chunk's iterations, caught to be emitted by the kernel.

Serially ``log.info(...)`` in the loop reaches the notebook's handlers (a
``basicConfig(filename=...)`` file, a list handler, a stream); on an engine
those handlers do not exist, so the records would be lost.  While a chunk
runs, the engine's loggers take the kernel's levels (so the loop makes the
records the kernel would make), and a handler on the root logger keeps every
record that reaches it instead of letting the engine's own handlers (or
logging's last resort on stderr) print it.  The records travel with the
chunk's result, prepared as ``logging.handlers.QueueHandler`` prepares them:
the message formatted now (its arguments may change later in the iteration),
the traceback as text.  Warnings the chunk shows are kept among them, in
order (``gpucell.protocol.warned``), for the kernel to issue again.

Standard library only.
"""

from __future__ import annotations

import copy
import logging
import pickle
import sys
import threading
import warnings
from typing import Any

from gpucell.protocol.program import LogLevels
from gpucell.protocol.warned import Warned

__all__ = ["Capture"]

#: loggers of the engine's own machinery, never the loop's
#: loggers of the engine process itself (and gpucell's own), not the loop's: their
#: records are not the serial cell's and their levels stay the engine's
_ENGINE_LOGGERS = (
    "ipyparallel",
    "ipykernel",
    "IPEngine",
    "traitlets",
    "tornado",
    "gpucell",
)


def _engine_logger(name: str) -> bool:
    """``name`` is one of those loggers or below one (``gpucell.x``, not
    ``gpucell_x``)."""
    return any(name == top or name.startswith(top + ".") for top in _ENGINE_LOGGERS)


#: attributes every LogRecord has (the rest came from ``extra=``)
_STANDARD = frozenset(vars(logging.LogRecord("", 0, "", 0, "", None, None))) | {
    "message",
    "asctime",
}


def prepared(record: logging.LogRecord) -> logging.LogRecord:
    """A copy of ``record`` that pickles: message formatted, traceback as
    text, ``extra=`` values that cannot travel as their repr."""
    r = copy.copy(record)
    try:
        r.msg = r.getMessage()
        r.args = None
    except Exception:  # noqa: BLE001 - the kernel's handler reports it, as serially
        r.args = tuple(map(repr, r.args)) if isinstance(r.args, tuple) else repr(r.args)
    if r.exc_info:
        if not r.exc_text:
            r.exc_text = logging.Formatter().formatException(r.exc_info)
        # a handler that reads exc_info gets the exception itself (tracebacks
        # do not pickle; the formatted one is exc_text, which formatters use)
        kind, value = r.exc_info[0], r.exc_info[1]
        try:
            pickle.loads(pickle.dumps(value))
            r.exc_info = (kind, value, None) if kind is not None else None
        except Exception:  # noqa: BLE001
            r.exc_info = None
    for k, v in list(vars(r).items()):
        if k not in _STANDARD:
            try:
                pickle.dumps(v)
            except Exception:  # noqa: BLE001
                setattr(r, k, repr(v))
    return r


class _Keep(logging.Handler):
    """Keeps the records the chunk's own thread logs (not the engine's)."""

    def __init__(self, thread: int) -> None:
        super().__init__(logging.NOTSET)
        self.thread = thread
        self.records: list[logging.LogRecord | Warned] = []

    def emit(self, record: logging.LogRecord) -> None:
        if record.thread != self.thread or _engine_logger(record.name):
            return
        self.records.append(prepared(record))


#: handlers no capture holds: made once, not per chunk (a handler's making,
#: its lock registered for fork and its weak reference in logging's list,
#: took ~65 us of a chunk cold)
_IDLE: list[_Keep] = []


#: the last levels met and their loggers (not the engine's own), each one's
#: level: every chunk of a cell gets the same levels (~100 loggers in a
#: notebook), so they are looked up once, not per chunk
_PLAN: list[Any] = [None, []]


def _plan(levels: LogLevels) -> list[tuple[logging.Logger, int]]:
    if _PLAN[0] is not levels:
        _PLAN[:] = [
            levels,
            [
                (logging.getLogger(name), level)
                for name, level in levels["named"].items()
                if not _engine_logger(name)
            ],
        ]
    return _PLAN[1]  # type: ignore[no-any-return]


#: module file -> module name, for what a warning's filters match; and how
#: many modules there were when it was made (a miss remakes it only if more)
_MODULE_FILES: list[Any] = [0, {}]


def _module_of(filename: str) -> str:
    """The ``__name__`` of the code that warned, from its file (what
    ``warnings.warn`` takes from the caller's globals): a module's, else the
    notebook's own ``__main__`` (the cell's code has the cell's filename)."""
    names = _MODULE_FILES[1]
    if filename not in names and len(sys.modules) != _MODULE_FILES[0]:
        _MODULE_FILES[0] = len(sys.modules)
        names = _MODULE_FILES[1] = {
            f: name
            for name, m in list(sys.modules.items())
            if isinstance(f := getattr(m, "__file__", None), str)
        }
    return names.get(filename, "__main__")  # type: ignore[no-any-return]


def _warned(msg: Any) -> Warned:
    message = msg.message
    try:
        pickle.dumps(message)
    except Exception:
        message = str(message)
    return Warned(
        message, msg.category, msg.filename, msg.lineno, _module_of(msg.filename)
    )


class _ShowHook:
    """``warnings._showwarnmsg`` while a chunk runs: a warning the chunk's
    thread shows is kept (for the kernel to issue) instead of printed, unless
    the iteration itself replaced how warnings are shown (its own
    ``catch_warnings(record=True)``, a ``showwarning`` of its own), which then
    gets it as serially."""

    def __init__(self, keep: _Keep) -> None:
        self.keep = keep
        self.previous = warnings._showwarnmsg  # type: ignore[attr-defined]
        self.impl = warnings._showwarnmsg_impl  # type: ignore[attr-defined]
        self.showwarning = warnings.showwarning

    def __call__(self, msg: Any) -> None:
        if (
            threading.get_ident() != self.keep.thread
            or warnings._showwarnmsg_impl is not self.impl  # type: ignore[attr-defined]
            or warnings.showwarning is not self.showwarning
        ):
            self.previous(msg)
            return
        self.keep.records.append(_warned(msg))


class Capture:
    """The kernel's levels and a keeping root handler while a chunk runs;
    everything is put back on exit, whatever happened.  Loggers cache which
    levels they let through: the caches are cleared only when a level
    changes (clearing walks every logger of the engine)."""

    def __init__(self, levels: LogLevels | None) -> None:
        self.levels = levels
        self.records: list[logging.LogRecord | Warned] = []
        self._saved: list[tuple[logging.Logger, int]] = []
        self._handlers: list[logging.Handler] = []
        self._disable = logging.NOTSET
        self._keep: _Keep | None = None
        self._shown: _ShowHook | None = None

    def __enter__(self) -> Capture:
        root = logging.getLogger()
        manager = root.manager
        self._handlers = root.handlers[:]
        self._disable = manager.disable
        self._saved = [(root, root.level)]
        lv = self.levels
        changed = False
        if lv is not None:
            changed = root.level != lv["root"] or manager.disable != lv["disable"]
            root.level = lv["root"]
            manager.disable = lv["disable"]
            for lg, level in _plan(lv):
                if lg.level != level:
                    self._saved.append((lg, lg.level))
                    lg.level = level
                    changed = True
        keep = _IDLE.pop() if _IDLE else _Keep(0)
        keep.thread, keep.records = threading.get_ident(), []
        keep.level, keep.filters = logging.NOTSET, []  # (a loop may set them)
        self._keep = keep
        root.handlers[:] = [keep]
        self._shown = _ShowHook(keep)
        warnings._showwarnmsg = self._shown  # type: ignore[attr-defined]
        if changed:
            _levels_changed(manager)
        return self

    def __exit__(self, *exc: object) -> None:
        if self._shown is not None:
            warnings._showwarnmsg = self._shown.previous  # type: ignore[attr-defined]
            self._shown = None
        root = logging.getLogger()
        root.handlers[:] = self._handlers
        changed = root.manager.disable != self._disable
        for lg, level in self._saved:
            if lg.level != level:
                lg.level = level
                changed = True
        root.manager.disable = self._disable
        if changed:
            _levels_changed(root.manager)
        if self._keep is not None:
            self.records = self._keep.records
            self._keep.records = []
            _IDLE.append(self._keep)
            self._keep = None


def _levels_changed(manager: Any) -> None:
    """Loggers cache whether a level is enabled: levels set by hand (one
    ``setLevel`` per logger clears every cache each time) need one clear."""
    clear = getattr(manager, "_clear_cache", None)
    if clear is not None:
        clear()
