"""Own items written back: each iteration's changes to its own item, applied
to the kernel's object in place (the kernel's side of ``engine/checkout.py``).

Serially ``for m in models: m.fit(X, y)`` changes the objects in the list;
every other name that refers to one of them sees the change.  So the kernel
never replaces an item: a module's parameters, buffers and gradients are
copied into its existing tensors (their identity, and an optimizer's hold on
them, kept), a tensor's values into it, an object's changed attributes set
on it, a container refilled (a set by what it lost and gained), a random
generator's state set.

Refused, atomically (before anything is written), where the engines' copies
could not have seen what a serial run sees: two iterations whose items are
one object, an item another item holds (one level: an attribute, an element)
or an input holds (or is), and an attribute the iteration replaced that is
shared with another item or an input.  torch is recognised, never imported.
"""

from __future__ import annotations

import bisect
import collections
import ctypes
import itertools
import sys
import types
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from gpucell.errors import NotParallelizable

__all__ = ["Target", "Update", "apply", "resolve"]

#: (iteration, path into its item, ("module" | "tensor" | "attrs", ...)): the
#: path's ints are a tuple item's parts, its ``("el", j)`` steps the j-th
#: element of a container (in the order the kernel's has before the merge)
Update = tuple[int, tuple[Any, ...], tuple[Any, ...]]

#: elements of a container looked at for references, at most
_CHILDREN_MAX = 100_000


@dataclass
class Target:
    """One kernel object and what to write into it."""

    iteration: int
    obj: Any
    update: tuple[Any, ...]
    path: tuple[Any, ...] = ()

    @property
    def label(self) -> str:
        what = f"(a {type(self.obj).__name__})"
        last = self.path[-1] if self.path else None
        if isinstance(last, tuple) and last[0] == "attr":
            return (
                f"the attribute `{self.path[-1][1]}` {what} of the item of "
                f"iteration {self.iteration}"
            )
        if self.path and self.path[-1] == _SELF:
            return f"the object of the item of iteration {self.iteration} {what}"
        if any(isinstance(j, tuple) for j in self.path):
            return f"an element {what} of the item of iteration {self.iteration}"
        return f"the item of iteration {self.iteration} {what}"

    def within(self, other: Target) -> bool:
        """Whether this is an element (at any depth) of ``other``'s object,
        written back with it: the one item holds it, as the engine's did."""
        n = len(other.path)
        return (
            self.iteration == other.iteration
            and len(self.path) > n
            and self.path[:n] == other.path
        )


def _children(value: Any) -> Iterator[Any]:
    """What ``value`` holds one level down: elements, dict values, instance
    attributes."""
    if isinstance(value, (list, tuple, set, frozenset, collections.deque)):
        items: Any = value
    elif _bit_generator(value) is not None:
        items = [_bit_generator(value)]
    elif isinstance(value, dict):
        items = value.values()
    elif not isinstance(value, (type, types.ModuleType)) and isinstance(
        getattr(value, "__dict__", None), dict
    ):
        items = vars(value).values()
    else:
        return
    attrs = getattr(value, "__dict__", None)
    if isinstance(value, (list, tuple, set, frozenset, dict)) and isinstance(
        attrs, dict
    ):  # a subclass of a container: its attributes too (`Batch(list).log`)
        items = itertools.chain(items, list(attrs.values()))
    for n, x in enumerate(items):
        if n >= _CHILDREN_MAX:
            return
        yield x


def _mutable(v: Any) -> bool:
    return not isinstance(
        v,
        (type(None), bool, int, float, complex, str, bytes, range, tuple, type)
        + (types.ModuleType, types.FunctionType, types.BuiltinFunctionType),
    )


