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
* a ``set`` (what it lost and gained), a ``collections.deque`` (its
  elements, as a list's), a ``bytearray`` (its bytes);
* an iterator over a list, tuple, range, string or bytes (``it =
  iter(rows)``, ``reversed(xs)``): its position (``next(it)``), set in the
  kernel's own iterator over the kernel's sequence;
* a ``random.Random``, a numpy ``Generator`` or ``RandomState``: its whole
  state (``getstate``, ``bit_generator.state``, ``get_state``), so the
  kernel's draws go on where the engine's copy stopped;
* a torch optimizer or LR scheduler: its ``state_dict`` (parameters by
  position), where the item holds the modules it steps (and a scheduler its
  optimizer);
* a notebook subclass of ``dict`` or ``list`` (``class Row(dict)``): its
  elements as a dict's or list's and its attributes, unless it defines a
  store (``__setitem__``, ``append``...) that the kernel's refill would run
  again;
* any other object with a ``__dict__`` (an estimator, a plain object): the
  attributes the iteration set, changed or deleted, where they are all its
  state as pickle sees it;
* a container inside a dict, list or deque item (two levels down) changed
  in place: into the kernel's own, as its item is.

Anything else that changed (a subclass of a set or a generator, another
iterator: a generator, a ``map``, a file; a bound method) cannot be written
back: the chunk fails as before, naming it. So does a change to a notebook
class's own attributes made through an item (``self.seen.append`` on a
class-level list, ``type(self).count += 1``): every instance shares them,
serially later iterations would see the change. A process-wide generator
is never written back (each process has its own: ``protocol/globalrng.py``).
Standard library only.
"""

from __future__ import annotations

import collections
import copyreg
import random
import types
from collections.abc import Hashable, Iterable, Iterator
from typing import Any

from gpucell.engine import checkin
from gpucell.protocol.fold import is_numpy
from gpucell.protocol.globalrng import global_generator

__all__ = ["ItemsBefore", "before", "changes"]

#: (iteration, path into the item) -> (kind, token, its notebook class's
#: state): kind "module", "tensor", "object" (token: attribute -> token) or ""
#: (a part that cannot be written)
ItemsBefore = dict[tuple[int, tuple[int, ...]], tuple[str, Any, Hashable]]

_VALUES = (type(None), bool, int, float, complex, str, bytes, range)
_VALUE_TYPES = frozenset(_VALUES)


def _kind(obj: Any) -> str:
    if isinstance(obj, (type, types.ModuleType, types.FunctionType) + _VALUES):
        return ""
    if checkin._is_module(obj):
        return "module"
    if checkin._is_tensor(obj):
        return "tensor"
    torch_kind = _torch_state_kind(obj)
    if torch_kind:
        return torch_kind
    if is_numpy(obj):
        plain = not checkin._is_numpy_scalar(obj) and not obj.dtype.hasobject
        return "array" if plain else ""
    t = type(obj)
    if t.__module__.startswith("pandas") and t.__name__ in ("DataFrame", "Series"):
        return "frame"
    if isinstance(obj, dict) and t.__module__ in ("builtins", "collections"):
        return "dict"
    if isinstance(obj, list) and t.__module__ == "builtins":
        return "list"
    if isinstance(obj, (dict, list)) and _plain_subclass(obj):
        return "udict" if isinstance(obj, dict) else "ulist"
    special = _stdlib_kind(obj)
    if special is not None:
        return special
    if isinstance(obj, (set, tuple, frozenset)) or t.__module__ == "builtins":
        return ""
    if isinstance(getattr(obj, "__dict__", None), dict):
        return "object" if _attributes_are_state(obj) else ""
    if _slot_names(obj):
        return "slots" if _attributes_are_state(obj) else ""
    return ""


#: numpy's generators, by (module, class): their state is their bit
#: generator's, read and set through these
_NUMPY_RNG = {
    ("numpy.random._generator", "Generator"): "generator",
    ("numpy.random.mtrand", "RandomState"): "randomstate",
}


#: what a subclass of dict or list may not define for its elements to be
#: written back by dict's and list's own stores (they would run again)
_MUTATORS = frozenset(
    "__setitem__ __delitem__ __iadd__ __imul__ clear update setdefault pop "
    "popitem append extend insert remove sort reverse __setattr__ __delattr__ "
    "__setstate__ __getstate__ __reduce__ __reduce_ex__ __slots__".split()
)


#: torch's objects that keep their state in a ``state_dict`` (their
#: parameters, their optimizer, by position: never the engine's copies)
_TORCH_STATE = {
    ("torch.optim.optimizer", "Optimizer"): "optimizer",
    ("torch.optim.lr_scheduler", "LRScheduler"): "scheduler",
}


def _torch_state_kind(obj: Any) -> str:
    for cls in type(obj).__mro__:
        if (cls.__module__, cls.__name__) in _TORCH_STATE:
            return _TORCH_STATE[(cls.__module__, cls.__name__)]
    return ""


def _plain_subclass(obj: Any) -> bool:
    """A subclass of ``dict`` or ``list`` (``class Row(dict)``) whose state is
    its elements and its attributes, as pickle sees it, with none of the
    stores overridden: its elements are written back as a dict's or list's,
    its attributes as an object's."""
    base = dict if isinstance(obj, dict) else list
    for cls in type(obj).__mro__:
        if cls in (base, object):
            break
        if cls.__module__ != "__main__" or _MUTATORS & set(vars(cls)):
            return False  # (a library's subclass may keep invariants)
    else:
        return False
    try:
        red = obj.__reduce_ex__(4)
    except Exception:
        return False
    newobj = getattr(copyreg, "__newobj__", None)
    if not (isinstance(red, tuple) and len(red) == 5 and red[0] is newobj):
        return False
    elements = red[4] if base is dict else red[3]
    other = red[3] if base is dict else red[4]
    return (
        tuple(red[1]) == (type(obj),)
        and (red[2] is None or isinstance(red[2], dict))
        and elements is not None
        and other is None
    )


