"""The loop body's sink statements as recorder calls: ``L.append(e)``,
``D[k] = e``, ``acc += e``... become calls of ``__gpucell_rec__`` so the engine
never changes a shipped object in place; each new node keeps the line of the
statement it replaces."""

from __future__ import annotations

import ast
from collections.abc import Iterable, Mapping
from typing import Any, cast

from gpucell.core.analysis.scope import indexer_write, target_parts
from gpucell.protocol.program import (
    NATIVE_REDUCTIONS,
    REC,
    Method,
    gather_name,
    partial_name,
)

__all__: list[str] = []


def _rec_call(method: str, args: list[ast.expr], loc: ast.AST) -> ast.Expr:
    call = ast.Call(
        func=ast.Attribute(ast.Name(REC, ast.Load()), method, ast.Load()),
        args=args,
        keywords=[],
    )
    stmt = ast.Expr(call)
    ast.copy_location(call, loc)
    ast.copy_location(call.func, loc)
    ast.copy_location(call.func.value, loc)  # type: ignore[attr-defined]
    return ast.copy_location(stmt, loc)


def _plain(call: ast.Call) -> bool:
    """One positional argument, nothing starred: the shape ``list.append`` takes."""
    return (
        len(call.args) == 1
        and not call.keywords
        and not isinstance(call.args[0], ast.Starred)
    )


_BINOPS: dict[str, type[ast.operator]] = {
    "+": ast.Add,
    "*": ast.Mult,
    "|": ast.BitOr,
    "&": ast.BitAnd,
    "^": ast.BitXor,
}


