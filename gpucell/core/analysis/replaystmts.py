"""Statements that only change a container from before the loop, replayed
on the kernel in iteration order: ``index.setdefault(w, set()).add(i)``,
``index[w].add(i)`` (keys that may repeat), ``pivot[s][b] += u``,
``grid[r][c] = v``, ``budget.subtract(c)``, ``heapq.heappush(heap, item)``,
``bisect.insort(xs, v)``.

Each such statement reads the container's state so far, so no engine can run
it; but its effect depends only on that state and on values the iteration
computes.  Where the body uses the container ``T`` in such statements only
(never reads it otherwise), an engine evaluates the values (the statement's
parts that do not involve ``T``: the "holes"), keeps them (a value the
statement stores as itself; one it reads, as it is now) and gathers
``(statement number, values)`` under a hidden name; the merge runs each
statement's template (``T`` and the holes as parameters) on the kernel's
``T`` in iteration order (``core/merge_replays.merge_replayed_statements``).

Tried before the own-item and sink readings (driver.analyse): the forms the
sinks already merge (``S.add(e)``, ``L.append(e)``, ``D[k] += e``,
``D[k].append(e)``) are left to them.
"""

from __future__ import annotations

import ast
from collections.abc import Callable
from dataclasses import dataclass, field

from gpucell.core.analysis.replays import concat_helper, name_uses
from gpucell.core.analysis.scope import ACCESSORS, COPYING_BUILTINS, scope_bindings
from gpucell.core.analysis.spellbase import _blocks, _pure, _reads
from gpucell.core.progressbars import DRAWING_METHODS, PROGRESS_METHODS

__all__ = [
    "LIBRARY_FUNCTIONS",
    "Replayed",
    "replay_loop_statements",
    "replay_statements",
]

#: methods that change their object and return nothing the body uses
MUTATORS = frozenset(
    {
        "add", "update", "discard", "subtract", "append", "extend", "insert",
        "appendleft", "extendleft", "setdefault",
    }
) | PROGRESS_METHODS  # fmt: skip
#: a list's growth, whose keyed forms (`D[k].append(e)`, through
#: `setdefault(k, [])` too) are keyed gathers: replayed only where the loop
#: is refused otherwise
_GROWTH = frozenset({"append", "extend"})
#: functions that change their first argument, by module (checked by
#: identity at the merge)
LIBRARY_FUNCTIONS: dict[str, tuple[str, ...]] = {
    "heapq": ("heappush", "heappushpop", "heapreplace"),
    "bisect": ("insort", "insort_left", "insort_right"),
}
FUNCTIONS = frozenset(n for ns in LIBRARY_FUNCTIONS.values() for n in ns)
#: what the sinks already merge on ``T`` itself
_SINK_METHODS = frozenset({"add", "update", "append", "extend"})
#: builtins a template may call on ``T`` (on the kernel, as serially)
_PURE_CALLS = frozenset({"len", "min", "max", "abs", "round"})
#: methods that keep their arguments themselves (the others read them)
_STORING = frozenset({"add", "append", "appendleft", "insert", "setdefault"})
#: methods a template may call on what ``T`` holds, to read it (on the
#: kernel, as serially): a mapping's ``get``
_READING_METHODS = frozenset({"get"})


@dataclass(eq=False)
class Replayed:
    """One container's replayed statements."""

    target: str
    # statement number -> the template, a function of (T, *holes), as source
    templates: dict[int, str] = field(default_factory=dict)
    # statement numbers whose first hole is a function (heapq.heappush)
    function_first: set[int] = field(default_factory=set)
    # statement numbers that call a method of T or of its items
    method_calls: set[int] = field(default_factory=set)
    # statement number -> the method it calls
    methods: dict[int, str] = field(default_factory=dict)
    # a method call's object, where T's attributes reach it (`res.scores`:
    # ("scores",); () for T itself; None through items): checked by type
    owners: dict[int, tuple[str, ...] | None] = field(default_factory=dict)
    # statement numbers that rebind T (`mean = mean + (x - mean) / n`): the
    # template returns T's new value
    rebinds: set[int] = field(default_factory=set)
    lines: dict[int, int] = field(default_factory=dict)


#: a statement found for a name: its block, index, template, holes and
#: whether the first hole is the function called
_Found = tuple[list[ast.stmt], int, ast.stmt, list[tuple[ast.expr, bool]], bool]


class _NotReplayable(Exception):
    pass


