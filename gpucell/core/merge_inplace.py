"""Reductions (``acc op= combined``) applied once, in place where serial code
changes the object (a numpy array, a torch tensor, a list, a set, a class with
an in-place operator), else rebound; and the checks that such a change, or a
store into an array, cannot fail in commit, which keyed reductions and
indexed writes share.  Pure: numpy and torch are recognised, imported only
when a value is one.
"""

from __future__ import annotations

import copy
import sys
from collections.abc import Callable, Sequence
from typing import Any

from gpucell.core.merge_base import Merging, Mutation
from gpucell.core.reducers import selects
from gpucell.protocol.fold import (
    BINARY,
    INPLACE,
    InOrder,
    combine,
    is_numpy,
    is_torch,
    replay,
)

__all__ = ["check_array_write", "changed_in_place", "merge_reductions", "plan_inplace"]


#: reduction operator -> (its in-place method, the function that calls it)
_INPLACE = INPLACE


def merge_reductions(m: Merging) -> None:
    """Reductions: the chunks' partials combined in chunk order, applied once."""
    up = m.up
    for red in m.plan.reductions:
        name, op = red.name, red.op
        partials = [r.reductions[name][1] for r in m.rs if name in r.reductions]
        if not partials:
            continue
        v0 = m.existing(name)
        if _scalar(v0) and any(isinstance(p, InOrder) for p in partials):
            # scalar floats: each contribution in iteration order, as serially
            up.assign[name] = replay(op, v0, partials)
            continue
        c = combine(op, partials)
        if selects(op):
            up.assign[name] = BINARY[op](v0, c)
        elif red.augmented:
            new, action = plan_inplace(name, v0, op, c)
            if new is v0 and changed_in_place(v0, op):
                m.claim(name, v0)
                up.mutations.append(Mutation(name, f"{op}=", action))
            up.assign[name] = new
        else:
            up.assign[name] = BINARY[op](v0, c)


def plan_inplace(name: str, v0: Any, op: str, c: Any) -> tuple[Any, Callable[[], Any]]:
    """Validate ``v0 op= c``; return (value to bind after commit, commit action).

    The action is ``None``-free: for immutable ``v0`` it just returns the new value
    computed here.
    """
    dunder, iop = _INPLACE[op]
    if _numpy_scalar(v0):
        # a numpy scalar (np.float32(0)) is immutable: `s += c` binds a new
        # scalar, as for a Python number (its `flags` say read-only)
        new = BINARY[op](v0, c)
        return new, lambda: new
    if is_numpy(v0):
        import numpy as np

        rt = np.result_type(v0, c)
        if not np.can_cast(rt, v0.dtype, casting="same_kind"):
            raise TypeError(
                f"cannot apply `{name} {op}= ...` in place: the combined result "
                f"has dtype {rt}, which cannot be cast to {name}'s dtype {v0.dtype}"
            )
        if op == "@":
            shape = np.shape(np.matmul(v0, c))
        else:
            shape = np.broadcast_shapes(v0.shape, np.shape(c))
        if tuple(shape) != tuple(v0.shape):
            raise ValueError(
                f"cannot apply `{name} {op}= ...` in place: result shape {shape} "
                f"differs from {name}'s shape {v0.shape}"
            )
        if not v0.flags.writeable:
            raise ValueError(f"`{name}` is a read-only array")
        return v0, lambda: iop(v0, c)
    if is_torch(v0) and hasattr(type(v0), dunder):
        import torch

        if is_torch(c) and c.device != v0.device:
            c = c.to(v0.device)
        trt = torch.result_type(v0, c)
        if not torch.can_cast(trt, v0.dtype):
            raise TypeError(
                f"cannot apply `{name} {op}= ...` in place: result type {trt} "
                f"cannot be cast to {v0.dtype}"
            )
        cshape = tuple(c.shape) if is_torch(c) else ()
        if _torch_broadcast_shape(tuple(v0.shape), cshape) != tuple(v0.shape):
            raise ValueError(f"cannot apply `{name} {op}= ...` in place: shape change")
        if v0.requires_grad and v0.is_leaf and torch.is_grad_enabled():
            raise RuntimeError(
                f"`{name}` is a leaf tensor that requires grad; in-place "
                f"`{op}=` is not allowed on it (serially it would fail too)"
            )
        return v0, lambda: iop(v0, c)
    if isinstance(v0, list) and op == "+":
        items = list(c)

        def extend() -> Any:
            v0.extend(items)
            return v0

        return v0, extend
    if hasattr(type(v0), dunder):
        # validate on an out-of-place computation (or a shallow copy)
        if isinstance(v0, (list, set, dict)):
            iop(copy.copy(v0), c)
        else:
            try:
                BINARY[op](v0, c)
            except TypeError:
                iop(copy.copy(v0), c)
        return v0, lambda: iop(v0, c)
    new = BINARY[op](v0, c)
    return new, lambda: new


def changed_in_place(v: Any, op: str) -> bool:
    """Does ``v op= c`` change ``v`` (the branches of :func:`plan_inplace`)?
    A number's result may be the same object (``0 - 0 is 0``) and two
    reductions may start from one cached ``0``: nothing is shared there."""
    return not _numpy_scalar(v) and (
        is_numpy(v)
        or (isinstance(v, list) and op == "+")
        or hasattr(type(v), _INPLACE[op][0])
    )


def check_array_write(target: Any, key: Any, value: Any) -> Any:
    """Validate ``target[key] = value`` for numpy/torch; return the converted value."""
    view = target[key]
    if is_numpy(target):
        import numpy as np

        if not target.flags.writeable:
            raise ValueError("assignment destination is read-only")
        conv = np.asarray(value, dtype=target.dtype)
        np.broadcast_to(conv, np.shape(view))
        return conv
    import torch

    tconv = torch.as_tensor(value, dtype=target.dtype, device=target.device)
    shape = tuple(view.shape)
    if _torch_broadcast_shape(tuple(tconv.shape), shape) != shape:
        raise ValueError(
            f"cannot write a value of shape {tuple(tconv.shape)} into {shape}"
        )
    if target.requires_grad and target.is_leaf and torch.is_grad_enabled():
        raise RuntimeError(
            "a leaf tensor that requires grad cannot be written in place"
        )
    return tconv


def _numpy_scalar(v: Any) -> bool:
    """A numpy scalar (``np.float32(0)``, ``np.int64(3)``): immutable."""
    np = sys.modules.get("numpy")
    return np is not None and isinstance(v, np.generic)


def _torch_broadcast_shape(*shapes: tuple[int, ...]) -> tuple[int, ...]:
    """``torch.broadcast_shapes`` as a tuple (torch leaves that function untyped)."""
    import torch

    broadcast: Callable[..., Sequence[int]] = torch.broadcast_shapes
    return tuple(broadcast(*shapes))


def _scalar(value: Any) -> bool:
    """A Python number or a numpy scalar: rebound by ``op=``, never changed."""
    return isinstance(value, (int, float, complex)) or _numpy_scalar(value)
