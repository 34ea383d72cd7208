"""Folding reduction contributions: the arithmetic both sides share.

Engines fold each chunk's contributions into one partial (``own`` the first,
``fold`` the rest); the kernel combines the chunks' partials in chunk order with
the same two functions (:func:`combine`), so a reduction means the same thing
wherever it is folded.  Standard library only; numpy and torch values are
recognised by their type's module, never imported.
"""

from __future__ import annotations

import copy
import operator
from collections.abc import Callable, Sequence
from typing import Any

__all__ = [
    "BINARY",
    "SELECTS",
    "combine",
    "fold",
    "is_numpy",
    "is_torch",
    "own",
    "unordered",
]

#: reduction operator -> the binary function serial code applies
BINARY: dict[str, Callable[[Any, Any], Any]] = {
    "+": operator.add,
    "-": operator.sub,
    "*": operator.mul,
    "|": operator.or_,
    "&": operator.and_,
    "^": operator.xor,
    "@": operator.matmul,
    "max": max,
    "min": min,
}

#: the operators whose result is one of the contributions, kept by identity
#: (no in-place form): the one place they are named (core/reducers.py reads it)
SELECTS: frozenset[str] = frozenset({"max", "min"})


def _module(value: Any) -> str:
    return type(value).__module__ or ""


def is_numpy(value: Any) -> bool:
    """A numpy array or scalar instance: never a class (``np.dtype`` and the
    dtype classes have a numpy metaclass) nor a dtype (it has ``shape`` and
    ``flags`` too, as attributes of another meaning)."""
    if isinstance(value, type) or not _module(value).startswith("numpy"):
        return False
    return any(
        c.__name__ in ("ndarray", "generic") and c.__module__ == "numpy"
        for c in type(value).__mro__
    )


def is_torch(value: Any) -> bool:
    """A tensor instance (``torch.Tensor`` itself is made by a metaclass of
    ``torch._C``, so its type's module says torch too)."""
    return (
        not isinstance(value, type)
        and _module(value).startswith("torch")
        and hasattr(value, "data_ptr")
        and hasattr(value, "_version")  # (a storage has data_ptr too)
    )


def unordered(value: Any) -> bool:
    """A value that is not equal to itself (a float, numpy or torch nan): no
    ``max``/``min`` comparison with it is ever true."""
    try:
        return bool(value != value)
    except Exception:  # (an array of several items has no single truth)
        return False


def own(op: str, value: Any) -> Any:
    """A private copy of a first contribution, so later in-place code cannot change it.

    ``max``/``min`` keep the object itself (serial code keeps a reference to it).
    """
    if op in SELECTS:
        return value
    if isinstance(value, list):
        return list(value)
    if isinstance(value, set):
        return set(value)
    if isinstance(value, dict):
        return copy.copy(value)
    if is_numpy(value):
        return value.copy()
    if is_torch(value):
        return value.clone()
    return value


def fold(op: str, acc: Any, value: Any) -> Any:
    """Fold one more contribution into a partial that this code owns.

    ``-`` contributions are added (united for sets): the total is subtracted once.
    Owned lists and sets grow in place (``+=`` accepts any iterable, as serial
    ``L += t`` does); everything else is computed out of place.
    """
    if op in ("+", "-") and isinstance(acc, list):
        acc += value
        return acc
    if op == "-":
        return acc | value if isinstance(acc, (set, frozenset)) else acc + value
    if op == "|" and isinstance(acc, set):
        acc |= value
        return acc
    return BINARY[op](acc, value)


def combine(op: str, partials: Sequence[Any]) -> Any:
    """Combine chunk partials in chunk order (associativity only)."""
    it = iter(partials)
    acc = own(op, next(it))
    for p in it:
        acc = fold(op, acc, p)
    return acc