def resolve(
    updates: Sequence[Update],
    item_of: Callable[[int], Any],
    inputs: Mapping[str, Any],
    count: int | None = None,
) -> list[Target]:
    """The kernel's objects the updates go to, checked; raises
    ``NotParallelizable`` (nothing written) where a serial run could differ.
    ``count``: the loop's iterations, whose every item is looked at (an item
    no iteration changed may still be, or hold, or share memory with, one
    that another iteration changed)."""
    targets: list[Target] = []
    owner: dict[int, int] = {}
    at: set[tuple[int, tuple[Any, ...]]] = set()
    done: set[tuple[int, int]] = set()
    for iteration, path, update in sorted(updates, key=_order):
        at.add((iteration, tuple(path)))
        obj = _at(item_of(iteration), path, iteration)
        other = owner.setdefault(id(obj), iteration)
        if other != iteration:
            _one_object(other, iteration, obj, len(path) > 0 and _is_el(path[-1]))
        if (iteration, id(obj)) in done:
            continue  # one object reached twice in one item: one update
        done.add((iteration, id(obj)))
        again = _at(item_of(iteration), path, iteration)
        if again is not obj and (_span(obj) is None or _span(again) != _span(obj)):
            _made_anew(iteration, obj)
        update = _as_slots(obj, update)
        _check_shape(obj, update, iteration)
        targets.append(Target(iteration, obj, update, tuple(path)))
    changed = {id(t.obj): t for t in targets}
    others: list[tuple[str, Any]] = []
    for i in range(count or 0):
        for path, leaf in _leaves(item_of(i)):
            if (i, path) in at:
                continue  # (the changed leaf itself, a view made anew maybe)
            hit = changed.get(id(leaf))
            if hit is not None and hit.iteration != i:
                _one_object(min(i, hit.iteration), max(i, hit.iteration), leaf)
            if hit is None:
                others.append((f"the item of iteration {i}", leaf))
    _check_module_parts(targets, inputs, others)
    _check_reach(targets, inputs, others)
    _check_memory(targets, inputs, others)
    return targets


#: the step from a bound method item to its object
_SELF = ("self", 0)


def _order(u: Update) -> tuple[int, list[tuple[Any, ...]]]:
    """Iteration, then path: parts, then elements and attributes (an item's
    own update before theirs)."""
    return u[0], [(0, j) if isinstance(j, int) else (1, *map(repr, j)) for j in u[1]]


def _at(item: Any, path: Sequence[Any], iteration: int) -> Any:
    """The object ``path`` names in an item (see ``Update``)."""
    obj = item
    try:
        for j in path:
            if isinstance(j, int):
                obj = obj[j]
            elif j == _SELF:
                obj = obj.__self__
            elif j[0] == "attr":
                obj = getattr(obj, j[1])
            elif isinstance(obj, dict):
                obj = list(obj.values())[j[1]]
            else:
                obj = list(obj)[j[1]]
    except (IndexError, KeyError, TypeError, AttributeError):
        raise NotParallelizable(
            f"gpucell: the item of iteration {iteration} changed in place and "
            "cannot be written back: an element the engine changed is not in "
            "the kernel's item. Nothing was merged. Run the cell serially."
        ) from None
    return obj


def _module_parts(obj: Any) -> list[tuple[str, Any]]:
    """A torch module's submodules, parameters and buffers, by name, or a
    numpy generator's bit generator: what its write-back writes into, which
    another item may hold too (a shared encoder, a tied weight, two
    ``Generator``s of one bit generator)."""
    bits = _bit_generator(obj)
    if bits is not None:
        return [("bit generator", bits)]
    if not callable(getattr(obj, "named_modules", None)):
        return []
    try:
        return [
            *((f"submodule `{n}`", m) for n, m in obj.named_modules() if n),
            *((f"parameter `{n}`", p) for n, p in obj.named_parameters()),
            *((f"buffer `{n}`", b) for n, b in obj.named_buffers() if b is not None),
        ]
    except Exception:
        return []


