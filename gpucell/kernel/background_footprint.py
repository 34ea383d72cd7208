"""What a ``--background`` run will still do to the notebook, as names
(:class:`gpucell.core.waitrule.Footprint`), computed once when it starts; and
what the notebook code a later cell names may use.  Reads the namespace,
never changes it."""

from __future__ import annotations

import ast
import contextlib
import types
import weakref
from collections.abc import Mapping
from typing import Any

from gpucell.core import waitrule

__all__ = ["footprint", "notebook_code"]

#: builtins whose call depends on no state a later cell could change
_PURE_BUILTINS = frozenset(
    {
        "abs", "all", "any", "ascii", "bin", "bool", "bytes", "callable", "chr",
        "complex", "dict", "divmod", "enumerate", "filter", "float", "format",
        "frozenset", "getattr", "hasattr", "hash", "hex", "id", "int",
        "isinstance", "issubclass", "iter", "len", "list", "map", "max", "min",
        "next", "object", "oct", "ord", "pow", "print", "range", "repr",
        "reversed", "round", "set", "slice", "sorted", "str", "sum", "tuple",
        "type", "zip",
    }
)  # fmt: skip


def footprint(plan: Any, loop: Any, shell: Any) -> waitrule.Footprint:
    """What the run will still do to the notebook (:class:`waitrule.Footprint`):
    names it writes, objects it reads, the epilogue's names, and other names of
    those objects (``y = out``, a dict holding an input, a view of an array:
    :func:`gpucell.core.aliasing.shared_with_sinks`, one level deep)."""
    import builtins

    from gpucell.core.aliasing import shared_with_sinks

    ns = shell.user_ns
    own = lambda n: not n.startswith("__gpucell_")  # noqa: E731
    hidden = set(plan.hidden)
    writes = {i.name for i in plan.names if i.cls != "input"}
    writes |= {*plan.affected_names, *plan.locals, *plan.deep_writes}
    writes |= {r.name for r in plan.own_rows}
    if plan.result_name:
        writes.add(plan.result_name)
    writes = {n for n in writes if own(n) and n not in hidden}
    leaves: set[str] = set()
    for leaf in plan.iter_space.leaves if plan.iter_space is not None else ():
        with contextlib.suppress(SyntaxError):
            leaves |= waitrule.cell_use(leaf).names
    reads = {
        n
        for n in (*plan.inputs, *leaves)
        if own(n)
        and not _harmless(
            ns[n] if n in ns else getattr(builtins, n, _MISSING),
            n in ns or hasattr(builtins, n),
        )
    }
    if any(_logs(v) for v in loop.inputs.values()):
        reads.add("logging")  # its records reach the handlers at the merge
    always = None
    epilogue: set[str] = set()
    bound_only: set[str] = set()
    if plan.epilogue:
        use = waitrule.cell_use_of(
            ast.Module(body=list(plan.epilogue), type_ignores=[])
        )
        if use.unknowable is not None:
            always = f"the code after its loop {use.unknowable}"
        for n in use.names:
            value = ns.get(n, getattr(builtins, n, _MISSING))
            if n in _PURE_BUILTINS and value is getattr(builtins, n, None):
                bound_only.add(n)
            else:
                epilogue.add(n)
        inner = notebook_code(ns, frozenset(use.names))
        for n, uses in inner.items():
            if uses is None:
                always = f"the code after its loop uses `{n}`, code gpucell cannot read"
            else:
                epilogue |= {u for u in uses if u in ns}
    touched = writes | reads | epilogue
    objects = {n: ns[n] for n in touched if n in ns and not _harmless(ns[n], True)}
    candidates = {n: v for n, v in ns.items() if n not in touched}
    aliases: dict[str, str] = {}
    for s in shared_with_sinks(objects, candidates, frozenset(objects)):
        aliases.setdefault(s.input, f"{s.how} `{s.sink}`")
    by_id = {id(v): n for n, v in objects.items()}
    for n, v in candidates.items():  # notebook functions holding a run's object
        if n in aliases or not _notebook_function(v):
            continue
        held = [c.cell_contents for c in v.__closure__ or () if _filled(c)]
        held += [*(v.__defaults__ or ()), *(v.__kwdefaults__ or {}).values()]
        for obj in held:
            if id(obj) in by_id:
                aliases[n] = f"holds `{by_id[id(obj)]}` (in its closure or defaults)"
                break
    return waitrule.Footprint(
        writes=frozenset(writes),
        reads=frozenset(reads),
        epilogue=frozenset(epilogue),
        bound_only=frozenset(bound_only),
        aliases=tuple(sorted(aliases.items())),
        always=always,
    )


