"""Which files each iteration of a chunk opened, for reading or writing.

Serially an iteration that reads a file another iteration writes (a chain of
checkpoints, ``step{i-1}.txt`` read by iteration ``i``) sees what that
iteration wrote, or not yet; on the engines the two run apart, in any order,
and the text of the cell cannot show it (paths are computed, and the open is
often inside ``np.save``, ``torch.load`` or ``pd.read_csv``).  So while a chunk
runs, every open the chunk's own thread makes notes its path and which
iteration opened it; the kernel refuses the merge where two iterations met in
one file (``gpucell.core.fileconflicts``).

The opens are seen through Python's audit event ``open``, which ``io.open``
(``builtins.open``, pathlib, most libraries), ``os.open`` and the file
objects raise whatever name the function was reached by: a library's
module-level ``_open = open`` or ``from io import open as o`` in the
notebook hold the function itself, which no patching of ``builtins.open``
reaches.  An audit hook cannot be removed: one is added per process, the
first time, and does nothing outside a chunk.  A path relative to an
``os.open(..., dir_fd=fd)`` is taken relative to the working directory.

Standard library only.
"""

from __future__ import annotations

import os
import site
import sys
import threading
from typing import Any

from gpucell.engine.where import Where

__all__ = ["FileAccess"]

#: distinct iterations kept per path and way: two tell the kernel all it needs
_KEEP = 2


def _ignored_prefixes() -> tuple[str, ...]:
    """Places no loop shares on purpose: the system's pseudo-files, the
    interpreter's packages, per-user caches and settings that libraries
    write on first use (a font list, a downloaded model)."""
    home = os.path.expanduser("~")
    out = ["/dev/", "/proc/", "/sys/", sys.prefix, sys.base_prefix]
    out += [os.path.join(home, d) for d in (".cache", ".config", ".local")]
    for d in [*site.getsitepackages(), site.getusersitepackages()]:
        out.append(d)
    return tuple(p.rstrip("/") + "/" for p in out if p)


#: ``os.open`` flags that write (its audit event has no mode string)
_WRITE_FLAGS = os.O_WRONLY | os.O_RDWR | os.O_APPEND | os.O_CREAT | os.O_TRUNC

#: the FileAccess of the chunk running in this process, if any
_active: FileAccess | None = None
_hooked = False


#: audit events that list a folder: what a file made in it later changes
_LISTINGS = frozenset({"os.listdir", "os.scandir"})


def _audit(event: str, args: tuple[Any, ...]) -> None:
    """The process's audit hook: an ``open`` while a chunk runs is noted, and
    a folder listed (``os.listdir``, ``os.scandir``, ``glob``, ``os.walk``)
    as a read of the folder, which a file opened for writing in it writes
    (``n = len(os.listdir(d))`` then writing ``d/ckpt_{n}``)."""
    if event != "open" and event not in _LISTINGS:
        return
    fa = _active
    if fa is None or threading.get_ident() != fa._thread:
        return
    try:
        if event in _LISTINGS:
            folder = args[0] if args and args[0] is not None else "."
            if not isinstance(folder, int):
                fa._note(folder, False, folder=True)
            return
        file, mode, flags = args
        if isinstance(file, int):
            return  # (a descriptor: opened, and noted, by path before)
        writing = (
            any(c in mode for c in "wax+")
            if isinstance(mode, str)
            else bool(isinstance(flags, int) and flags & _WRITE_FLAGS)
        )
        fa._note(file, writing)
        if writing:
            fa._note(os.path.dirname(os.fsdecode(file)), True, folder=True)
    except Exception:  # a path it cannot spell is no path to compare
        pass  # (and an audit hook that raises would fail the open itself)


class FileAccess:
    """``with FileAccess(where) as fa`` around a chunk's iterations; then
    ``fa.files``: path -> (writers, readers), iterations of this chunk."""

    def __init__(self, where: Where) -> None:
        self.where = where
        self.files: dict[str, tuple[list[int], list[int]]] = {}
        self._thread = threading.get_ident()
        self._ignored = _IGNORED
        self._outer: FileAccess | None = None

    def __enter__(self) -> FileAccess:
        global _active, _hooked
        self._thread = threading.get_ident()
        if not _hooked:
            sys.addaudithook(_audit)
            _hooked = True
        self._outer, _active = _active, self
        return self

    def __exit__(self, *exc: object) -> None:
        global _active
        _active = self._outer

    def _note(self, file: Any, writing: bool, folder: bool = False) -> None:
        i = self.where.current()
        if i is None:
            return
        path = os.path.abspath(os.fsdecode(os.fspath(file)))
        if folder:  # (a folder's listing: named as a folder)
            path = path.rstrip(os.sep) + os.sep
        if path.startswith(self._ignored) or _PYCACHE in path:
            return  # (an import's bytecode, written under a name per process)
        entry = self.files.get(path)
        if entry is None:
            entry = self.files[path] = ([], [])
        seen = entry[0] if writing else entry[1]
        if i not in seen and len(seen) < _KEEP:
            seen.append(i)


_IGNORED = _ignored_prefixes()
_PYCACHE = f"{os.sep}__pycache__{os.sep}"
