"""Build the engine-side chunk program by rewriting the loop body's AST.

The program runs on an engine in a fresh namespace holding the inputs, the
recorder ``__gpucell_rec__`` and the chunk's items ``__gpucell_items__``::

    __gpucell_rec__.setup({...})                      # names and operators
    for __gpucell_i__, <target> in __gpucell_items__:
        __gpucell_begin__(__gpucell_i__, __gpucell_now__())
        <body, with sink patterns replaced by recorder calls>

The names the loop calls per iteration are bound by the recorder's ``setup`` to
C-level callables where it can (``dict.__setitem__``, ``list.append``,
``time.time``): the per-iteration cost of a trivial body is then a few tens of
nanoseconds, not a few Python calls.  Only a body that ``del``-etes a local keeps
a ``try/finally: __gpucell_rec__.end(__gpucell_i__)`` after each iteration, to
see the deletion.

Sink patterns (``L.append(e)``, ``D[k] = e``, ``acc += e``...) become recorder calls
so the engine never changes a shipped object in place. Every original node keeps
its line numbers, so a remote traceback points at the user's cell lines.
"""

from __future__ import annotations

import ast
from collections.abc import Collection, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, cast

from gpucell.core.analysis.ownrows import OwnRow
from gpucell.core.analysis.scope import indexer_write, target_parts
from gpucell.core.astcopy import copy_tree
from gpucell.protocol.program import (
    AS_DEVICE,
    BEGIN,
    DEVICE,
    INDEX,
    ITEMS,
    NATIVE_REDUCTIONS,
    NOW,
    REC,
    Method,
    Spec,
    gather_name,
    is_cuda_device,
    own_keys_name,
    own_name,
    partial_name,
)

__all__ = ["ProgramPlan", "build_program", "rewrite_cuda"]


def _rec_call(method: str, args: list[ast.expr], loc: ast.AST) -> ast.Expr:
    call = ast.Call(
        func=ast.Attribute(ast.Name(REC, ast.Load()), method, ast.Load()),
        args=args,
        keywords=[],
    )
    stmt = ast.Expr(call)
    ast.copy_location(call, loc)
    ast.copy_location(call.func, loc)
    ast.copy_location(call.func.value, loc)  # type: ignore[attr-defined]
    return ast.copy_location(stmt, loc)


def _plain(call: ast.Call) -> bool:
    """One positional argument, nothing starred: the shape ``list.append`` takes."""
    return (
        len(call.args) == 1
        and not call.keywords
        and not isinstance(call.args[0], ast.Starred)
    )


_BINOPS: dict[str, type[ast.operator]] = {
    "+": ast.Add,
    "*": ast.Mult,
    "|": ast.BitOr,
    "&": ast.BitAnd,
    "^": ast.BitXor,
}


def _const(value: Any, loc: ast.AST) -> ast.expr:
    return ast.copy_location(ast.Constant(value), loc)


