"""An own item's leaves and each leaf's state, taken before the chunk and
after it to see what the iteration changed: tokens by value, an object's
attributes by identity and value, and the containers inside a dict, list or
deque item followed two levels down (within a budget) so an element changed in
place can be written into the kernel's own.  Standard library only.
"""

from __future__ import annotations

import types
from collections.abc import Hashable, Iterator
from typing import Any

from gpucell.engine import checkin
from gpucell.engine.checkout_kinds import (
    VALUE_TYPES,
    VALUES,
    attributes_of,
    iterator_position,
    kind_of,
    rng_state,
)

__all__ = [
    "LISTS",
    "attribute_token",
    "describe_path",
    "item_parts",
    "notebook_class_state",
    "same_state",
    "state_of",
]


#: containers followed below an item, and how deep: an element of one that
#: changed in place is written back into the kernel's own element
#: (``r["scores"].sort()`` on a dict item), identity kept
_NESTED = ("dict", "list", "deque", "set", "bytes")
_NESTED_DEPTH = 2


#: elements of containers inside one item looked at one by one, at most
#: (past it a container element is hashed whole: changed in place, it fails
#: the chunk as before); the items' own elements are not counted
_NESTED_BUDGET = 20_000


#: the state of each element that is a container, by its id: what the state
#: after the chunk follows (``None``: before the chunk, within a budget)
_Template = dict[int, Any] | None


def _entries(
    kind: str, obj: Any, depth: int, budget: list[int], template: _Template
) -> list[tuple[Any, ...]]:
    """A dict's, list's or deque's ``(key, id, token, element, its own state
    if it is a container)`` for each element, in order (the element held: its
    id is not reused meanwhile)."""
    pairs = obj.items() if kind == "dict" else ((None, v) for v in obj)
    out: list[tuple[Any, ...]] = []
    for k, v in pairs:
        sub = _nested_state(v, depth, budget, template)
        tok = attribute_token(v) if sub is None or len(sub) == 3 else _shape(sub)
        out.append((k, id(v), tok, v, sub))
    return out


def _flat(kind: str, v: Any) -> bool:
    """A container of plain values only: hashed whole, and written back as
    values (none has an identity to keep)."""
    if kind not in (*LISTS, "set"):
        return False
    xs = v.values() if kind == "dict" else v
    return set(map(type, xs)) <= VALUE_TYPES


def _outline(kind: str, v: Any) -> Any:
    """What the kernel checks its element against: a dict's keys, a list's
    or deque's length."""
    if kind == "dict":
        return list(v.keys())
    return len(v) if kind in LISTS else None


def _nested_state(
    v: Any, depth: int, budget: list[int], template: _Template
) -> tuple[Any, ...] | None:
    """A container element's own state, where it is followed: before the
    chunk, within the depth and the budget; after it, where it was before."""
    if depth >= _NESTED_DEPTH or isinstance(v, VALUES):
        return None
    kind = kind_of(v)
    if kind not in _NESTED:
        return None
    if template is None:
        if _flat(kind, v):  # (kind, None, outline): its values, sent whole
            return kind, None, _outline(kind, v)
        size = len(v)
        if size > budget[0]:
            return None
        budget[0] -= size
        return kind, state_of(kind, v, depth + 1, budget)
    was = template.get(id(v))
    if was is None or was[0] != kind:
        return None
    if len(was) == 3:
        return kind, None, was[2]
    inner = {e[1]: e[4] for e in was[1] if e[4] is not None} if kind in LISTS else {}
    return kind, state_of(kind, v, depth + 1, budget, inner)


#: the kinds whose state is a list of entries (``_entries``)
LISTS = ("dict", "list", "deque")


def _shape(sub: tuple[str, Any]) -> Hashable:
    """A nested container's token, made from its state (each element hashed
    once, not again inside its container's pickle)."""
    kind, state = sub
    if kind == "set":
        return ("set", tuple(sorted((i, e[0]) for i, e in state.items())))
    if kind == "bytes":
        return ("bytes", state)
    return (kind, tuple(e[:3] for e in state))


