"""Classify every name of the loop body, and refuse what cannot stay serial.

Two passes over the body's AST, never evaluating anything:

1. *Sink patterns*: statements that only contribute to an outer object in a way
   the merge can replay (``L.append(e)``, ``D[k] = e``, ``acc += e``, ``D[k] += e``,
   ``S.add(e)``). A name is a sink when every occurrence of it is such a pattern.
2. *Flow*: a definite-assignment walk in evaluation order. A name assigned in the
   body but read where it is not definitely assigned would see the previous
   iteration's value: a loop-carried dependency, refused. The walk also finds the
   inputs, refuses control flow that escapes the iteration, and refuses in-place
   changes to objects that exist before the loop (whose effect could not come
   back from an engine).

Every problem becomes a :class:`Diagnostic`; the caller raises them all at once.
"""

from __future__ import annotations

import ast
from collections.abc import Callable, Iterable
from dataclasses import dataclass

from gpucell.core.analysis.concats import _concatenated
from gpucell.core.analysis.diagnostics import DiagnosticSink
from gpucell.core.analysis.flow import State, _Ctx, _Flow, _loop_bindings
from gpucell.core.analysis.keys import (
    _key_check,
    _own_elements,
    _own_index,
    _own_key,
    _own_rows,
)
from gpucell.core.analysis.messages import _element_fix, _refit_text, _row_depth_fix
from gpucell.core.analysis.ownrows import OwnRow
from gpucell.core.analysis.refusals import (
    InputRefit,
    IterableMutated,
    LoopTarget,
    MixedReduction,
    MixedUse,
)
from gpucell.core.analysis.scope import (
    ENGINE_PROVIDED,
    WELL_KNOWN_MODULES,
    bindings_of,
    block_statements,
    scope_nodes,
    target_names,
    target_parts,
)
from gpucell.core.analysis.selections import _selections, running_bests
from gpucell.core.analysis.sinks import (
    GATHER,
    KEYED,
    KEYED_GATHER,
    REDUCTION,
    UNION,
    WRITE,
    Candidate,
    Classification,
    match_candidates,
)
from gpucell.core.analysis.strkeys import _literal_keys, _write_keys
from gpucell.core.analysis.taint import (
    _alias_taint,
    _item_parts,
    _lazy_names,
    _rebound,
)

__all__ = ["classify_body"]


def _mixed_depths(cs: list[Candidate]) -> bool:
    """``A[i] *= 2`` beside ``A[i, :2] += 1``: one row written at two depths."""
    tuples: set[bool] = set()
    for c in cs:
        st = c.stmt
        if isinstance(st, ast.AugAssign) and isinstance(st.target, ast.Subscript):
            tuples.add(isinstance(st.target.slice, ast.Tuple))
    return len(tuples) > 1


def _refuse_mutated_iterable(
    loop_iter: ast.expr,
    is_builtin: Callable[[str], bool],
    sinks: dict[str, Candidate],
    own_elements: dict[str, str],
    ctx: _Ctx,
    diag: DiagnosticSink,
) -> None:
    """The loop iterates over a name the body changes (read lazily, not
    through a copy): serially the loop would see its own changes."""
    several_writes = ctx.several_writes
    for node in _lazy_names(loop_iter, is_builtin):
        if (
            node.id in sinks
            and node.id not in own_elements
            # (the write-once advice is there)
            and not (node.id in several_writes and node.id in ctx.sink_reads)
        ):
            diag.report(
                IterableMutated(
                    node.lineno,
                    node.col_offset,
                    node.id,
                    iterated=ast.unparse(_iterated_part(loop_iter, node)),
                    changed_at=sinks[node.id].stmt.lineno,
                    read_at=ctx.sink_reads.get(node.id),
                )
            )


def _iterated_part(loop_iter: ast.expr, name: ast.Name) -> ast.expr:
    """The part of the loop's iterable that is iterated and reads ``name``:
    ``name`` with the attributes, items and method calls taken from it
    (``df.index[1:]``, ``df.iterrows()``), not the builtin around it
    (``enumerate(queue)``: ``queue``)."""
    parents = {
        id(child): node
        for node in ast.walk(loop_iter)
        for child in ast.iter_child_nodes(node)
    }
    part: ast.expr = name
    while (up := parents.get(id(part))) is not None and (
        (isinstance(up, (ast.Attribute, ast.Subscript)) and up.value is part)
        or (isinstance(up, ast.Call) and up.func is part)
    ):
        part = up
    return part


