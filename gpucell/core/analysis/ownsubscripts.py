"""An iteration's own item reached through its container: by index or by key.

Serially ``for i in range(len(models)): models[i].fit(X, y)`` and ``for k in
groups: groups[k].sort()`` change, in iteration ``i`` (``k``), the element
``models[i]`` (``groups[k]``) only: that element is the iteration's own item,
as the loop variable's is in ``for m in models: m.fit(X, y)``.  Where every
use of the container in the body is that element, read (never stored into,
deleted or rebound, never the loop variable rebound, never inside a function
the body makes), and the body changes it in place or may (a method called
on it, a store into it, a name for it, a nested loop over its parts), the
loop is run as the form the engines write back::

    for i, __gpucell_own_models__ in zip(range(len(models)),
                                         [models[k] for k in range(len(models))]):
        __gpucell_own_models__.fit(X, y)

The elements are the kernel's own objects, read before the loop as serially
each iteration reads its own (the body never changes the container), so the
write-back goes into them in place.  Any other use (``models[i + 1]``,
``models[j]``, ``models.append``, ``len(models)``) keeps the loop as written,
and refused as before, by name.  Pure: standard library only.
"""

from __future__ import annotations

import ast
import builtins
from collections.abc import Callable
from dataclasses import dataclass

from gpucell.core.astcopy import copy_tree

__all__ = ["OwnSubscripts", "Trial", "chosen_own_subscripts", "own_subscripts"]

#: methods that only read (numbers, arrays, frames, strings): a call of one
#: on the element does not make it the iteration's changed item
_READERS = frozenset(
    "sum mean std var min max argmax argmin item tolist copy astype reshape "
    "dot get keys values items numpy cpu detach clone count index startswith "
    "endswith lower upper split strip format any all norm size dim nunique "
    "unique describe head tail predict predict_proba transform score "
    "score_samples decision_function".split()
)


@dataclass(frozen=True)
class OwnSubscripts:
    """The loop as the engines run it: ``target`` over ``iterable``, with
    each container's own element ``C[k]`` read as a hidden name (``names``:
    container -> hidden name)."""

    names: dict[str, str]
    target: ast.expr
    iterable: ast.expr
    body: list[ast.stmt]
    #: container -> (the key variable, the path to it in an item of the
    #: loop's iterable): the kernel reads ``C[key]`` for each item it drew,
    #: reading the iterable once (an iterator gives its keys once)
    keys: dict[str, tuple[str, tuple[int, ...]]]


def _is_own(node: object, container: str, var: str) -> bool:
    return (
        isinstance(node, ast.Subscript)
        and isinstance(node.value, ast.Name)
        and node.value.id == container
        and isinstance(node.slice, ast.Name)
        and node.slice.id == var
        and isinstance(node.ctx, ast.Load)
    )


def _bound(body: list[ast.stmt]) -> set[str]:
    """Every name the body binds or deletes, nested scopes included."""
    out: set[str] = set()
    for stmt in body:
        for node in ast.walk(stmt):
            if isinstance(node, ast.Name) and not isinstance(node.ctx, ast.Load):
                out.add(node.id)
            elif isinstance(node, ast.arg):
                out.add(node.arg)
            elif isinstance(
                node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)
            ):
                out.add(node.name)
            elif isinstance(node, (ast.Global, ast.Nonlocal)):
                out.update(node.names)
            elif isinstance(node, ast.ExceptHandler) and node.name:
                out.add(node.name)
            elif isinstance(node, (ast.Import, ast.ImportFrom)):
                out.update((a.asname or a.name).split(".")[0] for a in node.names)
            elif isinstance(node, (ast.MatchAs, ast.MatchStar)) and node.name:
                out.add(node.name)
    return out


def _parents(body: list[ast.stmt]) -> dict[int, ast.AST]:
    out: dict[int, ast.AST] = {}
    for stmt in body:
        for node in ast.walk(stmt):
            for child in ast.iter_child_nodes(node):
                out[id(child)] = node
    return out


_SCOPES = (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda, ast.ClassDef)