class _Template:
    """Builds a statement's template, the holes replaced by parameters."""

    def __init__(self, target: str) -> None:
        self.target = target
        self.holes: list[ast.expr] = []
        # per hole: stored by the statement (a reference, as serially: later
        # changes to the object in the iteration show through), or read
        # there and then (a shallow copy, iterators drawn)
        self.stored: list[bool] = []
        # `res.scores.append(x)`: reached through T's attributes too
        self.attributes = False
        # inside a branch serially evaluated only sometimes (`a if c else b`,
        # `a or b`): a hole there is evaluated always, so it must be pure
        self.lazy = 0

    def hole(self, e: ast.expr, stored: bool = False) -> ast.expr:
        if _reads(e, self.target) or isinstance(e, ast.Starred):
            raise _NotReplayable
        if self.lazy and not _pure(e, lambda _name: False):
            raise _NotReplayable
        self.holes.append(e)
        self.stored.append(stored)
        return ast.Name(f"__h{len(self.holes) - 1}__", ast.Load())

    def pairs(self) -> list[tuple[ast.expr, bool]]:
        """Each hole with whether the statement keeps it (see ``stored``)."""
        return list(zip(self.holes, self.stored, strict=True))

    def value(self, e: ast.expr) -> ast.expr:
        """``e`` as a template: what reads ``T`` kept (pure operations on it,
        made on the kernel as serially), what does not a hole (constants
        inline)."""
        if not _reads(e, self.target):
            return e if isinstance(e, ast.Constant) else self.hole(e)
        v = self.value
        if isinstance(e, ast.Name):
            return ast.Name("__T__", ast.Load())
        if isinstance(e, ast.BinOp):
            return ast.BinOp(v(e.left), e.op, v(e.right))
        if isinstance(e, ast.UnaryOp):
            return ast.UnaryOp(e.op, v(e.operand))
        if isinstance(e, ast.Compare):
            return ast.Compare(v(e.left), e.ops, [v(c) for c in e.comparators])
        if isinstance(e, ast.Tuple) and isinstance(e.ctx, ast.Load):
            return ast.Tuple([v(x) for x in e.elts], ast.Load())
        if isinstance(e, ast.Attribute) and isinstance(e.ctx, ast.Load):
            return ast.Attribute(v(e.value), e.attr, ast.Load())
        if isinstance(e, ast.Subscript) and isinstance(e.ctx, ast.Load):
            return ast.Subscript(v(e.value), v(e.slice), ast.Load())
        if (
            isinstance(e, ast.Call)
            and isinstance(e.func, ast.Name)
            and e.func.id in _PURE_CALLS
            and not e.keywords
        ):
            # (the function itself a hole: where the notebook shadows `max`,
            # the kernel must call the notebook's, as the serial loop does)
            fn = self.hole(e.func, True)
            return ast.Call(fn, [v(a) for a in e.args], [])
        if (
            isinstance(e, ast.Call)
            and isinstance(e.func, ast.Attribute)
            and e.func.attr in _READING_METHODS
            and _reads(e.func.value, self.target)
            and not e.keywords
            and 1 <= len(e.args) <= 2
        ):  # `T[a].get(b, 0)`
            owner = v(e.func.value)
            return ast.Call(
                ast.Attribute(owner, e.func.attr, ast.Load()),
                [v(a) for a in e.args],
                [],
            )
        if isinstance(e, (ast.IfExp, ast.BoolOp)):
            if isinstance(e, ast.IfExp):
                test = v(e.test)
                self.lazy += 1
                out: ast.expr = ast.IfExp(test, v(e.body), v(e.orelse))
            else:
                first = v(e.values[0])
                self.lazy += 1
                out = ast.BoolOp(e.op, [first, *(v(x) for x in e.values[1:])])
            self.lazy -= 1
            return out
        raise _NotReplayable

    def key(self, e: ast.expr) -> ast.expr:
        """A subscript's key: a hole, or (``df.loc[len(df)] = row``) a pure
        expression of ``T``, evaluated on the kernel as serially."""
        return self.value(e) if _reads(e, self.target) else self.hole(e, True)

    def spine(self, e: ast.expr) -> tuple[ast.expr, int]:
        """``e`` (which holds ``T``) as a template, and how deep below ``T``."""
        if isinstance(e, ast.Name) and e.id == self.target:
            return ast.Name("__T__", ast.Load()), 0
        if isinstance(e, ast.Subscript) and isinstance(e.ctx, ast.Load):
            inner, depth = self.spine(e.value)
            return ast.Subscript(inner, self.key(e.slice), ast.Load()), depth + 1
        if isinstance(e, ast.Attribute) and isinstance(e.ctx, ast.Load):
            if e.attr in ACCESSORS:
                inner, depth = self.spine(e.value)
                return ast.Attribute(inner, e.attr, ast.Load()), depth
            if self.attributes:  # `res.scores.append(x)`: an object T holds
                inner, depth = self.spine(e.value)
                return ast.Attribute(inner, e.attr, ast.Load()), depth + 1
        if (
            isinstance(e, ast.Call)
            and isinstance(e.func, ast.Attribute)
            and e.func.attr == "setdefault"
            and len(e.args) == 2
            and not e.keywords
        ):
            inner, depth = self.spine(e.func.value)
            args = [self.hole(a, True) for a in e.args]
            return ast.Call(ast.Attribute(inner, "setdefault", ast.Load()), args, []), (
                depth + 1
            )
        raise _NotReplayable


