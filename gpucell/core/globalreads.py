"""Which globals the notebook's own functions read (pure: objects in, names out).

A loop body that calls a helper defined in the notebook (``def is_new(t):
return t not in uniq``) depends on every global the helper reads.  Serially
the helper sees what earlier iterations left in those globals; on an engine
it runs on a copy of them from before the loop.  The analysis sees only the
cell's text, so the kernel asks this module, before anything runs, which
globals the functions reachable from the loop's inputs read, and refuses the
loop when the loop changes one of them.

Only code defined in the notebook is followed (a function whose globals are
the notebook's namespace, and the methods of classes defined there): an
installed library's functions read their own module's globals, which the
cell cannot change by assignment.
"""

from __future__ import annotations

import dis
import functools
import itertools
import types
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from typing import Any

__all__ = [
    "GlobalRead",
    "code_stores",
    "generator_reads",
    "global_random_calls",
    "global_reads",
    "notebook_functions",
    "plain_reads",
]

#: the instructions that read or write a global by name
_GLOBAL_OPS = frozenset(
    {
        "LOAD_GLOBAL",
        "LOAD_NAME",
        "LOAD_FROM_DICT_OR_GLOBALS",
        "STORE_GLOBAL",
        "DELETE_GLOBAL",
    }
)

#: at most this many functions are followed from one loop's inputs
MAX_FUNCTIONS = 500


@dataclass(frozen=True)
class GlobalRead:
    """``function`` (reached from the input ``via``) uses the global ``name``."""

    via: str
    function: str
    name: str


def code_globals(code: types.CodeType) -> set[str]:
    """Global names a code object and the code nested in it (inner functions,
    lambdas, comprehensions) load, store or delete: not attribute names,
    which ``co_names`` also holds."""
    out: set[str] = set()
    for ins in dis.get_instructions(code):
        if ins.opname in _GLOBAL_OPS and isinstance(ins.argval, str):
            out.add(ins.argval)
    for const in code.co_consts:
        if isinstance(const, types.CodeType):
            out |= code_globals(const)
    return out


#: how deep and how many objects :func:`_held` looks into an input's
#: containers and attributes for notebook functions
HELD_DEPTH = 3
HELD_BUDGET = 2000
_ATOMS = (int, float, complex, str, bytes, bool, type(None), range)


def _functions(value: Any, ns: Mapping[str, Any]) -> Iterator[types.FunctionType]:
    """The notebook functions ``value`` is or holds: as code (itself, a
    partial's or a bound method's function, a notebook class's methods, of a
    class or of an instance's class), or as data (``ops = {"s": scaled}``,
    ``[f, g]``, an object's attribute: a library's ``FunctionTransformer``),
    which a call reaches as surely (:func:`_held`)."""
    yield from _as_code(value, ns)
    budget = [HELD_BUDGET]
    for held in _held(value, HELD_DEPTH, budget):
        yield from _as_code(held, ns)


def _held(value: Any, depth: int, budget: list[int]) -> Iterator[Any]:
    """Callables inside ``value``'s containers (dict values, list, tuple and
    set elements) and instance attributes, ``depth`` levels down, at most
    ``budget`` objects looked at (scalars, arrays and strings are not
    looked into)."""
    if depth <= 0 or budget[0] <= 0:
        return
    if isinstance(value, dict):
        parts: Any = value.values()
    elif isinstance(value, (list, tuple, set, frozenset)):
        parts = value
    elif isinstance(value, (type, types.FunctionType, types.ModuleType)):
        return
    else:
        try:
            parts = vars(value).values()
        except TypeError:  # (no __dict__: numbers, strings, arrays, tensors)
            return
    for part in itertools.islice(parts, budget[0]):
        budget[0] -= 1
        if callable(part) and not isinstance(part, type):
            yield part
        if budget[0] <= 0:
            return
        if not isinstance(part, _ATOMS):
            yield from _held(part, depth - 1, budget)


def _as_code(value: Any, ns: Mapping[str, Any]) -> Iterator[types.FunctionType]:
    """The notebook functions ``value`` is or holds as code (see
    :func:`_functions`)."""
    if isinstance(value, functools.partial):
        yield from _as_code(value.func, ns)
        return
    if isinstance(value, types.MethodType):
        yield from _as_code(value.__func__, ns)
        return
    if isinstance(value, (staticmethod, classmethod)):
        yield from _as_code(value.__func__, ns)
        return
    if isinstance(value, property):
        for part in (value.fget, value.fset, value.fdel):
            if part is not None:
                yield from _as_code(part, ns)
        return
    if isinstance(value, types.FunctionType):
        if value.__globals__ is ns:
            yield value
        return
    cls = value if isinstance(value, type) else type(value)
    if getattr(cls, "__module__", None) != "__main__":
        return
    for klass in cls.__mro__:
        if getattr(klass, "__module__", None) != "__main__":
            continue
        for member in vars(klass).values():
            if isinstance(
                member,
                (types.FunctionType, staticmethod, classmethod, property),
            ):
                yield from _as_code(member, ns)


def global_reads(
    inputs: Mapping[str, Any], ns: Mapping[str, Any], names: set[str]
) -> list[GlobalRead]:
    """Which of ``names`` the notebook functions reachable from ``inputs``
    use as globals: followed through the globals they use and their
    closures, each function once.  In input order, then by name."""
    return [
        GlobalRead(via, fn.__qualname__, n)
        for via, fn in notebook_functions(inputs, ns)
        for n in sorted(code_globals(fn.__code__) & names)
    ]


