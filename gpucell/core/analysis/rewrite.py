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
from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass, field

from gpucell.core.analysis.cudarewrite import rewrite_cuda
from gpucell.core.analysis.ownrowrewrite import (
    _key_guard,
    _OwnRowRewriter,
    _value_row_guard,
)
from gpucell.core.analysis.ownrows import OwnRow
from gpucell.core.analysis.reccalls import _rec_call
from gpucell.core.analysis.sinkrewrite import _SinkRewriter
from gpucell.core.astcopy import copy_tree
from gpucell.protocol.program import (
    BEGIN,
    INDEX,
    ITEMS,
    NOW,
    Method,
    Spec,
)

# (rewrite_cuda: also for kernel/distributed_inputs.py's helper modules)
__all__ = ["ProgramPlan", "build_program", "rewrite_cuda", "unstamped"]


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