def _check_module_parts(
    targets: list[Target],
    inputs: Mapping[str, Any],
    others: Sequence[tuple[str, Any]],
) -> None:
    """No two changed modules may share a part, and no input or other item may
    be or hold one: serially the change (a step, an accumulated gradient, a
    running statistic) is made to the one shared object and seen by all of its
    holders; each engine changed its own copy, and the last write-back would
    win."""
    parts: dict[int, tuple[Target, str]] = {}
    for t in targets:
        for what, x in _module_parts(t.obj):
            prior = parts.setdefault(id(x), (t, what))
            if prior[0].obj is not t.obj:
                raise NotParallelizable(
                    f"gpucell: {prior[0].label} and {t.label} share one object "
                    f"(its {prior[1]}, their {what}), and both changed it in "
                    "place: serially each iteration's change would be made to "
                    "that one object and seen by the other; each engine changed "
                    "its own copy. Nothing was merged. Give each item its own "
                    f"{_own(what)} (`copy.deepcopy`), or run the cell serially."
                )
    if not parts:
        return
    budget = [_REACH_MAX]
    looked = [(_input_label(n, v), v) for n, v in inputs.items()] + list(others)
    for holder, value in looked:
        for x in _reachable(value, budget):
            hit = parts.get(id(x))
            if hit is not None:
                t, what = hit
                raise NotParallelizable(
                    f"gpucell: {t.label} changed in place, and {holder} is or "
                    f"holds its {what}: serially the change would be seen there "
                    "too; each engine changed its own copy. Nothing was merged. "
                    f"Give each item its own {_own(what)} (`copy.deepcopy`), or "
                    "run the cell serially."
                )


def _own(part: str) -> str:
    if part == "bit generator":
        return "generator (`np.random.default_rng(seed)` for each)"
    return "modules and parameters"


def _as_slots(obj: Any, update: tuple[Any, ...]) -> tuple[Any, ...]:
    """An object with ``__slots__`` whose engine copy had a ``__dict__`` (a
    notebook class rebuilt by cloudpickle keeps no slots): its attributes are
    set as slots, where they all are some."""
    if update[0] != "attrs" or isinstance(getattr(obj, "__dict__", None), dict):
        return update
    slots: set[str] = set()
    for cls in type(obj).__mro__:
        names = vars(cls).get("__slots__", ())
        slots |= {names} if isinstance(names, str) else set(names)
    if set(update[1]) | set(update[2]) <= slots:
        return ("slots", *update[1:])
    return update


def _leaves(item: Any, depth: int = 0) -> Iterator[tuple[tuple[Any, ...], Any]]:
    """An item's parts as ``engine/checkout`` splits it (a tuple, 2 levels;
    a bound method by its object)."""
    if type(item) is tuple and depth < 2:
        for j, x in enumerate(item):
            for path, leaf in _leaves(x, depth + 1):
                yield (j, *path), leaf
    elif type(item) is types.MethodType and not isinstance(
        item.__self__, (type, types.ModuleType)
    ):
        yield (_SELF,), item.__self__
    else:
        yield (), item


def _made_anew(iteration: int, obj: Any) -> None:
    """Items made anew each time the data is read (``df.iterrows()``'s rows,
    a generator's objects): serially the change is to a temporary only the
    loop variable still holds after the loop; the kernel's is another one."""
    raise NotParallelizable(
        f"gpucell: the item of iteration {iteration} (a {type(obj).__name__}) "
        "changed in place, but the loop's data makes its items anew each time "
        "it is read (like `df.iterrows()`'s rows, copies): the change could not "
        "reach the object the loop variable holds after a serial run. Nothing "
        "was merged. Collect the changed values (`rows.append(...)`, `df.loc[i, "
        "c] = ...`) instead."
    )


def _is_el(step: Any) -> bool:
    return isinstance(step, tuple)