def _stdlib_kind(obj: Any) -> str | None:
    """Containers and generators whose state is not attributes, written back
    by their own means (exactly these classes: a subclass may hold more)."""
    t = type(obj)
    if global_generator(obj) is not None:
        return ""  # process state, a reference to each process's own
    if t is set:
        return "set"
    if t is bytearray:
        return "bytes"
    if t is collections.deque:
        return "deque"
    if t is random.Random:
        return "random"
    if (t.__module__, t.__name__) in _NUMPY_RNG:
        return "rng"
    if t in _SEQUENCE_ITERATORS:
        return "iterator"
    return None


#: iterators over a sequence, whose whole state is their position (pickled
#: as ``(iter, (sequence,), position)``, set by ``__setstate__``): written
#: back as that position into the kernel's own, over the kernel's sequence
_SEQUENCE_ITERATORS = frozenset(
    type(x)
    for x in (
        iter([]),
        iter(()),
        iter(range(0)),
        iter(""),
        iter("\u00e9"),
        iter(b""),
        iter(bytearray()),
        reversed([]),
    )
)


def _position(it: Any) -> tuple[int, int | None]:
    """A sequence iterator's (length of its sequence, position), position
    ``None`` once it is used up (its sequence is dropped then)."""
    reduced = it.__reduce__()
    seq = reduced[1][0] if reduced[1] else ()
    if len(reduced) < 3:
        return -1, None
    return len(seq), int(reduced[2])


def rng_state(obj: Any) -> Any:
    """A ``random.Random``'s or numpy generator's whole state (a
    ``RandomState``'s cached Gaussian included)."""
    if type(obj) is random.Random:
        return obj.getstate()
    if _NUMPY_RNG[(type(obj).__module__, type(obj).__name__)] == "generator":
        return obj.bit_generator.state
    return obj.get_state(legacy=False)


