"""Facts about the loop the kernel needs at run time, found once here.

The kernel used to parse the cell again for each of them (the last item's
binding, a file every iteration writes, process-wide state, set orders, where
the body reseeds, a draw after the loop); the plan now carries them, so a run
parses nothing and a re-run of a cached plan computes nothing.
"""

from __future__ import annotations

import ast
from dataclasses import dataclass
from types import CodeType

from gpucell.core.analysis.scope import global_draw
from gpucell.core.lastitem import (
    last_item_binding,
    loop_node,
    process_state_calls,
    set_orders,
    shared_file_writes,
    uses_autograd,
)

__all__ = ["LoopFacts", "loop_facts"]


@dataclass(frozen=True)
class LoopFacts:
    """What :func:`loop_facts` found (empty for a loop that is not a ``for``)."""

    # code binding the loop's target to the last item (core/lastitem.py), or
    # None when the body may leave another value there
    last_item: CodeType | None = None
    # (line, path) of an open(path, "w"/"a") every iteration runs
    shared_file_writes: tuple[tuple[int, str], ...] = ()
    # (line, call) of a call changing process-wide state (os.chdir...)
    process_state_calls: tuple[tuple[int, str], ...] = ()
    # lines giving a set's order to something ordered (list(set(words)))
    set_orders: tuple[int, ...] = ()
    # lines of the body's own expression statements (run in every iteration)
    top_expressions: tuple[int, ...] = ()
    # (line, call) of the first draw from a global generator after the loop
    epilogue_draw: tuple[int, str] | None = None
    # the body runs autograd itself (loss.backward()): engines check every input
    uses_autograd: bool = False
    # names whose every item the body stores (`y[i] = ..`, `y[i] += ..`) is
    # keyed by the loop's own position, never rebound: no key repeats
    position_keyed: frozenset[str] = frozenset()
    # of those, the names whose item is stored by one statement that runs at
    # most once per iteration: each key gets exactly one store, so the merge
    # can replay it as serially, cast to the dtype included (`y[i] += 0.5`)
    stored_once: frozenset[str] = frozenset()
    # (name, line, statement, key) of each `name[key] = ..` / `name[key] += ..`
    # in the body, as the cell spells them: a merge that refuses a key names
    # it by its source, not by its value (`votes[va]`, not an array's repr)
    subscript_stores: tuple[tuple[str, int, str, str], ...] = ()
    # (name, training) of a module from before the loop whose mode the body
    # sets before any other use of it (`model.eval()` first), unconditionally:
    # no iteration depends on another's mode; the last call's mode stays
    mode_calls: tuple[tuple[str, bool], ...] = ()


def loop_facts(
    source: str,
    kind: str | None,
    loop_line: int,
    filename: str,
    epilogue_lines: tuple[int, int] | None,
) -> LoopFacts:
    """The :class:`LoopFacts` of the loop at ``loop_line`` of ``source``."""
    draw = _first_draw(source, epilogue_lines)
    if kind != "for":
        return LoopFacts(epilogue_draw=draw)
    loop = loop_node(source, loop_line)
    top = (
        tuple(st.lineno for st in loop.body if isinstance(st, ast.Expr))
        if loop is not None
        else ()
    )
    keyed = _position_keyed(loop) if loop is not None else frozenset()
    return LoopFacts(
        last_item=last_item_binding(source, loop_line, filename),
        shared_file_writes=tuple(shared_file_writes(source, loop_line)),
        process_state_calls=tuple(process_state_calls(source, loop_line)),
        set_orders=tuple(set_orders(source, loop_line)),
        top_expressions=top,
        epilogue_draw=draw,
        uses_autograd=uses_autograd(source, loop_line),
        position_keyed=keyed,
        stored_once=_stored_once(loop, keyed) if loop is not None else frozenset(),
        subscript_stores=_subscript_stores(source, loop) if loop is not None else (),
        mode_calls=_mode_calls(loop) if loop is not None else (),
    )


def _mode_call(st: ast.stmt) -> tuple[str, bool] | None:
    """``model.eval()``, ``model.train()``, ``model.train(False)``: (name, mode)."""
    if not (isinstance(st, ast.Expr) and isinstance(st.value, ast.Call)):
        return None
    call, f = st.value, st.value.func
    if not (isinstance(f, ast.Attribute) and isinstance(f.value, ast.Name)):
        return None
    args = [*call.args, *(k.value for k in call.keywords if k.arg == "mode")]
    if len(args) != len(call.args) + len(call.keywords):
        return None
    if f.attr == "eval" and not args:
        return f.value.id, False
    if f.attr == "train" and not args:
        return f.value.id, True
    if (
        f.attr == "train"
        and len(args) == 1
        and isinstance(args[0], ast.Constant)
        and isinstance(args[0].value, bool)
    ):
        return f.value.id, args[0].value
    return None


