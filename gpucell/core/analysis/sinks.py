"""The sink kinds and the statements that may be one (a candidate per
statement: ``L.append(e)``, ``D[k] = e``, ``acc += e``...): the first pass of
the classification; and how each kind's statements become recorder calls in
the chunk program (``rewrite``, walked by sinkrewrite.py)."""

from __future__ import annotations

import ast
from collections.abc import Callable
from typing import cast

from gpucell.core.analysis.bests import RunningBest
from gpucell.core.analysis.classification import Classification
from gpucell.core.analysis.keyedselect import selecting
from gpucell.core.analysis.reccalls import _BINOPS, _const, _plain, _rec_call
from gpucell.core.analysis.scope import indexer_write, target_parts
from gpucell.core.analysis.sinkbase import Candidate, Rewriting, Rewritten, SinkKind
from gpucell.core.reducers import BY_AST, SELECTING, selects, spelling
from gpucell.protocol.program import (
    NATIVE_REDUCTIONS,
    Method,
    gather_name,
    partial_name,
)

__all__ = [
    "BIN_OPS",
    "Candidate",
    "Classification",
    "GatherSink",
    "KINDS",
    "KeyedGatherSink",
    "KeyedSink",
    "LocalSink",
    "MERGE_ORDER",
    "OwnFrameRowsSink",
    "ReductionSink",
    "ReplayedConcatSink",
    "ReplayedStatementsSink",
    "ReplayedUfuncSink",
    "RunningBest",
    "RunningBestSink",
    "SinkKind",
    "UnionSink",
    "WriteSink",
    "GATHER",
    "INPUT",
    "KEYED",
    "KEYED_GATHER",
    "LOCAL",
    "REDUCTION",
    "UNION",
    "WRITE",
    "match_candidates",
]


INPUT = "input"
LOCAL = "local"
GATHER = "ordered gather"
WRITE = "indexed write"
REDUCTION = "reduction"
KEYED = "keyed reduction"
KEYED_GATHER = "keyed gather"
UNION = "set union"

#: operators accepted in reductions, by AST class (core/reducers.py)
BIN_OPS: dict[type[ast.operator], str] = BY_AST


class GatherSink(SinkKind):
    """``L.append(e)``, ``L.extend(e)``, ``L += [...]``: the chunks' items are
    appended in iteration order."""

    kind = GATHER

    @staticmethod
    def match(stmt: ast.stmt, is_builtin: Callable[[str], bool]) -> list[Candidate]:
        if isinstance(stmt, ast.Expr) and isinstance(stmt.value, ast.Call):
            call = stmt.value
            f = call.func
            if (
                isinstance(f, ast.Attribute)
                and isinstance(f.value, ast.Name)
                and f.attr in ("append", "extend")
                and len(call.args) == 1
                and not call.keywords
                and not isinstance(call.args[0], ast.Starred)
            ):
                return [Candidate(GATHER, f.value.id, stmt, [f.value])]
        elif (
            isinstance(stmt, ast.AugAssign)
            and isinstance(stmt.target, ast.Name)
            and BIN_OPS.get(type(stmt.op)) == "+"
            and isinstance(stmt.value, (ast.List, ast.ListComp))
        ):
            return [Candidate(GATHER, stmt.target.id, stmt, [stmt.target])]
        return []

    @staticmethod
    def describe(fresh: bool) -> str:
        """A comprehension's result is a new list; a loop's list is extended."""
        return (
            "new list, in iteration order" if fresh else "extended in iteration order"
        )

    @staticmethod
    def rewrite(node: ast.stmt, rw: Rewriting) -> Rewritten:
        names = rw.names[GATHER]
        if isinstance(node, ast.AugAssign) and isinstance(node.target, ast.Name):
            if node.target.id in names:  # L += [...]
                nm = _const(node.target.id, node)
                return _rec_call(Method.EXTEND, [nm, node.value], node)
            return None
        found = _named_method_call(node, names)
        if found is None:
            return None
        v, name, attr = found
        if attr == "append" and _plain(v):
            # the engine appends to its own list, bound per chunk
            func = ast.copy_location(ast.Name(gather_name(name), ast.Load()), node)
            call = ast.copy_location(
                ast.Call(func=func, args=v.args, keywords=[]), node
            )
            return ast.copy_location(ast.Expr(call), node)
        if attr in (Method.APPEND, Method.EXTEND):
            return _rec_call(attr, [_const(name, node), *v.args], node)
        return None


