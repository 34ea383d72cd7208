"""The loop's logging in the kernel: levels out to the engines, records back.

The engines make the records the kernel's levels allow (``engine/logs.py``)
and send them with each chunk's result; after the merge the kernel hands them
to its own loggers in iteration order, so a ``basicConfig(filename=...)``
file, a list handler or a stream gets the lines a serial run writes.  The
warnings the iterations showed come among them and are issued again here.
"""

from __future__ import annotations

import logging
import multiprocessing
import os
import sys
import threading
import warnings
from collections.abc import Iterable
from typing import Any

from gpucell.protocol.program import LogLevels
from gpucell.protocol.warned import Warned

__all__ = ["emit", "levels"]


def levels() -> LogLevels:
    """The kernel's logging levels, for the engines' setup."""
    manager = logging.getLogger().manager
    named = {
        name: lg.level
        for name, lg in list(manager.loggerDict.items())
        if isinstance(lg, logging.Logger)
    }
    return {
        "root": logging.getLogger().level,
        "disable": int(manager.disable),
        "named": named,
    }


def emit(records: Iterable[Any]) -> None:
    """Hand each engine record to the kernel's logger of that name, as if the
    kernel's thread had logged it: its filters, handlers and propagation, and
    the process and thread a serial run would have named."""
    start = getattr(logging, "_startTime", None)
    pid = os.getpid()
    process = multiprocessing.current_process().name
    thread = threading.current_thread()
    root = logging.getLogger()
    for r in records:
        if isinstance(r, Warned):
            _warn_again(r)
            continue
        if not isinstance(r, logging.LogRecord):
            continue
        r.process, r.processName = pid, process
        r.thread, r.threadName = thread.ident, thread.name
        if start is not None:
            r.relativeCreated = (r.created - start) * 1000
        logger = root if r.name == root.name else logging.getLogger(r.name)
        logger.handle(r)


def _warn_again(w: Warned) -> None:
    """Issue an engine's warning in the kernel, as its iteration would have:
    the kernel's filters and the warning place's registry (shown once per
    place, across engines and chunks), a ``catch_warnings`` or
    ``logging.captureWarnings`` of the kernel's."""
    module = sys.modules.get(w.module)
    if w.module == "__main__" or module is None:
        from IPython import get_ipython

        shell = get_ipython()
        where = shell.user_ns if shell is not None else vars(sys.modules["__main__"])
    else:
        where = vars(module)
    registry = where.setdefault("__warningregistry__", {})
    warnings.warn_explicit(
        w.message, w.category, w.filename, w.lineno, module=w.module, registry=registry
    )