def _one_object(first: int, second: int, obj: Any, element: bool = False) -> None:
    what = "hold one object" if element else "are one object"
    raise NotParallelizable(
        f"gpucell: the items of iterations {first} and {second} {what} "
        f"(a {type(obj).__name__}) and the loop changes it: serially "
        "the second iteration would see the first one's change, each engine "
        "changed its own copy. Nothing was merged. Make the items distinct "
        "objects (`[make() for _ in range(n)]`, not `[m] * n`)."
    )


def _check_shape(obj: Any, update: tuple[Any, ...], iteration: int) -> None:
    """The update fits the kernel's object (else the item is not what the
    engine had: refuse rather than write half of it)."""
    kind = update[0]
    problem = ""
    if kind == "module":
        params = dict(obj.named_parameters())
        if params.keys() != update[1]["params"].keys():
            problem = "its parameters are not the ones the engine's copy has"
        elif any(
            tuple(params[n].shape) != tuple(q.shape)
            for n, q in update[1]["params"].items()
        ):
            problem = "a parameter changed shape"
        else:
            buffers = {n for n, b in obj.named_buffers() if b is not None}
            if buffers != update[1]["buffers"].keys():
                problem = "its buffers are not the ones the engine's copy has"
    elif kind == "tensor":
        if tuple(obj.shape) != tuple(update[1].shape) or obj.dtype != update[1].dtype:
            problem = "its shape or dtype changed"
    elif kind == "array":
        new = update[1]
        if type(obj).__name__ != "ndarray" or obj.shape != new.shape:
            problem = "its shape changed, or it is not the array the engine had"
        elif obj.dtype != new.dtype:
            problem = "its dtype changed"
        elif not obj.flags.writeable:
            problem = "the kernel's array is read-only"
    elif kind in ("dict", "list", "deque"):
        if kind == "dict" and not (
            isinstance(obj, dict) and list(obj.keys()) == update[1]
        ):
            problem = "its keys are not the ones the engine's copy had"
        elif kind != "dict" and not (
            isinstance(obj, list if kind == "list" else collections.deque)
            and len(obj) == update[1]
        ):
            problem = "its length is not the engine copy's"
        elif len(update) > 3 and not isinstance(getattr(obj, "__dict__", None), dict):
            problem = "it has no attributes to set"
    elif kind in ("set", "bytes", "random", "rng"):
        problem = _check_state(obj, update)
    elif kind == "torchstate":
        problem = _check_torch_state(obj, update[1])
    elif kind == "iterator":
        problem = _check_iterator(obj, update)
    elif kind == "frame":
        if type(obj) is not type(update[1]) or not hasattr(obj, "_update_inplace"):
            problem = "it is not the frame the engine had"
        elif getattr(obj, "_cacher", None) is not None:
            # (pandas < 3: `df[c]`, a column its frame caches: serially an
            # in-place change writes into the frame, a new state would not)
            problem = "it is a column its frame holds (`df[c]`)"
    elif kind == "slots":
        if isinstance(getattr(obj, "__dict__", None), dict):
            problem = "it is not the object the engine had"
    elif not isinstance(getattr(obj, "__dict__", None), dict):
        problem = "it has no attributes to set"
    if problem:
        raise NotParallelizable(
            f"gpucell: the item of iteration {iteration} (a {type(obj).__name__}) "
            f"changed in place and cannot be written back: {problem}. Nothing was "
            "merged. Build the object inside the loop and collect it "
            "(`results.append(m)`), or run the cell serially."
        )