class ReductionSink(SinkKind):
    """``acc op= e``, ``acc = acc op e``, ``acc = max(acc, e)``: each chunk's
    partial result, folded in iteration order (core/reducers.py)."""

    kind = REDUCTION

    @staticmethod
    def match(stmt: ast.stmt, is_builtin: Callable[[str], bool]) -> list[Candidate]:
        if isinstance(stmt, ast.AugAssign):
            t = stmt.target
            op = BIN_OPS.get(type(stmt.op))
            gathers = op == "+" and isinstance(stmt.value, (ast.List, ast.ListComp))
            if isinstance(t, ast.Name) and op is not None and not gathers:
                return [Candidate(REDUCTION, t.id, stmt, [t], op, True)]
            return []
        if not (
            isinstance(stmt, ast.Assign)
            and len(stmt.targets) == 1
            and isinstance(stmt.targets[0], ast.Name)
        ):
            return []
        t, v = stmt.targets[0], stmt.value
        if (
            isinstance(v, ast.BinOp)
            and isinstance(v.left, ast.Name)
            and v.left.id == t.id
            and type(v.op) in BIN_OPS
        ):
            op = BIN_OPS[type(v.op)]
            return [Candidate(REDUCTION, t.id, stmt, [t, v.left], op, False)]
        if (
            isinstance(v, ast.Call)
            and isinstance(v.func, ast.Name)
            and v.func.id in SELECTING
            and is_builtin(v.func.id)
            and len(v.args) == 2
            and not v.keywords
            and isinstance(v.args[0], ast.Name)
            and v.args[0].id == t.id
        ):
            return [Candidate(REDUCTION, t.id, stmt, [t, v.args[0]], v.func.id, False)]
        return []

    @staticmethod
    def describe(name: str, op: str, augmented: bool) -> str:
        """As the user would write it: ``acc += ...``, ``best = max(best, ...)``."""
        return spelling(name, op, augmented)

    @staticmethod
    def rewrite(node: ast.stmt, rw: Rewriting) -> Rewritten:
        names = rw.names[REDUCTION]
        if isinstance(node, ast.AugAssign):
            t = node.target
            if isinstance(t, ast.Name) and t.id in names:
                return ReductionSink._reduce(t.id, node.value, node, rw)
            return None
        if (
            isinstance(node, ast.Assign)
            and len(node.targets) == 1
            and isinstance(node.targets[0], ast.Name)
            and node.targets[0].id in names
        ):
            v = node.value  # acc = acc op e, best = max(best, e)
            e = v.right if isinstance(v, ast.BinOp) else cast(ast.Call, v).args[1]
            return ReductionSink._reduce(node.targets[0].id, e, node, rw)
        return None

    @staticmethod
    def _reduce(name: str, e: ast.expr, node: ast.stmt, rw: Rewriting) -> ast.stmt:
        """``acc += e``: the partial folded by the operator itself, where the
        operator folds as the merge does (``+ * | & ^``); else a recorder call."""
        op = rw.reduction_ops.get(name)
        if op in NATIVE_REDUCTIONS:
            target = ast.copy_location(ast.Name(partial_name(name), ast.Store()), node)
            return ast.copy_location(ast.AugAssign(target, _BINOPS[op](), e), node)
        return _rec_call(Method.REDUCE, [_const(name, node), e], node)


