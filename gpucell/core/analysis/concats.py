"""``x = np.append(x, e)``, ``x = np.vstack([x, row])``, ``x = torch.cat([x,
t])``, ``df = pd.concat([df, part])``: a name from before the loop rebound by
a concatenation of itself, and used nowhere else in the body.

Serially each call reads what the previous iteration left; as written the
loop is refused (a loop-carried read).  Rewritten (spellings.respell), each
call is recorded instead of made: the function, a snapshot of its other
arguments and where ``x`` goes (``protocol/concat.ConcatCall``), gathered in
iteration order under a hidden name; the merge makes the calls on the kernel,
in order, from ``x``'s value before the loop (``core/merge_replays.py``).
"""

from __future__ import annotations

import ast

from gpucell.core.analysis.replays import _used_only_by
from gpucell.protocol.concat import ATTRIBUTES, MODULES

__all__: list[str] = []


def _concat_call(s: ast.stmt) -> tuple[str, ast.Call, tuple[int, ...]] | None:
    """``x = m.f(...)`` with ``m.f`` a concatenation's spelling and ``x``
    once among its arguments, as one of them or as an item of a list or tuple
    literal one of them is: ``(x, the call, where x is)``."""
    if not (
        isinstance(s, ast.Assign)
        and len(s.targets) == 1
        and isinstance(s.targets[0], ast.Name)
        and isinstance(s.value, ast.Call)
    ):
        return None
    x, call = s.targets[0].id, s.value
    f = call.func
    if not (
        isinstance(f, ast.Attribute)
        and isinstance(f.value, ast.Name)
        and f.value.id in MODULES
        and f.attr in ATTRIBUTES
        and f.value.id != x
    ):
        return None
    if any(k.arg is None for k in call.keywords):
        return None
    at: tuple[int, ...] | None = None
    for i, a in enumerate(call.args):
        if isinstance(a, ast.Starred):
            return None
        if isinstance(a, ast.Name) and a.id == x:
            at = (i,) if at is None else ()
        elif isinstance(a, (ast.List, ast.Tuple)):
            for j, e in enumerate(a.elts):
                if isinstance(e, ast.Starred):
                    return None
                if isinstance(e, ast.Name) and e.id == x:
                    at = (i, j) if at is None else ()
    uses = sum(
        isinstance(n, ast.Name) and n.id == x
        for part in (*call.args, *call.keywords)
        for n in ast.walk(part)
    )
    if not at or uses != 1:
        return None
    return x, call, at


_ONCE = {"np": "np.concatenate", "numpy": "numpy.concatenate", "torch": "torch.cat"}


def _concatenated(stmts: list[ast.stmt]) -> dict[str, tuple[int, str]]:
    """Names some statement rebinds by a concatenation of themselves -> the
    first such statement's line and the one call that would concatenate the
    gathered pieces after the loop (for the refusal's advice)."""
    out: dict[str, tuple[int, str]] = {}
    for st in stmts:
        for node in ast.walk(st):
            if isinstance(node, ast.stmt):
                found = _concat_call(node)
                if found is not None:
                    f = found[1].func
                    assert isinstance(f, ast.Attribute)
                    assert isinstance(f.value, ast.Name)
                    once = _ONCE.get(f.value.id, f"{f.value.id}.concat")
                    out.setdefault(found[0], (node.lineno, once))
    return out


def _concat_targets(body: list[ast.stmt], iterated: set[str]) -> set[str]:
    """The names the body uses only as ``x = concatenation(.. x ..)``: any
    other use would read the value so far (the loop's own iterable too)."""

    def target(s: ast.stmt) -> str | None:
        found = _concat_call(s)
        return None if found is None else found[0]

    return _used_only_by(body, target, 2) - iterated


def _concat(s: ast.stmt, targets: set[str]) -> tuple[ast.stmt, str, str] | None:
    """``x = m.f(a, [x, e], k=v)`` as ``__gpucell_cat_x__.append((m.f,
    snapshot((a, [None, e])), snapshot({'k': v}), (1, 0)))``: the statement
    replaced, its hidden gather and ``x``."""
    found = _concat_call(s)
    if found is None or found[0] not in targets:
        return None
    x, call, at = found
    args: list[ast.expr] = []
    for i, a in enumerate(call.args):
        if at == (i,):
            args.append(ast.Constant(None))
        elif len(at) == 2 and at[0] == i:
            assert isinstance(a, (ast.List, ast.Tuple))
            elts = [
                ast.Constant(None) if j == at[1] else e for j, e in enumerate(a.elts)
            ]
            args.append(type(a)(elts=elts, ctx=ast.Load()))
        else:
            args.append(a)
    kwargs = ast.Dict(
        keys=[ast.Constant(k.arg) for k in call.keywords],
        values=[k.value for k in call.keywords],
    )
    snap = ast.parse(
        "__import__('gpucell.protocol.concat', fromlist=['snapshot']).snapshot",
        mode="eval",
    ).body
    entry = ast.Tuple(
        elts=[
            call.func,
            ast.Call(snap, [ast.Tuple(elts=args, ctx=ast.Load())], []),
            ast.Call(snap, [kwargs], []),
            ast.Tuple(elts=[ast.Constant(k) for k in at], ctx=ast.Load()),
        ],
        ctx=ast.Load(),
    )
    hidden = f"__gpucell_cat_{x}__"
    append = ast.Attribute(ast.Name(hidden, ast.Load()), "append", ast.Load())
    new = ast.Expr(ast.Call(append, [entry], []))
    for node in ast.walk(new):
        if not hasattr(node, "lineno"):
            ast.copy_location(node, s)
    return new, hidden, x
