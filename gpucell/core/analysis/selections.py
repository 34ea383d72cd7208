"""Running bests and first matches (``if d < best: best = d``): found in the
body so a refusal can say how to keep them after the loop."""

from __future__ import annotations

import ast
import dataclasses
from collections.abc import Iterable
from dataclasses import dataclass

from gpucell.core.analysis.scope import (
    target_names,
)
from gpucell.core.analysis.sinks import block_statements

__all__ = []


@dataclass(frozen=True)
class _Selection:
    """A name kept as a first match (``kind == "first"``) or a running best
    (``"best"``): ``op`` is ``"max"`` or ``"min"`` when the test says which
    (``if loss < best: best = loss`` keeps a minimum), and ``score`` the text
    of what it is compared with (``loss``) when that is a name."""

    kind: str
    op: str | None = None
    score: str | None = None
    # `<`/`>` (the first of equal scores is kept) rather than `<=`/`>=`
    strict: bool = True
    # what the test's branch assigns: name -> the value's text (`closest = j`)
    kept: tuple[tuple[str, str], ...] = ()


#: ``x OP name``: a new ``x`` is taken when it is smaller (min) or larger (max)
_TAKES_WHEN_RIGHT = {ast.Lt: "min", ast.LtE: "min", ast.Gt: "max", ast.GtE: "max"}
_FLIP = {"min": "max", "max": "min"}


def _best_direction(node: ast.Compare, name: str) -> tuple[str | None, str | None]:
    """``("min", "loss")`` for ``loss < best`` or ``best > loss`` (the value
    is replaced when the test holds), ``(None, None)`` when it cannot tell."""
    sides = [node.left, *node.comparators]
    for k, side in enumerate(sides):
        if not (isinstance(side, ast.Name) and side.id == name):
            continue
        if k > 0:  # `other OP name`
            op, other = node.ops[k - 1], sides[k - 1]
            took = _TAKES_WHEN_RIGHT.get(type(op))
        else:  # `name OP other`: reversed
            op, other = node.ops[0], sides[1]
            took = _TAKES_WHEN_RIGHT.get(type(op))
            took = _FLIP[took] if took else None
        score = other.id if isinstance(other, ast.Name) else None
        return took, score
    return None, None


def _selection_kind(
    test: ast.expr, name: str, when_false: bool = False
) -> _Selection | None:
    """A first match for a test like ``name is None`` / ``not name``, a
    running best for an ordering (``score > name``), else ``None``;
    ``when_false``: ``name`` is assigned when the test fails (an ``else``)."""
    negated: set[int] = set()
    for node in ast.walk(test):
        if isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.Not):
            if isinstance(node.operand, ast.Name) and node.operand.id == name:
                return _Selection("first")
            negated |= {id(n) for n in ast.walk(node.operand)}
        if isinstance(node, ast.Compare):
            sides = [node.left, *node.comparators]
            if not any(isinstance(x, ast.Name) and x.id == name for x in sides):
                continue
            if any(isinstance(op, (ast.Is, ast.IsNot)) for op in node.ops):
                return _Selection("first")
            if any(
                isinstance(op, (ast.Lt, ast.Gt, ast.LtE, ast.GtE)) for op in node.ops
            ):
                op, score = _best_direction(node, name)
                if op is not None and when_false:
                    op = _FLIP[op]
                if id(node) in negated or (
                    isinstance(test, ast.BoolOp) and isinstance(test.op, ast.Or)
                ):
                    op = None  # (under `not` or `or`: which way is not plain)
                strict = all(isinstance(o, (ast.Lt, ast.Gt)) for o in node.ops)
                return _Selection("best", op, score, strict != when_false)
    return None


def _assigned(body: Iterable[ast.stmt]) -> set[str]:
    return {
        n.id
        for st in block_statements(body)
        if isinstance(st, (ast.Assign, ast.AnnAssign))
        for t in (st.targets if isinstance(st, ast.Assign) else [st.target])
        for n in target_names(t)
    }


def _selections(stmts: Iterable[ast.stmt]) -> dict[str, _Selection]:
    """Names the body re-assigns under a test that reads them (``if score >
    best: best = score``, ``if found is None: found = x``): a running best or a
    first match, for which a reduction is the wrong advice."""
    out: dict[str, _Selection] = {}
    for s in stmts:
        # (test, names assigned when it holds, names assigned when it fails)
        guarded: list[tuple[ast.expr, set[str], set[str]]] = []
        if isinstance(s, ast.If):
            guarded.append((s.test, _assigned(s.body), _assigned(s.orelse)))
        elif isinstance(s, ast.Assign) and isinstance(s.value, ast.IfExp):
            names = _assigned([s])
            # `best = best if best > x else x`: the new value comes when it fails
            keeps = {
                n
                for n in names
                if isinstance(s.value.body, ast.Name) and s.value.body.id == n
            }
            guarded.append((s.value.test, names - keeps, keeps))
        for test, if_true, if_false in guarded:
            kept = _simple_assignments(s.body) if isinstance(s, ast.If) else {}
            for n in sorted(if_true | if_false):
                kind = _selection_kind(test, n, when_false=n not in if_true)
                if kind is not None and n in kept and not kind.kept:
                    kind = dataclasses.replace(kind, kept=tuple(kept.items()))
                if kind is not None:
                    out.setdefault(n, kind)
    return out


def _running_best_text(n: str, pick: _Selection) -> str:
    """The advice for a running best kept with what goes with it (``if d <
    best_d: best_i, best_d = i, d``): the pairs, and the pick after the loop
    with the same choice among equal scores."""
    kept = dict(pick.kept)
    score = kept[n]
    others = [k for k in kept if k != n]
    names = ", ".join([n, *others])
    values = ", ".join([score, *(kept[k] for k in others)])
    what = {"max": "running maximum", "min": "running minimum"}[pick.op or "max"]
    pairs = "pairs" if pick.strict else "reversed(pairs)"
    ties = "first" if pick.strict else "last"
    return (
        f"`{n}` keeps a {what} (with {', '.join(f'`{k}`' for k in others)}), "
        "which depends on the iterations before it: collect the candidates "
        f"(`pairs = [({names})]` before the loop, `pairs.append(({values}))` in "
        f"it) and pick after the loop (`{names} = "
        f"{pick.op}({pairs}, key=lambda t: t[0])`, which keeps the {ties} of "
        "equal scores, as the loop does)."
    )


def _simple_assignments(body: list[ast.stmt]) -> dict[str, str]:
    """``name -> value text`` for the plain assignments of a branch
    (``best = d``, ``best_i, best_d = i, d``), in order."""
    out: dict[str, str] = {}
    for st in body:
        if not (isinstance(st, ast.Assign) and len(st.targets) == 1):
            continue
        t, v = st.targets[0], st.value
        if isinstance(t, ast.Name):
            out[t.id] = ast.unparse(v)
        elif (
            isinstance(t, ast.Tuple)
            and isinstance(v, ast.Tuple)
            and len(t.elts) == len(v.elts)
            and all(isinstance(e, ast.Name) for e in t.elts)
        ):
            for e, val in zip(t.elts, v.elts, strict=True):
                out[e.id] = ast.unparse(val)  # type: ignore[attr-defined]
    return out