def _attributes_are_state(obj: Any) -> bool:
    """Whether an object's attributes (``__dict__`` and slots) are all of its
    state, as pickle sees it: made from its class alone, with a dict of
    attributes.  Not a ``random.Random`` (its generator state lives in its C
    base, pickled as a tuple), nor a subclass of ``dict`` or ``list`` (their
    elements travel beside the attributes): written back by attributes, such
    an item would silently keep what it was."""
    try:
        red = obj.__reduce_ex__(4)
    except Exception:
        return False
    if not isinstance(red, tuple) or len(red) < 2:
        return False
    made, args = red[0], red[1]
    newobj = getattr(copyreg, "__newobj__", None)  # (not in typeshed)
    from_class = made is newobj and tuple(args) == (type(obj),)
    # SimpleNamespace: (its class, (), its attributes)
    from_class = from_class or (made is type(obj) and tuple(args) == ())
    if not from_class or any(x is not None for x in red[3:5]):
        return False
    state = red[2] if len(red) > 2 else None
    if type(state) is tuple and len(state) == 2:  # (attributes, slots)
        return all(x is None or isinstance(x, dict) for x in state)
    return state is None or isinstance(state, dict)


def _slot_names(obj: Any) -> list[str]:
    """The ``__slots__`` of an object's classes (a plain object without a
    ``__dict__``: ``p.x += 1`` on a ``@dataclass(slots=True)``)."""
    names: list[str] = []
    for cls in type(obj).__mro__:
        slots = vars(cls).get("__slots__", ())
        for n in (slots,) if isinstance(slots, str) else slots:
            if n not in ("__dict__", "__weakref__") and n not in names:
                names.append(n)
    return names


def _attributes(kind: str, obj: Any) -> dict[str, Any]:
    """The attributes an iteration can set on an object of this kind."""
    if kind == "slots":
        return {n: getattr(obj, n) for n in _slot_names(obj) if hasattr(obj, n)}
    if kind == "module":  # its own plain attributes (checkin.module_attributes)
        return {
            k: v
            for k, v in vars(obj).items()
            if not k.startswith("_") and k != "training"
        }
    return dict(vars(obj))


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
        tok = _attribute(v) if sub is None or len(sub) == 3 else _shape(sub)
        out.append((k, id(v), tok, v, sub))
    return out


def _flat(kind: str, v: Any) -> bool:
    """A container of plain values only: hashed whole, and written back as
    values (none has an identity to keep)."""
    if kind not in (*_LISTS, "set"):
        return False
    xs = v.values() if kind == "dict" else v
    return set(map(type, xs)) <= _VALUE_TYPES


def _outline(kind: str, v: Any) -> Any:
    """What the kernel checks its element against: a dict's keys, a list's
    or deque's length."""
    if kind == "dict":
        return list(v.keys())
    return len(v) if kind in _LISTS else None


def _nested_state(
    v: Any, depth: int, budget: list[int], template: _Template
) -> tuple[Any, ...] | None:
    """A container element's own state, where it is followed: before the
    chunk, within the depth and the budget; after it, where it was before."""
    if depth >= _NESTED_DEPTH or isinstance(v, _VALUES):
        return None
    kind = _kind(v)
    if kind not in _NESTED:
        return None
    if template is None:
        if _flat(kind, v):  # (kind, None, outline): its values, sent whole
            return kind, None, _outline(kind, v)
        size = len(v)
        if size > budget[0]:
            return None
        budget[0] -= size
        return kind, _state(kind, v, depth + 1, budget)
    was = template.get(id(v))
    if was is None or was[0] != kind:
        return None
    if len(was) == 3:
        return kind, None, was[2]
    inner = {e[1]: e[4] for e in was[1] if e[4] is not None} if kind in _LISTS else {}
    return kind, _state(kind, v, depth + 1, budget, inner)


_LISTS = ("dict", "list", "deque")


def _shape(sub: tuple[str, Any]) -> Hashable:
    """A nested container's token, made from its state (each element hashed
    once, not again inside its container's pickle)."""
    kind, state = sub
    if kind == "set":
        return ("set", tuple(sorted((i, e[0]) for i, e in state.items())))
    if kind == "bytes":
        return ("bytes", state)
    return (kind, tuple(e[:3] for e in state))


def _parts(
    item: Any, path: tuple[Any, ...] = ()
) -> Iterator[tuple[tuple[Any, ...], Any]]:
    """The item's leaves: a tuple item (``(i, x)``, ``(key, model)``) by
    part, two levels deep; a bound method by its object (``ticks =
    [c.tick for c in counters]``: calling one changes its ``self``,
    ``("self", 0)``); anything else is one leaf."""
    if type(item) is tuple and len(path) < 2:
        for j, x in enumerate(item):
            yield from _parts(x, (*path, j))
    elif type(item) is types.MethodType and not isinstance(
        item.__self__, (type, types.ModuleType)
    ):
        yield (*path, ("self", 0)), item.__self__
    else:
        yield path, item


