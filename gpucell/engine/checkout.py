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

This module takes each leaf's state before the chunk and says what changed
after it; ``checkout_kinds`` says what a leaf is, ``checkout_state`` what its
state is, ``checkout_updates`` what to send for a changed one.  Standard
library only.
"""

from __future__ import annotations

import collections
import types
from collections.abc import Hashable, Iterable, Iterator
from typing import Any

from gpucell.engine import checkin
from gpucell.engine.checkout_kinds import VALUES, kind_of
from gpucell.engine.checkout_state import (
    LISTS,
    describe_path,
    item_parts,
    notebook_class_state,
    same_state,
    state_of,
)
from gpucell.engine.checkout_updates import leaf_update, torch_state_why
from gpucell.protocol.fold import is_numpy

__all__ = ["ItemsBefore", "before", "changes"]

#: (iteration, path into the item) -> (kind, token, its notebook class's
#: state): kind "module", "tensor", "object" (token: attribute -> token) or ""
#: (a part that cannot be written)
ItemsBefore = dict[tuple[int, tuple[int, ...]], tuple[str, Any, Hashable]]


def before(items: Iterable[Any], start: int) -> ItemsBefore:
    """The state of every leaf of the chunk's items, before it runs."""
    out: ItemsBefore = {}
    classes: dict[int, Hashable] = {}
    for k, item in enumerate(items):
        for path, leaf in item_parts(item):
            kind = kind_of(leaf)
            out[(start + k, path)] = (
                kind,
                state_of(kind, leaf),
                notebook_class_state(leaf, classes),
            )
    return out


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
                    f"the item of iteration {iteration}{describe_path(path)} now holds "
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
        value, (*VALUES, type, types.ModuleType, types.FunctionType)
    ):
        return
    if is_numpy(value) or checkin._is_tensor(value) or kind_of(value) == "frame":
        return
    if depth >= 0:
        yield value
    if depth >= 2:
        return
    if isinstance(value, dict):
        parts: Iterable[Any] = value.values()
    elif isinstance(value, (list, tuple, set, frozenset, collections.deque)):
        if value and isinstance(next(iter(value)), VALUES) and len(value) > 64:
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
        for path, leaf in item_parts(item):
            key = (start + k, path)
            kind, then, shared = was.get(key, ("", None, None))
            where = f"the item of iteration {start + k}" + describe_path(path)
            if not checkin._same(shared, notebook_class_state(leaf, classes)):
                cannot.append(
                    f"{where}, a {type(leaf).__name__}: an attribute of its class "
                    f"`{type(leaf).__qualname__}` changed (every instance "
                    "shares it: serially later iterations would see the change)"
                )
                continue
            now_kind = kind_of(leaf)
            # (its containers followed where they were before the chunk)
            entries = then[0] if kind in ("udict", "ulist") else then
            was_subs = (
                {e[1]: e[4] for e in entries if e[4] is not None}
                if now_kind == kind and kind in (*LISTS, "udict", "ulist")
                else {}
            )
            now = state_of(now_kind, leaf, 0, None, was_subs)
            if now_kind == kind and same_state(kind, then, now):
                continue
            if kind != now_kind or kind == "":
                what = checkin.logger_why(then, now) or "changed in place"
                cannot.append(f"{where}, a {type(leaf).__name__}, {what}")
                continue
            why = torch_state_why(kind, leaf, item)
            ups, why = ([], why) if why else leaf_update(kind, leaf, then, now)
            if why:
                cannot.append(f"{where}, a {type(leaf).__name__}: {why}")
            else:
                updates += [(start + k, (*path, *sub), u) for sub, u in ups]
    return updates, cannot
