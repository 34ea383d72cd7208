"""A chunk's printed output on an engine, each line tagged with the engine and
the iteration that printed it (the kernel's relay files it under the cell).

Standard library only.
"""

from __future__ import annotations

import io
from typing import Any

from gpucell.engine.where import Where

__all__ = ["Tagged", "untagged"]


class Tagged(io.TextIOBase):
    """A stream that prefixes each line with the engine and iteration."""

    def __init__(self, target: Any, engine: int, where: Where) -> None:
        self._target = target
        self._engine = engine
        self._where = where  # which iteration runs, as the chunk runs
        self._at_line_start = True
        self.written = False  # flushing costs a round trip to the I/O thread

    def _prefix(self) -> str:
        i = self._where.current()
        if i is None:
            return f"[engine {self._engine}] "
        return f"[engine {self._engine} | iteration {i}] "

    def writable(self) -> bool:
        return True

    def write(self, s: str) -> int:
        self.written = True
        out = []
        for piece in s.splitlines(keepends=True):
            if self._at_line_start:
                out.append(self._prefix())
            out.append(piece)
            self._at_line_start = piece.endswith("\n")
        self._target.write("".join(out))
        return len(s)

    def flush(self) -> None:
        self._target.flush()

    def set_parent(self, parent: Any) -> None:
        """ipykernel tags output with its request through
        ``sys.stdout.set_parent`` (and skips a stream without one)."""
        set_parent = getattr(self._target, "set_parent", None)
        if set_parent is not None:
            set_parent(parent)


def untagged(stream: Any) -> Any:
    """``stream`` without the :class:`Tagged` wrappers around it."""
    while isinstance(stream, Tagged):
        stream = stream._target
    return stream