def _named_method_call(
    node: ast.stmt, names: set[str]
) -> tuple[ast.Call, str, str] | None:
    """``X.m(...)`` as a statement, ``X`` one of ``names``: the call, ``X``, ``m``."""
    if not (isinstance(node, ast.Expr) and isinstance(node.value, ast.Call)):
        return None
    v = node.value
    f = v.func
    if isinstance(f, ast.Attribute) and isinstance(f.value, ast.Name):
        if f.value.id in names:
            return v, f.value.id, f.attr
    return None


def _method_call(stmt: ast.stmt) -> tuple[ast.Call, ast.Attribute] | None:
    """``X.m(args)`` as a statement of its own, with no keyword or ``*starred``
    argument (whose items the analysis cannot count): the call and ``X.m``."""
    if not (isinstance(stmt, ast.Expr) and isinstance(stmt.value, ast.Call)):
        return None
    call = stmt.value
    f = call.func
    if not isinstance(f, ast.Attribute) or call.keywords:
        return None
    if any(isinstance(a, ast.Starred) for a in call.args):
        return None
    return call, f


class UnionSink(SinkKind):
    """``S.add(e)``, ``S.update(...)``: the union of every iteration's
    additions."""

    kind = UNION

    @staticmethod
    def match(stmt: ast.stmt, is_builtin: Callable[[str], bool]) -> list[Candidate]:
        found = _method_call(stmt)
        if found is None:
            return []
        call, f = found
        if (
            isinstance(f.value, ast.Name)
            and (f.attr == "add" and len(call.args) == 1 or f.attr == "update")
            and call.args
        ):
            return [Candidate(UNION, f.value.id, stmt, [f.value])]
        return []

    @staticmethod
    def describe() -> str:
        return "union of all additions"

    @staticmethod
    def rewrite(node: ast.stmt, rw: Rewriting) -> Rewritten:
        found = _named_method_call(node, rw.names[UNION])
        if found is None or found[2] not in (Method.ADD, Method.UPDATE):
            return None
        v, name, attr = found
        return _rec_call(attr, [_const(name, node), *v.args], node)


class KeyedGatherSink(SinkKind):
    """``D[k].append(e)``: the list under each key gathers in iteration order."""

    kind = KEYED_GATHER

    @staticmethod
    def match(stmt: ast.stmt, is_builtin: Callable[[str], bool]) -> list[Candidate]:
        found = _method_call(stmt)
        if found is None:
            return []
        call, f = found
        if (
            f.attr in ("append", "extend")
            and isinstance(f.value, ast.Subscript)
            and isinstance(f.value.value, ast.Name)
            and len(call.args) == 1
        ):
            d = f.value.value
            return [Candidate(KEYED_GATHER, d.id, stmt, [d])]
        return []

    @staticmethod
    def describe(name: str) -> str:
        return f"{name}[k].append(...)"

    @staticmethod
    def rewrite(node: ast.stmt, rw: Rewriting) -> Rewritten:
        """``D[k].append(e)``: the recorder keeps each key's items in order."""
        if not (isinstance(node, ast.Expr) and isinstance(node.value, ast.Call)):
            return None
        v = node.value
        f = v.func
        if not (
            isinstance(f, ast.Attribute)
            and f.attr in (Method.APPEND, Method.EXTEND)
            and isinstance(f.value, ast.Subscript)
            and isinstance(f.value.value, ast.Name)
            and f.value.value.id in rw.names[KEYED_GATHER]
        ):
            return None
        method = Method.KEYED_APPEND if f.attr == Method.APPEND else Method.KEYED_EXTEND
        d = f.value
        name = _const(f.value.value.id, node)
        return _rec_call(method, [name, d.slice, *v.args], node)