def _resolve_sinks(
    by_name: dict[str, list[Candidate]],
    diag: DiagnosticSink,
    result: Classification,
) -> dict[str, Candidate]:
    """Each name's sink (its first candidate of the one kind it is used as),
    filed in ``result`` by kind; a name used as two kinds, or reduced with two
    operators or forms, refused in ``diag``."""
    sinks: dict[str, Candidate] = {}
    for name, cs in by_name.items():
        classes = {c.cls for c in cs}
        first = cs[0]
        if classes == {KEYED, KEYED_GATHER}:
            # counts and lists under different keys of one dict (stats["n"] += 1,
            # stats["items"].append(x)); a key used both ways fails the merge
            classes = {KEYED}
            first = next(c for c in cs if c.cls == KEYED)
            result.keyed_gathers[name] = next(
                c.stmt.lineno for c in cs if c.cls == KEYED_GATHER
            )
            cs = [c for c in cs if c.cls == KEYED]
        if len(classes) > 1:
            kinds = " and ".join(sorted(classes))
            fix = (
                _element_fix(name)
                if WRITE in classes and classes & {KEYED, KEYED_GATHER}
                else "Use a separate name for each."
            )
            diag.report(
                MixedUse(
                    cs[1].stmt.lineno, cs[1].stmt.col_offset, name, kinds=kinds, fix=fix
                )
            )
            sinks[name] = first
            continue
        cls = first.cls
        if cls in (REDUCTION, KEYED):
            ops = {c.op for c in cs}
            augs = {c.augmented for c in cs}
            if len(ops) > 1 or len(augs) > 1:
                diag.report(
                    MixedReduction(
                        cs[1].stmt.lineno,
                        cs[1].stmt.col_offset,
                        name,
                        forms=", ".join(sorted(ast.unparse(c.stmt) for c in cs)),
                        key="[k]" if cls == KEYED else "",
                        depth_fix=_row_depth_fix(name) if _mixed_depths(cs) else "",
                    )
                )
        sinks[name] = first
        line = first.stmt.lineno
        if cls == GATHER:
            result.gathers[name] = line
        elif cls == WRITE:
            result.writes[name] = line
        elif cls == UNION:
            result.unions[name] = line
        elif cls == REDUCTION:
            result.reductions[name] = (first.op or "+", first.augmented, line)
        elif cls == KEYED:
            result.keyed[name] = (first.op or "+", line)
        elif cls == KEYED_GATHER:
            result.keyed_gathers[name] = line
    return sinks


@dataclass
class _Sinks:
    """The body's sink candidates by name, and which names they are."""

    stmts: list[ast.stmt]
    nodes: list[ast.AST]
    by_name: dict[str, list[Candidate]]
    sinks: dict[str, Candidate]
    own_rows: dict[str, OwnRow]
    own: set[int]
    body_bound: set[str]


def _find_sinks(
    body: list[ast.stmt],
    loop_target: ast.expr,
    loop_iter: ast.expr | None,
    diag: DiagnosticSink,
    is_builtin: Callable[[str], bool],
    result: Classification,
) -> _Sinks:
    """Match every statement against the sink forms and keep the names whose
    every binding is a sink's own store (a name also assigned by ordinary code
    is a plain local)."""
    stmts = list(block_statements(body))
    nodes = [n for s in body for n in scope_nodes(s)]
    cands: list[Candidate] = []
    for s in stmts:
        cands.extend(match_candidates(s, is_builtin))
    own_store_ids = {
        id(n) for c in cands for n in c.own if isinstance(n.ctx, ast.Store)
    }
    other_bound = {n.id for n in target_names(loop_target)} | bindings_of(
        nodes, exclude=own_store_ids
    )

    own_rows = _own_rows(body, nodes, loop_target, loop_iter, other_bound, is_builtin)
    by_name: dict[str, list[Candidate]] = {}
    for c in cands:
        if c.name in other_bound or c.name in own_rows:
            continue
        by_name.setdefault(c.name, []).append(c)
    sinks = _resolve_sinks(by_name, diag, result)
    own = {id(n) for name in sinks for c in by_name[name] for n in c.own}
    own |= {
        id(node)
        for st in body
        for node in ast.walk(st)
        if isinstance(node, ast.Name) and node.id in own_rows
    }
    return _Sinks(stmts, nodes, by_name, sinks, own_rows, own, other_bound - set(sinks))


