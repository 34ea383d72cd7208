"""A chunk of a loop as it travels, and what running it gives back.

The kernel cuts the loop's iterable into chunk objects (:mod:`gpucell.core.analysis.
iterspace`), plain tuples small enough to pickle::

    ("range", range_obj)              a range slice, never materialised
    ("seq", sequence_slice)           list/tuple/str slice, numpy/torch view
    ("enumerate", offset, inner)      enumerate(inner items, offset)
    ("zip", (inner, inner, ...))      zip of inner items

An engine turns one back into the items the loop iterates over
(:func:`chunk_items`) and returns a :class:`ChunkResult`, which the kernel merges.
Standard library only: both sides import it.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

__all__ = ["ChunkResult", "chunk_items", "item_at", "item_refs"]


#: per-iteration detail (start stamps) a run keeps, at most: enough for the
#: profile a re-run is scheduled from, and bounded whatever the loop's length
DETAIL_MAX = 200_000


@dataclass
class ChunkResult:
    """What one chunk of iterations produced. Plain data; pickles as is.

    Attributes
    ----------
    start : int
        Index of the chunk's first iteration.
    count : int
        Iterations run.
    gathers : dict
        ``name -> [items]`` appended/extended, in iteration order.
    writes : dict
        ``name -> [(key, value)]`` item writes, in iteration order.
    reductions : dict
        ``name -> (op, partial)``: contributions folded in iteration order. Absent
        when no iteration contributed.
    keyed : dict
        ``name -> (op, [(key, partial)])``, keys in first-seen order.
    unions : dict
        ``name -> [("add", [items]) | ("update", payload)]`` in iteration order.
    last_values : dict
        ``name -> (iteration, kind, payload)`` for the chunk's last iteration that
        assigned the local; kind is ``"value"``, ``"deleted"`` or ``"module"``
        (payload: the module's name, since modules do not pickle).
    """

    start: int
    count: int = 0
    gathers: dict[str, list[Any]] = field(default_factory=dict)
    writes: dict[str, list[tuple[Any, Any]]] = field(default_factory=dict)
    reductions: dict[str, tuple[str, Any]] = field(default_factory=dict)
    keyed: dict[str, tuple[str, list[tuple[Any, Any]]]] = field(default_factory=dict)
    unions: dict[str, list[tuple[str, Any]]] = field(default_factory=dict)
    last_values: dict[str, tuple[int, str, Any]] = field(default_factory=dict)
    # name -> [(key, [items])]: D[k].append/extend, in iteration order
    keyed_gathers: dict[str, list[tuple[Any, list[Any]]]] = field(default_factory=dict)
    # the logging records the iterations made, in order, ready to travel
    # (message formatted, traceback as text): the kernel's handlers emit them
    logs: list[Any] = field(default_factory=list)
    # (iteration, path into its item, update): what each iteration changed of
    # its own item (engine/checkout.py), applied in place by the kernel
    own_items: list[tuple[int, tuple[int, ...], tuple[Any, ...]]] = field(
        default_factory=list
    )
    # path -> (iterations that wrote it, iterations that read it), at most two
    # of each: enough for the kernel to see two iterations meet in one file
    # (engine/fileaccess.py, core/fileconflicts.py)
    files: dict[str, tuple[list[int], list[int]]] = field(default_factory=dict)


def chunk_items(obj: tuple[Any, ...]) -> Iterable[Any]:
    """Turn a chunk object back into the items the loop iterates over.

    Runs on engines; standard library only.
    """
    tag = obj[0]
    if tag in ("range", "seq"):
        return obj[1]  # type: ignore[no-any-return]
    if tag == "enumerate":
        return enumerate(chunk_items(obj[2]), obj[1])
    if tag == "zip":
        return zip(*(chunk_items(o) for o in obj[1]), strict=False)
    raise ValueError(f"unknown chunk object tag {tag!r}")


#: a path's last step to a part of a tuple item: ``(PART, j)``
PART = "part"

#: item types whose identity nothing can observe apart from their value
_PLAIN = (int, float, complex, str, bytes, bool, type(None))


def item_refs(obj: tuple[Any, ...], start: int) -> dict[int, tuple[Any, ...]]:
    """``id(item) -> (iteration, *path)`` for the objects a chunk's list or
    tuple sequences hold (not plain values), and the parts of an item that
    is a tuple: a result that holds one of them holds the loop's own item,
    which the kernel has too (serially ``out.append(p)`` makes ``out[0] is
    people[0]``).  ``path`` leads from the chunk object to the sequence:
    ``"e"`` into an ``enumerate``, an int ``j`` into part ``j`` of a ``zip``;
    a last ``(PART, j)``, to part ``j`` of the item.  Runs on engines."""
    refs: dict[int, tuple[Any, ...]] = {}

    def walk(o: tuple[Any, ...], path: tuple[Any, ...]) -> None:
        tag = o[0]
        seq = o[1]
        if tag == "seq" and type(seq) in (list, tuple) and seq:
            if type(seq[0]) in _PLAIN and type(seq[-1]) in _PLAIN:
                return  # (numbers or strings: 10^6 of them cost ~50 ms to scan)
            for k, x in enumerate(seq):
                if type(x) not in _PLAIN:
                    refs.setdefault(id(x), (start + k, *path))
                if type(x) is tuple:  # `for name, m in models.items()`: m too
                    for j, part in enumerate(x):
                        if type(part) not in _PLAIN:
                            refs.setdefault(id(part), (start + k, *path, (PART, j)))
        elif tag == "enumerate":
            walk(o[2], (*path, "e"))
        elif tag == "zip":
            for j, part in enumerate(o[1]):
                walk(part, (*path, j))

    walk(obj, ())
    return refs


def item_at(obj: tuple[Any, ...], path: tuple[Any, ...]) -> Any:
    """The first item of the sequence ``path`` leads to in a one-iteration
    chunk object (the kernel's side of :func:`item_refs`)."""
    part = path[-1][1] if path and isinstance(path[-1], tuple) else None
    for step in path[:-1] if part is not None else path:
        obj = obj[2] if step == "e" else obj[1][step]
    if obj[0] != "seq":
        raise ValueError(f"no sequence at {path!r} in a {obj[0]!r} chunk")
    return obj[1][0] if part is None else obj[1][0][part]