class KeyedSink(SinkKind):
    """``D[k] op= e``: a reduction per key, folded in iteration order."""

    kind = KEYED

    @staticmethod
    def match(stmt: ast.stmt, is_builtin: Callable[[str], bool]) -> list[Candidate]:
        if isinstance(stmt, ast.Assign):
            found = selecting(stmt, is_builtin)
            if found is None:
                return []
            d, read, select, _e = found
            return [Candidate(KEYED, d.id, stmt, [d, read], select, False)]
        if not isinstance(stmt, ast.AugAssign):
            return []
        op = BIN_OPS.get(type(stmt.op))
        t = stmt.target
        if (
            isinstance(t, ast.Subscript)
            and isinstance(t.value, ast.Name)
            and op is not None
        ):
            return [Candidate(KEYED, t.value.id, stmt, [t.value], op, True)]
        return []

    @staticmethod
    def describe(name: str, op: str) -> str:
        if selects(op):
            return f"{name}[k] = {op}({name}[k], ...)"
        return f"{name}[k] {op}= ..."

    @staticmethod
    def rewrite(node: ast.stmt, rw: Rewriting) -> Rewritten:
        if isinstance(node, ast.Assign):
            t0 = node.targets[0] if len(node.targets) == 1 else None
            if not (
                isinstance(t0, ast.Subscript)
                and isinstance(t0.value, ast.Name)
                and t0.value.id in rw.names[KEYED]
                and isinstance(node.value, ast.Call)
            ):
                return None
            e = node.value.args[1]  # (classified: `D[k] = max(D[k], e)`)
            name = _const(t0.value.id, node)
            return _rec_call(Method.KEYED, [name, t0.slice, e], node)
        if not isinstance(node, ast.AugAssign):
            return None
        t = node.target
        if not (
            isinstance(t, ast.Subscript)
            and isinstance(t.value, ast.Name)
            and t.value.id in rw.names[KEYED]
        ):
            return None
        name = _const(t.value.id, node)
        return _rec_call(Method.KEYED, [name, t.slice, node.value], node)


class WriteSink(SinkKind):
    """``D[k] = e``, ``D.at[k] = e`` (pandas), ``del D[k]``: item writes (and
    deletions) applied in iteration order, the last one winning."""

    kind = WRITE

    @staticmethod
    def match(stmt: ast.stmt, is_builtin: Callable[[str], bool]) -> list[Candidate]:
        out: list[Candidate] = []
        if isinstance(stmt, ast.Delete):
            # `del D[k]`: a write of the key's absence (own keys only, later)
            for target in stmt.targets:
                if isinstance(target, ast.Subscript) and isinstance(
                    target.value, ast.Name
                ):
                    out.append(Candidate(WRITE, target.value.id, stmt, [target.value]))
        elif isinstance(stmt, ast.Assign):
            if selecting(stmt, is_builtin) is not None:
                return []  # (a keyed max/min: KeyedSink's)
            for target in stmt.targets:
                for part in target_parts(target):
                    if isinstance(part, ast.Subscript) and isinstance(
                        part.value, ast.Name
                    ):
                        out.append(Candidate(WRITE, part.value.id, stmt, [part.value]))
            indexed = indexer_write(stmt)
            if indexed is not None:  # D.at[k] = v (pandas): an indexed write of D
                out.append(Candidate(WRITE, indexed[0].id, stmt, [indexed[0]]))
        return out

    @staticmethod
    def describe() -> str:
        return "item writes in iteration order"

    @staticmethod
    def rewrite(node: ast.stmt, rw: Rewriting) -> Rewritten:
        writes = rw.names[WRITE]
        if isinstance(node, ast.Delete):
            return WriteSink._delete(node, writes)
        if not isinstance(node, ast.Assign):
            return None
        indexed = indexer_write(node)
        if indexed is not None and indexed[0].id in writes:
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
            and p.value.id in writes
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
        return WriteSink._through_temporaries(node, sink_parts, rw)

    @staticmethod
    def _through_temporaries(
        node: ast.Assign, sink_parts: list[ast.Subscript], rw: Rewriting
    ) -> list[ast.stmt]:
        """Tuple or chained targets: assign to temporaries, then record the
        writes, in the order Python stores them."""
        replaced: list[tuple[str, ast.Subscript]] = []

        def swap(t: ast.expr) -> ast.expr:
            if isinstance(t, (ast.Tuple, ast.List)):
                t.elts = [swap(e) for e in t.elts]
                return t
            if isinstance(t, ast.Starred):
                t.value = swap(t.value)
                return t
            if any(t is p for p in sink_parts):
                tmp = rw.temporary()
                replaced.append((tmp, t))  # type: ignore[arg-type]
                return ast.copy_location(ast.Name(tmp, ast.Store()), t)
            return t

        node.targets = [swap(t) for t in node.targets]
        out: list[ast.stmt] = [node]
        for tmp, sub in replaced:
            value = ast.copy_location(ast.Name(tmp, ast.Load()), sub)
            name = _const(cast(ast.Name, sub.value).id, sub)
            out.append(_rec_call(Method.SETITEM, [value, name, sub.slice], sub))
        return out

    @staticmethod
    def _delete(node: ast.Delete, writes: set[str]) -> Rewritten:
        """``del D[k]`` of the own key: recorded as a write of DELETED."""
        if not (
            len(node.targets) == 1
            and isinstance(node.targets[0], ast.Subscript)
            and isinstance(node.targets[0].value, ast.Name)
            and node.targets[0].value.id in writes
        ):
            return None
        t = node.targets[0]
        gone = ast.parse(
            "__import__('gpucell.core.deleted', fromlist=['DELETED']).DELETED",
            mode="eval",
        ).body
        for n in ast.walk(gone):
            ast.copy_location(n, node)
        name = _const(cast(ast.Name, t.value).id, node)
        return _rec_call(Method.SETITEM, [gone, name, t.slice], node)