def _check_state(obj: Any, update: tuple[Any, ...]) -> str:
    """Why a set, bytearray or generator cannot take the engine's change."""
    kind = update[0]
    if kind == "set":
        if type(obj) is not set:
            return "it is not the set the engine had"
        try:
            lost = [v for v in update[1] or () if v not in obj]
        except TypeError:
            lost = list(update[1])
        if lost:
            # an object compared by identity: the engine's is a copy
            return (
                f"an element it removed (a {type(lost[0]).__name__}) is not in "
                "the kernel's set by value"
            )
    elif kind == "bytes":
        if type(obj) is not bytearray:
            return "it is not the bytearray the engine had"
        if len(obj) != len(update[1]) and not _resizable(obj):
            return (
                "its length changed, and a view of it (a memoryview, an "
                "array) holds its memory"
            )
    elif kind == "random":
        if type(obj).__name__ != "Random" or not hasattr(obj, "setstate"):
            return "it is not the generator the engine had"
    elif _bit_generator(obj) is None or (
        type(_bit_generator(obj)).__name__ != update[1].get("bit_generator")
    ):
        return "its bit generator is not the one the engine's copy had"
    return ""


def _check_iterator(obj: Any, update: tuple[Any, ...]) -> str:
    """A sequence iterator takes the engine's position where it is the same
    kind, over a sequence as long as the engine's copy's was."""
    _kind, name, length, _position = update
    if type(obj).__name__ != name or not callable(getattr(obj, "__setstate__", None)):
        return "it is not the iterator the engine had"
    reduced = obj.__reduce__()
    if len(reduced) < 3:
        return "the kernel's iterator is used up"
    if length >= 0 and len(reduced[1][0]) != length:
        return "its sequence is not as long as the engine copy's"
    return ""


def _seek(it: Any, position: int | None) -> None:
    """A sequence iterator to ``position``, or used up (``None``)."""
    if position is not None:
        it.__setstate__(position)
        return
    # past the end (the setters clamp: -1 for a reversed one), then one step
    # that finds nothing, as a used-up iterator has taken
    it.__setstate__(-1 if "reverse" in type(it).__name__ else sys.maxsize)
    next(it, None)


def _check_torch_state(obj: Any, state: Mapping[str, Any]) -> str:
    """An optimizer's groups must hold as many parameters as the engine's
    (``load_state_dict`` would raise half-way through the merge)."""
    if not callable(getattr(obj, "load_state_dict", None)):
        return "it has no state to load"
    groups = state.get("param_groups")
    if groups is None:
        return ""
    mine = getattr(obj, "param_groups", None)
    if not isinstance(mine, list) or [len(g["params"]) for g in mine] != [
        len(g["params"]) for g in groups
    ]:
        return "its parameter groups are not the engine copy's"
    return ""


def _resizable(b: bytearray) -> bool:
    """Whether no buffer (a memoryview, a numpy array) holds a bytearray's
    memory: resizing it would raise there (grown by one and shrunk back, or
    not at all)."""
    try:
        b.append(0)
    except BufferError:
        return False
    b.pop()
    return True


def _bit_generator(obj: Any) -> Any:
    """A numpy ``Generator``'s or ``RandomState``'s bit generator (what two
    generators may share), or ``None``."""
    name = type(obj).__name__
    if name == "Generator" and type(obj).__module__.startswith("numpy"):
        return getattr(obj, "bit_generator", None)
    if name == "RandomState" and type(obj).__module__.startswith("numpy"):
        return getattr(obj, "_bit_generator", None)
    return None


#: objects looked at (through containers and attributes) when checking who
#: holds a changed item, at most: past it the check refuses, never guesses
_REACH_MAX = 2_000_000


def _code_names(code: types.CodeType) -> set[str]:
    names = set(code.co_names)
    for const in code.co_consts:
        if isinstance(const, types.CodeType):
            names |= _code_names(const)
    return names


def _uses(fn: Any) -> list[Any]:
    """What a notebook function reads when called: the globals its code
    names, its closure, its defaults (a helper reading `P` while the loop
    changes `P`'s rows is reading an input)."""
    if isinstance(fn, types.MethodType):
        return [fn.__self__, *_uses(fn.__func__)]
    if not isinstance(fn, types.FunctionType) or fn.__module__ != "__main__":
        return []
    g = fn.__globals__
    out = [g[n] for n in sorted(_code_names(fn.__code__)) if n in g]
    for cell in fn.__closure__ or ():
        try:
            out.append(cell.cell_contents)
        except ValueError:  # an empty cell
            pass
    return out + list(fn.__defaults__ or ())


