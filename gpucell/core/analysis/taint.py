"""Alias taint: which of the body's names may hold an object from outside
the iteration (an input, an item of the loop's data), so that changing it in
place changes something the engines cannot send back."""

from __future__ import annotations

import ast
from collections.abc import Callable, Iterable, Iterator

from gpucell.core.analysis.scope import (
    COPYING_BUILTINS,
    root_name,
    target_names,
)

__all__ = []


#: calls that return their argument's memory as a numpy array, where writes
#: bump no tensor version counter (the engines' check of a tensor input):
#: ``t.numpy()``, ``np.asarray(t)``, ``torch.from_numpy(a)``
_SHARING_METHODS = frozenset({"numpy"})
_SHARING_FUNCTIONS = frozenset(
    {"asarray", "asanyarray", "ascontiguousarray", "from_numpy", "as_tensor",
     "frombuffer", "from_dlpack"}
)  # fmt: skip


def _alias_expr(e: ast.AST, is_outer: Callable[[str], bool]) -> bool:
    """Could evaluating ``e`` return an object from outside (not a new one)?"""
    if isinstance(e, (ast.Name, ast.Attribute, ast.Subscript, ast.Starred)):
        root = root_name(e)
        return root is not None and is_outer(root.id)
    if isinstance(e, ast.Call) and isinstance(e.func, ast.Attribute):
        if e.func.attr in _SHARING_METHODS and not e.args:
            return _alias_expr(e.func.value, is_outer)
        if e.func.attr in _SHARING_FUNCTIONS and e.args:
            return _alias_expr(e.args[0], is_outer)
    if isinstance(e, ast.IfExp):
        return _alias_expr(e.body, is_outer) or _alias_expr(e.orelse, is_outer)
    if isinstance(e, ast.BoolOp):
        return any(_alias_expr(v, is_outer) for v in e.values)
    if isinstance(e, (ast.Tuple, ast.List)):
        return any(_alias_expr(v, is_outer) for v in e.elts)
    if isinstance(e, ast.NamedExpr):
        return _alias_expr(e.value, is_outer)
    return False


def _mentions(e: ast.AST, is_outer: Callable[[str], bool]) -> bool:
    return any(
        isinstance(n, ast.Name) and isinstance(n.ctx, ast.Load) and is_outer(n.id)
        for n in ast.walk(e)
    )


#: builtins that consume their argument before the loop starts: a sink named in
#: them (``range(len(a))``) is read once, as serially, not iterated lazily
_EAGER = frozenset(
    {
        "len", "list", "tuple", "sorted", "set", "frozenset", "dict", "sum",
        "min", "max", "range",
    }
)  # fmt: skip


def _lazy_names(e: ast.AST, is_builtin: Callable[[str], bool]) -> Iterator[ast.Name]:
    """Names an iterable expression reads lazily (not inside an eager builtin)."""
    if (
        isinstance(e, ast.Call)
        and isinstance(e.func, ast.Name)
        and e.func.id in _EAGER
        and is_builtin(e.func.id)
    ):
        return
    if (
        isinstance(e, ast.Call)
        and isinstance(e.func, ast.Attribute)
        and e.func.attr in _COPYING_METHODS
    ):
        return  # a new object, made before the loop runs (its arguments too)
    if isinstance(e, ast.Name):
        yield e
        return
    if (
        isinstance(e, ast.Call)
        and isinstance(e.func, ast.Attribute)
        and e.func.attr in _SNAPSHOT_ITERATORS
    ):
        # the receiver is split when iteration starts, before the first
        # iteration runs; its arguments (`itertools.groupby(xs)`) are read lazily
        for arg in [*e.args, *(kw.value for kw in e.keywords)]:
            yield from _lazy_names(arg, is_builtin)
        return
    for child in ast.iter_child_nodes(e):
        yield from _lazy_names(child, is_builtin)


#: methods that return a new object (a copy, a sorted or filtered one): an
#: iterable made with one does not see what the body changes afterwards
_COPYING_METHODS = frozenset(
    {
        "copy",
        "sort_values",
        "sort_index",
        "drop_duplicates",
        "unique",
        "tolist",
        "to_list",
        "value_counts",
        "nlargest",
        "nsmallest",
    }
)