def _changes(
    node: ast.AST, parents: dict[int, ast.AST], names: dict[str, list[ast.Name]]
) -> bool:
    """May the element at ``node`` be changed here: a method called on it or
    on a part of it, a store or ``del`` into it, a nested loop or a ``with``
    over it, or the same through a name given to it (``opt = C[k]``;
    ``names``: the body's reads of each name)?"""
    child, up = node, parents.get(id(node))
    while isinstance(up, (ast.Attribute, ast.Subscript)) and up.value is child:
        if not isinstance(up.ctx, ast.Load):
            return True  # `C[i].x = v`, `C[i][j] += v`, `del C[i].x`
        child, up = up, parents.get(id(up))
    if isinstance(up, ast.Call) and up.func is child:
        return child is not node and not (
            isinstance(child, ast.Attribute) and child.attr in _READERS
        )
    if isinstance(up, ast.Assign) and up.value is child:
        targets = [t.id for t in up.targets if isinstance(t, ast.Name)]
        if len(targets) != len(up.targets):
            return False
        # (each name's reads, once: `a = C[k]; b = a` is followed to b)
        reads = [r for t in targets for r in names.pop(t, [])]
        return any(_changes(r, parents, names) for r in reads)
    if isinstance(up, (ast.For, ast.AsyncFor)) and up.iter is child:
        return True
    if isinstance(up, ast.keyword):
        up = parents.get(id(up))
    if isinstance(up, ast.Call) and up.func is not child:
        # handed to a function of the notebook's (`center_(data[i])`): it may
        # change its argument in place (a builtin's or a method's argument
        # is read, as before)
        return (
            child is node
            and isinstance(up.func, ast.Name)
            and up.func.id not in _BUILTINS
        )
    return isinstance(up, ast.withitem) and up.context_expr is child


def _in_scope(node: ast.AST, parents: dict[int, ast.AST]) -> bool:
    """Inside a function or class the body makes (it may run after the
    loop, and read the element's hidden name there)."""
    up = parents.get(id(node))
    while up is not None:
        if isinstance(up, _SCOPES):
            return True
        up = parents.get(id(up))
    return False


def _stores_outer(body: list[ast.stmt], local: set[str]) -> bool:
    """Does the body store an object from before the loop into an object
    (``S[i][0] = obj``, ``x.ref = cfg``)?  An element that holds it would
    come back a copy (serially it is the object, and a method called on the
    element could change it): such a loop keeps its own reading."""
    for stmt in body:
        for node in ast.walk(stmt):
            if isinstance(node, ast.Assign) and any(
                isinstance(t, (ast.Subscript, ast.Attribute)) for t in node.targets
            ):
                v = node.value
                while isinstance(v, (ast.Attribute, ast.Subscript)):
                    v = v.value
                if isinstance(v, ast.Name) and v.id not in local:
                    return True
    return False


def _own_uses(
    body: list[ast.stmt], keys: set[str], parents: dict[int, ast.AST]
) -> dict[str, str]:
    """``container -> key variable`` for each name the body uses only as
    ``C[k]``, read (``k`` one loop variable, never rebound), and changes."""
    uses: dict[str, list[ast.AST]] = {}
    var_of: dict[str, str | None] = {}
    for stmt in body:
        for node in ast.walk(stmt):
            if not (isinstance(node, ast.Name) and isinstance(node.ctx, ast.Load)):
                continue
            up = parents.get(id(node))
            var = (
                up.slice.id
                if isinstance(up, ast.Subscript)
                and up.value is node
                and isinstance(up.slice, ast.Name)
                and up.slice.id in keys
                and _is_own(up, node.id, up.slice.id)
                and not _in_scope(up, parents)
                else None
            )
            if var_of.setdefault(node.id, var) != var:
                var_of[node.id] = None
            if up is not None:
                uses.setdefault(node.id, []).append(up)
    reads: dict[str, list[ast.Name]] = {}
    for stmt in body:
        for node in ast.walk(stmt):
            if isinstance(node, ast.Name) and isinstance(node.ctx, ast.Load):
                reads.setdefault(node.id, []).append(node)
    return {
        c: var
        for c, var in var_of.items()
        if var is not None and any(_changes(u, parents, dict(reads)) for u in uses[c])
    }


