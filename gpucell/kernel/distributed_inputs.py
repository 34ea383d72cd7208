"""What the ranks of a ``%%gpu_distributed`` cell get from the notebook: the
names the cell reads (and the globals of the notebook code among them), which
of those each rank's namespace lacks or holds an older version of
(:class:`Synced`), and their wire frames.  Reads the namespace, never changes
it."""

from __future__ import annotations

import ast
import weakref
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

__all__ = [
    "Synced",
    "for_cpu",
    "inputs_of",
    "modules_of",
    "names_read",
    "rank_frames",
]


# -- which names the cell reads ----------------------------------------------------


def names_read(tree: ast.Module) -> list[str]:
    """Names the cell reads before binding them at its top level, in order of
    first use (a name assigned by an earlier top-level statement is the cell's
    own; one read inside a function the cell defines counts as read)."""
    free = _global_names(tree)
    bound: set[str] = set()
    out: list[str] = []
    for stmt in tree.body:
        loads, stores = _uses(stmt)
        for n in loads:
            if n in free and n not in bound and n not in out:
                out.append(n)
        bound |= stores
    return out


def _global_names(tree: ast.Module) -> set[str]:
    """Names the cell's code looks up in its namespace: read at its top level,
    or read as globals inside the functions, classes and comprehensions it
    defines (not their parameters and locals)."""
    import symtable

    top = symtable.symtable(ast.unparse(tree), "<cell>", "exec")
    out = {s.get_name() for s in top.get_symbols()}  # `x += 1` is not "referenced"
    todo = list(top.get_children())
    while todo:
        table = todo.pop()
        out.update(
            s.get_name()
            for s in table.get_symbols()
            if s.is_referenced() and s.is_global()
        )
        todo.extend(table.get_children())
    return out


def _uses(stmt: ast.stmt) -> tuple[list[str], set[str]]:
    loads: list[str] = []
    stores: set[str] = set()
    for node in ast.walk(stmt):
        if isinstance(node, ast.Name):
            if isinstance(node.ctx, ast.Load):
                loads.append(node.id)
        elif isinstance(node, ast.AugAssign) and isinstance(node.target, ast.Name):
            loads.append(node.target.id)  # x += 1 reads x
    _top_level_stores(stmt, stores)
    return loads, stores


def _top_level_stores(node: ast.AST, stores: set[str]) -> None:
    """Names ``node`` binds in the cell's own (module) scope."""
    if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
        stores.add(node.name)
        return
    if isinstance(node, (ast.Lambda, ast.ListComp, ast.SetComp, ast.DictComp)):
        return
    if isinstance(node, ast.GeneratorExp):
        return
    if isinstance(node, ast.Name) and isinstance(node.ctx, ast.Store):
        stores.add(node.id)
    elif isinstance(node, (ast.Import, ast.ImportFrom)):
        for a in node.names:
            stores.add((a.asname or a.name).split(".")[0])
    for child in ast.iter_child_nodes(node):
        _top_level_stores(child, stores)


def inputs_of(tree: ast.Module, ns: dict[str, Any], hidden: Iterable[str]) -> list[str]:
    """The notebook's names a rank needs for this cell: those it reads, and the
    globals the notebook functions and classes among them read (they run on
    the rank's namespace, as in the notebook)."""
    from gpucell.core.globalreads import code_globals, notebook_functions

    skip = set(hidden)
    want = [n for n in names_read(tree) if n in ns and n not in skip]
    seen = set(want)
    for _via, fn in notebook_functions({n: ns[n] for n in want}, ns):
        for n in sorted(code_globals(fn.__code__)):
            if n in ns and n not in seen and n not in skip:
                seen.add(n)
                want.append(n)
    return [n for n in want if not (n.startswith("__") and n.endswith("__"))]


def modules_of(names: Iterable[str], ns: dict[str, Any]) -> dict[str, str]:
    """``{name: module name}`` for the names bound to an importable module:
    a rank imports those itself (a module is not data; the ``gpucell``
    package, a ``ModuleType`` subclass, cannot be pickled by reference)."""
    import sys
    import types

    out = {}
    for n in names:
        value = ns.get(n)
        if isinstance(value, types.ModuleType):
            name = getattr(value, "__name__", None)
            if isinstance(name, str) and sys.modules.get(name) is value:
                out[n] = name
    return out


# -- what each rank's namespace holds of the notebook's ------------------------------