def item_parts(
    item: Any, path: tuple[Any, ...] = ()
) -> Iterator[tuple[tuple[Any, ...], Any]]:
    """The item's leaves: a tuple item (``(i, x)``, ``(key, model)``) by
    part, two levels deep; a bound method by its object (``ticks =
    [c.tick for c in counters]``: calling one changes its ``self``,
    ``("self", 0)``); anything else is one leaf."""
    if type(item) is tuple and len(path) < 2:
        for j, x in enumerate(item):
            yield from item_parts(x, (*path, j))
    elif type(item) is types.MethodType and not isinstance(
        item.__self__, (type, types.ModuleType)
    ):
        yield (*path, ("self", 0)), item.__self__
    else:
        yield path, item


def describe_path(path: tuple[Any, ...]) -> str:
    steps = [str(j) for j in path if isinstance(j, int)]
    part = f" (part {'/'.join(steps)})" if steps else ""
    return part + (" (its method's object)" if path and path[-1] == ("self", 0) else "")


def _attr_state(v: Any) -> tuple[Any, ...]:
    """An attribute's (identity, token), and a torch module's own state (a
    trainer's ``model`` trained in place is written into the kernel's)."""
    if checkin._is_module(v):
        return id(v), attribute_token(v), state_of("module", v)
    return id(v), attribute_token(v)


def attribute_token(v: Any) -> Hashable:
    """An attribute's token, by value (never made read-only: the item's own
    ``fit`` may write into its own arrays)."""
    if isinstance(v, VALUES):
        return ("=", type(v).__name__, v)
    return checkin._pickled(v)


def state_of(
    kind: str,
    obj: Any,
    depth: int = 0,
    budget: list[int] | None = None,
    template: _Template = None,
) -> Any:
    if kind in ("object", "slots"):  # (identity, value): rebound, or changed in place
        return {k: _attr_state(v) for k, v in attributes_of(kind, obj).items()}
    if kind == "module":
        attrs = attributes_of(kind, obj).items()
        return (checkin.token(obj), {k: (id(v), attribute_token(v)) for k, v in attrs})
    if kind in LISTS:
        budget = [_NESTED_BUDGET] if budget is None else budget
        return _entries(kind, obj, depth, budget, template)
    if kind in ("udict", "ulist"):  # (its elements, its attributes)
        return (
            state_of(kind[1:], obj, depth, budget, template),
            state_of("object", obj),
        )
    if kind == "set":  # by identity, the values kept (a removed one is sent)
        return {id(v): (attribute_token(v), v) for v in obj}
    if kind == "bytes":
        return bytes(obj)
    if kind in ("random", "rng"):
        return checkin._pickled(rng_state(obj))
    if kind == "iterator":
        return (type(obj).__name__, *iterator_position(obj))
    if kind == "optimizer":  # (and the parameters it steps: they change too)
        params = [p for g in obj.param_groups for p in g["params"]]
        return (checkin._pickled(obj.state_dict()), tuple(map(checkin.token, params)))
    if kind == "scheduler":
        return checkin._pickled(obj.state_dict())
    if kind == "frame":
        return checkin._pickled(obj)
    if kind == "array":  # (its flag: `a.flags.writeable = False` changes no byte)
        flags = bool(obj.flags.writeable)
        return (obj.shape, obj.dtype.str, checkin.array_digest(obj), flags)
    return checkin.token(obj)


def notebook_class_state(leaf: Any, classes: dict[int, Hashable]) -> Hashable:
    """The state a notebook class's instances share (``checkin.class_state``),
    once per class per look."""
    cls = type(leaf)
    if getattr(cls, "__module__", None) != "__main__":
        return None
    if id(cls) not in classes:
        classes[id(cls)] = checkin.class_state(cls)
    return classes[id(cls)]


def same_state(kind: str, was: Any, now: Any) -> bool:
    if kind in ("object", "slots"):
        return was.keys() == now.keys() and all(
            checkin._same(was[n], now[n]) for n in was
        )
    if kind == "module":
        return same_state("", was[0], now[0]) and same_state("object", was[1], now[1])
    if kind == "set":
        return was.keys() == now.keys() and all(
            checkin._same(was[i][0], now[i][0]) for i in was
        )
    if kind in ("udict", "ulist"):
        elements = same_state(kind[1:], was[0], now[0])
        return elements and same_state("object", was[1], now[1])
    if kind in ("dict", "list", "deque"):
        return len(was) == len(now) and all(
            a[0] == b[0] and a[1] == b[1] and checkin._same(a[2], b[2])
            for a, b in zip(was, now, strict=True)
        )
    return bool(checkin._same(was, now))
