"""Replayed calls: what the engines recorded of calls on a notebook object
(a ufunc's ``.at``, the cells written in a frame's own rows, a set's ``add``
and ``update``) replayed on the kernel's object in iteration order, tried
on a copy first so what fails, fails before anything changes.  Pure.
"""

from __future__ import annotations

import copy
import functools
from collections.abc import Callable
from typing import Any

from gpucell.core.analysis.replaystmts import LIBRARY_FUNCTIONS
from gpucell.core.merge_base import Merging, Mutation
from gpucell.core.progressbars import is_progress_bar
from gpucell.errors import NotParallelizable, add_note
from gpucell.protocol.concat import (
    BIND,
    calls_of,
    known_concatenation,
    library_of,
    replay_recorded,
)
from gpucell.protocol.fold import is_numpy

__all__ = [
    "merge_concats",
    "merge_frame_rows",
    "merge_replayed_statements",
    "merge_ufunc_at",
    "merge_unions",
]


def _merge_replayed(m: Merging, kind: str, prepare: Callable[..., Any]) -> None:
    """What the engines gathered under each hidden name of ``kind`` (a
    spelling's table: hidden name -> the notebook's name), replayed on the
    notebook's object in iteration order by ``prepare``'s mutation."""
    for hidden, name in getattr(m.spelled, kind, {}).items():
        gathered = m.concat("gathers", hidden)
        if gathered:
            target = m.existing(name)
            m.claim(name, target)
            m.up.mutations.append(prepare(name, target, gathered))


def merge_ufunc_at(m: Merging) -> None:
    """``np.add.at(D, idx, w)``: the calls replayed into D in iteration order."""
    _merge_replayed(m, "ufunc_at", _prepare_ufunc_at)


def merge_frame_rows(m: Merging) -> None:
    """A frame's own rows read back: each iteration's written cells replayed."""
    _merge_replayed(m, "frame_rows", _prepare_frame_rows)


def merge_concats(m: Merging) -> None:
    """``x = np.append(x, e)`` and the like: the recorded calls made here, in
    iteration order, from ``x``'s value before the loop; ``x`` rebound to
    the result (the value before is not changed, as serially)."""
    for hidden, name in getattr(m.spelled, "concats", {}).items():
        entries = m.concat("gathers", hidden)
        if not entries:
            continue
        if name in m.current or not (
            isinstance(entries[0][0], str) and entries[0][0] == BIND
        ):
            start = m.existing(name)
        else:
            start = None  # (bound by the first iteration, as serially)
        for c in calls_of(entries):
            if known_concatenation(c.function) is None:
                raise NotParallelizable(
                    f"gpucell: `{name} = {_spelled(c.function)}(... {name} ...)` "
                    "was taken for a numpy, torch or pandas concatenation, but "
                    f"`{_spelled(c.function)}` is {c.function!r}: what it does "
                    "cannot be made on the kernel afterwards. Nothing was merged; "
                    f"gather the pieces in the loop (`pieces.append(...)`) and "
                    f"combine them after it."
                )
        m.up.assign[name] = replay_recorded(start, entries)


def merge_replayed_statements(m: Merging) -> None:
    """``index.setdefault(w, set()).add(i)``, ``heapq.heappush(heap, x)``:
    each recorded statement run on the kernel's container in iteration
    order, on a copy first (what fails, fails before anything changes)."""
    for hidden, rep in getattr(m.spelled, "replayed", {}).items():
        entries = m.concat("gathers", hidden)
        if not entries:
            continue
        target = m.existing(rep.target)
        fns = {k: _compiled(src) for k, src in rep.templates.items()}
        if rep.rebinds:
            m.up.assign[rep.target] = _run_statements(rep, fns, target, entries, True)
            continue
        m.claim(rep.target, target)
        for k, values in entries:
            if k in rep.function_first and not library_of(values[0], LIBRARY_FUNCTIONS):
                raise NotParallelizable(
                    f"gpucell: line {rep.lines[k]} calls {values[0]!r} on "
                    f"`{rep.target}`, taken for heapq's or bisect's function: "
                    "what it does cannot be made on the kernel afterwards. "
                    "Nothing was merged."
                )
        try:
            # (one copy of both: a value the replay puts into the container,
            # `set()` in `setdefault(w, set())`, must not be shared with it)
            trial = (
                None if is_progress_bar(target) else copy.deepcopy((target, entries))
            )
        except Exception:
            trial = None  # (validated as it is applied: see the module's note)
        if trial is not None:
            _run_statements(rep, fns, trial[0], trial[1], False)
        apply = functools.partial(_run_statements, rep, fns, target, entries, False)
        m.up.mutations.append(Mutation(rep.target, "replayed", apply))