def _flow_context(
    body: list[ast.stmt],
    found: _Sinks,
    loop_target: ast.expr,
    loop_iter: ast.expr | None,
    diag: DiagnosticSink,
    is_builtin: Callable[[str], bool],
    module_names: Iterable[str],
    assume_nonempty: bool,
) -> _Ctx:
    """What the flow walk is told before it starts: the sinks, the taint, the
    own elements and keys, the running bests."""
    stmts, nodes, sinks = found.stmts, found.nodes, found.sinks
    writes = {n: cs for n, cs in found.by_name.items() if sinks[n].cls == WRITE}
    several_writes: dict[str, tuple[str, list[int]]] = {}
    own_elements = _own_elements(
        writes,
        body,
        loop_target,
        loop_iter,
        bindings_of(nodes),
        is_builtin,
        several_writes,
    )
    # `for r, (k, v) in enumerate(d.items()): d[k] = ...`: `k` is as much
    # the iteration's own key as without `enumerate`
    inner = _enumerated(loop_target, loop_iter, is_builtin)
    enumerated: set[str] = set()
    if inner is not None:
        for name, key in _own_elements(
            writes, body, *inner, bindings_of(nodes), is_builtin
        ).items():
            if name not in own_elements:
                own_elements[name] = key
                enumerated.add(name)
    # alias taint: locals that may hold objects from outside the iteration
    tainted, shallow = _alias_taint(
        stmts, nodes, loop_target, loop_iter, found.body_bound, is_builtin
    )
    ctx = _Ctx(
        sink=diag,
        body_bound=found.body_bound,
        sinks=sinks,
        own=found.own,
        tainted=tainted,
        module_names=set(module_names) | set(WELL_KNOWN_MODULES),
        is_builtin=is_builtin,
    )
    ctx.shallow = shallow
    ctx.target_names = {n.id for n in target_names(loop_target)}
    ctx.item_names = _item_parts(body, (ctx.target_names & tainted) - _rebound(body))
    ctx.assume_nonempty = assume_nonempty
    ctx.own_elements = own_elements
    ctx.enumerated_keys = enumerated
    ctx.write_keys = _write_keys(writes, own_elements, body)
    ctx.several_writes = several_writes
    ctx.literal_keys = _literal_keys(loop_target, loop_iter, body)
    ctx.loop_stored = _loop_bindings(stmts)
    ctx.selections = _selections(stmts)
    ctx.concatenated = _concatenated(stmts)
    ctx.bests, ctx.best_reads = running_bests(body, is_builtin, ctx.target_names)
    own_key = _own_key(loop_target, loop_iter, is_builtin)
    if (
        isinstance(loop_target, ast.Name)
        and loop_iter is not None
        and _own_index(loop_target, loop_iter, is_builtin) is None
        # keys that may repeat, or a name's own (distinct for that name only)
        and (own_key is None or own_key[1] is not None)
    ):
        ctx.key_loop = (loop_target.id, ast.unparse(loop_iter))
    return ctx


def _enumerated(
    loop_target: ast.expr, loop_iter: ast.expr | None, is_builtin: Callable[[str], bool]
) -> tuple[ast.expr, ast.expr] | None:
    """``(target, items)`` of ``for n, target in enumerate(items)``."""
    if (
        isinstance(loop_iter, ast.Call)
        and isinstance(loop_iter.func, ast.Name)
        and loop_iter.func.id == "enumerate"
        and is_builtin("enumerate")
        and len(loop_iter.args) == 1
        and not loop_iter.keywords
        and isinstance(loop_target, (ast.Tuple, ast.List))
        and len(loop_target.elts) == 2
    ):
        return loop_target.elts[1], loop_iter.args[0]
    return None


def _refuse_target_parts(loop_target: ast.expr, diag: DiagnosticSink) -> None:
    """``for d[k] in ...``, ``for self.x in ...``: a loop target that stores
    into an object changes something outside the iteration."""
    for part in target_parts(loop_target):
        if not isinstance(part, ast.Name):
            diag.report(LoopTarget(part.lineno, part.col_offset, ast.unparse(part)))


def _own_row_results(
    result: Classification,
    found: _Sinks,
    ctx: _Ctx,
    flow: _Flow,
    loop_target: ast.expr,
    loop_iter: ast.expr | None,
    is_builtin: Callable[[str], bool],
) -> None:
    """Own rows as writes, the inputs their values name watched, and the keys
    the kernel checks distinct before the run."""
    own_rows = found.own_rows
    for name, row in own_rows.items():
        result.writes[name] = row.line
        ctx.inputs.setdefault(name, row.line)  # engines copy the rows they write
    result.own_rows = own_rows
    # a row's value handed to a function or a method (`d[k] = [x]`, then
    # `f(d[k])`) may have what it holds changed: the engines check the inputs
    # the written values name, as for a call's arguments
    for row in own_rows.values():
        for st in found.stmts:
            if st.lineno in row.handed and isinstance(st, ast.Assign):
                for sub in ast.walk(st.value):
                    if isinstance(sub, ast.Name) and isinstance(sub.ctx, ast.Load):
                        flow.watch(sub, st.lineno)
    check = _key_check(loop_iter, is_builtin)
    inner = _enumerated(loop_target, loop_iter, is_builtin)
    # (an own key under `enumerate`: as distinct as the enumerated items)
    inner_check = _key_check(inner[1], is_builtin) if inner is not None else None
    checks = {
        n: inner_check if n in ctx.enumerated_keys else check for n in ctx.own_elements
    }
    if check is not None or inner_check is not None:
        # (a row made new under any loop variable never reads what was there:
        # two keys for one element are a repeated key, the last one wins)
        i = _own_index(loop_target, loop_iter, is_builtin)
        rows = {
            n: (r.index, check)
            for n, r in own_rows.items()
            if r.index == i and check is not None
        }
        result.key_checks = {
            **rows,
            **{
                n: (k, how)
                for n, k in ctx.own_elements.items()
                if (how := checks[n]) is not None
            },
        }


