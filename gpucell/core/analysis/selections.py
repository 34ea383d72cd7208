"""Running bests and first matches (``if d < best: best = d``): found in the
body so a refusal can say how to keep them after the loop."""

from __future__ import annotations

import ast
import dataclasses
from collections.abc import Callable, Iterable
from dataclasses import dataclass

from gpucell.core.analysis.scope import (
    block_statements,
    target_names,
)
from gpucell.core.analysis.sinks import RunningBest

__all__ = ["running_bests"]


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


# ---------------------------------------------------------------- running bests


_COMPARE_TEXT = {ast.Lt: "<", ast.LtE: "<=", ast.Gt: ">", ast.GtE: ">="}

#: calls a score or a payload may make: they run on the engines whenever the
#: chunk's own best improves (serially: when the cell's best does), so they
#: must not have effects
_PURE_BUILTINS = frozenset(
    {"abs", "float", "int", "round", "len", "min", "max", "sum", "list", "tuple"}
    | {"dict", "sorted", "str", "bool"}
)
_PURE_METHODS = frozenset(
    {"copy", "clone", "detach", "cpu", "item", "tolist", "numpy", "state_dict"}
    | {"items", "keys", "values", "get_params", "mean", "sum", "min", "max"}
)
_PURE_FUNCTIONS = frozenset({"deepcopy"})  # (`copy.deepcopy`, `deepcopy`)

_PURE_NODES = (
    ast.Name,
    ast.Constant,
    ast.Attribute,
    ast.Subscript,
    ast.Slice,
    ast.Tuple,
    ast.List,
    ast.Dict,
    ast.Set,
    ast.BinOp,
    ast.UnaryOp,
    ast.ListComp,
    ast.DictComp,
    ast.SetComp,
    ast.GeneratorExp,
    ast.comprehension,
    ast.keyword,
    ast.Call,
    ast.JoinedStr,
    ast.FormattedValue,
    ast.expr_context,
    ast.operator,
    ast.unaryop,
)


def _pure_value(e: ast.expr, is_builtin: Callable[[str], bool]) -> bool:
    """What the branch stores: names, attributes, items, copies (``.clone()``,
    ``copy.deepcopy(m)``, ``{k: v.clone() for k, v in m.state_dict().items()}``)."""
    for node in ast.walk(e):
        if not isinstance(node, _PURE_NODES):
            return False
        if isinstance(node, ast.comprehension) and node.is_async:
            return False
        if isinstance(node, ast.Call):
            f = node.func
            if isinstance(f, ast.Name):
                ok = (f.id in _PURE_BUILTINS and is_builtin(f.id)) or (
                    f.id in _PURE_FUNCTIONS
                )
            elif isinstance(f, ast.Attribute):
                ok = f.attr in _PURE_METHODS or (
                    f.attr in _PURE_FUNCTIONS
                    and isinstance(f.value, ast.Name)
                    and f.value.id == "copy"
                )
            else:
                ok = False
            if not ok:
                return False
    return True


def _best_tests(test: ast.expr) -> list[tuple[str, str, bool, bool, ast.expr]]:
    """``score OP best`` / ``best OP score`` (and ``best is None or ...``):
    each reading as ``(best, OP, best_left, none_first, score)`` (both sides
    may be names: the branch tells which is kept)."""
    none_first = False
    guard: str | None = None
    if isinstance(test, ast.BoolOp) and isinstance(test.op, ast.Or):
        if len(test.values) != 2:
            return []
        first, test = test.values
        if not (
            isinstance(first, ast.Compare)
            and isinstance(first.left, ast.Name)
            and len(first.ops) == 1
            and isinstance(first.ops[0], ast.Is)
            and isinstance(first.comparators[0], ast.Constant)
            and first.comparators[0].value is None
        ):
            return []
        none_first, guard = True, first.left.id
    if not (isinstance(test, ast.Compare) and len(test.ops) == 1):
        return []
    op = _COMPARE_TEXT.get(type(test.ops[0]))
    if op is None:
        return []
    left, right = test.left, test.comparators[0]
    out = []
    for best, best_left, score in ((right, False, left), (left, True, right)):
        if (
            isinstance(best, ast.Name)
            and best.id not in _names_in(score)
            and guard in (None, best.id)
        ):
            out.append((best.id, op, best_left, none_first, score))
    return out