def _reachable(
    value: Any, budget: list[int], depth: int = 3, seen: set[int] | None = None
) -> Iterator[Any]:
    """``value`` and what it holds, ``depth`` levels down (elements, dict
    values, instance attributes; a notebook function's globals and closure,
    each function once); arrays, tensors and frames are leaves."""
    yield value
    seen = set() if seen is None else seen
    if isinstance(value, (types.FunctionType, types.MethodType)):
        if id(value) not in seen:
            seen.add(id(value))
            for x in _uses(value):
                budget[0] -= 1
                yield from _reachable(x, budget, max(depth, 1), seen)
        return
    if depth <= 0 or not _mutable(value):
        return
    for x in _children(value):
        budget[0] -= 1
        if budget[0] < 0:
            raise NotParallelizable(
                "gpucell: the loop changed its own items, and the objects the "
                "loop reads are too many to check that none of them holds an "
                "item (a serial run would see the change through it). Nothing "
                "was merged. Run the cell serially."
            )
        if _mutable(x) or isinstance(x, types.FunctionType):
            yield from _reachable(x, budget, depth - 1, seen)


def _attrs_old(t: Target) -> dict[str, Any]:
    """A changed object's attributes as the kernel holds them (before)."""
    kind = t.update[0]
    if kind == "attrs":
        return dict(vars(t.obj))
    if kind == "slots":
        return {n: getattr(t.obj, n) for n in t.update[1] if hasattr(t.obj, n)}
    if kind == "module":
        return {
            n: getattr(t.obj, n) for n in t.update[1]["attrs"][0] if n in vars(t.obj)
        }
    if kind in ("dict", "list") and len(t.update) > 3:
        return dict(vars(t.obj))
    return {}


def _inplace(t: Target) -> list[str]:
    kind = t.update[0]
    if kind in ("attrs", "slots"):
        return list(t.update[3])
    if kind == "module":
        return list(t.update[1]["attrs"][2])
    if kind in ("dict", "list") and len(t.update) > 3:
        return list(t.update[3][2])
    return []


def _input_label(name: str, value: Any) -> str:
    if isinstance(value, (types.FunctionType, types.MethodType)):
        return f"what `{name}` reads (its globals, closure or defaults)"
    return f"`{name}`"


def _check_reach(
    targets: list[Target],
    inputs: Mapping[str, Any],
    others: Sequence[tuple[str, Any]] = (),
) -> None:
    """No input and no other item may be or hold a changed item, nor a mutable
    attribute the iteration replaced (serially other iterations would see the
    change through it)."""
    changed = {id(t.obj): t for t in targets}
    # attributes changed in place (not rebound): serially the change is in
    # the attribute's object, which other holders see; here it is replaced
    replaced: dict[int, tuple[Target, str]] = {}
    for t in targets:
        old = _attrs_old(t)
        for n in _inplace(t):
            if n in old and _mutable(old[n]):
                replaced[id(old[n])] = (t, n)
    budget = [_REACH_MAX]
    looked: list[tuple[str, Target | None, Iterator[Any]]] = [
        (_input_label(n, v), None, _reachable(v, budget)) for n, v in inputs.items()
    ]
    looked += [(what, None, _reachable(v, budget)) for what, v in others]
    looked += [
        (
            t.label,
            t,
            (y for x in _children(t.obj) for y in _reachable(x, budget, 2)),
        )
        for t in targets
    ]
    for what, by, seen in looked:
        holder = None if by is None else by.obj
        first = True
        for x in seen:
            hit = changed.get(id(x))
            if hit is not None and by is not None and hit.within(by):
                continue  # its own element: written back with it
            if (
                hit is not None
                and by is not None
                and by.update[0] == "torchstate"
                and hit.iteration == by.iteration
            ):
                continue  # (a scheduler's optimizer: loaded, never replaced)
            if hit is not None and hit.obj is not holder:
                raise NotParallelizable(
                    f"gpucell: {hit.label} changed in place, and {what} "
                    f"{'is' if first and holder is None else 'holds'} it: "
                    "serially other "
                    "iterations would see the change through it, each engine "
                    "changed its own copy. Nothing was merged. Give each "
                    "iteration an object nothing else refers to."
                )
            first = False
            shared = replaced.get(id(x))
            if shared is not None and shared[0].obj is not holder:
                t, n = shared
                raise NotParallelizable(
                    f"gpucell: {t.label} changed its attribute `{n}`, which "
                    f"{what} holds too: serially the change would be seen "
                    "there as well. Nothing was merged. Give each item its own "
                    f"`{n}` (`copy.deepcopy`), or run the cell serially."
                )


