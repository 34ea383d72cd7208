"""Keyed reductions into containers that cast what they store, checked before
the loop runs (a pre-flight check of kernel/preflight.py).

``D[k] += e`` is merged by folding each key's contributions and storing once;
a pandas Series (and any container but a dict, a list, a DataFrame's columns,
a numpy array or a torch tensor, whose merge checks what it stores) casts every
store to its dtype, so two iterations on one key would be cast once instead of
twice.  Keys that are the loop's own positions cannot repeat, so those run.
"""

from __future__ import annotations

import ast
from typing import Any

from gpucell.core.analysis.diagnostics import Diagnostic
from gpucell.core.analysis.plan import LoopPlan
from gpucell.kernel.preflight import Namespace, _line_of, _problem

__all__ = ["of_other_types"]


def of_other_types(plan: LoopPlan, ns: Namespace) -> list[Diagnostic]:
    """``D[k] += e`` (also ``D[k] = D[k] + e``, ``D.get`` spellings) is merged by
    folding each key's contributions and storing once.  Exact for a dict, a list
    (they store what they are given) and a DataFrame's columns (a column is
    replaced whole); an array, tensor or Series casts every store to its dtype,
    so two iterations on one key would be cast once instead of twice
    (``y[0] += 0.5`` twice on an int array stays 1 serially).  Keys that are
    the loop's own positions cannot repeat, so those loops run."""
    out = []
    for name, _op in plan.keyed:
        if name not in ns or _stores_what_it_is_given(ns[name]):
            continue
        if _keys_are_positions_of_one_iteration(plan, name):
            continue  # each key once: one store per key, as serially
        kind = type(ns[name])
        line = _line_of(plan, name)
        out.append(
            _problem(
                line,
                name,
                "keyed-reduction-of-other-type",
                f"`{name}[...]` is combined across iterations (line {line}), and "
                f"`{name}` is a `{kind.__module__}.{kind.__qualname__}`, which casts "
                "each value stored into it to its dtype, and its keys may repeat: "
                "folding one key's contributions before storing them can differ "
                "from storing after each iteration. Gather per-key contributions "
                f"in a dict (`parts[k] = parts.get(k, 0) + e`) and add them into "
                f"`{name}` after the loop, or key it by the loop's own position "
                "(`for i in range(n): ...[i] += ...`).",
            )
        )
    return out


def _keys_are_positions_of_one_iteration(plan: LoopPlan, name: str) -> bool:
    """Every ``name[k]`` the loop writes is keyed by the loop's own position
    (``for i in range(n)``, ``range(a, n)`` with ``a`` a literal >= 0, or the
    count of ``enumerate``), never rebound in the body: no key repeats, and
    no negative position names another iteration's element."""
    loop = _loop_node(plan)
    if loop is None:
        return False
    var = _position_variable(loop)
    if var is None:
        return False
    for node in ast.walk(ast.Module(body=loop.body, type_ignores=[])):
        if isinstance(node, ast.Name) and node.id == var:
            if isinstance(node.ctx, ast.Store):
                return False  # rebound: keys may repeat
        targets: list[ast.expr] = []
        if isinstance(node, ast.Assign):
            targets = list(node.targets)
        elif isinstance(node, (ast.AugAssign, ast.AnnAssign)):
            targets = [node.target]
        for t in targets:
            if (
                isinstance(t, ast.Subscript)
                and isinstance(t.value, ast.Name)
                and t.value.id == name
                and not (isinstance(t.slice, ast.Name) and t.slice.id == var)
            ):
                return False
    return True


def _loop_node(plan: LoopPlan) -> Any:
    """The parallel loop's ``for`` statement, parsed from the cell's text."""
    if plan.loop_lines is None:
        return None
    try:
        tree = ast.parse(plan.source)
    except SyntaxError:
        return None
    for node in ast.walk(tree):
        if isinstance(node, ast.For) and node.lineno == plan.loop_lines[0]:
            return node
    return None


def _position_variable(loop: Any) -> str | None:
    """The name bound to the iteration's position, if the loop has one."""
    it, target = loop.iter, loop.target
    if not (isinstance(it, ast.Call) and isinstance(it.func, ast.Name)):
        return None
    if it.keywords and it.func.id == "range":
        return None

    def non_negative_literal(e: ast.expr) -> bool:
        return isinstance(e, ast.Constant) and type(e.value) is int and e.value >= 0

    if it.func.id == "range" and isinstance(target, ast.Name):
        if len(it.args) == 1 or (
            len(it.args) in (2, 3)
            and non_negative_literal(it.args[0])
            and (len(it.args) == 2 or non_negative_literal(it.args[2]))
        ):
            return target.id
        return None
    if (
        it.func.id == "enumerate"
        and isinstance(target, ast.Tuple)
        and len(target.elts) == 2
        and isinstance(target.elts[0], ast.Name)
    ):
        start = it.args[1:] or [kw.value for kw in it.keywords if kw.arg == "start"]
        if not start or non_negative_literal(start[0]):
            return target.elts[0].id
    return None


def _stores_what_it_is_given(target: Any) -> bool:
    """A dict or list (subclasses included), or a pandas DataFrame; a numpy
    array or torch tensor too, whose merge fails, nothing merged, where a
    key's folded value is of another kind than the dtype (core/merge.py)."""
    from gpucell.protocol.fold import is_numpy, is_torch

    if isinstance(target, (dict, list)) or is_numpy(target) or is_torch(target):
        return True
    kind = type(target)
    return kind.__name__ == "DataFrame" and kind.__module__.startswith("pandas")
