"""The sink kinds and the statements that may be one (a candidate per
statement: ``L.append(e)``, ``D[k] = e``, ``acc += e``...): the first pass of
the classification."""

from __future__ import annotations

import ast
import sys
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from typing import ClassVar

from gpucell.core.analysis.ownrows import OwnRow
from gpucell.core.analysis.scope import (
    indexer_write,
    target_parts,
)
from gpucell.core.reducers import BY_AST, SELECTING, spelling

__all__ = [
    "BIN_OPS",
    "Candidate",
    "Classification",
    "GatherSink",
    "KINDS",
    "KeyedGatherSink",
    "KeyedSink",
    "ReductionSink",
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
    "block_statements",
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


@dataclass
class Candidate:
    """A statement that may be a sink pattern for ``name``."""

    cls: str
    name: str
    stmt: ast.stmt
    own: list[ast.Name]
    op: str | None = None
    augmented: bool = True


class SinkKind:
    """One kind of sink: which statements may be one (``match``: the
    statement's candidates of this kind) and how the plan describes a name of
    that kind (``describe``). A statement is at most one kind's, but an
    assignment may be a reduction and write items besides."""

    kind: ClassVar[str]

    @staticmethod
    def match(stmt: ast.stmt, is_builtin: Callable[[str], bool]) -> list[Candidate]:
        raise NotImplementedError


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


class KeyedSink(SinkKind):
    """``D[k] op= e``: a reduction per key, folded in iteration order."""

    kind = KEYED

    @staticmethod
    def match(stmt: ast.stmt, is_builtin: Callable[[str], bool]) -> list[Candidate]:
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
        return f"{name}[k] {op}= ..."


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


#: every sink kind, in the order a statement's candidates are listed
KINDS: tuple[type[SinkKind], ...] = (
    GatherSink,
    ReductionSink,
    UnionSink,
    KeyedGatherSink,
    KeyedSink,
    WriteSink,
)


@dataclass
class Classification:
    """Result of classifying a loop body. Line numbers are the cell's."""

    inputs: dict[str, int] = field(default_factory=dict)
    locals: dict[str, int] = field(default_factory=dict)
    gathers: dict[str, int] = field(default_factory=dict)
    writes: dict[str, int] = field(default_factory=dict)
    reductions: dict[str, tuple[str, bool, int]] = field(default_factory=dict)
    keyed: dict[str, tuple[str, int]] = field(default_factory=dict)
    unions: dict[str, int] = field(default_factory=dict)
    deleted_locals: set[str] = field(default_factory=set)
    keyed_gathers: dict[str, int] = field(default_factory=dict)
    # writes whose iteration reads its own row back (see ownrows.py)
    own_rows: dict[str, OwnRow] = field(default_factory=dict)
    prints: list[int] = field(default_factory=list)
    # inputs a call could change in place (receivers, arguments, callees), with
    # the lines: the engines check them before and after each chunk
    watch: dict[str, list[int]] = field(default_factory=dict)
    # lines where an item of the loop's data is a receiver or an argument
    watch_items: list[int] = field(default_factory=list)
    # an alias of outer data is a receiver or argument: check every input
    watch_all: bool = False
    # (line, call) drawing from a global random generator
    random_calls: list[tuple[int, str]] = field(default_factory=list)
    # (line, iterable) of nested loops taken to run at least once because
    # their iterable, made of inputs, is checked non-empty before the run
    nonempty: list[tuple[int, str]] = field(default_factory=list)
    # own elements and own rows whose keys may name one element twice:
    # sink -> (the loop's key, "range" or "any"); `y[-3]` and `y[0]` are one
    # element of a 3-item list, `a[True]` and `a[(0, 1)]` overlap `a[0]`: the
    # engine program checks each key of a sink that is not a dict
    key_checks: dict[str, tuple[str, str]] = field(default_factory=dict)


def _handlers(s: ast.stmt) -> list[ast.ExceptHandler]:
    """The except clauses of a ``try`` / ``try*`` statement; none for others."""
    if isinstance(s, ast.Try):
        return s.handlers
    if sys.version_info >= (3, 11) and isinstance(s, ast.TryStar):
        return s.handlers
    return []


def block_statements(stmts: Iterable[ast.stmt]) -> Iterator[ast.stmt]:
    """Every statement of the body's scope, through compound statements."""
    for s in stmts:
        yield s
        if isinstance(s, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            continue
        for name in ("body", "orelse", "finalbody"):
            yield from block_statements(getattr(s, name, []))
        for h in _handlers(s):
            yield from block_statements(h.body)
        if isinstance(s, ast.Match):
            for c in s.cases:
                yield from block_statements(c.body)


def match_candidates(
    stmt: ast.stmt, is_builtin: Callable[[str], bool]
) -> list[Candidate]:
    """Sink patterns in one statement (structure only; names decided later)."""
    return [c for kind in KINDS for c in kind.match(stmt, is_builtin)]