def _const(value: Any, loc: ast.AST) -> ast.expr:
    return ast.copy_location(ast.Constant(value), loc)


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
        self.keyed_gathers = set(keyed_gathers)
        self.gathers = set(gathers)
        self.writes = set(writes)
        self.reductions = set(reductions)
        self.keyed = set(keyed)
        self.unions = set(unions)
        self.deleted = set(deleted)
        self.reduction_ops: Mapping[str, str] = {}
        self._tmp = 0

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
        handler = getattr(self, "visit_" + type(s).__name__, None)
        if handler is not None:
            r = handler(s)
            if r is not None:
                return r
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

    def visit_Expr(self, node: ast.Expr) -> Any:
        v = node.value
        if (
            isinstance(v, ast.Call)
            and isinstance(v.func, ast.Attribute)
            and v.func.attr in (Method.APPEND, Method.EXTEND)
            and isinstance(v.func.value, ast.Subscript)
            and isinstance(v.func.value.value, ast.Name)
            and v.func.value.value.id in self.keyed_gathers
        ):
            # D[k].append(e) -> the recorder, per key in iteration order
            method = (
                Method.KEYED_APPEND
                if v.func.attr == Method.APPEND
                else Method.KEYED_EXTEND
            )
            d = v.func.value
            name = d.value.id  # type: ignore[attr-defined]
            return _rec_call(method, [_const(name, node), d.slice, *v.args], node)
        if (
            isinstance(v, ast.Call)
            and isinstance(v.func, ast.Attribute)
            and isinstance(v.func.value, ast.Name)
        ):
            name, attr = v.func.value.id, v.func.attr
            nm = _const(name, node)
            if name in self.gathers and attr == "append" and _plain(v):
                call = ast.copy_location(
                    ast.Call(
                        func=ast.copy_location(
                            ast.Name(gather_name(name), ast.Load()), node
                        ),
                        args=v.args,
                        keywords=[],
                    ),
                    node,
                )
                return ast.copy_location(ast.Expr(call), node)
            if name in self.gathers and attr in (Method.APPEND, Method.EXTEND):
                return _rec_call(attr, [nm, *v.args], node)
            if name in self.unions and attr in (Method.ADD, Method.UPDATE):
                return _rec_call(attr, [nm, *v.args], node)
        return None

    def _reduce(self, name: str, e: ast.expr, node: ast.stmt) -> ast.stmt:
        """``acc += e``: the partial folded by the operator itself, where the
        operator folds as the merge does (``+ * | & ^``); else a recorder call."""
        op = self.reduction_ops.get(name)
        if op in NATIVE_REDUCTIONS:
            target = ast.copy_location(ast.Name(partial_name(name), ast.Store()), node)
            return ast.copy_location(ast.AugAssign(target, _BINOPS[op](), e), node)
        return _rec_call(Method.REDUCE, [_const(name, node), e], node)

    def visit_AugAssign(self, node: ast.AugAssign) -> Any:
        t = node.target
        if isinstance(t, ast.Name):
            nm = _const(t.id, node)
            if t.id in self.gathers:
                return _rec_call(Method.EXTEND, [nm, node.value], node)
            if t.id in self.reductions:
                return self._reduce(t.id, node.value, node)
        if (
            isinstance(t, ast.Subscript)
            and isinstance(t.value, ast.Name)
            and t.value.id in self.keyed
        ):
            return _rec_call(
                Method.KEYED, [_const(t.value.id, node), t.slice, node.value], node
            )
        return None

    def visit_Assign(self, node: ast.Assign) -> Any:
        if len(node.targets) == 1 and isinstance(node.targets[0], ast.Name):
            name = node.targets[0].id
            if name in self.reductions:
                v = node.value
                e = v.right if isinstance(v, ast.BinOp) else cast(ast.Call, v).args[1]
                return self._reduce(name, e, node)
        indexed = indexer_write(node)
        if indexed is not None and indexed[0].id in self.writes:
            # D.at[k] = v: recorded, applied through the same indexer at merge
            target, accessor, key = indexed
            return _rec_call(
                Method.SETINDEXED,
                [node.value, _const(target.id, node), _const(accessor, node), key],
                node,
            )
        sink_parts = [
            p
            for t in node.targets
            for p in target_parts(t)
            if isinstance(p, ast.Subscript)
            and isinstance(p.value, ast.Name)
            and p.value.id in self.writes
        ]
        if not sink_parts:
            return None
        if (
            len(node.targets) == 1
            and isinstance(node.targets[0], ast.Subscript)
            and len(sink_parts) == 1
        ):
            p = sink_parts[0]
            return _rec_call(
                Method.SETITEM,
                [node.value, _const(cast(ast.Name, p.value).id, node), p.slice],
                node,
            )
        # tuple or chained targets: assign to temporaries, then record the writes
        replaced: list[tuple[str, ast.Subscript]] = []

        def swap(t: ast.expr) -> ast.expr:
            if isinstance(t, (ast.Tuple, ast.List)):
                t.elts = [swap(e) for e in t.elts]
                return t
            if isinstance(t, ast.Starred):
                t.value = swap(t.value)
                return t
            if any(t is p for p in sink_parts):
                tmp = f"__gpucell_w{self._tmp}__"
                self._tmp += 1
                replaced.append((tmp, t))  # type: ignore[arg-type]
                return ast.copy_location(ast.Name(tmp, ast.Store()), t)
            return t

        node.targets = [swap(t) for t in node.targets]
        out: list[ast.stmt] = [node]
        for tmp, sub in replaced:
            out.append(
                _rec_call(
                    Method.SETITEM,
                    [
                        ast.copy_location(ast.Name(tmp, ast.Load()), sub),
                        _const(sub.value.id, sub),  # type: ignore[attr-defined]
                        sub.slice,
                    ],
                    sub,
                )
            )
        return out

    def visit_Delete(self, node: ast.Delete) -> Any:
        if (
            len(node.targets) == 1
            and isinstance(node.targets[0], ast.Subscript)
            and isinstance(node.targets[0].value, ast.Name)
            and node.targets[0].value.id in self.writes
        ):
            # `del D[k]` of the own key: recorded as a write of DELETED
            t = node.targets[0]
            gone = ast.parse(
                "__import__('gpucell.core.deleted', fromlist=['DELETED']).DELETED",
                mode="eval",
            ).body
            for n in ast.walk(gone):
                ast.copy_location(n, node)
            return _rec_call(
                Method.SETITEM,
                [gone, _const(cast(ast.Name, t.value).id, node), t.slice],
                node,
            )
        names = [
            p.id
            for t in node.targets
            for p in target_parts(t)
            if isinstance(p, ast.Name) and p.id in self.deleted
        ]
        if not names:
            return None
        return [node, _rec_call(Method.DELETED, [_const(tuple(names), node)], node)]
