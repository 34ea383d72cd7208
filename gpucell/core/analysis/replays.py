"""Sinks the engines gather and the merge replays, rewritten where the loop
as written is refused (spellings.respell): a ufunc's ``.at`` into an array
from before the loop (the calls, with a private copy of their arguments),
and a DataFrame's own row read back (each iteration's written cells, from a
private one-row copy: core/framerows.py)."""

from __future__ import annotations

import ast
from collections.abc import Callable

__all__: list[str] = []


def _ufunc_at_call(s: ast.stmt) -> tuple[ast.Call, str] | None:
    """``m.ufunc.at(D, idx[, w])`` as a statement: the call and ``D``."""
    if not (isinstance(s, ast.Expr) and isinstance(s.value, ast.Call)):
        return None
    call = s.value
    f = call.func
    if (
        isinstance(f, ast.Attribute)
        and f.attr == "at"
        and isinstance(f.value, ast.Attribute)
        and isinstance(f.value.value, ast.Name)
        and 2 <= len(call.args) <= 3
        and not call.keywords
        and not any(isinstance(a, ast.Starred) for a in call.args)
        and isinstance(call.args[0], ast.Name)
    ):
        return call, call.args[0].id
    return None


def concat_helper(name: str) -> ast.expr:
    """``gpucell.protocol.concat``'s function ``name``, as the chunk program
    reaches it (``snapshot``, ``read_now``: what an engine keeps of a value)."""
    return ast.parse(
        f"__import__('gpucell.protocol.concat', fromlist=['{name}']).{name}",
        mode="eval",
    ).body


def name_uses(body: list[ast.stmt]) -> dict[str, int]:
    """Names used anywhere in the body (nested definitions too) -> how many
    times."""
    uses: dict[str, int] = {}
    for st in body:
        for node in ast.walk(st):
            if isinstance(node, ast.Name):
                uses[node.id] = uses.get(node.id, 0) + 1
    return uses


def _used_only_by(
    body: list[ast.stmt], match: Callable[[ast.stmt], tuple[str, int] | None]
) -> set[str]:
    """The names the body uses only in statements ``match`` finds for them
    (it says how many uses of the name each accounts for; a matched statement
    is not looked into): any other use would see the effects so far."""
    covered: dict[str, int] = {}
    uses = name_uses(body)

    def visit(node: ast.AST) -> None:
        if isinstance(node, ast.stmt):
            found = match(node)
            if found is not None:
                covered[found[0]] = covered.get(found[0], 0) + found[1]
                return
        for child in ast.iter_child_nodes(node):
            visit(child)

    for st in body:
        visit(st)
    return {d for d, n in covered.items() if uses.get(d) == n}


def _ufunc_at_targets(body: list[ast.stmt]) -> set[str]:
    """The arrays only ever given to ``m.ufunc.at`` as its first argument in
    the body: any other use would see the calls' effects so far."""

    def target(s: ast.stmt) -> tuple[str, int] | None:
        found = _ufunc_at_call(s)
        return None if found is None else (found[1], 1)

    return _used_only_by(body, target)


def _ufunc_at(s: ast.stmt, targets: set[str]) -> tuple[ast.stmt, str, str] | None:
    """``np.add.at(D, idx, w)`` on an array from before the loop as
    ``__gpucell_at_D__.append((np.add, deepcopy((idx, w))))``: the ufunc and
    a private copy of its arguments, gathered for the merge to replay."""
    found = _ufunc_at_call(s)
    if found is None or found[1] not in targets:
        return None
    call, d = found
    f = call.func
    assert isinstance(f, ast.Attribute)
    hidden = f"__gpucell_at_{d}__"
    copied = ast.parse("__import__('copy').deepcopy(())", mode="eval").body
    assert isinstance(copied, ast.Call)
    copied.args = [ast.Tuple(elts=list(call.args[1:]), ctx=ast.Load())]
    entry = ast.Tuple(elts=[f.value, copied], ctx=ast.Load())
    append = ast.Attribute(ast.Name(hidden, ast.Load()), "append", ast.Load())
    new = ast.Expr(ast.Call(append, [entry], []))
    for node in ast.walk(new):
        if not hasattr(node, "lineno") or node is not f.value:
            ast.copy_location(node, s)
    return new, hidden, d


