"""What to send for a leaf of an own item that changed (the update the kernel
applies in place, ``core/writeback.py``), or a few words on why it cannot be
written back: an element changed in place that the kernel may share, an
attribute holding torch parameters, an optimizer without its modules.
Standard library only.
"""

from __future__ import annotations

from collections.abc import Hashable, Iterable
from typing import Any

from gpucell.engine import checkin
from gpucell.engine.checkout_kinds import VALUES, attributes_of, kind_of, rng_state
from gpucell.engine.checkout_state import item_parts, same_state
from gpucell.protocol.fold import is_numpy

__all__ = ["leaf_update", "torch_state_why"]


#: (a path below the leaf: ``("el", position)`` steps, update)
_Ups = list[tuple[tuple[Any, ...], tuple[Any, ...]]]


def leaf_update(kind: str, leaf: Any, then: Any, now: Any) -> tuple[_Ups, str]:
    """What to send for one changed leaf (and its changed elements), or why
    it cannot be written back."""
    if kind in ("dict", "list", "deque"):
        return _container_update(kind, leaf, then, now)
    if kind in ("object", "slots"):
        return _object_update(kind, leaf, then, now)
    if kind in ("udict", "ulist"):
        ups, why = _container_update(kind[1:], leaf, then[0], now[0])
        attrs = _attrs_update(then[1], now[1], dict(vars(leaf)))
        why = why or _holds_torch_identity(attrs[0])
        if why:
            return [], why
        return [((), (*ups[0][1], attrs)), *ups[1:]], ""
    update, why = _update_one(kind, leaf, then, now)
    return ([((), update)] if not why else []), why


def torch_state_why(kind: str, leaf: Any, item: Any) -> str:
    """Why an optimizer or a scheduler cannot be written back by its
    ``state_dict``: it holds no parameters, only their positions, so the
    parameters it steps must be written back with it, each a parameter of a
    module in the same item (``for net, opt in zip(nets, opts)``); a
    scheduler's optimizer must be in the item too (the rates it set travel in
    the optimizer's state)."""
    if kind not in ("optimizer", "scheduler"):
        return ""
    leaves = [x for _p, x in item_parts(item)]
    if kind == "scheduler":
        if any(x is getattr(leaf, "optimizer", None) for x in leaves):
            return ""
        return (
            "its optimizer is not in the same item (`for net, opt, sched in "
            "zip(nets, opts, scheds)`): the rates it set would be lost"
        )
    mine = {id(p) for x in leaves if kind_of(x) == "module" for p in x.parameters()}
    params = [p for g in leaf.param_groups for p in g["params"]]
    if all(id(p) in mine for p in params):
        return ""
    return (
        "it steps parameters of no module in the same item (`for net, opt in "
        "zip(nets, opts)`): written back, its steps would be lost"
    )


def _update_one(
    kind: str, leaf: Any, then: Any, now: Any
) -> tuple[tuple[Any, ...], str]:
    if kind in ("optimizer", "scheduler"):
        return ("torchstate", leaf.state_dict()), ""
    if kind in ("module", "tensor"):
        token_then, token_now = (then[0], now[0]) if kind == "module" else (then, now)
        how = checkin.hooks_changed(token_then, token_now)
        if how:  # (a hook is code: it would have to run on the kernel's object)
            return (), (
                f"it cannot be written back: hooks were {how} "
                f"(`register_forward_hook`, `register_hook`...); {checkin.HOOKS_ADVICE}"
            )
    if kind == "module":
        state = _module_state(leaf)
        state["attrs"] = _attrs_update(then[1], now[1], attributes_of(kind, leaf))
        return ("module", state), ""
    if kind == "tensor":
        grad = getattr(leaf, "grad", None) if leaf.is_leaf else None
        value = leaf.detach().clone()
        flag = bool(leaf.requires_grad)
        return ("tensor", value, None if grad is None else grad, flag), ""
    if kind == "set":
        return _set_update(then, now)
    if kind == "bytes":
        return ("bytes", now), ""
    if kind in ("random", "rng"):
        return (kind, rng_state(leaf)), ""
    if kind == "iterator":  # (type name, its sequence's length, position)
        if then[1] >= 0 and now[1] >= 0 and then[1] != now[1]:
            return (), "its sequence changed length"
        return ("iterator", then[0], then[1], now[2]), ""
    if kind == "frame":  # a copy: the item itself would travel as a reference
        return ("frame", leaf.copy(deep=True)), ""
    # (its new writeable flag, None if the same, and whether its bytes changed:
    # a read-only kernel array can take a flag alone)
    flag = now[3] if then[3] != now[3] else None
    return ("array", leaf.copy(), flag, then[:3] != now[:3]), ""


