"""The reduction operators, in one table: what the body writes for each, what
serial code applies, and whether the result is one of the contributions.

The analysis matches a reduction statement by the operator's AST class (``acc
+= e``, ``acc = acc + e``) or by the builtin it calls (``acc = max(acc, e)``);
the merge and the plan's description ask the table whether an operator
*selects* (``max``/``min``: the result is one of the values, kept by identity,
with no in-place form) or *combines* (``+ - * | & ^ @``).  Folding itself is
:mod:`gpucell.protocol.fold` (shared with the engines), whose ``BINARY`` is
built from the same rows.  The rows are :data:`gpucell.protocol.fold.OPS`
(the engines fold by them too): adding an operator is a row there.
"""

from __future__ import annotations

import ast
from dataclasses import dataclass

from gpucell.protocol.fold import NATIVE, OPS, SELECTS

__all__ = [
    "BY_AST",
    "NATIVE_AST",
    "REDUCERS",
    "SELECTING",
    "Reducer",
    "selects",
    "spelling",
]


@dataclass(frozen=True)
class Reducer:
    """One reduction operator."""

    op: str  # as the plan names it: "+", "max"
    # the AST operator class of ``acc op= e`` / ``acc = acc op e`` (None: a call)
    ast_op: type[ast.operator] | None

    @property
    def selects(self) -> bool:
        """max/min: the result is one of the contributions (no in-place form)."""
        return self.op in SELECTS


REDUCERS: dict[str, Reducer] = {
    o.op: Reducer(o.op, getattr(ast, o.ast_op) if o.ast_op else None)
    for o in OPS.values()
}

#: operators accepted in reductions, by AST class
BY_AST: dict[type[ast.operator], str] = {
    r.ast_op: r.op for r in REDUCERS.values() if r.ast_op is not None
}

#: the builtins a reduction calls (``acc = max(acc, e)``)
SELECTING: frozenset[str] = frozenset(r.op for r in REDUCERS.values() if r.selects)

#: the operators an engine folds with the operator itself, by their AST class
#: (``p op= e`` in the chunk program)
NATIVE_AST: dict[str, type[ast.operator]] = {
    op: t for op, r in REDUCERS.items() if op in NATIVE and (t := r.ast_op)
}


def selects(op: str) -> bool:
    """``max``/``min``: the result is one of the contributions."""
    r = REDUCERS.get(op)
    return r is not None and r.selects


def spelling(name: str, op: str, augmented: bool) -> str:
    """How the body writes the reduction of ``name`` (for the plan)."""
    if selects(op):
        return f"{name} = {op}({name}, ...)"
    return f"{name} {op}= ..." if augmented else f"{name} = {name} {op} ..."
