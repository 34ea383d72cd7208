"""Which process-wide random generators a loop can draw from, for ``--seed``
(pure: the loop's text and the objects it reads in, generator names out).

``--seed S`` reseeds before every iteration so iteration ``i``'s draws depend
only on ``(S, i)``.  Reseeding a generator the loop cannot reach is harmless
but not free: ``random.seed`` ~4 us, torch's ~1-2 us per iteration, so a
numpy-only loop on engines that loaded torch paid for all three.  This module
names the generators worth reseeding.

First law: a draw we miss would be silently different from the serial cell
seeded the same way, so every doubt reseeds everything (:data:`ALL`).  A loop
reaches a generator only through the names its code loads; each name must be
one of: the loop's own (assigned in its text), a builtin known to draw nothing
by itself, a module or module attribute whose package is listed in
:data:`REACH`, plain data (numbers, strings, arrays of numbers), or a notebook
function whose own globals, defaults and closure pass the same test.  Anything
else (an estimator, a library object, a library not listed, ``eval``, a name
not found) could call code that draws from any generator: :data:`ALL`.
"""

from __future__ import annotations

import ast
import builtins
import textwrap
import types
from collections.abc import Mapping
from typing import Any

from gpucell.core.globalreads import code_globals

__all__ = ["ALL", "REACH", "generators", "loop_generators"]

#: every generator ``--seed`` knows how to reseed
ALL: frozenset[str] = frozenset({"random", "numpy", "torch"})

_NONE: frozenset[str] = frozenset()

#: top-level package -> the process-wide generators its functions (and the
#: objects they return) can draw from.  Only packages whose code calls no
#: other library's generator; sklearn, scipy, pandas and the like draw from
#: numpy's global one through ``random_state=None`` and are left out (ALL).
REACH: Mapping[str, frozenset[str]] = {
    "numpy": frozenset({"numpy"}),
    "random": frozenset({"random"}),
    "torch": frozenset({"torch"}),
    **{
        name: _NONE
        for name in (
            "math",
            "cmath",
            "operator",
            "itertools",
            "string",
            "re",
            "json",
            "time",
            "datetime",
            "collections",
            "heapq",
            "bisect",
            "fractions",
            "decimal",
            "array",
            "struct",
            "hashlib",
            "zlib",
            "base64",
            "copy",
        )
    },
}

#: builtins that call no user-visible code but their arguments' (which the
#: analysis follows by the arguments' own names)
_SAFE_BUILTINS = frozenset(
    """abs all any ascii bin bool bytearray bytes callable chr complex dict
    divmod enumerate filter float format frozenset getattr hasattr hash hex id
    int isinstance issubclass iter len list map max min next object oct ord pow
    print range repr reversed round set setattr slice sorted str sum tuple type
    zip True False None Ellipsis NotImplemented ValueError TypeError KeyError
    IndexError RuntimeError Exception ArithmeticError ZeroDivisionError
    StopIteration AssertionError AttributeError LookupError""".split()
)

#: numpy's own objects whose methods run numpy's code only
_NUMPY_OWN = frozenset({"ufunc", "RandomState", "Generator", "dtype", "SeedSequence"})

#: plain values: no method of theirs draws from anything
_PLAIN: frozenset[type] = frozenset(
    {int, float, complex, bool, str, bytes, range, type(None), slice}
)


def _package(name: object) -> str:
    return name.split(".", 1)[0] if isinstance(name, str) else ""


def _data(value: object, depth: int = 0) -> bool:
    """Plain data: numbers, strings, numpy arrays of numbers, and containers
    of them.  Exact types only: a subclass of ``int`` may define an operator
    that draws.  A container of plain items is told by their types alone
    (``map(type, ...)`` runs in C: a million floats in ~20 ms); one of other
    items is looked into up to 10,000 of them, two levels deep."""
    if type(value) in _PLAIN:
        return True
    if _package(type(value).__module__) == "numpy":
        dtype = getattr(value, "dtype", None)
        return getattr(dtype, "hasobject", True) is False
    if type(value) in (list, tuple, set, frozenset) and depth < 2:
        items: Any = value
    elif type(value) is dict and depth < 2:
        items = [*value.keys(), *value.values()]
    else:
        return False
    if set(map(type, items)) <= _PLAIN:
        return True
    return len(items) <= 10_000 and all(_data(v, depth + 1) for v in items)