def _template(
    s: ast.stmt, target: str, nested_items: bool, sinks_too: bool = False
) -> tuple[ast.stmt, list[tuple[ast.expr, bool]], bool]:
    """The statement's template over ``__T__`` and ``__hN__``, its holes, and
    whether the first hole is the function called; raises _NotReplayable.
    ``nested_items``: also ``T[a][b] op= e`` and ``T[a][b] = e``."""
    t = _Template(target)
    t.attributes = nested_items
    if isinstance(s, ast.Expr) and isinstance(s.value, ast.Call):
        call = s.value
        f = call.func
        if call.keywords and any(k.arg is None for k in call.keywords):
            raise _NotReplayable
        if (
            isinstance(f, ast.Attribute)
            and f.attr in MUTATORS
            and _reads(f.value, target)
        ):
            inner, depth = t.spine(f.value)
            if depth == 0 and f.attr in _SINK_METHODS and call.args and not sinks_too:
                raise _NotReplayable  # a gather or a union (unless mixed)
            if not nested_items and f.attr in _GROWTH:
                raise _NotReplayable
            if (
                depth == 1
                and f.attr in ("append", "extend")
                and isinstance(f.value, ast.Subscript)
            ):
                raise _NotReplayable  # a keyed gather
            keeps = f.attr in _STORING
            args = [t.hole(a, keeps) for a in call.args]
            kws = [ast.keyword(k.arg, t.hole(k.value, keeps)) for k in call.keywords]
            new = ast.Call(ast.Attribute(inner, f.attr, ast.Load()), args, kws)
            return ast.Expr(new), t.pairs(), False
        name = f.attr if isinstance(f, ast.Attribute) else getattr(f, "id", None)
        if name in FUNCTIONS and call.args and _reads(call.args[0], target):
            fn = t.hole(f, True)
            inner, _depth = t.spine(call.args[0])
            rest = [t.hole(a, True) for a in call.args[1:]]
            if call.keywords:
                raise _NotReplayable
            return ast.Expr(ast.Call(fn, [inner, *rest], [])), t.pairs(), True
        raise _NotReplayable
    if nested_items and isinstance(s, (ast.AugAssign, ast.Assign)):
        tgt: ast.expr | None = s.target if isinstance(s, ast.AugAssign) else None
        if isinstance(s, ast.Assign) and len(s.targets) == 1:
            tgt = s.targets[0]
        if (
            isinstance(s, ast.Assign)
            and isinstance(tgt, ast.Name)
            and tgt.id == target
            and _reads(s.value, target)
        ):  # `mean = mean + (x - mean) / n`: the new value, made on the kernel
            return ast.Return(t.value(s.value)), t.pairs(), False
        if not (isinstance(tgt, ast.Subscript) and _reads(tgt, target)):
            raise _NotReplayable
        inner, depth = t.spine(tgt.value)
        if depth == 0 and not _reads(tgt.slice, target):
            raise _NotReplayable  # `D[k] op= e`, `D[k] = e`: the sinks' own
        key = t.key(tgt.slice)
        # (`T[a][b] = v` keeps v itself; pandas' indexers and `+=` read it)
        through = isinstance(tgt.value, ast.Attribute) and tgt.value.attr in ACCESSORS
        if isinstance(s, ast.Assign) and _reads(s.value, target):
            value = t.value(s.value)  # `T[a][b] = T[a].get(b, 0) + 1`
        else:
            value = t.hole(s.value, isinstance(s, ast.Assign) and not through)
        store = ast.Subscript(inner, key, ast.Store())
        if isinstance(s, ast.AugAssign):
            return ast.AugAssign(store, s.op, value), t.pairs(), False
        return ast.Assign([store], value), t.pairs(), False
    raise _NotReplayable