class _SinkRewriter:
    """Replace sink patterns with recorder calls; leave everything else alone.

    Sink patterns are statements, so only statement lists are walked (not every
    expression, which is what makes ``ast.NodeTransformer`` slow on long cells).
    """

    def __init__(
        self,
        *,
        gathers: Iterable[str],
        writes: Iterable[str],
        reductions: Iterable[str],
        keyed: Iterable[str],
        unions: Iterable[str],
        deleted: Iterable[str],
        keyed_gathers: Iterable[str] = (),
    ) -> None:
        self.keyed_gathers = set(keyed_gathers)
        self.gathers = set(gathers)
        self.writes = set(writes)
        self.reductions = set(reductions)
        self.keyed = set(keyed)
        self.unions = set(unions)
        self.deleted = set(deleted)
        self.reduction_ops: Mapping[str, str] = {}
        self._tmp = 0

    def block(self, stmts: list[ast.stmt]) -> list[ast.stmt]:
        out: list[ast.stmt] = []
        for s in stmts:
            r = self.stmt(s)
            if isinstance(r, list):
                out.extend(r)
            else:
                out.append(r)
        return out

    def stmt(self, s: ast.stmt) -> Any:
        # nested scopes hold no sink patterns (the classifier refused them)
        if isinstance(s, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            return s
        handler = getattr(self, "visit_" + type(s).__name__, None)
        if handler is not None:
            r = handler(s)
            if r is not None:
                return r
        for name in ("body", "orelse", "finalbody"):
            block = getattr(s, name, None)
            if block:
                setattr(s, name, self.block(block))
        for h in getattr(s, "handlers", ()):
            h.body = self.block(h.body)
            if h.name and h.name in self.deleted:
                h.body.insert(0, _rec_call(Method.DELETED, [_const((h.name,), h)], h))
        for case in getattr(s, "cases", ()):
            case.body = self.block(case.body)
        return s

    def visit_Expr(self, node: ast.Expr) -> Any:
        v = node.value
        if (
            isinstance(v, ast.Call)
            and isinstance(v.func, ast.Attribute)
            and v.func.attr in (Method.APPEND, Method.EXTEND)
            and isinstance(v.func.value, ast.Subscript)
            and isinstance(v.func.value.value, ast.Name)
            and v.func.value.value.id in self.keyed_gathers
        ):
            # D[k].append(e) -> the recorder, per key in iteration order
            method = (
                Method.KEYED_APPEND
                if v.func.attr == Method.APPEND
                else Method.KEYED_EXTEND
            )
            d = v.func.value
            name = d.value.id  # type: ignore[attr-defined]
            return _rec_call(method, [_const(name, node), d.slice, *v.args], node)
        if (
            isinstance(v, ast.Call)
            and isinstance(v.func, ast.Attribute)
            and isinstance(v.func.value, ast.Name)
        ):
            name, attr = v.func.value.id, v.func.attr
            nm = _const(name, node)
            if name in self.gathers and attr == "append" and _plain(v):
                call = ast.copy_location(
                    ast.Call(
                        func=ast.copy_location(
                            ast.Name(gather_name(name), ast.Load()), node
                        ),
                        args=v.args,
                        keywords=[],
                    ),
                    node,
                )
                return ast.copy_location(ast.Expr(call), node)
            if name in self.gathers and attr in (Method.APPEND, Method.EXTEND):
                return _rec_call(attr, [nm, *v.args], node)
            if name in self.unions and attr in (Method.ADD, Method.UPDATE):
                return _rec_call(attr, [nm, *v.args], node)
        return None

    def _reduce(self, name: str, e: ast.expr, node: ast.stmt) -> ast.stmt:
        """``acc += e``: the partial folded by the operator itself, where the
        operator folds as the merge does (``+ * | & ^``); else a recorder call."""
        op = self.reduction_ops.get(name)
        if op in NATIVE_REDUCTIONS:
            target = ast.copy_location(ast.Name(partial_name(name), ast.Store()), node)
            return ast.copy_location(ast.AugAssign(target, _BINOPS[op](), e), node)
        return _rec_call(Method.REDUCE, [_const(name, node), e], node)

    def visit_AugAssign(self, node: ast.AugAssign) -> Any:
        t = node.target
        if isinstance(t, ast.Name):
            nm = _const(t.id, node)
            if t.id in self.gathers:
                return _rec_call(Method.EXTEND, [nm, node.value], node)
            if t.id in self.reductions:
                return self._reduce(t.id, node.value, node)
        if (
            isinstance(t, ast.Subscript)
            and isinstance(t.value, ast.Name)
            and t.value.id in self.keyed
        ):
            return _rec_call(
                Method.KEYED, [_const(t.value.id, node), t.slice, node.value], node
            )
        return None

    def visit_Assign(self, node: ast.Assign) -> Any:
        if len(node.targets) == 1 and isinstance(node.targets[0], ast.Name):
            name = node.targets[0].id
            if name in self.reductions:
                v = node.value
                e = v.right if isinstance(v, ast.BinOp) else cast(ast.Call, v).args[1]
                return self._reduce(name, e, node)
        indexed = indexer_write(node)
        if indexed is not None and indexed[0].id in self.writes:
            # D.at[k] = v: recorded, applied through the same indexer at merge
            target, accessor, key = indexed
            return _rec_call(
                Method.SETINDEXED,
                [node.value, _const(target.id, node), _const(accessor, node), key],
                node,
            )
        sink_parts = [
            p
            for t in node.targets
            for p in target_parts(t)
            if isinstance(p, ast.Subscript)
            and isinstance(p.value, ast.Name)
            and p.value.id in self.writes
        ]
        if not sink_parts:
            return None
        if (
            len(node.targets) == 1
            and isinstance(node.targets[0], ast.Subscript)
            and len(sink_parts) == 1
        ):
            p = sink_parts[0]
            return _rec_call(
                Method.SETITEM,
                [node.value, _const(cast(ast.Name, p.value).id, node), p.slice],
                node,
            )
        # tuple or chained targets: assign to temporaries, then record the writes
        replaced: list[tuple[str, ast.Subscript]] = []

        def swap(t: ast.expr) -> ast.expr:
            if isinstance(t, (ast.Tuple, ast.List)):
                t.elts = [swap(e) for e in t.elts]
                return t
            if isinstance(t, ast.Starred):
                t.value = swap(t.value)
                return t
            if any(t is p for p in sink_parts):
                tmp = f"__gpucell_w{self._tmp}__"
                self._tmp += 1
                replaced.append((tmp, t))  # type: ignore[arg-type]
                return ast.copy_location(ast.Name(tmp, ast.Store()), t)
            return t

        node.targets = [swap(t) for t in node.targets]
        out: list[ast.stmt] = [node]
        for tmp, sub in replaced:
            out.append(
                _rec_call(
                    Method.SETITEM,
                    [
                        ast.copy_location(ast.Name(tmp, ast.Load()), sub),
                        _const(sub.value.id, sub),  # type: ignore[attr-defined]
                        sub.slice,
                    ],
                    sub,
                )
            )
        return out

    def visit_Delete(self, node: ast.Delete) -> Any:
        if (
            len(node.targets) == 1
            and isinstance(node.targets[0], ast.Subscript)
            and isinstance(node.targets[0].value, ast.Name)
            and node.targets[0].value.id in self.writes
        ):
            # `del D[k]` of the own key: recorded as a write of DELETED
            t = node.targets[0]
            gone = ast.parse(
                "__import__('gpucell.core.deleted', fromlist=['DELETED']).DELETED",
                mode="eval",
            ).body
            for n in ast.walk(gone):
                ast.copy_location(n, node)
            return _rec_call(
                Method.SETITEM,
                [gone, _const(cast(ast.Name, t.value).id, node), t.slice],
                node,
            )
        names = [
            p.id
            for t in node.targets
            for p in target_parts(t)
            if isinstance(p, ast.Name) and p.id in self.deleted
        ]
        if not names:
            return None
        return [node, _rec_call(Method.DELETED, [_const(tuple(names), node)], node)]


class _OwnRowRewriter(ast.NodeTransformer):
    """``S[i]`` -> the iteration's private row ``__gpucell_own_S__`` (``S[i, k]``
    -> ``__gpucell_own_S__[k]``), and each write to it followed by a note of
    the key written (see ownrows.py).  Keys and values are evaluated once, in
    the order Python evaluates the original statement."""

    def __init__(self, rows: Mapping[str, OwnRow]) -> None:
        self.rows = rows
        self._tmp = 0

    def _name(self, n: str, ctx: ast.expr_context, loc: ast.AST) -> ast.Name:
        return ast.copy_location(ast.Name(n, ctx), loc)

    def visit_Subscript(self, node: ast.Subscript) -> Any:
        v = node.value
        row = self.rows.get(v.id) if isinstance(v, ast.Name) else None
        if row is None:
            return self.generic_visit(node)
        key = node.slice
        if isinstance(key, ast.Name) and key.id == row.index:
            return self._name(own_name(row.name), node.ctx, node)
        if isinstance(key, ast.Tuple) and key.elts:  # S[i, k...] -> own[k...]
            rest = [self.visit(e) for e in key.elts[1:]]
            inner: ast.expr = (
                rest[0]
                if len(rest) == 1
                else ast.copy_location(ast.Tuple(rest, ast.Load()), key)
            )
            own = self._name(own_name(row.name), ast.Load(), node)
            return ast.copy_location(ast.Subscript(own, inner, node.ctx), node)
        return self.generic_visit(node)

    def _target(self, t: ast.expr) -> tuple[str, ast.expr] | None:
        """(row name, rewritten target) when ``t`` writes an own row."""
        new = self.visit(t)
        for name in self.rows:
            own = own_name(name)
            if isinstance(new, ast.Name) and new.id == own:
                return name, new
            if (
                isinstance(new, ast.Subscript)
                and isinstance(new.value, ast.Name)
                and new.value.id == own
            ):
                return name, new
        return None

    def _tmp_name(self, what: str, loc: ast.AST) -> tuple[ast.Name, ast.Name]:
        self._tmp += 1
        n = f"__gpucell_{what}{self._tmp}__"
        return self._name(n, ast.Store(), loc), self._name(n, ast.Load(), loc)

    def _written(self, name: str, key: ast.expr | None, loc: ast.stmt) -> ast.stmt:
        keys = own_keys_name(name)
        if key is None:  # the whole element: a flag
            return ast.copy_location(
                ast.Assign([self._name(keys, ast.Store(), loc)], _const(True, loc)),
                loc,
            )
        return _rec_call(Method.TOUCH, [self._name(keys, ast.Load(), loc), key], loc)

    def _write(
        self, node: ast.Assign | ast.AugAssign, target: ast.expr
    ) -> list[ast.stmt] | None:
        hit = self._target(target)
        if hit is None:
            return None
        name, new = hit
        out: list[ast.stmt] = []
        value = self.visit(node.value)
        if isinstance(node, ast.Assign):
            v_store, v_load = self._tmp_name("v", node)
            out.append(ast.copy_location(ast.Assign([v_store], value), node))
            value = v_load
        key_load: ast.expr | None = None
        if isinstance(new, ast.Subscript):
            k_store, key_load = self._tmp_name("k", node)
            out.append(ast.copy_location(ast.Assign([k_store], new.slice), node))
            new = ast.copy_location(
                ast.Subscript(new.value, key_load, ast.Store()), new
            )
        if isinstance(node, ast.Assign):
            out.append(ast.copy_location(ast.Assign([new], value), node))
        else:
            aug_target = cast("ast.Name | ast.Subscript", new)
            out.append(
                ast.copy_location(ast.AugAssign(aug_target, node.op, value), node)
            )
        out.append(self._written(name, key_load, node))
        return out

    def visit_Assign(self, node: ast.Assign) -> Any:
        if len(node.targets) == 1:
            done = self._write(node, node.targets[0])
            if done is not None:
                return done
        return self.generic_visit(node)

    def visit_AugAssign(self, node: ast.AugAssign) -> Any:
        done = self._write(node, node.target)
        return done if done is not None else self.generic_visit(node)

    def wrap(self, body: list[ast.stmt], loc: ast.AST) -> list[ast.stmt]:
        """Each row's private copy before the body; its writes recorded after
        (also after ``continue``)."""
        before: list[ast.stmt] = []
        after: list[ast.stmt] = []
        for name, row in self.rows.items():
            index = self._name(row.index, ast.Load(), loc)
            copy_call = ast.copy_location(
                ast.Call(
                    func=ast.copy_location(
                        ast.Attribute(
                            self._name(REC, ast.Load(), loc),
                            Method.OWN_COPY,
                            ast.Load(),
                        ),
                        loc,
                    ),
                    args=[self._name(name, ast.Load(), loc), index],
                    keywords=[],
                ),
                loc,
            )
            before.append(
                ast.copy_location(
                    ast.Assign(
                        [self._name(own_name(name), ast.Store(), loc)], copy_call
                    ),
                    loc,
                )
            )
            start: ast.expr = (
                ast.copy_location(ast.Dict([], []), loc)
                if row.mode == "row"
                else _const(False, loc)
            )
            before.append(
                ast.copy_location(
                    ast.Assign(
                        [self._name(own_keys_name(name), ast.Store(), loc)], start
                    ),
                    loc,
                )
            )
            after.append(
                _rec_call(
                    Method.OWN_DONE,
                    [
                        _const(name, loc),
                        self._name(row.index, ast.Load(), loc),
                        self._name(own_name(name), ast.Load(), loc),
                        self._name(own_keys_name(name), ast.Load(), loc),
                    ],
                    loc,
                )
            )
        guarded = ast.copy_location(
            ast.Try(body=body, handlers=[], orelse=[], finalbody=after), loc
        )
        return [*before, guarded]


def _key_guard(name: str, key: str, how: str, loc: ast.AST) -> ast.stmt:
    """Each iteration: an own element or row of anything but a dict under a
    key that may name another iteration's element.  ``y[-3]`` and ``y[0]``
    are one element of a 3-item list (``how == "range"``: ``range(k, n)``);
    the items of ``set(idx)`` (``"any"``) may also be ``True`` or a tuple,
    which overlap ``a[0]`` of an array, or mix ``0`` and ``"a"``, one element
    of a Series labelled by strings: only non-negative ints (not of a Series)
    and a DataFrame's string labels pass.  Serially the later iteration reads
    what the earlier wrote, on an engine the value from before the loop: the
    iteration raises instead, and nothing is merged."""
    text = (
        f"%%gpu_parallel: the loop writes `{name}[{key}]` as each iteration's "
        f"own item, and `{key}` is {{!r}}, which may name the element of "
        f"another iteration (`{name}[-1]` is the last element, `{name}[True]` "
        f"or `{name}[(0, 1)]` overlap `{name}[0]` of an array), so two "
        f"iterations could share one. Loop over positions that cannot "
        f"(`range(len({name}))`), or run the cell without %%gpu_parallel. "
        f"Nothing from the loop was merged."
    )
    b = "__import__('builtins')"
    kind = f"{b}.type({name})"
    pandas = f"{kind}.__module__.startswith('pandas')"
    if how == "range":  # ints
        bad = f"{key} < 0"
    elif how == "mapping":  # `for k in d`: keys of a dict, columns of a frame
        bad = f"not ({pandas} and {kind}.__name__ == 'DataFrame')"
    else:
        # a non-negative int of anything but a Series (which takes `s[0]` as
        # a position or a label, as its labels are strings or not); a string
        # of a DataFrame (a column's label, never a position)
        bad = (
            f"not (({b}.type({key}) is {b}.int and {key} >= 0 and not "
            f"({pandas} and {kind}.__name__ == 'Series')) or ({b}.type({key}) "
            f"is {b}.str and {pandas} and {kind}.__name__ == 'DataFrame'))"
        )
    src = (
        f"if ({bad}) and not {b}.isinstance({name}, {b}.dict):\n"
        f"    raise {b}.IndexError({text!r}.format({key}))\n"
    )
    if how == "mapping":
        src = src.replace(
            f"{text!r}.format({key})",
            f"{_mapping_text(name, key)!r}.format({b}.type({name}).__name__)",
        )
    guard = ast.parse(src).body[0]
    for node in ast.walk(guard):
        ast.copy_location(node, loc)
    return guard


def _mapping_text(name: str, key: str) -> str:
    return (
        f"%%gpu_parallel: the loop iterates over `{name}` and writes "
        f"`{name}[{key}]` as each iteration's own item, which holds only for a "
        f"dict (distinct keys) or a DataFrame (distinct columns); `{name}` is a "
        f"{{}}, whose items may repeat or be its values. Loop over "
        f"`range(len({name}))` for positions, or run the cell without "
        f"%%gpu_parallel. Nothing from the loop was merged."
    )


def _value_row_guard(row: OwnRow, loc: ast.AST) -> ast.stmt:
    """Before a chunk: whole elements read back (``y[i] = 0``, ``y[i] += v``)
    only of a list or a dict, which store what they are given.  A frame aligns
    what it stores to its index and an array casts it to its dtype (the kernel
    refuses arrays before the loop), while the engine's private element would
    keep the value as written: numbers that differ without a word.  The chunk
    raises instead, and nothing is merged."""
    name = row.name
    text = (
        f"%%gpu_parallel: `{name}` (line {row.line}) is a {{}} whose elements "
        f"the loop assigns whole and reads back; gpucell does that only for "
        f"lists and dicts, which store what they are given (a frame aligns "
        f"what it stores, an array casts it, and an engine's private element "
        f"would not). Keep the value in a local and store it once (`v = ...`, "
        f"then `{name}[{row.index}] = v`), or run the cell without %%gpu_parallel. "
        f"Nothing from the loop was merged."
    )
    src = (
        f"if not isinstance({name}, (__import__('builtins').list, "
        "__import__('builtins').dict)):\n"
        f"    raise __import__('builtins').TypeError({text!r}.format("
        f"__import__('builtins').type({name}).__name__))\n"
    )
    guard = ast.parse(src).body[0]
    for node in ast.walk(guard):
        ast.copy_location(node, loc)
    return guard


def _spec_expr(spec: Spec, loc: ast.AST) -> ast.expr:
    expr = ast.parse(repr(dict(spec)), mode="eval").body
    for n in ast.walk(expr):
        ast.copy_location(n, loc)
    return expr


@dataclass(frozen=True)
class ProgramPlan:
    """What the engines' chunk program is made from: the loop, its body, the
    ``with`` contexts around it, and what the body does with each name.

    ``reductions`` and ``keyed`` map each name to its operator; the other sinks
    are the names of their kind."""

    loop_node: ast.stmt
    target: ast.expr
    body: list[ast.stmt]
    contexts: Sequence[ast.expr] = ()
    locals_: tuple[str, ...] = ()
    device: bool = False
    gathers: Collection[str] = ()
    writes: Collection[str] = ()
    reductions: Mapping[str, str] = field(default_factory=dict)
    keyed: Mapping[str, str] = field(default_factory=dict)
    unions: Collection[str] = ()
    deleted: Collection[str] = ()
    keyed_gathers: Collection[str] = ()
    own_rows: Mapping[str, OwnRow] = field(default_factory=dict)
    key_checks: Mapping[str, tuple[str, str]] = field(default_factory=dict)


def _in_contexts(loop: ast.For, contexts: Sequence[ast.expr], loc: ast.AST) -> ast.stmt:
    """The chunk's loop inside the `with` blocks around the cell's loop,
    re-entered on the engine around each chunk (expressions copied: the kernel
    evaluates the originals)."""
    items = [
        ast.withitem(context_expr=copy_tree(c), optional_vars=None) for c in contexts
    ]
    # a context may swallow the loop's exception (contextlib.suppress): the
    # recorder keeps it, and the engine raises it anyway (serially the later
    # iterations would not run: this chunk's results must not be merged)
    exc = "__gpucell_exc__"
    handler = ast.ExceptHandler(
        type=ast.copy_location(ast.Name("BaseException", ast.Load()), loc),
        name=exc,
        body=[
            _rec_call(
                Method.RAISED, [ast.copy_location(ast.Name(exc, ast.Load()), loc)], loc
            ),
            ast.Raise(),
        ],
    )
    guarded = ast.Try(body=[loop], handlers=[handler], orelse=[], finalbody=[])
    wrapped: ast.stmt = ast.With(items=items, body=[guarded])
    return ast.fix_missing_locations(ast.copy_location(wrapped, loc))


def build_program(plan: ProgramPlan) -> ast.Module:
    """The chunk program as an ``ast.Module`` with the cell's line numbers.

    ``plan.body`` and ``plan.target`` are rewritten in place: pass a tree the
    analysis does not keep (re-parsing the cell is much cheaper than
    ``copy_tree``).
    """
    body, loc = plan.body, plan.loop_node
    rows = _OwnRowRewriter(plan.own_rows)
    if rows.rows:
        body = [rows.visit(st) for st in body]
        body = [x for st in body for x in (st if isinstance(st, list) else [st])]
    rw = _SinkRewriter(
        gathers=plan.gathers,
        writes=set(plan.writes) - set(rows.rows),
        reductions=plan.reductions,
        keyed=plan.keyed,
        unions=plan.unions,
        deleted=plan.deleted,
        keyed_gathers=plan.keyed_gathers,
    )
    rw.reduction_ops = plan.reductions
    new_body = rw.block(list(body))
    deletes = bool(rw.deleted)
    spec: Spec = {
        "locals": plan.locals_,
        "reductions": dict(plan.reductions),
        "keyed": dict(plan.keyed),
        "device": plan.device,
        "gathers": tuple(sorted(rw.gathers)),
        "end": deletes,
    }
    setup = _rec_call(Method.SETUP, [_spec_expr(spec, loc)], loc)
    idx_store = ast.copy_location(ast.Name(INDEX, ast.Store()), loc)
    tgt = ast.copy_location(ast.Tuple([idx_store, plan.target], ast.Store()), loc)

    def name(n: str) -> ast.expr:
        return ast.copy_location(ast.Name(n, ast.Load()), loc)

    now = ast.copy_location(ast.Call(func=name(NOW), args=[], keywords=[]), loc)
    begin = ast.copy_location(
        ast.Expr(
            ast.copy_location(
                ast.Call(func=name(BEGIN), args=[name(INDEX), now], keywords=[]), loc
            )
        ),
        loc,
    )
    guards = [_value_row_guard(r, loc) for r in rows.rows.values() if r.mode == "value"]
    per_iteration: list[ast.stmt] = new_body
    if rows.rows:
        per_iteration = rows.wrap(per_iteration, loc)
    if plan.key_checks:
        per_iteration = [
            *(_key_guard(n, k, how, loc) for n, (k, how) in plan.key_checks.items()),
            *per_iteration,
        ]
    if deletes:
        end = _rec_call(Method.END, [name(INDEX)], loc)
        per_iteration = [
            ast.copy_location(
                ast.Try(body=new_body, handlers=[], orelse=[], finalbody=[end]), loc
            )
        ]
    loop = ast.copy_location(
        ast.For(
            target=tgt,
            iter=name(ITEMS),
            body=[begin, *per_iteration],
            orelse=[],
        ),
        loc,
    )
    if plan.contexts:
        wrapped = _in_contexts(loop, plan.contexts, loc)
        return ast.Module(body=[setup, *guards, wrapped], type_ignores=[])
    return ast.Module(body=[setup, *guards, loop], type_ignores=[])


# ---------------------------------------------------------------------------
# CPU engines: make `.cuda()`-style code run on the engine's device
# ---------------------------------------------------------------------------


def _is_cuda_str(node: ast.AST) -> bool:
    return (
        isinstance(node, ast.Constant)
        and isinstance(node.value, str)
        and is_cuda_device(node.value)
    )


class _CudaRewriter:
    """``.cuda()``, ``.to("cuda")``, ``device="cuda"``, ``torch.device("cuda")``.

    A device given by a variable or expression (``.to(dev)``, ``device=cfg.dev``,
    ``torch.device(name)``) is passed through ``__gpucell_as_device__``, which maps
    a CUDA device (a ``"cuda..."`` string or a ``torch.device``) to the engine's
    and returns anything else (a dtype, a tensor, ``"cpu"``) unchanged.

    Every rewrite changes a ``Call`` node in place, so one ``ast.walk`` suffices.
    """

    def __init__(self) -> None:
        self.lines: list[int] = []
        self.wrapped = 0

    def _device(self, loc: ast.AST) -> ast.expr:
        self.lines.append(getattr(loc, "lineno", 0))
        return ast.copy_location(ast.Name(DEVICE, ast.Load()), loc)

    def _maybe(self, e: ast.expr) -> ast.expr:
        """``e`` if it cannot be a CUDA device held in a value, else wrapped."""
        if isinstance(e, (ast.Constant, ast.Starred)) or (
            isinstance(e, ast.Name) and e.id == DEVICE
        ):
            return e
        self.wrapped += 1
        fn = ast.copy_location(ast.Name(AS_DEVICE, ast.Load()), e)
        return ast.copy_location(ast.Call(func=fn, args=[e], keywords=[]), e)

    def call(self, node: ast.Call) -> None:
        f = node.func
        if not isinstance(f, ast.Attribute):
            self._keywords(node)
            return
        if (
            f.attr == "device"
            and isinstance(f.value, ast.Name)
            and f.value.id == "torch"
            and node.args
        ):
            if _is_cuda_str(node.args[0]):
                # torch.device("cuda"[, n]) -> torch.device(__gpucell_device__)
                node.args = [self._device(node)]
                node.keywords = []
            elif len(node.args) == 1:
                node.args[0] = self._maybe(node.args[0])
            return
        if f.attr == "cuda":
            # x.cuda(), x.cuda(0), x.cuda(non_blocking=True) -> x.to(device, ...)
            node.func = ast.copy_location(ast.Attribute(f.value, "to", ast.Load()), f)
            node.args = [self._device(node)]
            node.keywords = [k for k in node.keywords if k.arg != "device"]
            return
        if f.attr == "to" and node.args:
            if _is_cuda_str(node.args[0]):
                node.args[0] = self._device(node.args[0])
            else:
                node.args[0] = self._maybe(node.args[0])
        self._keywords(node)

    def _keywords(self, node: ast.Call) -> None:
        for k in node.keywords:
            if k.arg == "device":
                if _is_cuda_str(k.value):
                    k.value = self._device(k.value)
                else:
                    k.value = self._maybe(k.value)


def rewrite_cuda(module: ast.Module) -> tuple[ast.Module, tuple[int, ...], bool]:
    """Rewrite CUDA device selections in place.

    Returns the module, the lines of the literal selections rewritten, and whether
    any device given by a value was wrapped (the program then needs
    ``__gpucell_as_device__``).
    """
    rw = _CudaRewriter()
    for node in list(ast.walk(module)):
        if isinstance(node, ast.Call):
            rw.call(node)
    return module, tuple(sorted(set(rw.lines))), rw.wrapped > 0


def unstamped(module: ast.Module) -> ast.Module | None:
    """The chunk program without its per-iteration stamp: ``for <target> in
    __gpucell_items__`` and the body alone, or ``None`` when the body itself
    needs the iteration's index (``rec.end``, own rows).

    Engines run it over long chunks of a range, list or tuple, where a stamp per
    iteration costs more than a cheap body and its times would not be kept
    anyway; they read which iteration runs from the items' iterator instead.
    """
    m = copy_tree(module)
    for node in ast.walk(m):
        if not (
            isinstance(node, ast.For)
            and isinstance(node.iter, ast.Name)
            and node.iter.id == ITEMS
        ):
            continue
        tgt, body = node.target, node.body
        if not (
            isinstance(tgt, ast.Tuple)
            and len(tgt.elts) == 2
            and isinstance(tgt.elts[0], ast.Name)
            and tgt.elts[0].id == INDEX
            and body
            and isinstance(body[0], ast.Expr)
            and isinstance(body[0].value, ast.Call)
            and isinstance(body[0].value.func, ast.Name)
            and body[0].value.func.id == BEGIN
        ):
            return None
        rest = body[1:]
        if any(
            isinstance(n, ast.Name) and n.id == INDEX for b in rest for n in ast.walk(b)
        ):
            return None
        node.target = tgt.elts[1]
        node.body = rest or [ast.copy_location(ast.Pass(), node)]
        return m
    return None
