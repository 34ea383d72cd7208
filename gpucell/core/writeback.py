"""Own items written back: each iteration's changes to its own item, applied
to the kernel's object in place (the kernel's side of ``engine/checkout.py``).

Serially ``for m in models: m.fit(X, y)`` changes the objects in the list;
every other name that refers to one of them sees the change.  So the kernel
never replaces an item: a module's parameters, buffers and gradients are
copied into its existing tensors (their identity, and an optimizer's hold on
them, kept), a tensor's values into it, an object's changed attributes set
on it.

Refused, atomically (before anything is written), where the engines' copies
could not have seen what a serial run sees: two iterations whose items are
one object, an item another item holds (one level: an attribute, an element)
or an input holds (or is), and an attribute the iteration replaced that is
shared with another item or an input.  torch is recognised, never imported.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from gpucell.errors import NotParallelizable

__all__ = ["Target", "Update", "apply", "resolve"]

#: (iteration, path into its item, ("module" | "tensor" | "attrs", ...))
Update = tuple[int, tuple[int, ...], tuple[Any, ...]]

#: elements of a container looked at for references, at most
_CHILDREN_MAX = 100_000


@dataclass
class Target:
    """One kernel object and what to write into it."""

    iteration: int
    obj: Any
    update: tuple[Any, ...]

    @property
    def label(self) -> str:
        return f"the item of iteration {self.iteration} (a {type(self.obj).__name__})"


def _children(value: Any) -> Iterator[Any]:
    """What ``value`` holds one level down: elements, dict values, instance
    attributes."""
    if isinstance(value, (list, tuple, set, frozenset)):
        items: Any = value
    elif isinstance(value, dict):
        items = value.values()
    elif not isinstance(value, type) and isinstance(
        getattr(value, "__dict__", None), dict
    ):
        items = vars(value).values()
    else:
        return
    for n, x in enumerate(items):
        if n >= _CHILDREN_MAX:
            return
        yield x


def _mutable(v: Any) -> bool:
    return not isinstance(
        v, (type(None), bool, int, float, complex, str, bytes, range, tuple, type)
    )


def resolve(
    updates: Sequence[Update],
    item_of: Callable[[int], Any],
    inputs: Mapping[str, Any],
) -> list[Target]:
    """The kernel's objects the updates go to, checked; raises
    ``NotParallelizable`` (nothing written) where a serial run could differ."""
    targets: list[Target] = []
    owner: dict[int, int] = {}
    for iteration, path, update in sorted(updates, key=lambda u: (u[0], u[1])):
        obj = item_of(iteration)
        for j in path:
            obj = obj[j]
        other = owner.setdefault(id(obj), iteration)
        if other != iteration:
            raise NotParallelizable(
                f"gpucell: the items of iterations {other} and {iteration} are one "
                f"object (a {type(obj).__name__}) and the loop changes it: serially "
                "the second iteration would see the first one's change, each engine "
                "changed its own copy. Nothing was merged. Make the items distinct "
                "objects (`[make() for _ in range(n)]`, not `[m] * n`)."
            )
        _check_shape(obj, update, iteration)
        targets.append(Target(iteration, obj, update))
    _check_reach(targets, inputs)
    return targets


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
    elif not isinstance(getattr(obj, "__dict__", None), dict):
        problem = "it has no attributes to set"
    if problem:
        raise NotParallelizable(
            f"gpucell: the item of iteration {iteration} (a {type(obj).__name__}) "
            f"changed in place and cannot be written back: {problem}. Nothing was "
            "merged. Build the object inside the loop and collect it "
            "(`results.append(m)`), or run the cell serially."
        )


def _check_reach(targets: list[Target], inputs: Mapping[str, Any]) -> None:
    """No input and no other item may hold a changed item, nor a mutable
    attribute the iteration replaced (serially other iterations would see the
    change through it)."""
    changed = {id(t.obj): t for t in targets}
    # attributes changed in place (not rebound): serially the change is in
    # the attribute's object, which other holders see; here it is replaced
    replaced: dict[int, tuple[Target, str]] = {}
    for t in targets:
        if t.update[0] == "attrs":
            old = vars(t.obj)
            for n in t.update[3]:
                if n in old and _mutable(old[n]):
                    replaced[id(old[n])] = (t, n)
    # an input may not be or hold one; an item may hold only its own parts
    looked: list[tuple[str, Any, list[Any]]] = [
        (f"`{n}`", None, [v, *_children(v)]) for n, v in inputs.items()
    ]
    looked += [(t.label, t.obj, list(_children(t.obj))) for t in targets]
    for what, holder, seen in looked:
        for x in seen:
            hit = changed.get(id(x))
            if hit is not None and hit.obj is not holder:
                raise NotParallelizable(
                    f"gpucell: {hit.label} changed in place, and {what} "
                    f"{'is' if x is seen[0] and holder is None else 'holds'} it: "
                    "serially other "
                    "iterations would see the change through it, each engine "
                    "changed its own copy. Nothing was merged. Give each "
                    "iteration an object nothing else refers to."
                )
            shared = replaced.get(id(x))
            if shared is not None and shared[0].obj is not holder:
                t, n = shared
                raise NotParallelizable(
                    f"gpucell: {t.label} changed its attribute `{n}`, which "
                    f"{what} holds too: serially the change would be seen "
                    "there as well. Nothing was merged. Give each item its own "
                    f"`{n}` (`copy.deepcopy`), or run the cell serially."
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
        else:
            state = vars(obj)
            for n in t.update[2]:
                state.pop(n, None)
            state.update(t.update[1])


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
    for n, b in m.named_buffers():
        if b is not None and n in state["buffers"]:
            b.data.copy_(state["buffers"][n])
    training = state["training"]
    for n, sub in m.named_modules():
        if n in training:
            sub.training = training[n]
