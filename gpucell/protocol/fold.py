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
from typing import Any, NamedTuple

__all__ = [
    "BINARY",
    "INPLACE",
    "InOrder",
    "NATIVE",
    "OPS",
    "Op",
    "SELECTS",
    "combine",
    "fold",
    "is_numpy",
    "is_torch",
    "own",
    "own_in_order",
    "replay",
    "unordered",
]


class Op(NamedTuple):
    """One reduction operator: the reducer table's row (core/reducers.py reads
    it for the analysis, the merge for its in-place form)."""

    op: str  # as the plan names it: "+", "max"
    binary: Callable[[Any, Any], Any]  # what serial code applies
    inplace: str | None  # ``acc op= e``'s method (None: no in-place form)
    ast_op: str | None  # the ``ast`` operator class's name (None: a call)
    native: bool  # an engine folds the partial with the operator itself


#: the reduction operators, one row each: adding one is a row here (and, if
#: ``native``, its in-place method on engine/recorder._Start: a test checks)
OPS: dict[str, Op] = {
    o.op: o
    for o in (
        Op("+", operator.add, "__iadd__", "Add", True),
        Op("-", operator.sub, "__isub__", "Sub", False),
        Op("*", operator.mul, "__imul__", "Mult", True),
        Op("|", operator.or_, "__ior__", "BitOr", True),
        Op("&", operator.and_, "__iand__", "BitAnd", True),
        Op("^", operator.xor, "__ixor__", "BitXor", True),
        Op("@", operator.matmul, "__imatmul__", "MatMult", False),
        # the result is one of the contributions, kept by identity
        Op("max", max, None, None, False),
        Op("min", min, None, None, False),
    )
}

#: reduction operator -> the binary function serial code applies
BINARY: dict[str, Callable[[Any, Any], Any]] = {o.op: o.binary for o in OPS.values()}

#: reduction operator -> (its in-place method, the function that calls it)
INPLACE: dict[str, tuple[str, Callable[[Any, Any], Any]]] = {
    o.op: (o.inplace, getattr(operator, o.inplace))
    for o in OPS.values()
    if o.inplace is not None
}

#: the operators whose result is one of the contributions, kept by identity
#: (no in-place form, no operator: a call of the builtin of that name)
SELECTS: frozenset[str] = frozenset(
    o.op for o in OPS.values() if o.inplace is None and o.ast_op is None
)

#: the operators whose partial an engine folds with the operator itself
#: (``p op= e``), not by a recorder call
NATIVE: frozenset[str] = frozenset(o.op for o in OPS.values() if o.native)


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


#: operators whose floating-point results depend on the order of the operands
_NOT_ASSOCIATIVE_IN_FLOATS = frozenset({"+", "-", "*"})


def _float_scalar(value: Any) -> bool:
    """A Python or numpy floating or complex scalar (not an array: a float
    array's contributions stay a partial, element by element)."""
    if type(value) in (float, complex):
        return True
    return (
        is_numpy(value)
        and type(value).__name__ != "ndarray"
        and getattr(getattr(value, "dtype", None), "kind", "") in ("f", "c")
    )


class InOrder:
    """A chunk's scalar float contributions to a reduction, kept one by one.

    Floating-point ``+``, ``-`` and ``*`` are not associative: a chunk
    partial ``(a + b) + c`` added to the kernel's ``v0`` is not serial code's
    ``((v0 + a) + b) + c`` (``[1e16, 1.0, ..., -1e16]`` sums to 0.0 serially
    and to 4.0 in two partials).  The kernel applies the contributions to the
    reduction's value one by one, in iteration order (:func:`replay`).  The
    engine appends with the operator itself (``p += e``), one list append an
    iteration."""

    __slots__ = ("values",)

    def __init__(self, values: list[Any]) -> None:
        self.values = values

    def _append(self, value: Any) -> InOrder:
        self.values.append(value)
        return self

    __iadd__ = __imul__ = __add__ = __mul__ = _append

    def __reduce__(self) -> tuple[Any, ...]:
        return (InOrder, (self.values,))

    def __repr__(self) -> str:
        return f"InOrder({len(self.values)} values)"


def own_in_order(op: str, value: Any) -> Any:
    """:func:`own`, except that a scalar float contribution to ``+``, ``-`` or
    ``*`` starts an :class:`InOrder` (plain reductions; keyed ones fold)."""
    if op in _NOT_ASSOCIATIVE_IN_FLOATS and _float_scalar(value):
        return InOrder([value])
    return own(op, value)


def replay(op: str, v0: Any, partials: Sequence[Any]) -> Any:
    """``v0`` with every chunk's contributions applied in iteration order, as
    serial code applies them (``-``: each subtracted in turn); a chunk's
    ordinary partial is applied whole."""
    apply = BINARY[op]
    acc = v0
    for p in partials:
        for v in p.values if isinstance(p, InOrder) else (p,):
            acc = apply(acc, v)
    return acc


def collapse(op: str, partial: Any) -> Any:
    """An :class:`InOrder` folded into an ordinary partial (where the value it
    goes to is not a scalar and takes the combined partial in place)."""
    if not isinstance(partial, InOrder):
        return partial
    values = partial.values
    acc = own(op, values[0])
    for v in values[1:]:
        acc = fold(op, acc, v)
    return acc


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
    it = iter(collapse(op, p) for p in partials)
    acc = own(op, next(it))
    for p in it:
        acc = fold(op, acc, p)
    return acc
