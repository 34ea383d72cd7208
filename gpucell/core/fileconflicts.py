"""Two iterations that met in one file: the merge is refused.

Engines note which iterations opened which paths (``engine/fileaccess.py``).
Serially, an iteration reading a file another iteration writes sees what that
one wrote, or not yet; two iterations writing one file leave the later one's
text. On the engines they run apart, so neither holds: the cell fails with
nothing merged, naming the file and the two iterations.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Protocol

from gpucell.errors import NotParallelizable

__all__ = ["check_files"]


class _WithFiles(Protocol):
    files: Mapping[str, tuple[list[int], list[int]]]


def conflicts(results: Iterable[_WithFiles]) -> list[tuple[str, int, int, bool]]:
    """``(path, writer, other, other_writes)`` for each file two iterations
    met in (the writer and another iteration that wrote or read it)."""
    writers: dict[str, set[int]] = {}
    readers: dict[str, set[int]] = {}
    for r in results:
        for path, (w, rd) in getattr(r, "files", {}).items():
            writers.setdefault(path, set()).update(w)
            readers.setdefault(path, set()).update(rd)
    out = []
    for path, ws in sorted(writers.items()):
        if not ws:
            continue
        if path.endswith(("/", "\\")):
            # a folder: files made in it by several iterations are each
            # their own; only a listing by another iteration met them
            listed = sorted(readers.get(path, set()))
            pair = next(((w, r) for r in listed for w in sorted(ws) if w != r), None)
            if pair is not None:
                out.append((path, pair[0], pair[1], False))
            continue
        first = min(ws)
        others = sorted(ws - {first})
        if others:
            out.append((path, first, others[0], True))
            continue
        read = sorted(readers.get(path, set()) - {first})
        if read:
            out.append((path, first, read[0], False))
    return out


def check_files(results: Iterable[_WithFiles]) -> None:
    """Raise ``NotParallelizable`` naming the first file two iterations met in."""
    found = conflicts(results)
    if not found:
        return
    path, writer, other, writes = found[0]
    more = f" (and {len(found) - 1} more files)" if len(found) > 1 else ""
    if writes:
        what = (
            f"iterations {writer} and {other} both wrote `{path}`{more}: serially "
            "the file holds what the later one wrote"
        )
    elif path.endswith(("/", "\\")):
        what = (
            f"iteration {other} listed the folder `{path}`{more}, in which "
            f"iteration {writer} wrote a file: serially the listing shows the "
            "files of the iterations before it"
        )
    else:
        what = (
            f"iteration {other} read `{path}`{more}, which iteration {writer} "
            "wrote: serially it reads what that iteration wrote (or had not yet "
            "written)"
        )
    raise NotParallelizable(
        f"gpucell: {what}; on the engines the two ran apart, in any order. "
        "Nothing was merged; the files the loop wrote are on disk as the engines "
        "left them. Give each iteration files of its own, carry the value from "
        "one iteration to the next in memory in a serial loop, or run the cell "
        "without %%gpu_parallel."
    )
