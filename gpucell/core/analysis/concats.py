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

from gpucell.core.analysis.replays import _used_only_by, concat_helper
from gpucell.core.analysis.spellbase import _pure, _reads
from gpucell.protocol.concat import ATTRIBUTES, BIND, IF_NONE, MODULES

__all__: list[str] = []


def _assigned(s: ast.stmt) -> tuple[str, ast.expr] | None:
    """``x = value`` (one name): ``(x, value)``."""
    if (
        isinstance(s, ast.Assign)
        and len(s.targets) == 1
        and isinstance(s.targets[0], ast.Name)
    ):
        return s.targets[0].id, s.value
    return None


def _concat_assign(s: ast.stmt) -> tuple[str, ast.Call] | None:
    """``x = m.f(...)``, ``m.f`` a concatenation's spelling: ``(x, the call)``."""
    found = _assigned(s)
    if found is None or not isinstance(found[1], ast.Call):
        return None
    f = found[1].func
    if (
        isinstance(f, ast.Attribute)
        and isinstance(f.value, ast.Name)
        and f.value.id in MODULES
        and f.attr in ATTRIBUTES
    ):
        return found[0], found[1]
    return None


def _concat_call(s: ast.stmt) -> tuple[str, ast.Call, tuple[int, ...]] | None:
    """``x = m.f(...)`` with ``m.f`` a concatenation's spelling and ``x``
    once among its arguments, as one of them or as an item of a list or tuple
    literal one of them is: ``(x, the call, where x is)``."""
    found = _concat_assign(s)
    if found is None:
        return None
    x, call = found
    f = call.func
    assert isinstance(f, ast.Attribute) and isinstance(f.value, ast.Name)
    if x == f.value.id:  # (`np = np.append(np, ...)`)
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


def _concat_reading(s: ast.stmt) -> tuple[str, ast.Call, tuple[int, ...]] | None:
    """``x = m.f(... x ...)`` with ``x`` read in the arguments in any way
    (``np.append(x, x[-1] + 1)``): for the advice only."""
    found = _concat_assign(s)
    if found is None:
        return None
    x, call = found
    if not _reads(call, x):
        return None
    return x, call, ()


def _concatenated(stmts: list[ast.stmt]) -> dict[str, tuple[int, str]]:
    """Names some statement rebinds by a concatenation of themselves -> the
    first such statement's line and the one call that would concatenate the
    gathered pieces after the loop (for the refusal's advice)."""
    out: dict[str, tuple[int, str]] = {}
    for st in stmts:
        for node in ast.walk(st):
            if isinstance(node, ast.stmt):
                found = _concat_call(node) or _concat_reading(node)
                if found is not None:
                    f = found[1].func
                    assert isinstance(f, ast.Attribute)
                    assert isinstance(f.value, ast.Name)
                    once = _ONCE.get(f.value.id, f"{f.value.id}.concat")
                    out.setdefault(found[0], (node.lineno, once))
    return out


def _bind(s: ast.stmt) -> tuple[str, ast.expr] | None:
    """``x = e``, ``e`` not reading ``x``: ``(x, e)``."""
    found = _assigned(s)
    if found is None:
        return None
    x, e = found
    return None if _reads(e, x) else found


def _if_none(s: ast.stmt) -> tuple[str, ast.expr, ast.Assign] | None:
    """``if x is None: x = e`` ``else: x = concatenation(.. x ..)`` (or the
    test ``x is not None`` with the branches the other way round): ``(x, e,
    the concatenation)``."""
    if not (
        isinstance(s, ast.If)
        and isinstance(s.test, ast.Compare)
        and isinstance(s.test.left, ast.Name)
        and len(s.test.ops) == 1
        and isinstance(s.test.ops[0], (ast.Is, ast.IsNot))
        and isinstance(s.test.comparators[0], ast.Constant)
        and s.test.comparators[0].value is None
        and len(s.body) == 1
        and len(s.orelse) == 1
    ):
        return None
    x = s.test.left.id
    first, then = s.body[0], s.orelse[0]
    if isinstance(s.test.ops[0], ast.IsNot):
        first, then = then, first
    bound, cat = _bind(first), _concat_call(then)
    if bound is None or cat is None or bound[0] != x or cat[0] != x:
        return None
    assert isinstance(then, ast.Assign)
    # serially one branch runs; here the first value and the call's other
    # arguments are all evaluated: only the one expression both share (once)
    # may have effects
    temp = ast.Name("__gpucell_none__", ast.Load())
    swapped = _with_temp(cat[1], bound[1], temp.id)
    others = [
        n
        for a in (*swapped.args, *(k.value for k in swapped.keywords))
        for n in (a.elts if isinstance(a, (ast.List, ast.Tuple)) else [a])
        if not (isinstance(n, ast.Name) and n.id in (x, temp.id))
    ]
    if not all(_pure(n, lambda _name: False) for n in others):
        return None
    if not _reads(swapped, temp.id) and not _pure(bound[1], lambda _n: False):
        return None
    return x, bound[1], then