def _span(x: Any) -> tuple[int, int] | None:
    """The bytes an array, tensor or bytearray covers in memory, ``[lo, hi)``."""
    try:
        if type(x) is bytearray:
            if not x:
                return None
            # (the ctypes view is an export only while it lives: here)
            ptr = ctypes.addressof((ctypes.c_char * len(x)).from_buffer(x))
            return ptr, ptr + len(x)
        if type(x).__name__ == "ndarray" and hasattr(x, "__array_interface__"):
            face = x.__array_interface__
            ptr, shape = face["data"][0], x.shape
            strides, size = x.strides, x.itemsize
        elif type(x).__name__ in ("Tensor", "Parameter") and hasattr(x, "data_ptr"):
            if str(x.layout) != "torch.strided":
                return None
            ptr, shape = x.data_ptr(), tuple(x.shape)
            size = x.element_size()
            strides = tuple(st * size for st in x.stride())
        else:
            return None
    except Exception:
        return None
    if any(n == 0 for n in shape):
        return None
    lo = ptr + sum(min(0, (n - 1) * st) for n, st in zip(shape, strides, strict=True))
    hi = ptr + sum(max(0, (n - 1) * st) for n, st in zip(shape, strides, strict=True))
    return lo, hi + size


def _check_memory(
    targets: list[Target],
    inputs: Mapping[str, Any],
    others: Sequence[tuple[str, Any]],
) -> None:
    """No other item and no input may share memory with a changed array or
    tensor (a view of it, or of what it is a view of: ``for row in P`` while
    the body reads ``P``); serially the change would be seen there."""
    spans = sorted(
        ((s, t) for t in targets if (s := _span(t.obj)) is not None),
        key=lambda st: st[0],
    )
    if not spans:
        return
    for (a, t), (b, u) in zip(spans, spans[1:], strict=False):
        if b[0] < a[1]:  # two changed windows overlap
            _shares(t, u.label)
    # disjoint and sorted: the first whose end is past a span's start is the
    # only one that could overlap it first
    ends = [hi for (_lo, hi), _t in spans]
    mine = {id(t.obj) for t in targets}
    budget = [_REACH_MAX]
    candidates = [(_input_label(n, v), v) for n, v in inputs.items()]
    candidates += list(others)
    for what, v in candidates:
        for x in _reachable(v, budget):
            span = _span(x) if id(x) not in mine else None
            if span is None:
                continue
            j = bisect.bisect_right(ends, span[0])
            if j < len(spans) and spans[j][0][0] < span[1]:
                _shares(spans[j][1], what)


def _shares(t: Target, what: str) -> None:
    raise NotParallelizable(
        f"gpucell: {t.label} changed in place, and {what} "
        "shares its memory (a view of it, or of the same "
        "array): serially other iterations would see the "
        "change there, each engine changed its own copy. "
        "Nothing was merged. Change a copy (`x = x.copy()`) "
        "and collect it, or run the cell serially."
    )