def replay_statements(
    body: list[ast.stmt],
    excluded: set[str],
    bound: set[str],
    nested_items: bool = False,
) -> dict[str, Replayed]:
    """Rewrite, in place, the statements of each container the body only
    changes by replayable statements; return hidden name -> what the merge
    replays.  ``excluded``: the loop's variables and its iterable's names;
    ``bound``: names the body binds (not containers from before the loop).
    ``nested_items`` (tried only where the loop is refused otherwise: a
    nested own row is written back in place, numpy arrays included): also
    ``T[a][b] op= e`` and ``T[a][b] = e``."""
    uses = name_uses(body)
    found: dict[str, list[_Found]]
    found = {}
    sink_forms: set[int] = set()  # (`S.add(e)`, `S.update(...)`: the sinks')
    statements: list[tuple[list[ast.stmt], int]] = []
    _blocks(
        body, lambda stmts: statements.extend((stmts, i) for i in range(len(stmts)))
    )
    for block, i in statements:
        s = block[i]
        rebound = _rebound_name(s) if nested_items else None
        names = {
            n.id
            for n in ast.walk(s)
            if isinstance(n, ast.Name)
            and n.id not in excluded
            and (n.id not in bound or n.id == rebound)
        }
        for name in names:
            try:
                tpl, holes, fn_first = _template(s, name, nested_items, True)
            except _NotReplayable:
                continue
            found.setdefault(name, []).append((block, i, tpl, holes, fn_first))
            if _sink_form(s, name, nested_items):
                sink_forms.add(id(s))
    out: dict[str, Replayed] = {}
    for name, stmts in sorted(found.items()):
        if sum(_count(s[0][s[1]], name) for s in stmts) != uses.get(name):
            continue  # read elsewhere too: the state so far would be seen
        if all(id(s[0][s[1]]) in sink_forms for s in stmts):
            continue  # a gather or a union: the sinks merge it
        kinds = {isinstance(s[2], ast.Return) for s in stmts}
        if len(kinds) > 1 or (True in kinds and name not in bound):
            continue  # rebound and changed in place: one or the other
        hidden = f"__gpucell_rp_{name}__"
        rep = Replayed(name)
        for k, (block, i, tpl, holes, fn_first) in enumerate(stmts):
            old = block[i]
            rep.templates[k] = _function_source(tpl, len(holes))
            rep.lines[k] = old.lineno
            if fn_first:
                rep.function_first.add(k)
            elif isinstance(tpl, ast.Return):
                rep.rebinds.add(k)
            elif isinstance(tpl, ast.Expr):
                rep.method_calls.add(k)
                rep.owners[k] = _attribute_path(tpl)
                assert isinstance(tpl.value, ast.Call)
                assert isinstance(tpl.value.func, ast.Attribute)
                rep.methods[k] = tpl.value.func.attr
            block[i] = _recording(old, hidden, k, holes)
        out[hidden] = rep
    return out


def replay_loop_statements(
    body: list[ast.stmt],
    target: ast.expr,
    iterable: ast.expr | None,
    nested_items: bool = False,
    is_builtin: Callable[[str], bool] | None = None,
) -> dict[str, Replayed]:
    """:func:`replay_statements` for a loop: never its variables or what its
    iterable reads as it goes, never a name the body binds (but a
    rebinding's own)."""
    live = _live_part(iterable, is_builtin or (lambda _name: False))
    loop = ast.Tuple([target, live], ast.Load())
    excluded = {n.id for n in ast.walk(loop) if isinstance(n, ast.Name)}
    # (`for s in pbar: pbar.set_postfix(...)`: a bar's drawing changes nothing
    # the iteration draws; the kernel checks it is a progress bar)
    uses = name_uses(body)
    excluded -= {
        n for n in excluded if n in uses and _drawing_calls(body, n) == uses[n]
    }
    return replay_statements(body, excluded, scope_bindings(list(body)), nested_items)


