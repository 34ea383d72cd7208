"""The flow walk: a definite-assignment walk of the body in evaluation order
that finds loop-carried reads, the inputs, control flow leaving the
iteration and in-place changes to objects from before the loop.  Its parts:
``flowbase`` (state, context, reads of names), ``mutations`` (in-place
changes), ``flowstmts`` (statements that leave or scope the iteration), and
here assignments, loops, branches and expressions."""

from __future__ import annotations

import ast
from collections.abc import Callable, Iterable

from gpucell.core.analysis.flowbase import State, _add, _Ctx, _join, _Jumps
from gpucell.core.analysis.flowstmts import _Statements
from gpucell.core.analysis.keys import _int_literal, _is_own_key
from gpucell.core.analysis.messages import _AWAIT_TEXT, _op_text
from gpucell.core.analysis.refusals import Await, Yield
from gpucell.core.analysis.scope import (
    COMPREHENSIONS,
    bindings_of,
    scope_nodes,
    target_names,
    target_parts,
)
from gpucell.core.analysis.strkeys import _differ, _read_keys
from gpucell.protocol.program import INDEXERS

__all__ = ["State", "_Ctx"]


class _Flow(_Statements):
    """Definite-assignment walk of the loop body in evaluation order."""

    def block(self, stmts: Iterable[ast.stmt], state: State) -> State:
        for s in stmts:
            state = self.stmt(s, state)
        return state

    def store(self, target: ast.expr, state: State, op: str = "") -> State:
        for part in target_parts(target):
            if isinstance(part, ast.Name):
                if id(part) in self.c.own:
                    continue
                self.c.seen_stored.add(part.id)
                state = _add(state, [part.id])
            elif isinstance(part, ast.Subscript):
                if isinstance(part.value, ast.Name) and id(part.value) in self.c.own:
                    state = self.expr(part.slice, state)
                    continue
                state = self.expr(part.value, state)
                state = self.expr(part.slice, state)
                self.check_target_mutation(part, state, op)
            elif isinstance(part, ast.Attribute):
                state = self.expr(part.value, state)
                self.check_target_mutation(part, state, op)
            else:
                state = self.expr(part, state)
        return state

    def stmt(self, s: ast.stmt, state: State) -> State:  # noqa: C901
        m = getattr(self, "stmt_" + type(s).__name__, None)
        if m is not None:
            return m(s, state)  # type: ignore[no-any-return]
        # simple statements: evaluate every expression child in order
        for child in ast.iter_child_nodes(s):
            if isinstance(child, ast.expr):
                state = self.expr(child, state)
        return state

    def stmt_Assign(self, s: ast.Assign, state: State) -> State:
        state = self.expr(s.value, state)
        for t in s.targets:
            state = self.store(t, state)
        return state

    def stmt_AnnAssign(self, s: ast.AnnAssign, state: State) -> State:
        if s.value is None:
            return state
        state = self.expr(s.value, state)
        state = self.expr(s.annotation, state)
        return self.store(s.target, state)

    def stmt_AugAssign(self, s: ast.AugAssign, state: State) -> State:
        t = s.target
        if isinstance(t, ast.Name):
            if id(t) in self.c.own:
                return self.expr(s.value, state)
            self.load(
                ast.Name(t.id, ast.Load(), lineno=t.lineno, col_offset=t.col_offset),
                state,
            )
            state = self.expr(s.value, state)
            if t.id in self.c.tainted and t.id not in self.c.shallow:
                self._refuse_mutation(
                    s, t, f"`{t.id} {_op_text(s.op)}= ...` on an alias"
                )
            self.c.seen_stored.add(t.id)
            return _add(state, [t.id])
        if isinstance(t, ast.Subscript) and isinstance(t.value, ast.Name):
            if id(t.value) in self.c.own:
                state = self.expr(t.slice, state)
                return self.expr(s.value, state)
        state = self.store(t, state, _op_text(s.op))
        return self.expr(s.value, state)

    def _loop(
        self,
        s: ast.For | ast.While,
        state: State,
        head: Callable[[State], State],
    ) -> State:
        """Definite assignment through a nested loop.  A loop whose body surely
        runs once (:func:`_runs_once`) leaves what that body assigns on every
        path; any other may run zero times and leaves only what held before it.
        ``break``/``continue`` states are collected, not guessed."""
        entry = s_in = state
        self.loop_depth += 1
        converged = False
        for _ in range(4):  # definite assignment converges in a pass or two
            self.jumps.append(_Jumps())
            body_end = self.block(s.body, head(s_in))
            jumps = self.jumps.pop()
            new_in = _join(entry, body_end, *jumps.continues)
            converged = new_in == s_in
            if converged:
                break
            s_in = new_in
        self.loop_depth -= 1
        # the last pass's states are lower bounds only once they converged
        runs = converged and _runs_once(s, self.c.is_builtin, self._checkable)
        if isinstance(s, ast.While):
            exhausted = None if runs else head(s_in)
        else:
            exhausted = _join(body_end, *jumps.continues) if runs else s_in
        after = self.block(s.orelse, exhausted)
        return _join(after, *jumps.breaks)

    def _checkable(self, e: ast.expr) -> bool:
        """Can the kernel tell before the run that iterating ``e`` yields an
        item?  Inputs only (names the body never binds, their attributes,
        ``range`` of those, ``len`` of those and int literals): the same value
        in every iteration, so one check in the kernel covers them all.
        Recorded, for the plan to check (``LoopPlan.nonempty``)."""
        if not self.c.assume_nonempty or not self._input_expr(e, calls=True):
            return False
        self.c.nonempty[(e.lineno, ast.unparse(e))] = None
        return True

    def _input_expr(self, e: ast.expr, calls: bool) -> bool:
        if isinstance(e, ast.Name):
            n = e.id
            return not (
                n in self.c.body_bound
                or n in self.c.tainted
                or n in self.c.sinks
                or self._shadowed(n)
                or self.c.is_builtin(n)
            )
        if isinstance(e, ast.Attribute):
            return self._input_expr(e.value, False)
        if isinstance(e, ast.Constant):
            return isinstance(e.value, int) and not calls
        if (
            isinstance(e, ast.Call)
            and isinstance(e.func, ast.Name)
            and e.func.id in ("range", "len")
            and self.c.is_builtin(e.func.id)
            and not e.keywords
            and e.args
            and (e.func.id == "range") == calls
        ):
            return all(
                not isinstance(a, ast.Starred) and self._input_expr(a, False)
                for a in e.args
            )
        if isinstance(e, ast.BinOp) and not calls:  # range(n // 2), len(x) - 1
            return self._input_expr(e.left, False) and self._input_expr(e.right, False)
        return False

    def stmt_For(self, s: ast.For, state: State) -> State:
        state = self.expr(s.iter, state)
        return self._loop(s, state, lambda st: self.store(s.target, st))

    def stmt_AsyncFor(self, s: ast.AsyncFor, state: State) -> State:
        self._forbid_async(s, "async for")
        return self.stmt_For(s, state)  # type: ignore[arg-type]

    def stmt_While(self, s: ast.While, state: State) -> State:
        return self._loop(s, state, lambda st: self.expr(s.test, st))

    def stmt_If(self, s: ast.If, state: State) -> State:
        state = self.expr(s.test, state)
        return _join(self.block(s.body, state), self.block(s.orelse, state))

    def stmt_With(self, s: ast.With, state: State) -> State:
        for item in s.items:
            state = self.expr(item.context_expr, state)
            if item.optional_vars is not None:
                state = self.store(item.optional_vars, state)
        return self.block(s.body, state)

    def stmt_AsyncWith(self, s: ast.AsyncWith, state: State) -> State:
        self._forbid_async(s, "async with")
        return self.stmt_With(s, state)  # type: ignore[arg-type]

    # -- expressions ---------------------------------------------------------------

    def _own_read(self, e: ast.AST) -> ast.Name | None:
        """``S[i]``, ``S[i, ...]`` or ``S.at[i, ...]`` (any indexer) read, ``S``
        written only at the loop's own index ``i``: the sink's name node."""
        if not (isinstance(e, ast.Subscript) and isinstance(e.ctx, ast.Load)):
            return None
        base = e.value
        if isinstance(base, ast.Attribute) and base.attr in INDEXERS:
            base = base.value
        if not isinstance(base, ast.Name) or self._shadowed(base.id):
            return None
        i = self.c.own_elements.get(base.id)
        if i is not None and _is_own_key(e.slice, i):
            return base
        keys = self.c.write_keys.get(base.id)
        if keys is None:
            return None
        reads = _read_keys(e, ("loc",), self.c.literal_keys)
        if reads and all(_differ(k, r) for k in keys for r in reads):
            return base  # (keys no iteration writes: their values from before)
        return None

    def expr(self, e: ast.AST, state: State) -> State:  # noqa: C901
        own = self._own_read(e)
        if own is not None:
            # the iteration's own element (or row), which only this iteration
            # writes: it reads the value from before the loop, serially as here
            self.c.inputs.setdefault(own.id, e.lineno)  # type: ignore[attr-defined]
            return self.expr(e.slice, state)  # type: ignore[attr-defined]
        if isinstance(e, ast.Name):
            if isinstance(e.ctx, ast.Load):
                self.load(e, state)
            return state
        if isinstance(e, ast.NamedExpr):
            state = self.expr(e.value, state)
            self.c.seen_stored.add(e.target.id)
            return _add(state, [e.target.id])
        if isinstance(e, ast.BoolOp):
            first = self.expr(e.values[0], state)
            st = first
            for v in e.values[1:]:
                st = self.expr(v, st)
            return first
        if isinstance(e, ast.IfExp):
            state = self.expr(e.test, state)
            return _join(self.expr(e.body, state), self.expr(e.orelse, state))
        if isinstance(e, ast.Lambda):
            return self._nested(e, state)
        if isinstance(e, COMPREHENSIONS):
            return self._comprehension(e, state)
        if isinstance(e, (ast.Await, ast.Yield, ast.YieldFrom)):
            if isinstance(e, ast.Await):
                self._forbid_async(e, "await")
            else:
                self.forbid(e, Yield, "yield")
        if isinstance(e, ast.Call):
            self.check_call(e, state)
        for child in ast.iter_child_nodes(e):
            if isinstance(child, ast.keyword):
                state = self.expr(child.value, state)
            elif isinstance(child, ast.expr):
                state = self.expr(child, state)
        return state

    def _forbid_async(self, node: ast.AST, what: str) -> None:
        message, advice = _AWAIT_TEXT
        self.forbid(node, Await, what, what=message, fix=advice)

    def _comprehension(self, e: ast.AST, state: State) -> State:
        gens: list[ast.comprehension] = e.generators  # type: ignore[attr-defined]
        before = self.expr(gens[0].iter, state)
        st = before
        names = frozenset(n.id for g in gens for n in target_names(g.target))
        self.shadow.append(names)
        try:
            for i, g in enumerate(gens):
                if g.is_async:
                    self._forbid_async(g.iter, "async for")
                if i:
                    st = self.expr(g.iter, st)
                for cond in g.ifs:
                    st = self.expr(cond, st)
            if isinstance(e, ast.DictComp):
                st = self.expr(e.key, st)
                st = self.expr(e.value, st)
            else:
                st = self.expr(e.elt, st)  # type: ignore[attr-defined]
        finally:
            self.shadow.pop()
        return before