def _where(path: tuple[Any, ...]) -> str:
    steps = [str(j) for j in path if isinstance(j, int)]
    part = f" (part {'/'.join(steps)})" if steps else ""
    return part + (" (its method's object)" if path and path[-1] == ("self", 0) else "")


def _attr_state(v: Any) -> tuple[Any, ...]:
    """An attribute's (identity, token), and a torch module's own state (a
    trainer's ``model`` trained in place is written into the kernel's)."""
    if checkin._is_module(v):
        return id(v), _attribute(v), _state("module", v)
    return id(v), _attribute(v)


def _attribute(v: Any) -> Hashable:
    """An attribute's token, by value (never made read-only: the item's own
    ``fit`` may write into its own arrays)."""
    if isinstance(v, _VALUES):
        return ("=", type(v).__name__, v)
    return checkin._pickled(v)


def _state(
    kind: str,
    obj: Any,
    depth: int = 0,
    budget: list[int] | None = None,
    template: _Template = None,
) -> Any:
    if kind in ("object", "slots"):  # (identity, value): rebound, or changed in place
        return {k: _attr_state(v) for k, v in _attributes(kind, obj).items()}
    if kind == "module":
        attrs = _attributes(kind, obj).items()
        return (checkin.token(obj), {k: (id(v), _attribute(v)) for k, v in attrs})
    if kind in _LISTS:
        budget = [_NESTED_BUDGET] if budget is None else budget
        return _entries(kind, obj, depth, budget, template)
    if kind in ("udict", "ulist"):  # (its elements, its attributes)
        return (
            _state(kind[1:], obj, depth, budget, template),
            _state("object", obj),
        )
    if kind == "set":  # by identity, the values kept (a removed one is sent)
        return {id(v): (_attribute(v), v) for v in obj}
    if kind == "bytes":
        return bytes(obj)
    if kind in ("random", "rng"):
        return checkin._pickled(rng_state(obj))
    if kind == "iterator":
        return (type(obj).__name__, *_position(obj))
    if kind == "optimizer":  # (and the parameters it steps: they change too)
        params = [p for g in obj.param_groups for p in g["params"]]
        return (checkin._pickled(obj.state_dict()), tuple(map(checkin.token, params)))
    if kind == "scheduler":
        return checkin._pickled(obj.state_dict())
    if kind == "frame":
        return checkin._pickled(obj)
    if kind == "array":
        return (obj.shape, obj.dtype.str, checkin.array_digest(obj))
    return checkin.token(obj)


def before(items: Iterable[Any], start: int) -> ItemsBefore:
    """The state of every leaf of the chunk's items, before it runs."""
    out: ItemsBefore = {}
    classes: dict[int, Hashable] = {}
    for k, item in enumerate(items):
        for path, leaf in _parts(item):
            kind = _kind(leaf)
            out[(start + k, path)] = (
                kind,
                _state(kind, leaf),
                _class_state(leaf, classes),
            )
    return out


def _class_state(leaf: Any, classes: dict[int, Hashable]) -> Hashable:
    """The state a notebook class's instances share (``checkin.class_state``),
    once per class per look."""
    cls = type(leaf)
    if getattr(cls, "__module__", None) != "__main__":
        return None
    if id(cls) not in classes:
        classes[id(cls)] = checkin.class_state(cls)
    return classes[id(cls)]


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


def changes(
    was: ItemsBefore,
    items: Iterable[Any],
    start: int,
    inputs: dict[str, Any] | None = None,
) -> tuple[list[tuple[int, tuple[int, ...], tuple[Any, ...]]], list[str]]:
    """What each iteration changed of its own item, as ``(iteration, path,
    update)``; and, if some change cannot be written back, a few words on
    each (then nothing is written back: the chunk fails).  ``inputs``: the
    chunk's inputs, which no new value may be or hold (:func:`_held_inputs`)."""
    updates, cannot = _changes(was, items, start)
    if updates and inputs and not cannot:
        cannot = _held_inputs(updates, inputs)
    return updates, cannot