def _drawing_calls(body: list[ast.stmt], name: str) -> int:
    """How many statements of the body are ``name.set_postfix(...)`` and the
    like (``DRAWING_METHODS``)."""
    return sum(
        isinstance(s, ast.Expr)
        and isinstance(s.value, ast.Call)
        and isinstance(s.value.func, ast.Attribute)
        and s.value.func.attr in DRAWING_METHODS
        and isinstance(s.value.func.value, ast.Name)
        and s.value.func.value.id == name
        and _count(s, name) == 1
        for st in body
        for s in ast.walk(st)
        if isinstance(s, ast.stmt)
    )


def _live_part(
    iterable: ast.expr | None, is_builtin: Callable[[str], bool]
) -> ast.expr:
    """The part of the loop's iterable the iteration reads as it goes: none of
    ``list(index)`` or ``sorted(d.items())`` (copied whole before the first
    iteration, so the body may change ``index``), all of ``index`` or
    ``index.keys()`` (serially their later items see the body's changes).
    ``is_builtin``: whether a name means the builtin (not the notebook's)."""
    if iterable is None:
        return ast.Tuple([], ast.Load())
    if (
        isinstance(iterable, ast.Call)
        and isinstance(iterable.func, ast.Name)
        and iterable.func.id in COPYING_BUILTINS
        and is_builtin(iterable.func.id)
        and len(iterable.args) == 1
        and not isinstance(iterable.args[0], ast.Starred)
        and all(k.arg == "key" or k.arg == "reverse" for k in iterable.keywords)
    ):
        # (`key=` may read a name as it goes: it stays live)
        keys = [k.value for k in iterable.keywords]
        return ast.Tuple([iterable.func, *keys], ast.Load())
    return iterable


def _attribute_path(tpl: ast.stmt) -> tuple[str, ...] | None:
    """The attributes from ``T`` to the object whose method the template
    calls (``__T__.scores.append(...)``: ``("scores",)``), None where an item
    is on the way."""
    assert isinstance(tpl, ast.Expr) and isinstance(tpl.value, ast.Call)
    f = tpl.value.func
    assert isinstance(f, ast.Attribute)
    node, path = f.value, []
    while isinstance(node, ast.Attribute):
        path.append(node.attr)
        node = node.value
    return tuple(reversed(path)) if isinstance(node, ast.Name) else None


def _sink_form(s: ast.stmt, name: str, nested_items: bool) -> bool:
    """A statement the sinks merge by themselves (``S.add(e)``), replayed
    only beside another change to ``S`` (``S.subtract(...)``)."""
    try:
        _template(s, name, nested_items)
    except _NotReplayable:
        return True
    return False


def _rebound_name(s: ast.stmt) -> str | None:
    """``x`` of ``x = ...`` (a name the body binds, replayed as a rebinding)."""
    if (
        isinstance(s, ast.Assign)
        and len(s.targets) == 1
        and isinstance(s.targets[0], ast.Name)
    ):
        return s.targets[0].id
    return None


def _count(s: ast.stmt, name: str) -> int:
    return sum(isinstance(n, ast.Name) and n.id == name for n in ast.walk(s))


def _function_source(tpl: ast.stmt, holes: int) -> str:
    params = ["__T__", *(f"__h{j}__" for j in range(holes))]
    fn = ast.FunctionDef(
        name="__gpucell_replay__",
        args=ast.arguments(
            posonlyargs=[],
            args=[ast.arg(p) for p in params],
            kwonlyargs=[],
            kw_defaults=[],
            defaults=[],
        ),
        body=[tpl],
        decorator_list=[],
    )
    return ast.unparse(ast.fix_missing_locations(ast.Module([fn], [])))


def _recording(
    old: ast.stmt, hidden: str, k: int, holes: list[tuple[ast.expr, bool]]
) -> ast.stmt:
    """``__gpucell_rp_T__.append((k, (h0, read_now(h1), ...)))``: a value the
    statement keeps as itself, one it reads as it is now."""
    read = concat_helper("read_now")
    values = [e if stored else ast.Call(read, [e], []) for e, stored in holes]
    entry = ast.Tuple(
        elts=[ast.Constant(k), ast.Tuple(elts=values, ctx=ast.Load())], ctx=ast.Load()
    )
    append = ast.Attribute(ast.Name(hidden, ast.Load()), "append", ast.Load())
    new = ast.Expr(ast.Call(append, [entry], []))
    for node in ast.walk(new):
        if not hasattr(node, "lineno"):
            ast.copy_location(node, old)
    return new
