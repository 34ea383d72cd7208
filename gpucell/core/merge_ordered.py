"""The sinks merged by order alone: gathered items extended onto their list in
iteration order (a comprehension's result built from them), a running best
picked by replaying its test over the chunks' bests in chunk order, and each
local's value from the last iteration that assigned (or deleted) it.  Pure.
"""

from __future__ import annotations

import builtins
import importlib
import io
import operator
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from gpucell.core.merge_base import ChunkResultLike, Merging, Mutation
from gpucell.errors import NotParallelizable
from gpucell.protocol.fold import is_numpy, is_torch
from gpucell.protocol.program import RESULT, ItemError

__all__ = ["closed_file", "merge_bests", "merge_gathers", "merge_locals"]


def merge_gathers(m: Merging) -> None:
    """Ordered gathers: extended in iteration order; a comprehension's result."""
    plan, up = m.plan, m.up
    hidden = m.hidden_gathers()
    for name in plan.gathers:
        if name in hidden:
            continue
        items = m.concat("gathers", name)
        if not items:
            continue
        target = m.existing(name)
        m.claim(name, target)
        if not hasattr(target, "extend") and not hasattr(target, "append"):
            raise TypeError(
                f"`{name}` is a {type(target).__name__}, which has no append/extend"
            )
        ext = getattr(target, "extend", None)
        if ext is None:
            up.mutations.append(Mutation(name, "append", _appender(target, items)))
        else:
            up.mutations.append(Mutation(name, "extend", _extender(ext, items)))
    if getattr(plan, "result_name", None):
        values = m.concat("gathers", RESULT)
        up.assign[plan.result_name] = _build(
            getattr(plan, "result_kind", None) or "list", values
        )


def _appender(target: Any, items: Sequence[Any]) -> Callable[[], Any]:
    """A commit action appending ``items`` one by one to ``target``."""

    def action() -> list[Any]:
        return [target.append(x) for x in items]

    return action


def _extender(extend: Callable[[Any], Any], items: Sequence[Any]) -> Callable[[], Any]:
    """A commit action calling ``extend(items)``."""

    def action() -> Any:
        return extend(items)

    return action


def _build(kind: str, values: list[Any]) -> Any:
    """What the comprehension builds from its values in iteration order: the
    same builtin the serial statement calls, over the same values in the same
    order (so ``sum`` of floats is bit-for-bit the serial one, and ``max`` of
    nothing raises as it would serially)."""
    if kind == "list":
        return values
    if kind in ("any", "all"):
        return _short_circuit(kind == "any", values)
    return getattr(builtins, kind)(values)


def _short_circuit(want: bool, values: list[Any]) -> bool:
    """``any``/``all`` replayed in order over every item's value: an item that
    raised (``ItemError``) is raised only if no item before it decided, which is
    exactly when the serial call would have reached it."""
    for v in values:
        if isinstance(v, ItemError):
            raise v.exc
        if bool(v) is want:
            return want
    return not want


def merge_bests(m: Merging) -> None:
    """Running bests: the chunk whose final best the test takes, in chunk order."""
    for b in getattr(m.plan, "bests", ()):
        m.picked.update(b.names)
        m.up.assign.update(_pick_best(b, m.rs, m.current))


_COMPARE: dict[str, Callable[[Any, Any], Any]] = {
    "<": operator.lt,
    "<=": operator.le,
    ">": operator.gt,
    ">=": operator.ge,
}


def _totally_ordered(v: Any) -> bool:
    """A value whose ``<`` is a total order on its kind (a real number that
    is not nan, a string, bytes; a numpy or torch scalar of a real dtype):
    there folding the chunks' bests is the serial fold."""
    if isinstance(v, bool) or (
        isinstance(v, (int, float, str, bytes)) and not is_numpy(v)
    ):
        return v == v
    if is_numpy(v) or is_torch(v):
        dtype = str(getattr(v, "dtype", ""))
        size = getattr(v, "size", None)
        n = size if isinstance(size, int) else getattr(v, "numel", lambda: 0)()
        real = not any(t in dtype for t in ("complex", "object", "str", "void"))
        return n == 1 and real and bool(v == v)
    from decimal import Decimal
    from fractions import Fraction

    return isinstance(v, (Fraction, Decimal)) and v == v