#: objects looked at in the inputs and in the updates' new values
_INPUTS_BUDGET = 200_000


def _held_inputs(
    updates: list[tuple[int, tuple[int, ...], tuple[Any, ...]]],
    inputs: dict[str, Any],
) -> list[str]:
    """An item given an input, or a part of one (``row.ref = cfg``, ``d["m"]
    = model``): serially it holds the notebook's object itself (and a change
    made through it, ``row.ref.bump()``, is that object's); written back it
    would hold the engine's copy, and the change would be lost."""
    held: dict[int, str] = {}
    budget = [_INPUTS_BUDGET]
    for name, value in inputs.items():
        for x in _mutables(value, 0, budget):
            held.setdefault(id(x), name)
    if not held:
        return []
    out: list[str] = []
    for iteration, path, update in updates:
        for x in _mutables(update[1:], -2, budget):
            name = held.get(id(x))
            if name is not None:
                out.append(
                    f"the item of iteration {iteration}{_where(path)} now holds "
                    f"`{name}` (or a part of it), an input: serially it would hold "
                    "the notebook's object itself (and a change made through it "
                    "would be that object's); written back it would hold a copy"
                )
                break
    return out


def _mutables(value: Any, depth: int, budget: list[int]) -> Iterator[Any]:
    """``value`` and what it holds, two levels down (elements, dict values,
    attributes), but values nothing can change, what is shared by name
    (functions, classes, modules) and arrays, tensors and frames (read-only
    inputs on the engines: an estimator's ``_fit_X = X`` comes back an equal
    copy, as any result that holds an input does)."""
    budget[0] -= 1
    if budget[0] < 0 or isinstance(
        value, (*_VALUES, type, types.ModuleType, types.FunctionType)
    ):
        return
    if is_numpy(value) or checkin._is_tensor(value) or _kind(value) == "frame":
        return
    if depth >= 0:
        yield value
    if depth >= 2:
        return
    if isinstance(value, dict):
        parts: Iterable[Any] = value.values()
    elif isinstance(value, (list, tuple, set, frozenset, collections.deque)):
        if value and isinstance(next(iter(value)), _VALUES) and len(value) > 64:
            return  # (numbers or strings: nothing in them can be held)
        parts = value
    elif isinstance(getattr(value, "__dict__", None), dict) and not (
        checkin._is_module(value) or checkin._is_tensor(value)
    ):
        parts = vars(value).values()
    else:
        return
    for x in list(parts)[:10_000]:
        yield from _mutables(x, depth + 1, budget)


def _changes(
    was: ItemsBefore, items: Iterable[Any], start: int
) -> tuple[list[tuple[int, tuple[int, ...], tuple[Any, ...]]], list[str]]:
    updates: list[tuple[int, tuple[int, ...], tuple[Any, ...]]] = []
    cannot: list[str] = []
    classes: dict[int, Hashable] = {}
    for k, item in enumerate(items):
        for path, leaf in _parts(item):
            key = (start + k, path)
            kind, then, shared = was.get(key, ("", None, None))
            where = f"the item of iteration {start + k}" + _where(path)
            if not checkin._same(shared, _class_state(leaf, classes)):
                cannot.append(
                    f"{where}, a {type(leaf).__name__}: an attribute of its class "
                    f"`{type(leaf).__qualname__}` changed (every instance "
                    "shares it: serially later iterations would see the change)"
                )
                continue
            now_kind = _kind(leaf)
            # (its containers followed where they were before the chunk)
            entries = then[0] if kind in ("udict", "ulist") else then
            was_subs = (
                {e[1]: e[4] for e in entries if e[4] is not None}
                if now_kind == kind and kind in (*_LISTS, "udict", "ulist")
                else {}
            )
            now = _state(now_kind, leaf, 0, None, was_subs)
            if now_kind == kind and _same(kind, then, now):
                continue
            if kind != now_kind or kind == "":
                cannot.append(f"{where}, a {type(leaf).__name__}, changed in place")
                continue
            why = _torch_state_why(kind, leaf, item)
            ups, why = ([], why) if why else _update(kind, leaf, then, now)
            if why:
                cannot.append(f"{where}, a {type(leaf).__name__}: {why}")
            else:
                updates += [(start + k, (*path, *sub), u) for sub, u in ups]
    return updates, cannot


