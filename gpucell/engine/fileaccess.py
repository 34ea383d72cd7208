"""Which files each iteration of a chunk opened, for reading or writing.

Serially an iteration that reads a file another iteration writes (a chain of
checkpoints, ``step{i-1}.txt`` read by iteration ``i``) sees what that
iteration wrote, or not yet; on the engines the two run apart, in any order,
and the text of the cell cannot show it (paths are computed, and the open is
often inside ``np.save``, ``torch.load`` or ``pd.read_csv``).  So while a chunk
runs, ``open`` (``builtins.open`` and ``io.open``, which pathlib and most
libraries call) notes each path a chunk's own thread opens and which
iteration opened it; the kernel refuses the merge where two iterations met in
one file (``gpucell.core.fileconflicts``).

Standard library only.
"""

from __future__ import annotations

import builtins
import io
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


class FileAccess:
    """``with FileAccess(where) as fa`` around a chunk's iterations; then
    ``fa.files``: path -> (writers, readers), iterations of this chunk."""

    def __init__(self, where: Where) -> None:
        self.where = where
        self.files: dict[str, tuple[list[int], list[int]]] = {}
        self._thread = threading.get_ident()
        self._open: Any = None
        self._ignored = _IGNORED

    def __enter__(self) -> FileAccess:
        self._thread = threading.get_ident()
        self._open = builtins.open
        builtins.open = io.open = self._opening
        return self

    def __exit__(self, *exc: object) -> None:
        builtins.open = io.open = self._open

    def _opening(self, file: Any, mode: str = "r", *args: Any, **kwargs: Any) -> Any:
        f = self._open(file, mode, *args, **kwargs)
        if threading.get_ident() == self._thread and not isinstance(file, int):
            try:
                self._note(file, mode)
            except Exception:  # a path it cannot spell is no path to compare
                pass
        return f

    def _note(self, file: Any, mode: Any) -> None:
        i = self.where.current()
        if i is None:
            return
        path = os.path.abspath(os.fsdecode(os.fspath(file)))
        if path.startswith(self._ignored):
            return
        writing = isinstance(mode, str) and any(c in mode for c in "wax+")
        entry = self.files.get(path)
        if entry is None:
            entry = self.files[path] = ([], [])
        seen = entry[0] if writing else entry[1]
        if i not in seen and len(seen) < _KEEP:
            seen.append(i)


_IGNORED = _ignored_prefixes()