def _as_if(s: ast.stmt) -> ast.stmt:
    """``x = e if x is None else f([x, e])`` as the ``if`` statement it
    stands for (other statements as they are)."""
    found = _assigned(s)
    if found is None or not isinstance(found[1], ast.IfExp):
        return s
    x, v = found[0], found[1]

    def bind(e: ast.expr) -> ast.stmt:
        return ast.copy_location(ast.Assign([ast.Name(x, ast.Store())], e), s)

    return ast.copy_location(ast.If(v.test, [bind(v.body)], [bind(v.orelse)]), s)


def _form(s: ast.stmt) -> tuple[str, int] | None:
    """A statement of the forms a concatenated name may appear in, and how
    many uses of it the statement accounts for."""
    found = _if_none(_as_if(s))
    if found is not None:
        return found[0], 3 if isinstance(s, ast.Assign) else 4
    cat = _concat_call(s)
    if cat is not None:
        return cat[0], 2
    bound = _bind(s)
    return None if bound is None else (bound[0], 1)


def _concat_targets(body: list[ast.stmt], iterated: set[str]) -> set[str]:
    """The names the body uses only as ``x = concatenation(.. x ..)`` (also
    ``x = e``, and ``if x is None: x = e`` ``else: x = concatenation(..)``),
    with at least one concatenation: any other use would read the value so
    far (the loop's own iterable too)."""
    grows = set()
    for st in body:
        for node in ast.walk(st):
            if isinstance(node, ast.stmt):
                if (found := _concat_call(node)) is not None:
                    grows.add(found[0])
                elif (none := _if_none(_as_if(node))) is not None:
                    grows.add(none[0])
    return (_used_only_by(body, _form) & grows) - iterated


def _snapshot(e: ast.expr) -> ast.expr:
    return ast.Call(concat_helper("snapshot"), [e], [])


def _call_entry(x: str, call: ast.Call, at: tuple[int, ...]) -> ast.expr:
    """``(m.f, snapshot((a, [None, e])), snapshot({'k': v}), (1, 0))``."""
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
    return ast.Tuple(
        elts=[
            call.func,
            _snapshot(ast.Tuple(elts=args, ctx=ast.Load())),
            _snapshot(kwargs),
            ast.Tuple(elts=[ast.Constant(k) for k in at], ctx=ast.Load()),
        ],
        ctx=ast.Load(),
    )


def _tagged(tag: str, *parts: ast.expr) -> ast.expr:
    return ast.Tuple(elts=[ast.Constant(tag), *parts], ctx=ast.Load())


def _concat(s: ast.stmt, targets: set[str]) -> tuple[list[ast.stmt], str, str] | None:
    """A statement of a concatenated name as what records it under the
    hidden ``__gpucell_cat_x__``: ``x = m.f(a, [x, e], k=v)`` as
    ``__gpucell_cat_x__.append((m.f, snapshot((a, [None, e])),
    snapshot({'k': v}), (1, 0)))``; ``x = e`` as ``("bind", snapshot(e))``;
    ``if x is None: x = e else: x = m.f([x, e])`` as ``("if None",
    snapshot(e), the call's entry)``, ``e`` evaluated once where the call
    concatenates the same expression.  Returns (the statements, the hidden
    name, ``x``)."""
    pre: list[ast.stmt] = []
    none = _if_none(_as_if(s))
    if none is not None and none[0] in targets:
        x, first, then = none
        cat = _concat_call(then)
        assert cat is not None
        temp = f"__gpucell_cat_first_{x}__"
        pre.append(ast.Assign([ast.Name(temp, ast.Store())], first))
        call = _with_temp(cat[1], first, temp)
        first_value = _snapshot(ast.Name(temp, ast.Load()))
        entry = _tagged(IF_NONE, first_value, _call_entry(x, call, cat[2]))
    elif (cat := _concat_call(s)) is not None and cat[0] in targets:
        x = cat[0]
        entry = _call_entry(x, cat[1], cat[2])
    elif (bound := _bind(s)) is not None and bound[0] in targets:
        x = bound[0]
        entry = _tagged(BIND, _snapshot(bound[1]))
    else:
        return None
    hidden = f"__gpucell_cat_{x}__"
    append = ast.Attribute(ast.Name(hidden, ast.Load()), "append", ast.Load())
    out = [*pre, ast.Expr(ast.Call(append, [entry], []))]
    for new in out:
        for node in ast.walk(new):
            if not hasattr(node, "lineno"):
                ast.copy_location(node, s)
    return out, hidden, x


def _with_temp(call: ast.Call, e: ast.expr, temp: str) -> ast.Call:
    """``call`` with each argument (or list item) that is ``e`` itself, as
    written, replaced by the name ``temp`` (evaluated once)."""
    want = ast.dump(e)

    def swap(a: ast.expr) -> ast.expr:
        if ast.dump(a) == want:
            return ast.Name(temp, ast.Load())
        if isinstance(a, (ast.List, ast.Tuple)):
            return type(a)(elts=[swap(v) for v in a.elts], ctx=ast.Load())
        return a

    return ast.Call(call.func, [swap(a) for a in call.args], call.keywords)
