"""Pieces of the chunk program's recorder calls, shared by the sink kinds'
rewrites (sinks.py), the own-row rewrite and the program's frame."""

from __future__ import annotations

import ast
from typing import Any

from gpucell.core.reducers import NATIVE_AST
from gpucell.protocol.program import REC

__all__: list[str] = []


def _rec_call(method: str, args: list[ast.expr], loc: ast.AST) -> ast.Expr:
    """``__gpucell_rec__.method(*args)`` as a statement at ``loc``'s lines."""
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


#: the operators whose partial an engine folds with the operator itself
_BINOPS = NATIVE_AST


def _const(value: Any, loc: ast.AST) -> ast.expr:
    return ast.copy_location(ast.Constant(value), loc)