def own_subscripts(
    target: ast.expr,
    iterable: ast.expr,
    body: list[ast.stmt],
    shadowed: Callable[[str], bool],
) -> OwnSubscripts | None:
    """The loop with each container's own element ``C[k]`` an item of its
    own (``k`` a loop variable), or ``None`` where no container is used so.
    ``body`` is not changed (the rewrite is made on a copy)."""
    # (the iterable is evaluated once: iterspace.with_own_items draws its
    # items and reads each element; `zip` is the form classified)
    if not _names_only(target) or shadowed("zip"):
        return None
    bound = _bound(body)
    keys = {n.id for n in ast.walk(target) if isinstance(n, ast.Name)} - bound
    if _stores_outer(body, bound | keys):
        return None
    parents = _parents(body)
    found = {
        c: var
        for c, var in _own_uses(body, keys, parents).items()
        if c not in bound and c not in keys and not (c in _BUILTINS and not shadowed(c))
    }
    if not found:
        return None
    names = {c: f"__gpucell_own_{c}__" for c in sorted(found)}
    new_body = [copy_tree(s) for s in body]
    for stmt in new_body:
        for node in ast.walk(stmt):
            for field_name, value in ast.iter_fields(node):
                if isinstance(value, list):
                    for j, x in enumerate(value):
                        c = _own_of(x, found)
                        if c is not None:
                            value[j] = _load(names[c], x)
                else:
                    c = _own_of(value, found)
                    if c is not None:
                        setattr(node, field_name, _load(names[c], value))
    renamed = copy_tree(target)
    for n in ast.walk(renamed):
        if isinstance(n, ast.Name):
            n.id = f"__gpucell_key_{n.id}__"
    parts: list[ast.expr] = [copy_tree(iterable)]
    for c in names:
        parts.append(
            ast.ListComp(
                elt=ast.Subscript(
                    ast.Name(c, ast.Load()),
                    ast.Name(f"__gpucell_key_{found[c]}__", ast.Load()),
                    ast.Load(),
                ),
                generators=[
                    ast.comprehension(
                        target=copy_tree(renamed),
                        iter=copy_tree(iterable),
                        ifs=[],
                        is_async=0,
                    )
                ],
            )
        )
    # the form the analysis classifies; the kernel does not evaluate it (it
    # would read the iterable twice, and an iterator has no keys the second
    # time): it draws the elements from the items (iterspace.with_own_items)
    new_iter: ast.expr = ast.Call(
        ast.Name("zip", ast.Load()),
        parts,
        [ast.keyword("strict", ast.Constant(True))],
    )
    for n in ast.walk(new_iter):
        ast.copy_location(n, iterable)
    new_target: ast.expr = ast.Tuple(
        [copy_tree(target), *(ast.Name(n, ast.Store()) for n in names.values())],
        ast.Store(),
    )
    for n in ast.walk(new_target):
        if not hasattr(n, "lineno"):
            ast.copy_location(n, target)
    new_target = ast.fix_missing_locations(ast.copy_location(new_target, target))
    own_keys = {c: (found[c], _path_to(target, found[c])) for c in names}
    return OwnSubscripts(names, new_target, new_iter, new_body, own_keys)


def _path_to(target: ast.expr, var: str) -> tuple[int, ...]:
    """Where ``var`` is in an item unpacked into ``target`` (``()``: the
    item itself; ``(1, 0)``: ``k`` of ``i, (k, v)``)."""
    if isinstance(target, ast.Name):
        return ()
    assert isinstance(target, (ast.Tuple, ast.List))
    for j, e in enumerate(target.elts):
        if any(isinstance(n, ast.Name) and n.id == var for n in ast.walk(e)):
            return (j, *_path_to(e, var))
    raise ValueError(f"{var} is not in the loop's target")


#: what a loop's classification says: the names the engines would watch,
#: whether they watch every input, whether it is refused
Trial = tuple[set[str], bool, bool]


def chosen_own_subscripts(
    target: ast.expr,
    iterable: ast.expr,
    body: list[ast.stmt],
    shadowed: Callable[[str], bool],
    trial: Callable[[ast.expr, ast.expr, list[ast.stmt]], Trial],
) -> OwnSubscripts | None:
    """The loop with its own elements (:func:`own_subscripts`) where as
    written it is refused, or the engines would watch a container whose
    element it changes (the run would stop: "input changed"), and so it is
    not refused; else ``None`` (the loop runs, or is refused, as written)."""
    own = own_subscripts(target, iterable, body, shadowed)
    if own is None:
        return None
    watched, every, refused = trial(target, iterable, body)
    if not refused and not every and not set(own.names) & watched:
        return None
    return None if trial(own.target, own.iterable, own.body)[2] else own


_BUILTINS = frozenset(dir(builtins))


def _names_only(target: ast.expr) -> bool:
    if isinstance(target, ast.Name):
        return True
    if isinstance(target, (ast.Tuple, ast.List)):
        return all(_names_only(e) for e in target.elts)
    return False


def _own_of(node: object, found: dict[str, str]) -> str | None:
    if isinstance(node, ast.Subscript) and isinstance(node.value, ast.Name):
        c = node.value.id
        if c in found and _is_own(node, c, found[c]):
            return c
    return None


def _load(name: str, at: ast.AST) -> ast.Name:
    new = ast.Name(name, ast.Load())
    return ast.copy_location(new, at)