_LABEL_ACCESSORS = ("loc", "at")


def _own_cell(node: ast.AST, index: str) -> tuple[str, str] | None:
    """``D.loc[i, "c"]`` / ``D.at[i, "c"]``, ``i`` the loop's own label:
    ``(D, "c")``."""
    if not (
        isinstance(node, ast.Subscript)
        and isinstance(node.value, ast.Attribute)
        and node.value.attr in _LABEL_ACCESSORS
        and isinstance(node.value.value, ast.Name)
        and isinstance(node.slice, ast.Tuple)
        and len(node.slice.elts) == 2
    ):
        return None
    i, c = node.slice.elts
    if (
        isinstance(i, ast.Name)
        and i.id == index
        and isinstance(c, ast.Constant)
        and isinstance(c.value, str)
    ):
        return node.value.value.id, c.value
    return None


def _frame_rows(body: list[ast.stmt], index: str) -> dict[str, tuple[str, int]]:
    """Each frame the body uses only as ``D.loc[i, "c"]`` (or ``.at``), ``i``
    the loop's own label never rebound, writing some cell and reading one:
    every use goes to a private one-row copy made first in the iteration, and
    the iteration's written cells are gathered last (``core/framerows.py``).
    Returns ``D -> (its hidden gather, how many cells were rewritten)``.
    (The loop may iterate over the frame's rows: ``iterrows``, ``itertuples``
    and a frame's ``values`` read the frame once, when the loop starts.)"""
    uses: dict[str, int] = {}
    cells: dict[str, list[ast.Subscript]] = {}
    stores: dict[str, list[str]] = {}
    rebinds_index = False
    for st in body:
        for node in ast.walk(st):
            if isinstance(node, ast.Name):
                uses[node.id] = uses.get(node.id, 0) + 1
                if node.id == index and not isinstance(node.ctx, ast.Load):
                    rebinds_index = True
            found = _own_cell(node, index)
            if found is None:
                continue
            assert isinstance(node, ast.Subscript)
            cells.setdefault(found[0], []).append(node)
            if isinstance(node.ctx, ast.Store):
                cols = stores.setdefault(found[0], [])
                if found[1] not in cols:
                    cols.append(found[1])
    if rebinds_index:
        return {}
    frames = [
        d for d, subs in cells.items() if uses.get(d) == len(subs) and d in stores
    ]
    rewritten: dict[str, tuple[str, int]] = {}
    for d in sorted(frames):
        row, hidden = f"__gpucell_fr_{d}__", f"__gpucell_frw_{d}__"
        for sub in cells[d]:
            assert isinstance(sub.value, ast.Attribute)
            sub.value.value = ast.copy_location(ast.Name(row, ast.Load()), sub)
        first = body[0]
        make = ast.parse(f"{row} = {d}.loc[[{index}]].copy()").body[0]
        written = ", ".join(repr(c) for c in stores[d]) + ","
        keep = ast.parse(
            f"{hidden}.append(__import__('gpucell.core.framerows', "
            f"fromlist=['written']).written({row}, {index}, ({written})))"
        ).body[0]
        for node in ast.walk(make):
            ast.copy_location(node, first)
        for node in ast.walk(keep):
            ast.copy_location(node, body[-1])
        guarded = ast.copy_location(
            ast.Try(body=list(body), handlers=[], orelse=[], finalbody=[keep]),
            first,
        )
        body[:] = [make, guarded]
        rewritten[d] = (hidden, len(cells[d]))
    return rewritten