_MISSING = object()


def _harmless(value: Any, defined: bool) -> bool:
    """An input whose use by a later cell cannot change what the run reads: an
    immutable value, a module, a function or class of a library."""
    from gpucell.core.aliasing import _mutable

    if not defined or value is _MISSING:
        return False
    if isinstance(value, types.ModuleType):
        return True
    if isinstance(value, (types.BuiltinFunctionType, types.FunctionType, type)):
        return getattr(value, "__module__", "__main__") != "__main__"
    return not _mutable(value)


def _logs(value: Any) -> bool:
    import logging

    return value is logging or isinstance(value, (logging.Logger, logging.Handler))


def _filled(cell: Any) -> bool:
    try:
        cell.cell_contents  # noqa: B018
    except ValueError:
        return False
    return True


def _notebook_function(value: Any) -> bool:
    return isinstance(value, types.FunctionType) and value.__module__ == "__main__"


# -- notebook code a later cell uses: what its code may use -------------------------

_CODE_USES: weakref.WeakKeyDictionary[Any, frozenset[str]] = weakref.WeakKeyDictionary()
_NOT_CODE = object()


def notebook_code(ns: Mapping[str, Any], words: frozenset[str]) -> dict[str, Any]:
    """``{name: names its code may use}`` for the words of a cell that name
    notebook code (a function or class defined in the notebook, an instance of
    such a class), following the notebook functions and classes that code
    names; ``None`` where it cannot be read."""
    out: dict[str, Any] = {}
    for w in words:
        value = ns.get(w, _NOT_CODE)
        if value is _NOT_CODE:
            continue
        uses = _uses_of(value, ns, set(), 0)
        if uses is not _NOT_CODE:
            out[w] = uses
    return out


def _code_parts(value: Any) -> list[Any] | None:
    """The functions whose code ``value`` runs when used, or ``None`` when it
    is not notebook code."""
    if isinstance(value, types.MethodType):
        value = value.__func__
    if isinstance(value, types.FunctionType):
        return [value] if value.__module__ == "__main__" else None
    cls = value if isinstance(value, type) else type(value)
    if getattr(cls, "__module__", None) != "__main__":
        return None
    parts: list[Any] = []
    for klass in cls.__mro__:
        if getattr(klass, "__module__", None) != "__main__":
            continue
        for attr in vars(klass).values():
            if isinstance(attr, (staticmethod, classmethod)):
                attr = attr.__func__
            if isinstance(attr, property):
                parts += [f for f in (attr.fget, attr.fset, attr.fdel) if f]
            elif isinstance(attr, types.FunctionType):
                parts.append(attr)
    return parts


def _uses_of(value: Any, ns: Mapping[str, Any], seen: set[int], depth: int) -> Any:
    parts = _code_parts(value)
    if parts is None:
        return _NOT_CODE
    if depth > 8:
        return None  # too deep to follow: unknown
    out: set[str] = set()
    for fn in parts:
        if id(fn) in seen:
            continue
        seen.add(id(fn))
        code = getattr(fn, "__code__", None)
        if code is None:
            return None
        names = _CODE_USES.get(fn)
        if names is None:
            names = _CODE_USES[fn] = waitrule.code_uses(code)
        out |= names
        nested = [ns.get(n, _NOT_CODE) for n in names]
        nested += [c.cell_contents for c in fn.__closure__ or () if _filled(c)]
        for inner in nested:
            if inner is _NOT_CODE or id(inner) in seen:
                continue
            more = _uses_of(inner, ns, seen, depth + 1)
            if more is None:
                return None
            if more is not _NOT_CODE:
                out |= more
    return frozenset(out)
