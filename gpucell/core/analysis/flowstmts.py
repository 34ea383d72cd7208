"""The flow walk's statements that leave or scope the iteration: ``try``,
``match``, ``raise``/``return``/``break``/``continue``, ``global``, ``del``,
imports, and nested functions and classes."""

from __future__ import annotations

import ast

from gpucell.core.analysis.flowbase import State, _add, _join
from gpucell.core.analysis.messages import _op_text
from gpucell.core.analysis.mutations import _Mutations
from gpucell.core.analysis.refusals import (
    Break,
    DelOuter,
    Global,
    Nonlocal,
    Return,
    StarImport,
)
from gpucell.core.analysis.scope import (
    nested_free_loads,
    nested_statements,
    root_name,
    target_parts,
)

__all__: list[str] = []


class _Statements(_Mutations):
    """Statements other than assignments, loops, ``if`` and ``with``."""

    def stmt_Try(self, s: ast.Try, state: State) -> State:
        entry = state
        body_end = self.block(s.body, entry)
        else_end = self.block(s.orelse, body_end)
        ends = [else_end]
        for h in s.handlers:
            hs = entry
            if h.type is not None:
                hs = self.expr(h.type, hs)
            if h.name:
                self.c.seen_stored.add(h.name)
                hs = _add(hs, [h.name])
            end = self.block(h.body, hs)
            if h.name and end is not None:
                end = end - {h.name}  # Python deletes the name when the handler ends
                self.c.deleted.add(h.name)
            ends.append(end)
        normal = _join(*ends)
        if s.finalbody:
            self.block(
                s.finalbody, _join(entry, normal) if normal is not None else entry
            )
            return self.block(s.finalbody, normal)
        return normal

    stmt_TryStar = stmt_Try

    def stmt_Match(self, s: ast.Match, state: State) -> State:
        state = self.expr(s.subject, state)
        ends: list[State] = [state]
        for case in s.cases:
            cs = state
            for node in ast.walk(case.pattern):
                if isinstance(node, (ast.MatchValue,)):
                    cs = self.expr(node.value, cs)
                elif isinstance(node, ast.MatchClass):
                    cs = self.expr(node.cls, cs)
                name = getattr(node, "name", None) or getattr(node, "rest", None)
                if isinstance(name, str):
                    self.c.seen_stored.add(name)
                    cs = _add(cs, [name])
            if case.guard is not None:
                cs = self.expr(case.guard, cs)
            ends.append(self.block(case.body, cs))
        return _join(*ends)

    def stmt_Raise(self, s: ast.Raise, state: State) -> State:
        for e in (s.exc, s.cause):
            if e is not None:
                state = self.expr(e, state)
        return None

    def stmt_Return(self, s: ast.Return, state: State) -> State:
        self.forbid(s, Return, "return")
        if s.value is not None:
            self.expr(s.value, state)
        return None

    def stmt_Continue(self, s: ast.Continue, state: State) -> State:
        if self.jumps:  # a nested loop's: its next item starts from here
            self.jumps[-1].continues.append(state)
        return None

    def stmt_Break(self, s: ast.Break, state: State) -> State:
        if self.jumps:  # a nested loop's: the code after it starts from here
            self.jumps[-1].breaks.append(state)
        if self.loop_depth == 0:
            self.forbid(s, Break, "break")
        return None

    def stmt_Global(self, s: ast.Global | ast.Nonlocal, state: State) -> State:
        kind = Global if isinstance(s, ast.Global) else Nonlocal
        for n in s.names:
            self.forbid(s, kind, n)
        return state

    stmt_Nonlocal = stmt_Global

    def stmt_Delete(self, s: ast.Delete, state: State) -> State:
        for t in s.targets:
            for part in target_parts(t):
                if isinstance(part, ast.Name):
                    n = part.id
                    if n in self.c.sinks or n not in self.c.body_bound:
                        self.forbid(part, DelOuter, n)
                        continue
                    self.load(
                        ast.Name(
                            n,
                            ast.Load(),
                            lineno=part.lineno,
                            col_offset=part.col_offset,
                        ),
                        state,
                    )
                    self.c.deleted.add(n)
                    if state is not None:
                        state = state - {n}
                else:
                    if (
                        isinstance(part, ast.Subscript)
                        and isinstance(part.value, ast.Name)
                        and part.value.id in self.c.own_elements
                        and id(part.value) in self.c.own
                    ):
                        # `del D[k]` of the own key: recorded, deleted at merge
                        state = self.expr(part.slice, state)
                        continue
                    if isinstance(part, (ast.Subscript, ast.Attribute)):
                        state = self.expr(part.value, state)
                        if isinstance(part, ast.Subscript):
                            state = self.expr(part.slice, state)
                        root = root_name(part)
                        if self.outerish(root, state, part.value):
                            assert root is not None
                            self._refuse_mutation(
                                part, root, f"`del {ast.unparse(part)}`"
                            )
        return state

    def stmt_Import(self, s: ast.Import | ast.ImportFrom, state: State) -> State:
        names = []
        for alias in s.names:
            if alias.name == "*":
                self.forbid(s, StarImport, "*")
                continue
            names.append(alias.asname or alias.name.split(".")[0])
        self.c.seen_stored.update(names)
        return _add(state, names)

    stmt_ImportFrom = stmt_Import

    def _nested(self, node: ast.AST, state: State) -> State:
        """A def/lambda/class: outer parts now, free names read at definition."""
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda)):
            for d in [*node.args.defaults, *node.args.kw_defaults]:
                if d is not None:
                    state = self.expr(d, state)
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            for d in node.decorator_list:
                state = self.expr(d, state)
        if isinstance(node, ast.ClassDef):
            for b in [*node.bases, *(k.value for k in node.keywords)]:
                state = self.expr(b, state)
        free = nested_free_loads(node)
        free_names = {f.id for f in free}
        for name in free:
            self.load(name, state)
        for inner in nested_statements(node):
            if isinstance(inner, (ast.Global, ast.Nonlocal)):
                self.stmt_Global(inner, state)
            elif isinstance(inner, ast.Call) and isinstance(inner.func, ast.Attribute):
                root = root_name(inner.func.value)
                if root is not None and root.id in free_names:
                    self.check_call(inner, state)
            elif isinstance(inner, (ast.Assign, ast.AugAssign, ast.AnnAssign)):
                targets = (
                    inner.targets if isinstance(inner, ast.Assign) else [inner.target]
                )
                for t in targets:
                    for part in target_parts(t):
                        if isinstance(part, (ast.Attribute, ast.Subscript)):
                            root = root_name(part)
                            if root is not None and root.id in free_names:
                                op = (
                                    _op_text(inner.op)
                                    if isinstance(inner, ast.AugAssign)
                                    else ""
                                )
                                self.check_target_mutation(part, state, op)
        return state

    def stmt_FunctionDef(self, s: ast.FunctionDef, state: State) -> State:
        state = self._nested(s, state)
        self.c.seen_stored.add(s.name)
        return _add(state, [s.name])

    stmt_AsyncFunctionDef = stmt_FunctionDef
    stmt_ClassDef = stmt_FunctionDef
