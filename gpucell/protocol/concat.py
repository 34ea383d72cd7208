"""Concatenations rebinding a name from before the loop: ``x = np.append(x,
e)``, ``x = np.vstack([x, row])``, ``x = torch.cat([x, t])``, ``df =
pd.concat([df, part])``.

Each iteration's call reads the value the previous one left, so engines cannot
run it.  They run everything else and record the call instead: the function,
a snapshot of its other arguments (serially the call copies them at once; a
later change to ``e`` must not reach the result) and where ``x`` goes among
them (:class:`ConcatCall`).  The kernel then makes the calls itself, in
iteration order, from ``x``'s value before the loop (:func:`replay`): the same
calls on the same values, so the result is the serial one, dtypes, index and
all.  Where every piece has ``x``'s own dtype, one concatenation of all the
pieces gives the same array as the chain (numpy and torch; pandas is always
chained), and is used instead of the quadratic chain.

Standard library only: numpy, torch and pandas are looked up in
``sys.modules``, never imported.
"""

from __future__ import annotations

import copy
import sys
from collections.abc import Mapping, Sequence
from typing import Any, NamedTuple

from gpucell.errors import add_note

__all__ = [
    "ATTRIBUTES",
    "BIND",
    "IF_NONE",
    "calls_of",
    "replay_recorded",
    "MODULES",
    "ConcatCall",
    "known_concatenation",
    "library_of",
    "read_now",
    "replay",
    "snapshot",
]

#: each library's concatenations, by name (matched by identity)
_FUNCTIONS: dict[str, tuple[str, ...]] = {
    "numpy": (
        "append",
        "concatenate",
        "vstack",
        "hstack",
        "row_stack",
        "column_stack",
        "dstack",
    ),
    "torch": (
        "cat",
        "concat",
        "concatenate",
        "vstack",
        "hstack",
        "row_stack",
        "column_stack",
        "dstack",
    ),
    "pandas": ("concat",),
}

#: ``<module>.<function>`` spellings the analysis takes for a concatenation
#: (checked again, by identity, before anything is replayed)
MODULES: frozenset[str] = frozenset({"np", "numpy", "torch", "pd", "pandas"})
ATTRIBUTES: frozenset[str] = frozenset(n for ns in _FUNCTIONS.values() for n in ns)

#: those one call over all the pieces may stand for (same dtype throughout)
_FLAT: dict[str, tuple[str, ...]] = {
    "numpy": ("append", "concatenate", "vstack", "hstack"),
    "torch": ("cat", "concat", "concatenate", "vstack", "hstack"),
}


class ConcatCall(NamedTuple):
    """One iteration's call, as an engine recorded it."""

    function: Any
    args: tuple[Any, ...]  # ``x``'s place holds None
    kwargs: dict[str, Any]
    # where ``x`` goes: (i,) the i-th argument, (i, j) item j of the i-th,
    # a list or tuple literal
    at: tuple[int, ...]


def _array_copy(value: Any) -> Any:
    """A numpy array's copy, a tensor's clone (keeping its autograd history),
    or None for anything else."""
    module = type(value).__module__.split(".", 1)[0]
    if module == "numpy" and hasattr(value, "copy"):
        return value.copy()
    if module == "torch" and hasattr(value, "clone"):
        return value.clone()
    return None


def snapshot(value: Any) -> Any:
    """What the call would read of ``value`` now, kept from later changes:
    arrays and tensors copied (a tensor keeps its autograd history), list and
    tuple literals item by item, anything else deep-copied where it can be."""
    kind = type(value)
    copied = _array_copy(value)
    if copied is not None:
        return copied
    if kind in (list, tuple):
        return kind(snapshot(v) for v in value)
    if kind in (int, float, complex, str, bytes, bool, type(None)):
        return value
    try:
        return copy.deepcopy(value)
    except Exception:  # an object that cannot be copied is recorded as it is
        return value


def read_now(value: Any) -> Any:
    """What a method reads of its argument (``s.update(xs)``, ``dq.extend(g)``,
    ``c.subtract(words)``), kept from later changes: an iterator drawn into a
    list, a container copied one level (its items stay themselves, as the
    method would store them), an array copied."""
    kind = type(value)
    if kind in (list, tuple, set, frozenset, dict, bytearray):
        return kind(value)
    copied = _array_copy(value)
    if copied is not None:
        return copied
    if kind.__module__ == "collections" and hasattr(value, "copy"):
        return value.copy()  # (Counter, OrderedDict, deque, defaultdict)
    if hasattr(kind, "__next__") and hasattr(kind, "__iter__"):
        return list(value)  # (a generator cannot travel; its items can)
    return value


def library_of(function: Any, table: Mapping[str, Sequence[str]]) -> str | None:
    """The module of ``table`` (module -> function names) that ``function`` is
    one of, by identity, among the modules this process imported; else None."""
    for lib, names in table.items():
        mod = sys.modules.get(lib)
        if mod is not None and any(getattr(mod, n, None) is function for n in names):
            return lib
    return None


def known_concatenation(function: Any) -> str | None:
    """``"numpy"``, ``"torch"`` or ``"pandas"`` when ``function`` is one of
    those libraries' concatenations (by identity); else None."""
    return library_of(function, _FUNCTIONS)


def _with_x(call: ConcatCall, x: Any) -> list[Any]:
    args = list(call.args)
    i = call.at[0]
    if len(call.at) == 1:
        args[i] = x
    else:
        items = list(args[i])
        items[call.at[1]] = x
        args[i] = type(args[i])(items)
    return args