def _mode_calls(loop: ast.For) -> tuple[tuple[str, bool], ...]:
    """See ``LoopFacts.mode_calls``: each name whose first use in the body is
    a mode call of the body's own (not in a branch), whose every mode call is
    such a statement, and which the body never binds."""
    bound = {
        n.id
        for n in ast.walk(ast.Module(body=loop.body, type_ignores=[]))
        if isinstance(n, ast.Name) and not isinstance(n.ctx, ast.Load)
    }
    top = {id(st): _mode_call(st) for st in loop.body}
    nested = {
        found[0]
        for st in loop.body
        for node in ast.walk(st)
        if isinstance(node, ast.stmt)
        and id(node) not in top
        and (found := _mode_call(node)) is not None
    }
    first_use: dict[str, ast.stmt] = {}
    last: dict[str, bool] = {}
    for st in loop.body:
        for node in ast.walk(st):
            if isinstance(node, ast.Name):
                first_use.setdefault(node.id, st)
        call = top[id(st)]
        if call is not None:
            last[call[0]] = call[1]
    return tuple(
        (name, mode)
        for name, mode in sorted(last.items())
        if name not in bound
        and name not in nested
        and top[id(first_use[name])] is not None
    )


def _subscript_stores(
    source: str, loop: ast.For
) -> tuple[tuple[str, int, str, str], ...]:
    """``(name, line, statement, key)`` of each store into ``name[key]`` in the
    body, the statement and key as the cell writes them (one line)."""
    out = []
    for st in ast.walk(ast.Module(body=loop.body, type_ignores=[])):
        if isinstance(st, ast.Assign):
            targets = st.targets
        elif isinstance(st, (ast.AugAssign, ast.AnnAssign)):
            targets = [st.target]
        else:
            continue
        for t in targets:
            if isinstance(t, ast.Subscript) and isinstance(t.value, ast.Name):
                out.append(
                    (
                        t.value.id,
                        st.lineno,
                        _spelled(source, st),
                        _spelled(source, t.slice),
                    )
                )
    return tuple(out)


def _spelled(source: str, node: ast.AST) -> str:
    """``node`` as the cell writes it, on one line (else as ``ast`` prints it)."""
    text = ast.get_source_segment(source, node)
    return text if text is not None and "\n" not in text else ast.unparse(node)


def _position_keyed(loop: ast.For) -> frozenset[str]:
    """Names every stored item of which is keyed by the loop's own position
    (``for i in range(n)``, ``range(a, n)`` with ``a`` a literal >= 0, or the
    count of ``enumerate``), that name never rebound in the body: no key
    repeats, and no negative position names another iteration's element."""
    var = _position_variable(loop)
    if var is None:
        return frozenset()
    stored: set[str] = set()
    other: set[str] = set()
    for node in ast.walk(ast.Module(body=loop.body, type_ignores=[])):
        if isinstance(node, ast.Name) and node.id == var:
            if isinstance(node.ctx, ast.Store):
                return frozenset()  # rebound: keys may repeat
        targets: list[ast.expr] = []
        if isinstance(node, ast.Assign):
            targets = list(node.targets)
        elif isinstance(node, (ast.AugAssign, ast.AnnAssign)):
            targets = [node.target]
        for t in targets:
            if isinstance(t, ast.Subscript) and isinstance(t.value, ast.Name):
                if isinstance(t.slice, ast.Name) and t.slice.id == var:
                    stored.add(t.value.id)
                else:
                    other.add(t.value.id)
    return frozenset(stored - other)


#: statements whose body may run more than once per iteration (or later)
_REPEATS = (
    ast.For,
    ast.AsyncFor,
    ast.While,
    ast.FunctionDef,
    ast.AsyncFunctionDef,
    ast.ClassDef,
)


def _stored_once(loop: ast.For, names: frozenset[str]) -> frozenset[str]:
    """The ``names`` whose items one statement of the body stores, outside
    any inner loop or function (which may run it again).  Two statements on
    one key (`y[i] += a; y[i] += b`) each cast serially, and a fold of both
    casts once.  Stores are statements, so only statements are walked (a
    comprehension or lambda holds none)."""
    if not names:
        return frozenset()
    count: dict[str, int] = dict.fromkeys(names, 0)

    def visit(stmts: list[ast.stmt], repeated: bool) -> None:
        for st in stmts:
            targets: list[ast.expr] = []
            if isinstance(st, ast.Assign):
                targets = st.targets
            elif isinstance(st, (ast.AugAssign, ast.AnnAssign)):
                targets = [st.target]
            for t in targets:
                if isinstance(t, ast.Subscript) and isinstance(t.value, ast.Name):
                    if t.value.id in count:
                        count[t.value.id] += 2 if repeated else 1
            inner = repeated or isinstance(st, _REPEATS)
            for field in ("body", "orelse", "finalbody"):
                block = getattr(st, field, None)
                if isinstance(block, list):
                    visit(block, inner)
            for h in getattr(st, "handlers", ()):
                visit(h.body, inner)
            for case in getattr(st, "cases", ()):
                visit(case.body, inner)

    visit(loop.body, False)
    return frozenset(n for n, c in count.items() if c == 1)


def _position_variable(loop: ast.For) -> str | None:
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


def _first_draw(source: str, lines: tuple[int, int] | None) -> tuple[int, str] | None:
    """``(line, call)`` of the first draw from a global generator in the
    cell's code after the loop, if any."""
    if lines is None:
        return None
    try:
        tree = ast.parse(source)
    except SyntaxError:
        return None
    first, last = lines
    for node in ast.walk(tree):
        if isinstance(node, ast.Call) and first <= node.lineno <= last:
            text = global_draw(node)
            if text is not None:
                return node.lineno, text
    return None