def _loop_bindings(stmts: Iterable[ast.stmt]) -> dict[str, int]:
    """Names bound by a nested loop (its target or body) -> the line of the
    innermost such loop: where to initialise a name the loop may not assign."""
    out: dict[str, int] = {}
    for s in stmts:  # pre-order: an inner loop overwrites its outer one
        if isinstance(s, (ast.For, ast.AsyncFor, ast.While)):
            parts: list[ast.AST] = list(s.body)
            if not isinstance(s, ast.While):
                parts.append(s.target)
            for n in bindings_of(node for p in parts for node in scope_nodes(p)):
                out[n] = s.lineno
    return out


def _nonempty(
    e: ast.expr,
    is_builtin: Callable[[str], bool],
    checkable: Callable[[ast.expr], bool] = lambda e: False,
) -> bool:
    """Does iterating ``e`` surely yield an item?  Literals: ``range`` of int
    literals, a display with an item that is not ``*starred``, a non-empty
    string, ``enumerate``/``zip`` of those; and what ``checkable`` says the
    kernel checks before the run (a loader, ``range(epochs)``).  Anything else
    may be empty."""
    if isinstance(e, (ast.List, ast.Tuple, ast.Set)):
        return any(not isinstance(x, ast.Starred) for x in e.elts)
    if isinstance(e, ast.Dict):
        return any(k is not None for k in e.keys)
    if isinstance(e, ast.Constant):
        return isinstance(e.value, (str, bytes)) and len(e.value) > 0
    if not (
        isinstance(e, ast.Call)
        and isinstance(e.func, ast.Name)
        and is_builtin(e.func.id)
        and e.args
        and not any(isinstance(a, ast.Starred) for a in e.args)
    ):
        return checkable(e)
    f, args = e.func.id, e.args
    if f == "range" and not e.keywords and len(args) <= 3:
        bounds = [_int_literal(a) for a in args]
        ints = [b for b in bounds if b is not None]
        if len(ints) == len(args):
            return (len(args) < 3 or ints[2] != 0) and (len(range(*ints)) > 0)
        return checkable(e)
    if f == "enumerate":
        return _nonempty(args[0], is_builtin, checkable)
    if f == "zip":
        return all(_nonempty(a, is_builtin, checkable) for a in args)
    return False


def _runs_once(
    s: ast.For | ast.While,
    is_builtin: Callable[[str], bool],
    checkable: Callable[[ast.expr], bool] = lambda e: False,
) -> bool:
    """A nested ``for`` over a surely non-empty iterable runs its body at least
    once; a ``while True:`` leaves only by ``break`` (or an exception)."""
    if isinstance(s, ast.While):
        t = s.test
        return isinstance(t, ast.Constant) and bool(t.value)
    return _nonempty(s.iter, is_builtin, checkable)