def _on_device_of(x: Any, piece: Any) -> Any:
    """A tensor piece on ``x``'s device: a GPU engine's piece comes back on
    the host, where serially it was made beside ``x``."""
    if type(piece) in (list, tuple) and piece is not x:
        return type(piece)(_on_device_of(x, p) for p in piece)
    dev = getattr(x, "device", None)
    if (
        dev is not None
        and type(piece).__module__.startswith("torch")
        and getattr(piece, "device", dev) != dev
    ):
        return piece.to(dev)
    return piece


def _pieces(call: ConcatCall) -> list[Any]:
    """The values concatenated after ``x`` (``at`` is (0,) or (0, 0))."""
    if len(call.at) == 1:
        return list(call.args[1:2])
    return [v for k, v in enumerate(call.args[0]) if k != call.at[1]]


def _flat(x: Any, calls: Sequence[ConcatCall]) -> Any:
    """One concatenation of ``x`` and every piece, where it is provably the
    chain's result: the same numpy/torch function and keywords every time,
    ``x`` first, every piece of ``x``'s own dtype (and device), nothing
    recording autograd history; else None."""
    first = calls[0]
    lib = known_concatenation(first.function)
    if lib not in _FLAT or not _plain_array(x, lib):
        return None
    name = next(n for n in _FLAT[lib] if getattr(sys.modules[lib], n) is first.function)
    shape = ((0,), 2) if name == "append" else ((0, 0), 1)
    if (first.at, len(first.args)) != shape:
        return None
    if set(first.kwargs) - {"axis" if lib == "numpy" else "dim"}:
        return None
    if any(
        c.function is not first.function
        or c.at != first.at
        or len(c.args) != len(first.args)
        or c.kwargs != first.kwargs
        for c in calls
    ):
        return None
    pieces = [x]
    for c in calls:
        for p in _pieces(c):
            p = _as_piece(p, lib)
            if p is None or p.dtype != x.dtype:
                return None
            if lib == "torch" and p.device != x.device:
                return None
            pieces.append(p)
    try:
        if name == "append":
            np = sys.modules["numpy"]
            axis = first.kwargs.get("axis")
            if axis is None:
                return np.concatenate([p.ravel() for p in pieces])
            return np.concatenate(pieces, axis=axis)
        return first.function(pieces, **first.kwargs)
    except Exception:  # the chain says which call fails, and how
        return None


def _as_piece(p: Any, lib: str) -> Any:
    """``p`` as the array the concatenation reads, or None where that is not
    plain: numpy converts numbers and lists with ``asarray``; a subclass
    (a masked array, a Parameter) or a tensor with autograd history is left
    to the chain."""
    mod = sys.modules[lib]
    if lib == "numpy":
        if type(p) is mod.ndarray:
            return p
        if isinstance(p, (mod.generic, int, float, complex, bool, list, tuple)):
            try:
                return mod.asarray(p)
            except Exception:
                return None
        return None
    return p if _plain_array(p, lib) else None


def _plain_array(x: Any, lib: str) -> bool:
    mod = sys.modules.get(lib)
    if lib == "numpy":
        return type(x) is getattr(mod, "ndarray", None)
    return type(x) is getattr(mod, "Tensor", None) and not x.requires_grad


def replay(
    x: Any, calls: Sequence[ConcatCall], first: int = 0, total: int | None = None
) -> Any:
    """``x`` after the recorded calls, made in order as the serial loop made
    them.  A call that raises raises as it would have serially, with a note
    saying which of the loop's calls it was (``first`` calls came before
    these, of ``total``)."""
    if not calls:
        return x
    flat = _flat(x, calls)
    if flat is not None:
        return flat
    for k, call in enumerate(calls):
        args = [_on_device_of(x, a) for a in _with_x(call, x)]
        try:
            x = call.function(*args, **call.kwargs)
        except Exception as e:
            add_note(
                e,
                f"gpucell: raised by the loop's concatenation number "
                f"{first + k + 1} of {total or len(calls)} (in iteration order), "
                "replayed on the kernel after the engines ran. Nothing was merged.",
            )
            raise
    return x


def calls_of(entries: Sequence[Any]) -> list[ConcatCall]:
    """Every call among what the engines recorded (see :func:`replay_recorded`)."""
    out = []
    for e in entries:
        if not isinstance(e[0], str):
            out.append(ConcatCall(*e))
        elif e[0] == IF_NONE:
            out.append(ConcatCall(*e[2]))
    return out


#: recorded for ``x = e`` (``(BIND, e)``) and for ``if x is None: x = e
#: else: x = f([x, e])`` (``(IF_NONE, e, the call)``); a call is recorded as
#: the fields of its :class:`ConcatCall`
BIND = "bind"
IF_NONE = "if None"


def replay_recorded(x: Any, entries: Sequence[Any]) -> Any:
    """``x`` after what the engines recorded, in iteration order: a call
    concatenates, a bind rebinds, an ``if None`` binds where ``x`` is None
    and concatenates otherwise.  Runs of calls go to :func:`replay` (one
    concatenation where it is the chain's result)."""
    total = len(calls_of(entries))
    pending: list[ConcatCall] = []
    done = 0

    def flush(x: Any) -> Any:
        nonlocal done
        x = replay(x, pending, done, total)
        done += len(pending)
        pending.clear()
        return x

    for e in entries:
        if not isinstance(e[0], str):
            pending.append(ConcatCall(*e))
        elif e[0] == BIND:
            x = flush(x)
            x = e[1]
        elif not pending and x is None:  # (a call never gives None)
            x = e[1]
        else:
            pending.append(ConcatCall(*e[2]))
    return flush(x)
