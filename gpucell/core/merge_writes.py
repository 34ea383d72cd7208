"""Indexed writes (``D[k] = v``, ``del D[k]``, ``S[i][k] = v``, ``D.at[k] =
v``): every iteration's stores applied in iteration order, last write wins,
each checked first (on a copy, or by the array store's cast and shape) so a
bad key or value fails before anything changes.  Pure.
"""

from __future__ import annotations

from typing import Any

from gpucell.core.deleted import DELETED
from gpucell.core.merge_base import Merging, Mutation
from gpucell.core.merge_inplace import check_array_write
from gpucell.protocol.fold import is_numpy, is_torch
from gpucell.protocol.program import Indexed, Row

__all__ = ["merge_writes"]


def merge_writes(m: Merging) -> None:
    """Indexed writes, in iteration order."""
    for name in m.plan.writes:
        entries = m.concat("writes", name)
        if not entries:
            continue
        target = m.existing(name)
        m.claim(name, target)
        m.up.mutations.append(_prepare_writes(name, target, entries))


def _prepare_writes(name: str, target: Any, entries: list[tuple[Any, Any]]) -> Mutation:
    if any(isinstance(k, Row) for k, _v in entries):
        return _prepare_rows(name, target, entries)
    if any(isinstance(k, Indexed) for k, _v in entries):
        return _prepare_indexed(name, target, entries)
    gone = any(v is DELETED for _k, v in entries)
    if isinstance(target, dict):
        keys = set(target) if gone else set()
        for k, v in entries:
            hash(k)
            if v is DELETED and k not in keys:
                raise KeyError(k)  # (serially the iteration's `del` raises)
            if v is DELETED:
                keys.discard(k)
            else:
                keys.add(k)

        def apply_dict() -> None:
            for k, v in entries:
                if v is DELETED:
                    del target[k]
                else:
                    target[k] = v

        return Mutation(name, "setitem", apply_dict)
    if gone and _is_frame(target):
        return _prepare_frame_deletes(name, target, entries)
    if gone:
        raise TypeError(
            f"`{name}` is a {type(target).__name__}: gpucell deletes an "
            "iteration's own key (`del D[k]`) only from a dict"
        )
    if isinstance(target, list):
        new = list(target)
        for k, v in entries:
            new[k] = v

        def apply_list() -> None:
            target[:] = new

        return Mutation(name, "setitem", apply_list)
    if is_numpy(target) or is_torch(target):
        conv = [(k, check_array_write(target, k, v)) for k, v in entries]

        def apply_array() -> None:
            for k, v in conv:
                target[k] = v

        return Mutation(name, "setitem", apply_array)
    if not hasattr(target, "__setitem__"):
        raise TypeError(
            f"`{name}` is a {type(target).__name__}, which does not support item "
            f"assignment"
        )

    def apply_other() -> None:
        for k, v in entries:
            target[k] = v

    return Mutation(name, "setitem", apply_other)


def _prepare_indexed(
    name: str, target: Any, entries: list[tuple[Any, Any]]
) -> Mutation:
    """``D.at[k] = v`` writes (pandas indexers), tried on a copy first so a bad
    key fails before anything changes, then applied in iteration order."""

    def write_all(obj: Any) -> None:
        for k, v in entries:
            if isinstance(k, Indexed):
                getattr(obj, k.accessor)[k.key] = v
            else:
                obj[k] = v

    copy_of = getattr(target, "copy", None)
    if callable(copy_of):
        write_all(copy_of())  # raises here, with nothing changed yet
    return Mutation(name, "setitem", lambda: write_all(target))


def _prepare_rows(name: str, target: Any, entries: list[tuple[Any, Any]]) -> Mutation:
    """``S[i][k] = v`` writes under each iteration's own row, applied to the row
    in place (its identity kept, as serially), in iteration order.  Each row is
    tried on a copy first, so a bad key or value fails before anything
    changes."""
    rows: dict[int, Any] = {}
    checked: list[tuple[Any, Any, Any]] = []
    for k, v in entries:
        if not isinstance(k, Row):
            raise TypeError(f"`{name}`: mixed row and item writes")
        try:
            row = target[k.index]
        except (KeyError, IndexError, TypeError) as e:
            raise type(e)(
                f"`{name}[{k.index!r}]` does not exist in the kernel: {e}"
            ) from None
        if is_numpy(row) or is_torch(row):
            v = check_array_write(row, k.key, v)
        else:
            trial = rows.get(id(row))
            if trial is None:
                trial = rows[id(row)] = (
                    type(row)(row) if type(row) in (list, dict) else None
                )
            if trial is None:
                if not hasattr(row, "__setitem__"):
                    raise TypeError(
                        f"`{name}[{k.index!r}]` is a {type(row).__name__}, which "
                        "does not support item assignment"
                    )
            else:
                trial[k.key] = v  # raises here, with nothing changed yet
        checked.append((row, k.key, v))

    def apply_rows() -> None:
        for row, key, value in checked:
            row[key] = value

    return Mutation(name, "setitem", apply_rows)


def _is_frame(target: Any) -> bool:
    cls = type(target)
    return cls.__name__ == "DataFrame" and cls.__module__.startswith("pandas")


def _prepare_frame_deletes(
    name: str, target: Any, entries: list[tuple[Any, Any]]
) -> Mutation:
    """A DataFrame's own columns written and deleted (``del df[c]``), in
    iteration order; a column deleted that is not there fails the merge."""
    cols = set(target.columns)
    for k, v in entries:
        if v is DELETED and k not in cols:
            raise KeyError(k)
        if v is DELETED:
            cols.discard(k)
        else:
            cols.add(k)

    def apply_frame() -> None:
        for k, v in entries:
            if v is DELETED:
                del target[k]
            else:
                target[k] = v

    return Mutation(name, "setitem", apply_frame)