class _Reach:
    """The generators found so far, following notebook functions once each."""

    def __init__(self, ns: Mapping[str, Any]) -> None:
        self.ns = ns
        self.found: set[str] = set()
        self.seen: set[int] = set()

    def value(self, value: object) -> None:
        """What calling into or with ``value`` can draw from."""
        if self.found >= ALL or _data(value):
            return
        owner = _package(type(value).__module__)
        if isinstance(value, types.ModuleType):
            self._package(value.__name__)
        elif isinstance(value, types.MethodType):  # its function, on its object
            self.value(value.__self__)
            if isinstance(value.__func__, types.FunctionType):
                self.value(value.__func__)
        elif isinstance(value, types.FunctionType):
            if value.__globals__ is self.ns:
                self._function(value)
            else:  # a library's: its package, and what it closes over
                self._package(value.__module__)
                self._held(value)
        elif isinstance(value, types.BuiltinFunctionType):  # C: math.sin
            held = value.__self__
            if held is None or isinstance(held, types.ModuleType):
                self._package(value.__module__)
            else:
                self.value(held)
        elif isinstance(value, type):
            self._package(value.__module__)
        elif owner == "numpy" and type(value).__name__ in _NUMPY_OWN:
            self.found.add("numpy")
        elif owner == "torch" and hasattr(value, "shape") and hasattr(value, "dtype"):
            self.found.add("torch")  # a tensor: its methods are torch's
        else:  # an object whose methods may call anything
            self.found |= ALL

    def _held(self, fn: types.FunctionType) -> None:
        """A function's defaults and closure (a decorator's wrapped function)."""
        for v in (*(fn.__defaults__ or ()), *(fn.__kwdefaults__ or {}).values()):
            self.value(v)
        for cell in fn.__closure__ or ():
            try:
                self.value(cell.cell_contents)
            except ValueError:  # an empty cell
                pass

    def _package(self, name: object) -> None:
        self.found |= REACH.get(_package(name), ALL)

    def _function(self, fn: types.FunctionType) -> None:
        if id(fn) in self.seen:
            return
        self.seen.add(id(fn))
        for name in sorted(code_globals(fn.__code__)):
            self.name(name, set())
        self._held(fn)

    def name(self, name: str, own: set[str]) -> None:
        """A global (or builtin) name the code loads."""
        if name in own:
            return
        if name in self.ns:
            self.value(self.ns[name])
        elif name in _SAFE_BUILTINS and hasattr(builtins, name):
            return
        else:
            self.found |= ALL  # eval, exec, __import__, or nothing we know


def _own_names(tree: ast.AST) -> set[str]:
    """Names the code binds itself (its variables, imports, functions)."""
    own: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Name) and not isinstance(node.ctx, ast.Load):
            own.add(node.id)
        elif isinstance(node, ast.arg):
            own.add(node.arg)
        elif isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            own.add(node.name)
        elif isinstance(node, ast.ExceptHandler) and node.name:
            own.add(node.name)
    return own


def generators(
    code: str, inputs: Mapping[str, Any], ns: Mapping[str, Any]
) -> frozenset[str]:
    """The generators the loop ``code`` (its text) can draw from, given the
    objects it reads (``inputs``: name -> value) and the notebook's
    namespace ``ns`` (a function whose globals are ``ns`` is followed)."""
    try:
        tree = ast.parse(textwrap.dedent(code))
    except SyntaxError:
        return ALL
    reach = _Reach(ns)
    own = _own_names(tree)
    for node in ast.walk(tree):
        if isinstance(node, (ast.Import, ast.ImportFrom)):
            if isinstance(node, ast.ImportFrom) and (node.level or not node.module):
                return ALL
            modules = (
                [a.name for a in node.names]
                if isinstance(node, ast.Import)
                else [node.module or ""]
            )
            for m in modules:
                reach.found |= REACH.get(_package(m), ALL)
        elif isinstance(node, ast.Name) and isinstance(node.ctx, ast.Load):
            if node.id in inputs:  # (read before the loop binds it, maybe)
                reach.value(inputs[node.id])
            else:
                reach.name(node.id, own)
        if reach.found >= ALL:
            return ALL
    return frozenset(reach.found)


def loop_generators(
    source: str,
    prelude_lines: tuple[int, int] | None,
    epilogue_lines: tuple[int, int] | None,
    inputs: Mapping[str, Any],
    ns: Mapping[str, Any],
) -> tuple[str, ...]:
    """:func:`generators` of what of the cell ``source`` runs on the engines,
    sorted (what the engines are sent): the lines between the prelude and the
    epilogue (1-based, inclusive; both run in the kernel), which hold the loop
    and any ``with`` around it."""
    lines = source.splitlines()
    first = prelude_lines[1] if prelude_lines is not None else 0
    last = epilogue_lines[0] - 1 if epilogue_lines is not None else len(lines)
    return tuple(sorted(generators("\n".join(lines[first:last]), inputs, ns)))