def _module_state(m: Any) -> dict[str, Any]:
    """A module's state as plain tensors (never the module: an item object in
    a result travels as a reference to the kernel's own, unchanged one)."""

    def grad(p: Any) -> Any:
        g = getattr(p, "grad", None)
        return None if g is None else g.detach()

    return {
        "requires_grad": {n: bool(p.requires_grad) for n, p in m.named_parameters()},
        "params": {n: p.detach() for n, p in m.named_parameters()},
        "grads": {n: grad(p) for n, p in m.named_parameters()},
        "buffers": {n: b.detach() for n, b in m.named_buffers() if b is not None},
        "training": {n: bool(s.training) for n, s in m.named_modules()},
    }


def _object_update(kind: str, leaf: Any, then: Any, now: Any) -> tuple[_Ups, str]:
    """An object's attributes set, changed or deleted; a torch module among
    them changed in place (not rebound) is written into the kernel's own
    (``("attr", name)``: its identity, and every other name's hold on it,
    kept), never replaced by the engine's copy."""
    set_, gone, inplace = _attrs_update(then, now, attributes_of(kind, leaf))
    nested: _Ups = []
    for n in list(inplace):
        if len(then[n]) == 3 and len(now[n]) == 3:
            update, why = _update_one("module", set_[n], then[n][2], now[n][2])
            if why:
                return [], f"its attribute `{n}` (a {type(set_[n]).__name__}): {why}"
            nested.append(((("attr", n),), update))
            inplace.remove(n)
            del set_[n]
    why = _holds_torch_identity(set_)
    if why:
        return [], why
    tag = "attrs" if kind == "object" else "slots"
    return [((), (tag, set_, gone, inplace)), *nested], ""


def _holds_torch_identity(changed: dict[str, Any]) -> str:
    """Why no changed attribute can be written back when one holds a torch
    parameter or module (an optimizer's ``state``, keyed by its parameters,
    and its ``param_groups``; a trainer's ``model``): what the holder is for
    is their identity, and written back it would hold the engine's copies, so
    the kernel's optimizer would step tensors no model has."""
    for n, v in changed.items():
        if _reaches_torch(v, [10_000]):
            return (
                f"its attribute `{n}` holds torch parameters or modules (an "
                "optimizer's state, a model): written back, it would hold the "
                "engine's copies, not your objects"
            )
    return ""


def _reaches_torch(v: Any, budget: list[int], depth: int = 0) -> bool:
    budget[0] -= 1
    if budget[0] < 0 or isinstance(v, VALUES) or isinstance(v, type):
        return False
    if checkin._is_module(v) or type(v).__name__ == "Parameter":
        return True
    if depth >= 4 or checkin._is_tensor(v) or is_numpy(v):
        return False
    if isinstance(v, dict):
        parts: Iterable[Any] = [*v.keys(), *v.values()]
    elif isinstance(v, (list, tuple, set, frozenset)):
        parts = v
    elif isinstance(getattr(v, "__dict__", None), dict):
        parts = list(vars(v).values())
    else:
        return False
    return any(_reaches_torch(x, budget, depth + 1) for x in parts)


def _attrs_update(
    then: dict[str, Any], now: dict[str, Any], attrs: dict[str, Any]
) -> tuple[dict[str, Any], list[str], list[str]]:
    """(attributes set or changed, deleted, changed in place, not rebound)."""
    set_ = {
        n: v
        for n, v in attrs.items()
        if n not in then or not same_state("", then[n], now[n])
    }
    gone = [n for n in then if n not in attrs]
    # an attribute changed in place (not rebound): the kernel's object there
    # may be shared, and then cannot be replaced
    inplace = [n for n in set_ if n in then and then[n][0] == now[n][0]]
    return set_, gone, inplace