def _pick_best(
    b: Any, rs: Sequence[ChunkResultLike], current: Mapping[str, Any]
) -> dict[str, Any]:
    """``if score < best: best = score; best_epoch = epoch``: each chunk ran
    it from the kernel's ``best``, so its final ``best`` is its own running
    best; replaying the test over those in chunk order (from the kernel's
    ``best``) is the serial fold when the scores are totally ordered, ties
    included. A chunk whose payloads were never assigned took nothing."""
    missing = object()
    cur = current.get(b.name, missing)
    test = _COMPARE[b.op]
    chosen: dict[str, Any] | None = None
    for r in rs:
        last = r.last_values
        if b.payloads and not all(p in last for p in b.payloads):
            continue  # (the chunk never took: its best is the kernel's)
        rec = last.get(b.name)
        if rec is None:
            continue
        recs = {n: last[n] for n in b.names if n in last}
        if any(kind != "value" for _i, kind, _v in recs.values()):
            raise NotParallelizable(
                f"gpucell: `{b.name}` keeps a running best, and a value the "
                "chunk kept with it cannot travel back from an engine. Nothing "
                "was merged."
            )
        value = rec[2]
        if cur is missing or (b.none_first and cur is None):
            take = True
        else:
            for v in (value, cur):
                if not _totally_ordered(v):
                    raise NotParallelizable(
                        f"gpucell: `{b.name}` keeps a running best of "
                        f"{type(v).__name__} values, whose order is not total: "
                        "the best of the chunks' bests need not be the serial "
                        "one. Nothing was merged; collect the candidates and "
                        "pick after the loop."
                    )
            take = bool(test(cur, value) if b.best_left else test(value, cur))
        if take:
            cur = value
            chosen = {n: v for n, (_i, _k, v) in recs.items()}
    return chosen or {}


def merge_locals(m: Merging) -> None:
    """Locals: the last iteration that assigned (or deleted) each name."""
    up = m.up
    deletes: list[str] = []
    for name in m.plan.locals:
        if name in m.picked:
            continue
        best: tuple[int, str, Any] | None = None
        for r in m.rs:
            rec = r.last_values.get(name)
            if rec is not None and (best is None or rec[0] > best[0]):
                best = rec
        if best is None:
            continue
        _idx, kind, payload = best
        if kind == "value":
            up.assign[name] = payload
        elif kind == "module":
            up.assign[name] = importlib.import_module(payload)
        elif kind == "deleted":
            deletes.append(name)
        elif kind == "closed file":
            up.assign[name] = closed_file(payload)
        elif kind == "unsendable":
            up.notes.append(
                f"`{name}` keeps the value it had before the cell: its last value "
                f"in the loop (a {payload}) cannot travel back from an engine."
            )
    up.delete = tuple(deletes)


def closed_file(desc: dict[str, Any]) -> Any:
    """A closed file object like the one an engine's loop left (``with open(p)
    as f:`` in the body leaves ``f`` closed): same type, name, mode and
    encoding, over no file (built in memory: nothing on disk is touched)."""
    raw: Any = io.BytesIO()
    name, mode = desc.get("name"), desc.get("mode")
    if name is not None:
        raw.name = name
    kind = str(desc.get("kind"))
    inner = str(desc.get("buffer", kind))
    buffered: Any = {
        "writer": io.BufferedWriter,
        "random": io.BufferedRandom,
    }.get(inner, io.BufferedReader)(raw)
    if mode is not None:
        raw.mode = mode
    out: Any = buffered
    if kind == "text":
        out = io.TextIOWrapper(
            buffered,
            encoding=desc.get("encoding"),
            errors=desc.get("errors"),
            newline=None,
        )
        if mode is not None:
            out.mode = mode
    out.close()
    return out