def notebook_functions(
    inputs: Mapping[str, Any], ns: Mapping[str, Any]
) -> Iterator[tuple[str, types.FunctionType]]:
    """``(input, function)`` for every notebook function reachable from
    ``inputs`` (as :func:`global_reads` follows them), each once."""
    seen: set[int] = set()
    for via, value in inputs.items():
        todo = list(_functions(value, ns))
        while todo and len(seen) < MAX_FUNCTIONS:
            fn = todo.pop()
            if id(fn) in seen:
                continue
            seen.add(id(fn))
            yield via, fn
            for n in sorted(code_globals(fn.__code__)):
                if n in ns:
                    todo.extend(_functions(ns[n], ns))
            for cell in fn.__closure__ or ():
                try:
                    todo.extend(_functions(cell.cell_contents, ns))
                except ValueError:  # an empty cell
                    pass


def _value(v: Any) -> bool:
    """An object nothing can change in place."""
    return isinstance(
        v, (int, float, complex, str, bytes, bool, type(None), tuple, frozenset, range)
    )


def generator_reads(
    gen: types.GeneratorType[Any, Any, Any],
    ns: Mapping[str, Any],
    names: set[str],
) -> list[GlobalRead]:
    """Which of ``names`` (what the loop body changes) the items of the loop's
    generator ``gen`` may depend on: serially each item is made after the
    iterations before it, on an engine all items are made first.

    Only notebook code counts: a generator written in the notebook (its
    frame's globals are ``ns``) reads the globals its code loads (never an
    attribute name: ``iterrows`` reading ``self.index`` is no read of a global
    ``index``) and the objects it was given (``batches(out)`` while the body
    appends to ``out``); any generator reads, through the notebook functions
    its frame holds (a callback it was given), the globals those read.  An
    installed library's generator reads its own module's globals, which the
    cell cannot rebind.  In the order found, each name once."""
    via = gen.__name__
    frame = gen.gi_frame
    if frame is None:  # finished: it makes no more items
        return []
    out: dict[str, GlobalRead] = {}
    own = frame.f_globals is ns
    if own:
        for n in sorted(code_globals(gen.gi_code) & names):
            out.setdefault(n, GlobalRead(via, gen.__qualname__, n))
        # an object it holds that the body changes in place (a value is
        # rebound, never changed: a small int may be the same object)
        held = {id(v) for v in frame.f_locals.values() if not _value(v)}
        for n in sorted(names):
            if n in ns and id(ns[n]) in held:
                out.setdefault(n, GlobalRead(via, gen.__qualname__, n))
    reach = dict(frame.f_locals)
    if own:
        reach |= {n: ns[n] for n in code_globals(gen.gi_code) if n in ns}
    for r in global_reads(reach, ns, names):
        out.setdefault(r.name, GlobalRead(via, r.function, r.name))
    return list(out.values())


def global_random_calls(
    inputs: Mapping[str, Any], ns: Mapping[str, Any]
) -> list[tuple[str, str, str]]:
    """``(input, function, call)`` for calls drawing from a process-wide random
    generator (``random.random()``, ``np.random.rand()``, ``torch.randn()``)
    in the notebook functions reachable from ``inputs``: the loop's own text
    does not show them.  Read from the functions' source (IPython keeps each
    cell's); a function without one is skipped."""
    import ast
    import inspect
    import textwrap

    from gpucell.core.analysis.scope import global_draw

    out: list[tuple[str, str, str]] = []
    for via, fn in notebook_functions(inputs, ns):
        try:
            tree = ast.parse(textwrap.dedent(inspect.getsource(fn)))
        except (OSError, TypeError, SyntaxError, IndentationError):
            continue
        for node in ast.walk(tree):
            if isinstance(node, ast.Call):
                text = global_draw(node)
                if text is not None:
                    out.append((via, fn.__qualname__, text))
    return out


def code_stores(code: types.CodeType) -> set[str]:
    """Global names a code object (and the code nested in it) stores or
    deletes (``global x; x = ...``)."""
    out = {
        ins.argval
        for ins in dis.get_instructions(code)
        if ins.opname in ("STORE_GLOBAL", "DELETE_GLOBAL")
        and isinstance(ins.argval, str)
    }
    for const in code.co_consts:
        if isinstance(const, types.CodeType):
            out |= code_stores(const)
    return out


def plain_reads(value: Any, ns: Mapping[str, Any], names: set[str]) -> set[str] | None:
    """Which of ``names`` the notebook function ``value`` reads as globals,
    followed only through plain notebook functions it reads as globals;
    ``None`` when that is not the whole story: ``value`` is no plain notebook
    function, one of them stores one of ``names``, or a read of ``names`` is
    reached some other way (a closure, a notebook class's method).

    Such a function reads those names from the namespace it runs in, so an
    engine that runs it with the chunk's namespace as its globals (see
    ``engine.chunk``) gives it each iteration's values, as serially."""
    if not (isinstance(value, types.FunctionType) and value.__globals__ is ns):
        return None
    found: set[str] = set()
    seen: set[int] = set()
    todo = [value]
    while todo:
        fn = todo.pop()
        if id(fn) in seen:
            continue
        seen.add(id(fn))
        if len(seen) > MAX_FUNCTIONS or code_stores(fn.__code__) & names:
            return None
        used = code_globals(fn.__code__)
        found |= used & names
        for n in sorted(used):
            v = ns.get(n)
            if isinstance(v, types.FunctionType) and v.__globals__ is ns:
                todo.append(v)
    every = {r.name for r in global_reads({"f": value}, ns, names)}
    return found if every == found else None