@dataclass(frozen=True)
class _Token:
    """A notebook value as it was when a rank last got it (or last had a
    name of its own by that name): equal tokens mean "not changed since"."""

    fp: Any  # its content fingerprint (protocol.fingerprint), None when none
    ident: int
    ref: Any  # a weak (else strong) reference, so the id is not reused

    @classmethod
    def of(cls, value: Any) -> _Token:
        from gpucell.protocol.fingerprint import fingerprint

        try:
            ref: Any = weakref.ref(value)
        except TypeError:
            ref = value
        try:
            fp = fingerprint(value)
        except Exception:  # an object whose attributes cannot be read
            fp = None
        return cls(fp, id(value), ref)

    def same(self, value: Any) -> bool:
        if self.fp is not None:
            return self.fp == _Token.of(value).fp
        held = self.ref() if isinstance(self.ref, weakref.ref) else self.ref
        return held is value


@dataclass
class Synced:
    """Per rank process ((host, pid): its namespace lives as long as it does),
    the notebook's names it holds and the token of each when it got them.

    A name is sent to a rank when the notebook has it and the rank does not,
    or when the notebook's value changed since (rebound; for tensors, arrays,
    modules and containers of them also changed in place).  Otherwise the rank
    keeps its own: a model a distributed cell trained goes on training in the
    next one.  An object without a content fingerprint (an optimizer, a
    notebook class's instance) is sent again only when the notebook binds the
    name to another object.
    """

    tokens: dict[tuple[str, int], dict[str, _Token]] = field(default_factory=dict)
    names: dict[tuple[str, int], set[str]] = field(default_factory=dict)

    def wanted(
        self, proc: tuple[str, int], names: list[str], ns: dict[str, Any]
    ) -> list[str]:
        have = self.tokens.get(proc, {})
        return [n for n in names if n not in have or not have[n].same(ns[n])]

    def sent(
        self, proc: tuple[str, int], names: Iterable[str], ns: dict[str, Any]
    ) -> None:
        have = self.tokens.setdefault(proc, {})
        for n in names:
            have[n] = _Token.of(ns[n])

    def after(
        self,
        proc: tuple[str, int],
        held: Iterable[str],
        ns: dict[str, Any],
        bound: Iterable[str] = (),
    ) -> None:
        """A cell ended on ``proc``, whose namespace now holds ``held``; the
        notebook's names in ``bound`` were just set from the ranks (--out).
        A held name the notebook has without a token (the rank made its own)
        and a bound one get the notebook's value's token now: that value is
        not newer than the rank's.  Other tokens stay as they are (a rank that
        changed a name it was sent keeps its own until the notebook changes
        the name)."""
        held = set(held)
        self.names[proc] = held
        have = self.tokens.setdefault(proc, {})
        fresh = set(bound)
        for n in held:
            if n in ns and (n in fresh or n not in have):
                have[n] = _Token.of(ns[n])

    def forget(self, proc: tuple[str, int]) -> None:
        self.tokens.pop(proc, None)
        self.names.pop(proc, None)


def for_cpu(src: str, filename: str) -> tuple[ast.Module, tuple[int, ...]]:
    """The cell with its CUDA selections on the engine's device, as
    ``%%gpu_parallel`` runs ``.cuda()`` code on CPU engines."""
    from gpucell.core.analysis.rewrite import rewrite_cuda

    tree, lines, _wrapped = rewrite_cuda(ast.parse(src, filename))
    return ast.fix_missing_locations(tree), lines


def rank_frames(
    wanted: dict[int, list[str]], ns: dict[str, Any]
) -> dict[int, list[Any]]:
    """Each rank's names as wire frames (ranks that want the same names share
    one serialisation); a name that cannot travel is refused by name."""
    from gpucell.errors import InputNotSendable
    from gpucell.protocol import wire

    made: dict[tuple[str, ...], list[Any]] = {}
    out: dict[int, list[Any]] = {}
    for eid, names in wanted.items():
        key = tuple(names)
        if key not in made:
            if not names:
                made[key] = []
            else:
                try:
                    made[key] = wire.dumps({n: ns[n] for n in names}, cell_globals=ns)
                except Exception as e:
                    bad = _unsendable(names, ns)
                    raise InputNotSendable(
                        f"gpucell: {bad} cannot travel to the ranks "
                        f"({type(e).__name__}: {e}). Make it inside the "
                        "%%gpu_distributed cell instead (each rank then builds "
                        "its own). Nothing ran."
                    ) from None
        out[eid] = made[key]
    return out


def _unsendable(names: list[str], ns: dict[str, Any]) -> str:
    from gpucell.protocol import wire

    for n in names:
        try:
            wire.dumps(ns[n], cell_globals=ns)
        except Exception:
            return f"`{n}` ({type(ns[n]).__name__})"
    return "a name the cell reads"