def _container_update(
    kind: str, leaf: Any, then: list[Any], now: list[Any]
) -> tuple[_Ups, str]:
    """A dict's, list's or deque's new elements: each an old one (kept: the kernel's own
    object goes back in, identity as serially) or a new value; an old
    container element changed in place is written into the kernel's own
    (``("el", its old position)``: ``resolve`` checks that nothing else
    holds it).  Any other old element changed in place, or one held by a new
    value, cannot be: the kernel's object may be shared (``rows[0]['c'] is
    rows[1]['c']``)."""
    old = {e[1]: (j, e[2], e[4]) for j, e in enumerate(then)}
    out: list[tuple[Any, str, Any]] = []
    nested: _Ups = []
    for key, i, tok, v, sub in now:
        if i in old and not isinstance(v, VALUES):
            j, was, was_sub = old[i]
            what = f"`[{key!r}]`" if kind == "dict" else "an element"
            if not same_state("", was, tok):
                if was_sub is None or sub is None or was_sub[0] != sub[0]:
                    return [], (
                        f"{what} (a {type(v).__name__}) changed in place; only "
                        "elements replaced (`row[k] = new`) and containers' "
                        "elements can be written back"
                    )
                if len(was_sub) == 3:
                    ups, why = [((), _values_update(sub[0], v, was_sub[2]))], ""
                else:
                    ups, why = leaf_update(sub[0], v, was_sub[1], sub[1])
                if why:
                    return [], f"{what} (a {type(v).__name__}): {why}"
                nested += [((("el", j), *p), u) for p, u in ups]
            out.append((key, "old", j))
        else:
            if not isinstance(v, VALUES) and _holds(v, old):
                return [], "a new element holds one of its old elements"
            out.append((key, "new", v))
    keys = [e[0] for e in then] if kind == "dict" else len(then)
    return [((), (kind, keys, out)), *nested], ""


def _values_update(kind: str, v: Any, outline: Any) -> tuple[Any, ...]:
    """A container that held plain values only, as its new elements, each
    new (``("set", None, values)``: the kernel's set becomes those values)."""
    if kind == "set":
        return ("set", None, list(v))
    pairs = v.items() if kind == "dict" else ((None, x) for x in v)
    return (kind, outline, [(k, "new", x) for k, x in pairs])


def _set_update(
    then: dict[int, tuple[Hashable, Any]], now: dict[int, tuple[Hashable, Any]]
) -> tuple[tuple[Any, ...], str]:
    """A set's change as what it lost and what it gained: the elements kept
    stay the kernel's own objects (identity as serially); a removed one is
    found in the kernel's set by value, as ``discard`` finds it."""
    for i, (tok, v) in now.items():
        if i in then and not isinstance(v, VALUES):
            if not checkin._same(then[i][0], tok):
                return (), (
                    f"an element (a {type(v).__name__}) changed in place; only "
                    "elements added or removed can be written back"
                )
        elif i not in then and not isinstance(v, VALUES) and _holds(v, then):
            return (), "a new element holds one of its old elements"
    removed = [v for i, (_t, v) in then.items() if i not in now]
    added = [v for i, (_t, v) in now.items() if i not in then]
    return ("set", removed, added), ""


def _holds(v: Any, ids: dict[int, Any], depth: int = 0) -> bool:
    """Whether ``v`` reaches one of ``ids`` through containers (3 levels)."""
    if id(v) in ids:
        return True
    if depth >= 3:
        return False
    if isinstance(v, dict):
        parts: Iterable[Any] = v.values()
    elif isinstance(v, (list, tuple, set, frozenset)):
        parts = v
    elif isinstance(getattr(v, "__dict__", None), dict) and not isinstance(v, type):
        parts = vars(v).values()
    else:
        return False
    return any(_holds(x, ids, depth + 1) for x in list(parts)[:10_000])
