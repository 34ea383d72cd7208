"""A DataFrame's own row, read back after the iteration wrote it
(``df.loc[i, "rev"] = ...`` then ``df.loc[i, "rev"] > 50``), on an engine.

The chunk program (``analysis/spellings.py``) gives each iteration a private
one-row copy of its row, ``D.loc[[i]].copy()``: its reads see its own
writes, as serially, while the shipped frame stays as it was; :func:`written`
says what the iteration left in the columns it writes, which the kernel
replays into the frame in iteration order (``core/merge_replays.py``).  Pandas
decides a column's type from the column and the value stored, never from the
other rows, so a store into the one-row copy casts as the store into the
frame does, until a column's type changes: the dtypes come back with the
values, and the merge refuses where they differ from the frame's or between
iterations.  Standard library only (pandas is duck-typed)."""

from __future__ import annotations

from typing import Any

__all__ = ["written"]


def written(row: Any, label: Any, columns: tuple[str, ...]) -> tuple[Any, list[Any]]:
    """``(label, [(column, value, dtype), ...])`` for the columns the body
    writes that the row has (a write under an ``if`` that did not run leaves
    a new column out).  A label that names several rows fails the chunk."""
    if len(row) != 1:
        raise ValueError(
            f"gpucell: the row label {label!r} names {len(row)} rows of the "
            "frame: its own row is not one row (a repeated index). Nothing "
            "is merged; make the index unique (`df.reset_index(drop=True)`)."
        )
    out = [
        (c, row.at[label, c], str(row[c].dtype)) for c in columns if c in row.columns
    ]
    return label, out