def apply(targets: Sequence[Target]) -> None:
    """Write every update into its kernel object, in iteration order."""
    for t in targets:
        kind, obj = t.update[0], t.obj
        if kind == "module":
            _module(obj, t.update[1])
        elif kind == "tensor":
            obj.data.copy_(t.update[1])
            _grad(obj, t.update[2])
            if obj.is_leaf and len(t.update) > 3:
                obj.requires_grad_(t.update[3])
        elif kind == "array":
            obj[...] = t.update[1]
        elif kind == "frame":
            obj._update_inplace(t.update[1])
        elif kind in ("dict", "list", "deque"):
            _container(obj, kind, t.update[2])
            if len(t.update) > 3:  # a subclass's attributes (set, deleted)
                state = vars(obj)
                for n in t.update[3][1]:
                    state.pop(n, None)
                state.update(t.update[3][0])
        elif kind == "set" and t.update[1] is None:  # (plain values: those)
            obj.intersection_update(t.update[2])
            obj.update(t.update[2])
        elif kind == "set":
            obj.difference_update(t.update[1])
            obj.update(t.update[2])
        elif kind == "bytes":
            obj[:] = t.update[1]
        elif kind == "random":
            obj.setstate(t.update[1])
        elif kind == "iterator":
            _seek(obj, t.update[3])
        elif kind == "torchstate":  # by position: the kernel's own parameters
            obj.load_state_dict(t.update[1])
        elif kind == "rng":
            if type(obj).__name__ == "Generator":
                obj.bit_generator.state = t.update[1]
            else:
                obj.set_state(t.update[1])
        elif kind == "slots":
            for n in t.update[2]:
                if hasattr(obj, n):
                    delattr(obj, n)
            for n, v in t.update[1].items():
                setattr(obj, n, v)
        else:
            state = vars(obj)
            for n in t.update[2]:
                state.pop(n, None)
            state.update(t.update[1])


def _container(obj: Any, kind: str, entries: Sequence[tuple[Any, str, Any]]) -> None:
    """A dict's or list's new elements: an old one by its position (the
    kernel's own object, identity kept), or a new value."""
    old = list(obj.values()) if kind == "dict" else list(obj)
    values = [old[v] if tag == "old" else v for _k, tag, v in entries]
    if kind == "dict":
        # stored key by key: what every mapping means by a store (not
        # ``update``: a Counter's adds counts; nor dict's own methods: an
        # OrderedDict keeps its order beside them)
        obj.clear()
        for (k, _t, _v), v in zip(entries, values, strict=True):
            obj[k] = v
    elif kind == "deque":  # (its maxlen kept: the values fit, as the engine's)
        obj.clear()
        obj.extend(values)
    else:
        obj[:] = values


def _grad(p: Any, g: Any) -> None:
    if not getattr(p, "is_leaf", False):
        return
    if g is None:
        p.grad = None
    elif p.grad is not None and tuple(p.grad.shape) == tuple(g.shape):
        p.grad.copy_(g)
    else:
        p.grad = g.to(device=p.device, dtype=p.dtype)


def _module(m: Any, state: Mapping[str, Any]) -> None:
    for n, p in m.named_parameters():
        p.data.copy_(state["params"][n])
        _grad(p, state["grads"][n])
    for n, p in m.named_parameters():
        flag = state.get("requires_grad", {}).get(n)
        if flag is not None and p.is_leaf:
            p.requires_grad_(flag)
    for n, b in m.named_buffers():
        if b is not None and n in state["buffers"]:
            b.data.copy_(state["buffers"][n])
    training = state["training"]
    for n, sub in m.named_modules():
        if n in training:
            sub.training = training[n]
    if "attrs" in state:
        set_, gone, _inplace = state["attrs"]
        for n in gone:
            if n in vars(m):
                delattr(m, n)
        for n, v in set_.items():
            setattr(m, n, v)
