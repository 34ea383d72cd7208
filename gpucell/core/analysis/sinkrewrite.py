"""The loop body's sink statements as recorder calls: ``L.append(e)``,
``D[k] = e``, ``acc += e``... become calls of ``__gpucell_rec__`` so the engine
never changes a shipped object in place; each new node keeps the line of the
statement it replaces.  Each sink kind rewrites its own statements
(``SinkKind.rewrite`` in sinks.py); this walk finds the statements and keeps
track of deleted locals."""

from __future__ import annotations

import ast
from collections.abc import Iterable, Mapping
from typing import Any

from gpucell.core.analysis.reccalls import _const, _rec_call
from gpucell.core.analysis.scope import target_parts
from gpucell.core.analysis.sinks import (
    GATHER,
    KEYED,
    KEYED_GATHER,
    KINDS,
    REDUCTION,
    UNION,
    WRITE,
)
from gpucell.protocol.program import Method

__all__: list[str] = []


class _SinkRewriter:
    """Replace sink patterns with recorder calls; leave everything else alone.

    Sink patterns are statements, so only statement lists are walked (not every
    expression, which is what makes ``ast.NodeTransformer`` slow on long cells).
    """

    def __init__(
        self,
        *,
        gathers: Iterable[str],
        writes: Iterable[str],
        reductions: Iterable[str],
        keyed: Iterable[str],
        unions: Iterable[str],
        deleted: Iterable[str],
        keyed_gathers: Iterable[str] = (),
    ) -> None:
        self.gathers = set(gathers)
        self.deleted = set(deleted)
        # kind -> the names of that kind (sinks.Rewriting)
        self.names: Mapping[str, set[str]] = {
            GATHER: self.gathers,
            WRITE: set(writes),
            REDUCTION: set(reductions),
            KEYED: set(keyed),
            UNION: set(unions),
            KEYED_GATHER: set(keyed_gathers),
        }
        self.reduction_ops: Mapping[str, str] = {}
        self._tmp = 0

    def temporary(self) -> str:
        """A fresh local name for the chunk program."""
        tmp = f"__gpucell_w{self._tmp}__"
        self._tmp += 1
        return tmp

    def block(self, stmts: list[ast.stmt]) -> list[ast.stmt]:
        out: list[ast.stmt] = []
        for s in stmts:
            r = self.stmt(s)
            if isinstance(r, list):
                out.extend(r)
            else:
                out.append(r)
        return out

    def stmt(self, s: ast.stmt) -> Any:
        # nested scopes hold no sink patterns (the classifier refused them)
        if isinstance(s, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            return s
        if isinstance(s, (ast.Expr, ast.AugAssign, ast.Assign, ast.Delete)):
            for kind in KINDS:
                r = kind.rewrite(s, self)
                if r is not None:
                    return r
            if isinstance(s, ast.Delete):
                return self._deleted(s)
            return s
        for name in ("body", "orelse", "finalbody"):
            block = getattr(s, name, None)
            if block:
                setattr(s, name, self.block(block))
        for h in getattr(s, "handlers", ()):
            h.body = self.block(h.body)
            if h.name and h.name in self.deleted:
                h.body.insert(0, _rec_call(Method.DELETED, [_const((h.name,), h)], h))
        for case in getattr(s, "cases", ()):
            case.body = self.block(case.body)
        return s

    def _deleted(self, node: ast.Delete) -> Any:
        """``del x`` of a local: the recorder notes it after the statement."""
        names = [
            p.id
            for t in node.targets
            for p in target_parts(t)
            if isinstance(p, ast.Name) and p.id in self.deleted
        ]
        if not names:
            return node
        return [node, _rec_call(Method.DELETED, [_const(tuple(names), node)], node)]