class ReplayedUfuncSink(SinkKind):
    """``np.add.at(D, idx, w)``: each iteration's call replayed into ``D``, in
    order (matched and rewritten by spellings.py)."""

    kind = "replayed ufunc calls"


class ReplayedConcatSink(SinkKind):
    """``x = np.append(x, e)``, ``x = torch.cat([x, t])``: each iteration's
    call made on the kernel, in order, from ``x`` before the loop
    (concats.py, matched and rewritten by spellings.py)."""

    kind = "replayed concatenations"


class ReplayedStatementsSink(SinkKind):
    """``index.setdefault(w, set()).add(i)``, ``heapq.heappush(heap, x)``:
    each iteration's change to a container made on the kernel, in order
    (replaystmts.py)."""

    kind = "replayed changes"


class OwnFrameRowsSink(SinkKind):
    """A frame's own row: each iteration's written cells replayed (ownrows.py)."""

    kind = "own frame rows"


class RunningBestSink(SinkKind):
    """``if e < best: best = e; at = i``: the chunk whose best the test takes
    (bests.py, selections.py)."""

    kind = "running best"


class LocalSink(SinkKind):
    """A name the loop binds: the last iteration's value."""

    kind = LOCAL


#: every kind, in the order the merge applies them (core/merge.SINK_MERGES,
#: keyed by these classes): what one binds a later one may skip (a running
#: best's names are locals too)
MERGE_ORDER: tuple[type[SinkKind], ...] = (
    ReplayedUfuncSink,
    ReplayedConcatSink,
    ReplayedStatementsSink,
    OwnFrameRowsSink,
    GatherSink,
    WriteSink,
    ReductionSink,
    KeyedSink,
    KeyedGatherSink,
    UnionSink,
    RunningBestSink,
    LocalSink,
)

#: every sink kind, in the order a statement's candidates are listed
KINDS: tuple[type[SinkKind], ...] = (
    GatherSink,
    ReductionSink,
    UnionSink,
    KeyedGatherSink,
    KeyedSink,
    WriteSink,
)


def match_candidates(
    stmt: ast.stmt, is_builtin: Callable[[str], bool]
) -> list[Candidate]:
    """Sink patterns in one statement (structure only; names decided later)."""
    return [c for kind in KINDS for c in kind.match(stmt, is_builtin)]
