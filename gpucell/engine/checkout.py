"""An iteration's own item, checked out: what it changed travels back.

Serially ``for m in models: m.fit(X, y)`` leaves every model in the list
fitted.  On an engine each iteration changes its copy of its own item; the
input check (``checkin``) sees the items change.  When the items are all that
changed, the engine sends each changed item's new state instead of failing,
and the kernel applies it to its own objects in place (``core/writeback.py``),
so every name that refers to them sees the change, as serially.

What can be written back (a *leaf* of an item: the item itself, or a part of
a tuple item such as ``enumerate``'s or ``dict.items()``'s pairs):

* a torch module: its parameters, buffers and their gradients, and every
  submodule's train/eval flag;
* a torch tensor: its values (and gradient);
* any other object with a ``__dict__`` (an estimator, a plain object): the
  attributes the iteration set, changed or deleted.

Anything else that changed (a list item appended to, a numpy array) cannot be
written back: the chunk fails as before, naming it.  Standard library only.
"""

from __future__ import annotations

import types
from collections.abc import Hashable, Iterable, Iterator
from typing import Any

from gpucell.engine import checkin
from gpucell.protocol.fold import is_numpy

__all__ = ["ItemsBefore", "before", "changes"]

#: (iteration, path into the item) -> (kind, token): kind "module", "tensor",
#: "object" (token: attribute -> token) or "" (a part that cannot be written)
ItemsBefore = dict[tuple[int, tuple[int, ...]], tuple[str, Any]]

_VALUES = (type(None), bool, int, float, complex, str, bytes, range)


def _kind(obj: Any) -> str:
    if isinstance(obj, (type, types.ModuleType, types.FunctionType) + _VALUES):
        return ""
    if checkin._is_module(obj):
        return "module"
    if checkin._is_tensor(obj):
        return "tensor"
    if is_numpy(obj) or isinstance(obj, (list, dict, set, tuple)):
        return ""
    if hasattr(obj, "__dict__") and type(obj).__module__ != "builtins":
        return "object"
    return ""


def _parts(
    item: Any, path: tuple[int, ...] = ()
) -> Iterator[tuple[tuple[int, ...], Any]]:
    """The item's leaves: a tuple item (``(i, x)``, ``(key, model)``) by
    part, two levels deep; anything else is one leaf."""
    if type(item) is tuple and len(path) < 2:
        for j, x in enumerate(item):
            yield from _parts(x, (*path, j))
    else:
        yield path, item


def _attribute(v: Any) -> Hashable:
    """An attribute's token, by value (never made read-only: the item's own
    ``fit`` may write into its own arrays)."""
    if isinstance(v, _VALUES):
        return ("=", type(v).__name__, v)
    return checkin._pickled(v)


def _state(kind: str, obj: Any) -> Any:
    if kind == "object":  # (identity, value): rebound, or changed in place
        return {k: (id(v), _attribute(v)) for k, v in vars(obj).items()}
    return checkin.token(obj)


def before(items: Iterable[Any], start: int) -> ItemsBefore:
    """The state of every leaf of the chunk's items, before it runs."""
    out: ItemsBefore = {}
    for k, item in enumerate(items):
        for path, leaf in _parts(item):
            kind = _kind(leaf)
            out[(start + k, path)] = (kind, _state(kind, leaf))
    return out


def _module_state(m: Any) -> dict[str, Any]:
    """A module's state as plain tensors (never the module: an item object in
    a result travels as a reference to the kernel's own, unchanged one)."""

    def grad(p: Any) -> Any:
        g = getattr(p, "grad", None)
        return None if g is None else g.detach()

    return {
        "params": {n: p.detach() for n, p in m.named_parameters()},
        "grads": {n: grad(p) for n, p in m.named_parameters()},
        "buffers": {n: b.detach() for n, b in m.named_buffers() if b is not None},
        "training": {n: bool(s.training) for n, s in m.named_modules()},
    }


def changes(
    was: ItemsBefore, items: Iterable[Any], start: int
) -> tuple[list[tuple[int, tuple[int, ...], tuple[Any, ...]]], list[str]]:
    """What each iteration changed of its own item, as ``(iteration, path,
    update)``; and, if some change cannot be written back, a few words on
    each (then nothing is written back: the chunk fails)."""
    updates: list[tuple[int, tuple[int, ...], tuple[Any, ...]]] = []
    cannot: list[str] = []
    for k, item in enumerate(items):
        for path, leaf in _parts(item):
            key = (start + k, path)
            kind, then = was.get(key, ("", None))
            now_kind = _kind(leaf)
            now = _state(now_kind, leaf)
            if now_kind == kind and _same(kind, then, now):
                continue
            where = f"the item of iteration {start + k}" + (
                f" (part {'/'.join(map(str, path))})" if path else ""
            )
            if kind != now_kind or kind == "":
                cannot.append(f"{where}, a {type(leaf).__name__}, changed in place")
            elif kind == "module":
                updates.append((start + k, path, ("module", _module_state(leaf))))
            elif kind == "tensor":
                grad = getattr(leaf, "grad", None) if leaf.is_leaf else None
                value = leaf.detach().clone()
                updates.append(
                    (start + k, path, ("tensor", value, None if grad is None else grad))
                )
            else:
                attrs = vars(leaf)
                set_ = {
                    n: v
                    for n, v in attrs.items()
                    if n not in then or not _same("", then[n], now[n])
                }
                gone = [n for n in then if n not in attrs]
                # an attribute changed in place (not rebound): the kernel's
                # object there may be shared, and then cannot be replaced
                inplace = [n for n in set_ if n in then and then[n][0] == now[n][0]]
                updates.append((start + k, path, ("attrs", set_, gone, inplace)))
    return updates, cannot


def _same(kind: str, was: Any, now: Any) -> bool:
    if kind == "object":
        return was.keys() == now.keys() and all(
            checkin._same(was[n], now[n]) for n in was
        )
    return bool(checkin._same(was, now))