#: methods whose result, iterated, splits its receiver into new objects when
#: iteration starts: pandas' ``GroupBy.__iter__`` takes the frame's rows in
#: group order (``DataSplitter._sorted_data``, a copy, on the first ``next``)
#: and yields slices of that copy, so writes to the frame in the body are not
#: seen by later groups, serially as on the engines (the kernel lists the
#: groups before the loop)
_SNAPSHOT_ITERATORS = frozenset({"groupby"})


def _is_range(e: ast.AST, is_builtin: Callable[[str], bool]) -> bool:
    return (
        isinstance(e, ast.Call)
        and isinstance(e.func, ast.Name)
        and e.func.id == "range"
        and is_builtin("range")
    )


def _rebound(nodes: Iterable[ast.AST]) -> set[str]:
    """Names the body binds or deletes anywhere (a loop variable rebound is
    no longer surely the item: `row = template` then `row[k] = v`)."""
    out: set[str] = set()
    for node in nodes:
        # `row /= s`: in place for the arrays and lists it could change, a
        # new value (never an outer object) for the rest
        aug = {id(a.target) for a in ast.walk(node) if isinstance(a, ast.AugAssign)}
        for sub in ast.walk(node):
            if id(sub) in aug:
                continue
            if isinstance(sub, ast.Name) and not isinstance(sub.ctx, ast.Load):
                out.add(sub.id)
            elif isinstance(sub, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                out.add(sub.name)
            elif isinstance(sub, ast.arg):
                out.add(sub.arg)
            elif isinstance(sub, ast.ExceptHandler) and sub.name:
                out.add(sub.name)
            elif isinstance(sub, (ast.Import, ast.ImportFrom)):
                out |= {(a.asname or a.name).split(".")[0] for a in sub.names}
            elif isinstance(sub, (ast.Global, ast.Nonlocal)):
                out |= set(sub.names)
            elif isinstance(sub, ast.MatchAs) and sub.name:
                out.add(sub.name)
            elif isinstance(sub, ast.MatchStar) and sub.name:
                out.add(sub.name)
            elif isinstance(sub, ast.MatchMapping) and sub.rest:
                out.add(sub.rest)
    return out


def _target_taint(
    target: ast.expr, it: ast.expr, is_builtin: Callable[[str], bool]
) -> tuple[set[str], bool]:
    """Names of a loop target that may hold objects from the iterable.

    Returns (names, decided). Items of ``range`` are ints; ``enumerate``'s index is
    an int; everything else may be an element of outer data.
    """
    if _is_range(it, is_builtin):
        return set(), True
    if (
        isinstance(it, ast.Call)
        and isinstance(it.func, ast.Name)
        and it.func.id == "enumerate"
        and is_builtin("enumerate")
        and it.args
        and isinstance(target, (ast.Tuple, ast.List))
        and len(target.elts) == 2
    ):
        return _target_taint(target.elts[1], it.args[0], is_builtin)
    if (
        isinstance(it, ast.Call)
        and isinstance(it.func, ast.Name)
        and it.func.id == "zip"
        and is_builtin("zip")
        and isinstance(target, (ast.Tuple, ast.List))
        and len(target.elts) == len(it.args)
        and not it.keywords
    ):
        out: set[str] = set()
        for t, a in zip(target.elts, it.args, strict=True):
            out |= _target_taint(t, a, is_builtin)[0]
        return out, True
    return {n.id for n in target_names(target)}, False


def _new_container(e: ast.expr, is_builtin: Callable[[str], bool]) -> bool:
    """Does ``e`` make a new container whose items may be objects from
    elsewhere (``[prio, name]``, ``{"v": item}``, ``[p for p in ps]``,
    ``dict(base)``, ``base.copy()``)?  Changing the container itself changes
    nothing else; changing what it holds (``rec["v"].append(x)``) may."""
    if isinstance(e, (ast.List, ast.Tuple, ast.Set, ast.Dict)):
        return True
    if isinstance(e, (ast.ListComp, ast.SetComp, ast.DictComp)):
        return True
    if not isinstance(e, ast.Call):
        return False
    f = e.func
    if isinstance(f, ast.Name):
        return f.id in COPYING_BUILTINS and is_builtin(f.id)
    # `base.copy()`, `copy.copy(base)` (not `deepcopy`)
    return isinstance(f, ast.Attribute) and f.attr == "copy" and len(e.args) <= 1


def _holds_outer(e: ast.expr, is_outer: Callable[[str], bool]) -> bool:
    """May the new container ``e`` makes hold an object from outside?  A
    display's items as themselves (``[prio, name]``: if ``name`` may be one;
    ``[x + 1]``: a new number), a comprehension's or a copy's anything they
    read."""
    if isinstance(e, (ast.List, ast.Tuple, ast.Set)):
        return any(_alias_expr(x, is_outer) for x in e.elts)
    if isinstance(e, ast.Dict):
        parts = [*(k for k in e.keys if k is not None), *e.values]
        return any(_alias_expr(x, is_outer) for x in parts)
    if isinstance(e, (ast.ListComp, ast.SetComp, ast.DictComp)):
        # (`[p for p in ps]` holds ps' items, `[p.copy() for p in ps]` new ones)
        drawn: set[str] = set()

        def outer(n: str) -> bool:
            return is_outer(n) or n in drawn

        for g in e.generators:
            if _mentions(g.iter, outer):
                drawn |= {n.id for n in target_names(g.target)}

        parts = [e.key, e.value] if isinstance(e, ast.DictComp) else [e.elt]
        return any(_alias_expr(x, outer) for x in parts)
    return _mentions(e, is_outer)


#: methods that put their argument into their object (``extend``,
#: ``update``: the items of their argument)
_PUTS = frozenset({"append", "add", "insert", "appendleft", "setdefault"})
_PUTS_ITEMS = frozenset({"extend", "update", "extendleft"})


def _stores_into(node: ast.AST) -> tuple[str, ast.expr, str] | None:
    """``N[k] = e``, ``N.a = e``, ``N.append(e)``, ``N += e``, ``N.update(e)``:
    (``N``, ``e``, the kind of binding: "alias" where ``e`` itself is put,
    "holds" where its items are)."""
    if isinstance(node, ast.Assign):
        for t in node.targets:
            if isinstance(t, (ast.Subscript, ast.Attribute)) and isinstance(
                t.value, ast.Name
            ):
                return t.value.id, node.value, "alias"
    elif (
        isinstance(node, ast.AugAssign)
        and isinstance(node.target, ast.Name)
        and isinstance(node.value, (ast.List, ast.Tuple, ast.ListComp))
    ):  # `acc += [item]` (`total += x` makes a new number)
        return node.target.id, node.value, "holds"
    elif (
        isinstance(node, ast.Call)
        and isinstance(node.func, ast.Attribute)
        and isinstance(node.func.value, ast.Name)
        and node.args
    ):
        attr, owner = node.func.attr, node.func.value.id
        if attr in _PUTS:
            return owner, node.args[-1], "alias"
        if attr in _PUTS_ITEMS:
            return owner, ast.List(list(node.args), ast.Load()), "holds"
    return None


def _alias_taint(
    stmts: list[ast.stmt],
    nodes: list[ast.AST],
    loop_target: ast.expr,
    loop_iter: ast.expr | None,
    body_bound: set[str],
    is_builtin: Callable[[str], bool],
) -> tuple[set[str], set[str]]:
    """Locals of the body that may hold objects from outside the iteration:
    the loop's targets (but ``range``'s and ``enumerate``'s numbers) and
    what is bound from them or from names outside the body, to a fixpoint;
    and those of them that are only new containers of such objects
    (:func:`_new_container`, or what objects from outside are put into:
    ``rec["v"] = outer``, ``o.v = outer``, ``rows.append(item)``), which the
    body may change themselves, but not what they hold."""

    def is_outer(n: str) -> bool:
        return (n not in body_bound and not is_builtin(n)) or n in tainted

    itself: set[str] = set()  # may be an object from outside
    holding: set[str] = set()  # may hold one
    if loop_iter is not None:
        names, _ = _target_taint(loop_target, loop_iter, is_builtin)
        itself |= names
    # (kind, expression, names it binds, whether the names hold what it
    # gives rather than are it) for every binding that may alias
    aliasing: list[tuple[str, ast.expr, set[str], bool]] = []
    for s in stmts:
        if (
            isinstance(s, ast.Assign)
            and len(s.targets) == 1
            and isinstance(s.targets[0], ast.Name)
            and _new_container(s.value, is_builtin)
        ):
            aliasing.append(("holds", s.value, {s.targets[0].id}, True))
        elif isinstance(s, ast.Assign):
            names = {n.id for t in s.targets for n in target_names(t)}
            aliasing.append(("alias", s.value, names, False))
        elif isinstance(s, (ast.For, ast.AsyncFor)) and not _is_range(
            s.iter, is_builtin
        ):
            names = {n.id for n in target_names(s.target)}
            aliasing.append(("mentions", s.iter, names, False))
        elif isinstance(s, (ast.With, ast.AsyncWith)):
            for item in s.items:
                if item.optional_vars is not None:
                    names = {n.id for n in target_names(item.optional_vars)}
                    aliasing.append(("alias", item.context_expr, names, False))
    for node in nodes:
        if isinstance(node, ast.NamedExpr):
            aliasing.append(("alias", node.value, {node.target.id}, False))
        elif (put := _stores_into(node)) is not None and put[0] in body_bound:
            aliasing.append((put[2], put[1], {put[0]}, True))
    tainted = itself
    for _ in range(len(aliasing) + 1):
        before = len(itself) + len(holding)
        for kind, e, names, holds in aliasing:
            if names <= (holding if holds else itself):
                continue
            if kind == "alias":
                hit = _alias_expr(e, is_outer)
            elif kind == "holds":
                hit = _holds_outer(e, is_outer)
            else:
                hit = _mentions(e, is_outer)
            if hit:
                (holding if holds else itself).update(names)
        tainted = itself | holding
        if len(itself) + len(holding) == before:
            break
    tainted = (itself | holding) & body_bound
    return tainted, (holding - itself) & body_bound


def _reaches_part(e: ast.expr, items: set[str], calls: bool) -> bool:
    """Does ``e`` read a part of an item: the item's name, its attributes,
    its elements at constant keys, and (``calls``: a nested loop's iterable)
    its methods called with constants (``m.backbone.parameters()``)?"""
    while True:
        if isinstance(e, ast.Name):
            return e.id in items
        if isinstance(e, ast.Attribute):
            e = e.value
        elif isinstance(e, ast.Subscript) and isinstance(e.slice, ast.Constant):
            e = e.value
        elif (
            calls
            and isinstance(e, ast.Call)
            and isinstance(e.func, ast.Attribute)
            and all(isinstance(a, ast.Constant) for a in e.args)
            and all(isinstance(k.value, ast.Constant) for k in e.keywords)
        ):
            e = e.func.value
        else:
            return False


def _item_parts(body: list[ast.stmt], items: set[str]) -> set[str]:
    """``items`` and the body's names for parts of them: a name every
    binding of which is ``x = m`` or ``x = m.encoder`` (an alias), or a nested
    loop's variable over the item's parts (``for p in m.parameters()``), to
    a fixpoint.  A change through one is a change to the item (written
    back, or refused unmerged at run time, as the item's own)."""
    nodes = [n for s in body for n in ast.walk(s)]
    # (a comprehension's variables are its own: `[p for p in m.parameters()]`)
    comp = {
        id(t)
        for n in nodes
        if isinstance(n, ast.comprehension)
        for t in ast.walk(n.target)
    }
    stored: dict[str, list[int]] = {}
    for n in nodes:
        if (
            isinstance(n, ast.Name)
            and not isinstance(n.ctx, ast.Load)
            and id(n) not in comp
        ):
            stored.setdefault(n.id, []).append(id(n))
    other = _rebound(n for n in nodes if not isinstance(n, ast.Name)) - {
        # (`_rebound` of a statement walks its Names too: only what no
        # plain name binding explains, a def, an argument, an import...)
        n.id
        for n in nodes
        if isinstance(n, ast.Name)
    }
    parts = set(items)
    while True:
        good: set[int] = set()
        for n in nodes:
            if (
                isinstance(n, ast.Assign)
                and len(n.targets) == 1
                and isinstance(n.targets[0], ast.Name)
                and _reaches_part(n.value, parts, calls=False)
            ):
                good.add(id(n.targets[0]))
            elif isinstance(n, (ast.For, ast.AsyncFor)) and _reaches_part(
                n.iter, parts, calls=True
            ):
                good |= {id(t) for t in target_names(n.target)}
        found = items | {
            name
            for name, ids in stored.items()
            if name not in other and all(i in good for i in ids)
        }
        if found == parts:
            return parts
        parts = found