def _run_statements(
    rep: Any,
    fns: dict[int, Callable[..., Any]],
    obj: Any,
    entries: list[Any],
    rebinds: bool,
) -> Any:
    """Each recorded statement in iteration order: on ``obj`` in place, or
    (``rebinds``: ``mean = mean + (x - mean) / n``, pure operations on it)
    each new value made from the last; returns the last."""
    for n, (k, values) in enumerate(entries):
        try:
            new = fns[k](obj, *values)
        except Exception as e:
            what = (
                f"the update number {n + 1} of {len(entries)} of `{rep.target}` "
                "(in iteration order), made"
                if rebinds
                else f"the change number {n + 1} of {len(entries)} to "
                f"`{rep.target}` (in iteration order), replayed"
            )
            add_note(
                e,
                f"gpucell: raised by line {rep.lines[k]}, {what} on the kernel "
                "after the engines ran. Nothing was merged.",
            )
            raise
        if rebinds:
            obj = new
    return obj


def _compiled(source: str) -> Callable[..., Any]:
    scope: dict[str, Any] = {}
    exec(compile(source, "<gpucell-replay>", "exec"), scope)
    fn: Callable[..., Any] = scope["__gpucell_replay__"]
    return fn


def _spelled(function: Any) -> str:
    return getattr(function, "__qualname__", None) or repr(function)


def _prepare_ufunc_at(
    name: str, target: Any, calls: list[tuple[Any, tuple[Any, ...]]]
) -> Mutation:
    """``np.add.at(D, idx, w)`` per iteration: the engines gathered the ufunc
    and its arguments; replayed here in iteration order on a copy (what
    fails, fails before anything changes), then copied into ``D`` itself, so
    a float sum is the serial one bit for bit."""
    if not is_numpy(target) or not hasattr(target, "shape"):
        raise TypeError(
            f"`{name}` is a {type(target).__name__}: a ufunc's `.at` writes "
            "into numpy arrays only. Nothing was merged."
        )
    trial = target.copy()
    for ufunc, args in calls:
        if type(ufunc).__name__ != "ufunc" or not is_numpy(trial):
            raise NotParallelizable(
                f"gpucell: `{name}` was given to `{ufunc!r}.at`, which is not "
                "a numpy ufunc's: its effect cannot be replayed. Nothing was "
                "merged."
            )
        ufunc.at(trial, *args)

    def apply() -> None:
        target[...] = trial

    return Mutation(name, "ufunc.at", apply)


def _prepare_frame_rows(
    name: str, target: Any, rows: list[tuple[Any, list[tuple[str, Any, str]]]]
) -> Mutation:
    """``df.loc[i, c] = ...`` read back in the iteration: each ran on a
    private copy of its row (``core/framerows.py``); its written cells are
    stored into the frame in iteration order, on a copy first.  A column
    whose type an iteration's copy changed (or that two iterations' new
    column got differently) is refused: serially the later iterations would
    have read the frame's changed column."""
    columns = getattr(target, "columns", None)
    if columns is None or not hasattr(target, "loc"):
        raise TypeError(
            f"`{name}` is a {type(target).__name__}, not a DataFrame. Nothing "
            "was merged."
        )
    types: dict[str, str] = {}
    for _label, cells in rows:
        for c, _v, dtype in cells:
            before = str(target[c].dtype) if c in columns else None
            first = types.setdefault(c, before or dtype)
            if dtype != first:
                raise NotParallelizable(
                    f"gpucell: `{name}[{c!r}]` holds {first} values, and an "
                    f"iteration stored a value that made its own row's column "
                    f"{dtype}: serially the iterations after it read the "
                    "changed column. Nothing was merged; give the column its "
                    f"type before the loop (`{name}[{c!r}] = ...`)."
                )

    def store(frame: Any) -> None:
        loc = frame.loc
        for label, cells in rows:
            for c, v, _dtype in cells:
                loc[label, c] = v

    store(target.copy())
    return Mutation(name, "own rows", lambda: store(target))


def merge_unions(m: Merging) -> None:
    """Set unions: every iteration's additions."""
    for name in m.plan.unions:
        ops = m.concat("unions", name)
        if not ops:
            continue
        target = m.existing(name)
        m.claim(name, target)
        m.up.mutations.append(_prepare_union(name, target, ops))


def _prepare_union(name: str, target: Any, ops: list[tuple[str, Any]]) -> Mutation:
    if isinstance(target, set):
        # added one by one, first seen first, as serially: a set's iteration
        # order follows its insertion history, table resizes included
        # (`list(vocab)` after the loop; `update` would presize the table)
        items: dict[Any, None] = {}
        for _kind, payload in ops:
            items.update(dict.fromkeys(payload))

        def add_each() -> None:
            add = target.add
            for x in items:
                add(x)

        return Mutation(name, "update", add_each)
    if is_progress_bar(target):
        # (`bar.update(1)`: no copy tried, see core/progressbars.py)
        if any(kind != "update" for kind, _payload in ops):
            raise AttributeError(f"`{name}`, a progress bar, has no method `add`")
        return Mutation(name, "replay", lambda: _replay(target, ops))
    trial = copy.copy(target)
    _replay(trial, ops)
    return Mutation(name, "replay", lambda: _replay(target, ops))


def _replay(target: Any, ops: list[tuple[str, Any]]) -> None:
    for kind, payload in ops:
        if kind == "add":
            for x in payload:
                target.add(x)
        else:
            target.update(payload)
