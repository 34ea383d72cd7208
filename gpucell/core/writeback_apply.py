"""The write-back itself: each resolved update written into its kernel object
in place, in iteration order (a module's tensors copied into, a container
refilled, a generator's state set), so the object's identity, and every
other name's hold on it, is kept.  Runs in commit, on checked targets only.
"""

from __future__ import annotations

import sys
from collections.abc import Mapping, Sequence
from typing import Any

from gpucell.core.writeback_target import Target

__all__ = ["apply"]


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
        elif kind == "array":  # (its flag: made writable first, read-only last)
            flag = t.update[2] if len(t.update) > 2 else None
            if flag:
                obj.flags.writeable = True
            if len(t.update) < 4 or t.update[3]:
                obj[...] = t.update[1]
            if flag is False:
                obj.flags.writeable = False
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


def _seek(it: Any, position: int | None) -> None:
    """A sequence iterator to ``position``, or used up (``None``)."""
    if position is not None:
        it.__setstate__(position)
        return
    # past the end (the setters clamp: -1 for a reversed one), then one step
    # that finds nothing, as a used-up iterator has taken
    it.__setstate__(-1 if "reverse" in type(it).__name__ else sys.maxsize)
    next(it, None)