def _names_in(e: ast.AST) -> set[str]:
    return {n.id for n in ast.walk(e) if isinstance(n, ast.Name)}


def _branch_values(body: list[ast.stmt]) -> dict[str, ast.expr] | None:
    """``name -> value`` of a branch made only of plain assignments of
    distinct names (``best = d``, ``best_i, best_d = i, d``); else None."""
    out: dict[str, ast.expr] = {}
    for st in body:
        if not (isinstance(st, ast.Assign) and len(st.targets) == 1):
            return None
        t, v = st.targets[0], st.value
        pairs: list[tuple[ast.expr, ast.expr]]
        if isinstance(t, ast.Name):
            pairs = [(t, v)]
        elif (
            isinstance(t, ast.Tuple)
            and isinstance(v, ast.Tuple)
            and len(t.elts) == len(v.elts)
            and not any(isinstance(x, ast.Starred) for x in v.elts)
        ):
            pairs = list(zip(t.elts, v.elts, strict=True))
        else:
            return None
        for name, value in pairs:
            if not isinstance(name, ast.Name) or name.id in out:
                return None
            out[name.id] = value
    return out


def running_bests(
    body: list[ast.stmt],
    is_builtin: Callable[[str], bool],
    loop_names: Iterable[str] = (),
) -> tuple[dict[str, RunningBest], set[int]]:
    """The body's running bests that merge exactly, and the ``best`` reads
    in their tests (which see the chunk's own running value: not a
    loop-carried read).  Each group's names appear nowhere else in the body:
    ``best`` is read only by its test, every name assigned once, by the
    branch, from values that read no name of the group and call nothing with
    effects; no ``else``; nothing deleted (the engine's per-iteration end
    would take the running value away); at least one payload (a value alone
    is a reduction, ``best = min(best, x)``, which the advice says)."""
    loads: dict[str, int] = {}
    stores: dict[str, int] = dict.fromkeys(loop_names, 2)
    for st in body:
        for node in ast.walk(st):
            if isinstance(node, ast.Delete):
                return {}, set()
            if isinstance(node, ast.Name):
                bucket = loads if isinstance(node.ctx, ast.Load) else stores
                bucket[node.id] = bucket.get(node.id, 0) + 1
            elif isinstance(node, (ast.Global, ast.Nonlocal)):
                for n in node.names:
                    stores[n] = stores.get(n, 0) + 2
    found: dict[str, RunningBest] = {}
    reads: set[int] = set()
    for st in block_statements(body):
        if not isinstance(st, ast.If) or st.orelse:
            continue
        values = _branch_values(st.body)
        if values is None:
            continue
        readings = [
            t
            for t in _best_tests(st.test)
            if t[0] in values and ast.dump(values[t[0]]) == ast.dump(t[4])
        ]
        if len(readings) != 1:
            continue
        best, op, best_left, none_first, score = readings[0]
        group = set(values)
        if any(stores.get(n, 0) != 1 for n in group):
            continue
        if loads.get(best, 0) != 1 + none_first:
            continue
        if any(loads.get(n, 0) for n in group - {best}):
            continue
        if any(_names_in(v) & group for v in values.values()):
            continue
        if not all(_pure_value(v, is_builtin) for v in [score, *values.values()]):
            continue
        payloads = tuple(n for n in values if n != best)
        if not payloads:
            continue  # (a value alone is `best = min(best, x)`: the advice)
        found[best] = RunningBest(best, payloads, op, best_left, none_first, st.lineno)
        reads |= {
            id(n) for n in ast.walk(st.test) if isinstance(n, ast.Name) and n.id == best
        }
    return found, reads
