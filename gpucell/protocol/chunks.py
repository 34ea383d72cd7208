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

__all__ = ["ChunkResult", "chunk_items"]


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