def classify_body(
    body: list[ast.stmt],
    *,
    loop_target: ast.expr,
    loop_iter: ast.expr | None,
    diag: DiagnosticSink,
    is_builtin: Callable[[str], bool],
    module_names: Iterable[str] = (),
    fixed_sinks: dict[str, str] | None = None,
    assume_nonempty: bool = True,
) -> Classification:
    """Classify the names of a loop body.

    Parameters
    ----------
    body : list of ast.stmt
        The loop body (a synthesized one for the list-comprehension form).
    loop_target : ast.expr
        The parallel loop's target; its names are definitely assigned on entry.
    loop_iter : ast.expr or None
        The iterable (to refuse iterating over something the body changes, and to
        tell which loop targets hold outer objects).
    diag : DiagnosticSink
        Receives every refusal.
    is_builtin : callable
        ``is_builtin(name)`` when ``name`` resolves to the builtin on engines.
    module_names : iterable of str
        Names bound by ``import`` in the prelude (receivers whose in-place functions
        modify their argument rather than themselves).
    assume_nonempty : bool
        Take a nested loop over inputs (``for xb in loader``) to run at least
        once, recording its iterable in ``nonempty`` for the kernel to check.
    """
    result = Classification()
    found = _find_sinks(body, loop_target, loop_iter, diag, is_builtin, result)
    ctx = _flow_context(
        body,
        found,
        loop_target,
        loop_iter,
        diag,
        is_builtin,
        module_names,
        assume_nonempty,
    )
    flow = _Flow(ctx)
    entry: State = frozenset(n.id for n in target_names(loop_target))
    _refuse_target_parts(loop_target, diag)
    flow.block(body, entry)

    if loop_iter is not None:
        _refuse_mutated_iterable(
            loop_iter, is_builtin, found.sinks, ctx.own_elements, ctx, diag
        )

    if diag:
        # refused anyway: name the refit of an estimator from before the loop
        # first, which the engines' check would stop after running otherwise
        for name, call in ctx.refits.items():
            what, fix = _refit_text(name, call)
            diag.report(
                InputRefit(call.lineno, call.col_offset, name, what=what, fix=fix)
            )

    _own_row_results(result, found, ctx, flow, loop_target, loop_iter, is_builtin)
    _fill(result, ctx, found.nodes, loop_target, found.body_bound, is_builtin)
    return result


def _fill(
    result: Classification,
    ctx: _Ctx,
    nodes: list[ast.AST],
    loop_target: ast.expr,
    body_bound: set[str],
    is_builtin: Callable[[str], bool],
) -> None:
    """What the flow walk found, as the classification's names and lines."""
    result.inputs = {
        n: line
        for n, line in ctx.inputs.items()
        if n not in ENGINE_PROVIDED and not is_builtin(n)
    }
    first_lines: dict[str, int] = {}
    for n in target_names(loop_target):
        first_lines.setdefault(n.id, n.lineno)
    for any_node in nodes:
        if isinstance(any_node, ast.Name) and any_node.id in body_bound:
            first_lines.setdefault(any_node.id, any_node.lineno)
    result.locals = {n: first_lines.get(n, 0) for n in sorted(body_bound)}
    result.locals = dict(sorted(result.locals.items(), key=lambda kv: (kv[1], kv[0])))
    result.deleted_locals = ctx.deleted & body_bound
    result.prints = sorted(set(ctx.prints))
    result.watch = {
        n: sorted(set(lines)) for n, lines in ctx.watch.items() if n in result.inputs
    }
    result.watch_items = sorted(set(ctx.watch_items))
    result.watch_all = ctx.watch_all
    result.random_calls = sorted(set(ctx.random_calls))
    result.nonempty = list(ctx.nonempty)
    result.bests = ctx.bests