#: (a path below the leaf: ``("el", position)`` steps, update)
_Ups = list[tuple[tuple[Any, ...], tuple[Any, ...]]]


def _update(kind: str, leaf: Any, then: Any, now: Any) -> tuple[_Ups, str]:
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


def _torch_state_why(kind: str, leaf: Any, item: Any) -> str:
    """Why an optimizer or a scheduler cannot be written back by its
    ``state_dict``: it holds no parameters, only their positions, so the
    parameters it steps must be written back with it, each a parameter of a
    module in the same item (``for net, opt in zip(nets, opts)``); a
    scheduler's optimizer must be in the item too (the rates it set travel in
    the optimizer's state)."""
    if kind not in ("optimizer", "scheduler"):
        return ""
    leaves = [x for _p, x in _parts(item)]
    if kind == "scheduler":
        if any(x is getattr(leaf, "optimizer", None) for x in leaves):
            return ""
        return (
            "its optimizer is not in the same item (`for net, opt, sched in "
            "zip(nets, opts, scheds)`): the rates it set would be lost"
        )
    mine = {id(p) for x in leaves if _kind(x) == "module" for p in x.parameters()}
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
    if kind == "module":
        state = _module_state(leaf)
        state["attrs"] = _attrs_update(then[1], now[1], _attributes(kind, leaf))
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
    return ("array", leaf.copy()), ""


def _object_update(kind: str, leaf: Any, then: Any, now: Any) -> tuple[_Ups, str]:
    """An object's attributes set, changed or deleted; a torch module among
    them changed in place (not rebound) is written into the kernel's own
    (``("attr", name)``: its identity, and every other name's hold on it,
    kept), never replaced by the engine's copy."""
    set_, gone, inplace = _attrs_update(then, now, _attributes(kind, leaf))
    nested: _Ups = []
    for n in list(inplace):
        if len(then[n]) == 3 and len(now[n]) == 3:
            update, _why = _update_one("module", set_[n], then[n][2], now[n][2])
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
    if budget[0] < 0 or isinstance(v, _VALUES) or isinstance(v, type):
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
        if n not in then or not _same("", then[n], now[n])
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
        if i in old and not isinstance(v, _VALUES):
            j, was, was_sub = old[i]
            what = f"`[{key!r}]`" if kind == "dict" else "an element"
            if not _same("", was, tok):
                if was_sub is None or sub is None or was_sub[0] != sub[0]:
                    return [], (
                        f"{what} (a {type(v).__name__}) changed in place; only "
                        "elements replaced (`row[k] = new`) and containers' "
                        "elements can be written back"
                    )
                if len(was_sub) == 3:
                    ups, why = [((), _values_update(sub[0], v, was_sub[2]))], ""
                else:
                    ups, why = _update(sub[0], v, was_sub[1], sub[1])
                if why:
                    return [], f"{what} (a {type(v).__name__}): {why}"
                nested += [((("el", j), *p), u) for p, u in ups]
            out.append((key, "old", j))
        else:
            if not isinstance(v, _VALUES) and _holds(v, old):
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
        if i in then and not isinstance(v, _VALUES):
            if not checkin._same(then[i][0], tok):
                return (), (
                    f"an element (a {type(v).__name__}) changed in place; only "
                    "elements added or removed can be written back"
                )
        elif i not in then and not isinstance(v, _VALUES) and _holds(v, then):
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


def _same(kind: str, was: Any, now: Any) -> bool:
    if kind in ("object", "slots"):
        return was.keys() == now.keys() and all(
            checkin._same(was[n], now[n]) for n in was
        )
    if kind == "module":
        return _same("", was[0], now[0]) and _same("object", was[1], now[1])
    if kind == "set":
        return was.keys() == now.keys() and all(
            checkin._same(was[i][0], now[i][0]) for i in was
        )
    if kind in ("udict", "ulist"):
        return _same(kind[1:], was[0], now[0]) and _same("object", was[1], now[1])
    if kind in ("dict", "list", "deque"):
        return len(was) == len(now) and all(
            a[0] == b[0] and a[1] == b[1] and checkin._same(a[2], b[2])
            for a, b in zip(was, now, strict=True)
        )
    return bool(checkin._same(was, now))
