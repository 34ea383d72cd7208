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

This module finds the targets (``resolve``); beside it ``writeback_target``
(what a target is), ``writeback_fit`` (does the update fit it),
``writeback_reach`` (who else would see the change) and ``writeback_apply``
(the writes, in commit).
"""

from __future__ import annotations

import types
from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import Any

from gpucell.core.writeback_apply import apply
from gpucell.core.writeback_fit import check_shape
from gpucell.core.writeback_reach import (
    check_memory,
    check_module_parts,
    check_reach,
    memory_span,
)
from gpucell.core.writeback_target import SELF, Target, Update
from gpucell.errors import NotParallelizable

#: ``apply`` and the types are re-exported: callers use ``writeback.apply``
__all__ = ["Target", "Update", "apply", "resolve"]


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
        if again is not obj and (
            memory_span(obj) is None or memory_span(again) != memory_span(obj)
        ):
            _made_anew(iteration, obj)
        update = _as_slots(obj, update)
        check_shape(obj, update, iteration)
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
    check_module_parts(targets, inputs, others)
    check_reach(targets, inputs, others)
    check_memory(targets, inputs, others)
    return targets


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
            elif j == SELF:
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
        yield (SELF,), item.__self__
    else:
        yield (), item


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
