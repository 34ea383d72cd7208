"""``analyse``: cell text in, :class:`LoopPlan` (or one NotParallelizable) out."""

from __future__ import annotations

import ast
import dataclasses
from collections.abc import Callable, Collection, Iterable
from dataclasses import dataclass
from typing import Any

from gpucell.core.analysis.cellscope import (
    _cell_scope,
    _context_inputs,
    _nonempty_checks,
    _undefined_inputs,
)
from gpucell.core.analysis.classify import classify_body
from gpucell.core.analysis.cudarewrite import rewrite_cuda
from gpucell.core.analysis.diagnostics import Diagnostic, DiagnosticSink, raise_if_any
from gpucell.core.analysis.facts import loop_facts
from gpucell.core.analysis.iterspace import describe_iterable, with_own_items
from gpucell.core.analysis.ownsubscripts import (
    OwnSubscripts,
    Trial,
    chosen_own_subscripts,
)
from gpucell.core.analysis.plan import LoopPlan, NameInfo, Reduction
from gpucell.core.analysis.refusals import (
    Await,
    ShortCircuitWalrus,
    WithTarget,
)
from gpucell.core.analysis.replaystmts import Replayed, replay_loop_statements
from gpucell.core.analysis.rewrite import ProgramPlan, build_program
from gpucell.core.analysis.scope import scope_bindings, target_names
from gpucell.core.analysis.sinks import (
    GATHER,
    INPUT,
    KEYED,
    KEYED_GATHER,
    LOCAL,
    REDUCTION,
    UNION,
    WRITE,
    Classification,
    GatherSink,
    KeyedGatherSink,
    KeyedSink,
    ReductionSink,
    UnionSink,
    WriteSink,
)
from gpucell.core.analysis.spellings import Spelled, respell
from gpucell.core.analysis.split import (
    SHORT_CIRCUIT,
    Layer,
    comprehension_kind,
    comprehension_of,
    line_span,
    no_loop_refusal,
    parse_cell,
    source_of,
    split_cell,
)
from gpucell.core.astcopy import copy_tree, copy_trees
from gpucell.core.lastitem import last_item_binding
from gpucell.protocol.program import ITEM_ERROR, RESULT

__all__ = ["analyse"]


def _engine_contexts(
    layers: tuple[Layer, ...],
    loop_reads: dict[str, int],
    with_targets: set[str],
    diag: DiagnosticSink,
) -> list[ast.expr]:
    """The context expressions each engine enters around its chunks (a ``with``
    around the loop: ``torch.no_grad()``, ``np.errstate(...)``), outermost first.

    A ``with ... as name`` is entered in the kernel only (an open file, a
    connection: what it gives cannot travel), so the loop may not read ``name``.
    """
    for n in sorted(with_targets & loop_reads.keys()):
        diag.report(WithTarget(loop_reads[n], 0, n))
    return [
        item.context_expr
        for layer in layers
        for item in layer.node.items
        if item.optional_vars is None
    ]


def _shape(kind: str | None, comp: ast.expr) -> str:
    """``out = [x * 2 for ...]``-style header text for the plan report."""
    if isinstance(comp, ast.DictComp):
        return f"{{{ast.unparse(comp.key)}: {ast.unparse(comp.value)} for ...}}"
    elt = ast.unparse(comp.elt)  # type: ignore[attr-defined]
    if kind == "list":
        return f"[{elt} for ...]"
    if kind == "set":
        return f"{{{elt} for ...}}"
    return f"{kind}({elt} for ...)"


def _listcomp_body(
    comp: ast.ListComp | ast.SetComp | ast.DictComp | ast.GeneratorExp,
    short_circuit: bool = False,
) -> tuple[ast.expr, ast.expr, list[ast.stmt]]:
    """``name = [elt for t in it if c for u in it2]`` (or a set, dict or
    generator comprehension) as a loop body.

    Returns (target, iterable, body) where the body appends ``elt`` (a dict
    comprehension's ``(key, value)``) to a fresh result list: ``for u in it2: if
    c2: __gpucell_result__.append(elt)`` nested under the first generator's
    conditions.
    """
    gens = comp.generators
    if isinstance(comp, ast.DictComp):
        elt: ast.expr = ast.copy_location(
            ast.Tuple([comp.key, comp.value], ast.Load()), comp.key
        )
    else:
        elt = comp.elt
    recv = ast.copy_location(ast.Name(RESULT, ast.Load()), elt)
    call = ast.copy_location(
        ast.Call(
            ast.copy_location(ast.Attribute(recv, "append", ast.Load()), elt), [elt], []
        ),
        elt,
    )
    stmts: list[ast.stmt] = [ast.copy_location(ast.Expr(call), elt)]
    if short_circuit:
        stmts = _gather_errors_too(elt, recv)
    for g in reversed(gens[1:]):
        for cond in reversed(g.ifs):
            stmts = [ast.copy_location(ast.If(cond, stmts, []), cond)]
        stmts = [ast.copy_location(ast.For(g.target, g.iter, stmts, []), g.iter)]
    for cond in reversed(gens[0].ifs):
        stmts = [ast.copy_location(ast.If(cond, stmts, []), cond)]
    return gens[0].target, gens[0].iter, stmts


_ITEM_EXC = "__gpucell_item_exc__"


def _gather_errors_too(elt: ast.expr, recv: ast.expr) -> list[ast.stmt]:
    """``try: __gpucell_result__.append(elt)`` ``except Exception as e:``
    ``__gpucell_result__.append(__gpucell_item_error__(e))``: an item that
    raised is gathered in its place (``any``/``all``)."""
    err = _ITEM_EXC

    def append(value: ast.expr) -> ast.stmt:
        f = ast.Attribute(copy_tree(recv), "append", ast.Load())
        return ast.Expr(ast.Call(f, [value], []))

    wrapped = ast.Call(
        ast.Name(ITEM_ERROR, ast.Load()), [ast.Name(err, ast.Load())], []
    )
    handler = ast.ExceptHandler(
        ast.Name("Exception", ast.Load()), err, [append(wrapped)]
    )
    node = ast.Try([append(elt)], [handler], [], [])
    return [ast.fix_missing_locations(ast.copy_location(node, elt))]


def _names(cl: Classification, hidden: set[str], result: str | None) -> list[NameInfo]:
    infos: list[NameInfo] = []
    for n, line in cl.inputs.items():
        infos.append(NameInfo(n, INPUT, line, "shipped to every engine"))
    for n, line in cl.locals.items():
        if n not in hidden:
            infos.append(NameInfo(n, LOCAL, line, "value from the last iteration"))
    for n, line in cl.gathers.items():
        fresh = n == RESULT and bool(result)
        shown = result if fresh and result else n
        infos.append(NameInfo(shown, GATHER, line, GatherSink.describe(fresh)))
    for n, line in cl.writes.items():
        infos.append(NameInfo(n, WRITE, line, WriteSink.describe()))
    for n, (op, aug, line) in cl.reductions.items():
        infos.append(NameInfo(n, REDUCTION, line, ReductionSink.describe(n, op, aug)))
    for n, (op, line) in cl.keyed.items():
        infos.append(NameInfo(n, KEYED, line, KeyedSink.describe(n, op)))
    for n, line in cl.unions.items():
        infos.append(NameInfo(n, UNION, line, UnionSink.describe()))
    for n, line in cl.keyed_gathers.items():
        if n not in cl.keyed:  # (beside a keyed reduction it is listed there)
            infos.append(NameInfo(n, KEYED_GATHER, line, KeyedGatherSink.describe(n)))
    infos.sort(key=lambda i: (i.line, i.name))
    return infos


def _loop_kind(node: ast.stmt) -> str:
    if isinstance(node, (ast.For, ast.AsyncFor)):
        return "`for` loop"
    kind = comprehension_kind(node) or "list"
    return "comprehension" if kind in ("list", "set", "dict") else f"`{kind}(...)`"


def _choice(loop: ast.stmt, others: tuple[ast.stmt, ...]) -> str:
    """Which loop runs in parallel, by which rule, and where the others run."""
    if isinstance(loop, (ast.For, ast.AsyncFor)):
        text = f"the first top-level `for` loop (line {loop.lineno})"
        if any(not isinstance(o, (ast.For, ast.AsyncFor)) for o in others):
            text += "; a comprehension runs in parallel only in a cell without one"
    else:
        text = (
            f"the {_loop_kind(loop)} on line {loop.lineno} (the cell has no "
            "top-level `for` loop)"
        )
    if not others:
        return text
    where = ", ".join(
        f"the {_loop_kind(o)} on line {o.lineno} "
        f"({'before' if o.lineno < loop.lineno else 'after'} it)"
        for o in others
    )
    return f"{text}; in the kernel, as written: {where}"


def _no_loop(
    common: dict[str, Any], diag: DiagnosticSink, raise_errors: bool, why: Diagnostic
) -> LoopPlan:
    """The plan of a cell without a loop gpucell can run (refused: ``why``)."""
    diag.report(why)
    if raise_errors:
        raise_if_any(diag.sorted())
    return LoopPlan(
        **common,
        kind=None,
        loop_lines=None,
        loop_header="",
        iter_space=None,
        inputs=(),
        locals=(),
        gathers=(),
        writes=(),
        reductions=(),
        keyed=(),
        unions=(),
        result_name=None,
        hidden=(),
        names=(),
        prints=(),
        chunk_ast=None,
        epilogue_source="",
        epilogue_lines=None,
        diagnostics=diag.sorted(),
    )


@dataclass(frozen=True)
class _LoopParts:
    """The loop as a ``for``: its target, iterable and body, and how to show it."""

    target: ast.expr
    iterable: ast.expr
    body: list[ast.stmt]
    kind: str
    header: str
    hidden: set[str]
    result_name: str | None
    result_kind: str | None


def _loop_parts(loop: ast.stmt, diag: DiagnosticSink) -> _LoopParts:
    """A ``for`` loop as it is, or a comprehension assignment as the ``for``
    loop it stands for (its values gathered into a fresh result)."""
    result_name: str | None = None
    hidden: set[str] = set()
    result_kind: str | None = None
    if isinstance(loop, ast.Assign):
        comp = comprehension_of(loop)
        result_kind = comprehension_kind(loop)
        target, iterable, body = _listcomp_body(
            comp, short_circuit=result_kind in SHORT_CIRCUIT
        )
        result_name = loop.targets[0].id  # type: ignore[attr-defined]
        kind = "listcomp"
        hidden = {n.id for g in comp.generators for n in target_names(g.target)}
        if result_kind in SHORT_CIRCUIT:
            hidden.add(_ITEM_EXC)
            for node in ast.walk(comp):
                if isinstance(node, ast.NamedExpr):
                    name = node.target.id
                    diag.report(
                        ShortCircuitWalrus(
                            node.lineno, node.col_offset, name, call=result_kind
                        )
                    )
        if any(g.is_async for g in comp.generators):
            what = "an `async for` comprehension cannot run in parallel."
            diag.report(
                Await(loop.lineno, loop.col_offset, result_name, what=what, fix="")
            )
        header = f"{result_name} = {_shape(result_kind, comp)}"
    else:
        assert isinstance(loop, (ast.For, ast.AsyncFor))
        target, iterable, body = loop.target, loop.iter, list(loop.body)
        kind = "for"
        header = f"for {ast.unparse(target)} in {ast.unparse(iterable)}"
        if isinstance(loop, ast.AsyncFor):
            what, fix = (
                "`async for` cannot run in parallel; ",
                "use a plain `for` loop.",
            )
            diag.report(
                Await(loop.lineno, loop.col_offset, "async for", what=what, fix=fix)
            )

    return _LoopParts(
        target, iterable, body, kind, header, hidden, result_name, result_kind
    )


def _classify(
    body: list[ast.stmt],
    target: ast.expr,
    iterable: ast.expr | None,
    is_builtin: Callable[[str], bool],
    prelude_modules: Iterable[str],
    diag: DiagnosticSink,
    replayed: dict[str, Replayed] | None = None,
) -> tuple[Classification, Spelled]:
    """The body's classification, its problems added to ``diag``.

    `D[k] = D.get(k, 0) + e`, `D.setdefault(k, []).append(e)`, `lo, hi =
    min(lo, x), max(hi, x)`: rewritten to the forms classify_body proves only when
    that turns a refusal into an acceptance. A loop accepted as written keeps
    its own reading (`for c in df.columns: df[c] = df[c] + 1` is an own-key
    write, not a keyed reduction over the columns it iterates); one refused
    either way is refused for what the user wrote.

    ``classify_body`` reads the statements, never changes them: the trial's
    classification is the loop's own when it is kept."""

    def classified(stmts: list[ast.stmt]) -> tuple[Classification, DiagnosticSink]:
        trial = DiagnosticSink()
        found = classify_body(
            stmts,
            loop_target=target,
            loop_iter=iterable,
            diag=trial,
            is_builtin=is_builtin,
            module_names=prelude_modules,
        )
        return found, trial

    spelled = Spelled()
    cl, trial = classified(body)
    if trial:
        respelled = copy_trees(body)
        trial_spelled = respell(respelled, is_builtin, (target, iterable))
        cl_spelled, trial_of_spelled = classified(respelled)
        if not trial_of_spelled:
            body[:] = respelled
            spelled = trial_spelled
            cl, trial = cl_spelled, trial_of_spelled
    if diag:
        # problems found before the body change what it says (the refit of an
        # estimator is named only in a refused loop): classified again
        cl = classify_body(
            body,
            loop_target=target,
            loop_iter=iterable,
            diag=diag,
            is_builtin=is_builtin,
            module_names=prelude_modules,
        )
    else:
        diag.extend(trial.sorted())
    spelled.add_replayed(replayed or {})  # (replayed whatever the reading)
    return cl, spelled


def _own_subscripts(
    parts: _LoopParts, scope: Any, diag: DiagnosticSink
) -> OwnSubscripts | None:
    """The loop with ``C[k]`` as an item of its own (``ownsubscripts.py``)."""

    def trial(target: ast.expr, iterable: ast.expr, body: list[ast.stmt]) -> Trial:
        sink = DiagnosticSink()
        cl, _ = _classify(
            copy_trees(body), target, iterable, scope.is_builtin,
            scope.prelude_modules, sink,
        )  # fmt: skip
        return set(cl.watch), cl.watch_all, bool(sink)

    if parts.kind != "for" or diag:
        return None
    return chosen_own_subscripts(
        parts.target, parts.iterable, parts.body, scope.shadowed, trial
    )


def _facts(
    source: str, kind: str, lines: tuple[int, int], filename: str, epilogue: Any
) -> Any:
    """The loop's facts (``facts.py``), its target bound to the first part of
    the last item where it runs with its own elements (``zip(items, ...)``)."""
    facts = loop_facts(source, kind.split("+")[0], lines[0], filename, epilogue)
    if not kind.endswith("+own") or facts.last_item is None:
        return facts
    last = last_item_binding(source, lines[0], filename, part=True)
    return dataclasses.replace(facts, last_item=last)


def _chunk_program(
    loop: ast.stmt,
    target: ast.expr,
    body: list[ast.stmt],
    contexts: list[ast.expr],
    locals_: tuple[str, ...],
    cl: Classification,
    for_cpu: bool,
) -> tuple[ast.Module, tuple[int, ...]]:
    """The engines' chunk program, and the lines whose CUDA selections became
    the engine's device (``for_cpu``)."""
    cuda_lines: tuple[int, ...] = ()
    if for_cpu:
        # CUDA selections become the engine's device before the sinks are
        # rewritten, so the recorder's spec says at once whether it binds one
        cuda_mod, cuda_lines, wrapped = rewrite_cuda(
            ast.Module(body=body, type_ignores=[])
        )
        body = cuda_mod.body
        needs_device = bool(cuda_lines or wrapped)
    else:
        needs_device = False
    # the loop's nodes are rewritten in place: the plan keeps only the
    # prelude and epilogue trees, and classification is done
    program = build_program(
        ProgramPlan(
            loop_node=loop,
            target=target,
            body=body,
            contexts=contexts,
            locals_=locals_,
            device=needs_device,
            gathers=cl.gathers,
            writes=cl.writes,
            reductions={n: op for n, (op, _aug, _ln) in cl.reductions.items()},
            keyed={n: op for n, (op, _line) in cl.keyed.items()},
            unions=cl.unions,
            deleted=cl.deleted_locals,
            keyed_gathers=cl.keyed_gathers,
            own_rows=cl.own_rows,
            key_checks=cl.key_checks,
        )
    )
    return program, cuda_lines


def _classified_fields(
    cl: Classification, locals_: tuple[str, ...], hidden: set[str], result: str | None
) -> dict[str, Any]:
    """The plan's fields that say what the body does with each name."""
    return dict(
        inputs=tuple(cl.inputs),
        locals=locals_,
        gathers=tuple(n for n in cl.gathers if n != RESULT),
        writes=tuple(cl.writes),
        reductions=tuple(
            Reduction(n, op, aug, line) for n, (op, aug, line) in cl.reductions.items()
        ),
        keyed=tuple((n, op) for n, (op, _line) in cl.keyed.items()),
        keyed_gathers=tuple(cl.keyed_gathers),
        own_rows=tuple(cl.own_rows.values()),
        unions=tuple(cl.unions),
        hidden=tuple(sorted(hidden)),
        names=tuple(_names(cl, hidden, result)),
        prints=tuple(cl.prints),
        watch=tuple((n, tuple(lines)) for n, lines in cl.watch.items()),
        watch_items=tuple(cl.watch_items),
        watch_all=cl.watch_all,
        random_calls=tuple(cl.random_calls),
        bests=tuple(cl.bests.values()),
    )


def analyse(
    source: str,
    *,
    filename: str = "<gpucell-cell>",
    known_names: Collection[str] = (),
    for_cpu: bool = False,
    raise_errors: bool = True,
) -> LoopPlan:
    """Analyse a cell for ``%%gpu_parallel``.

    Parameters
    ----------
    source : str
        The cell after ``shell.transform_cell`` (plain Python).
    filename : str
        Used to compile every part so tracebacks and syntax errors name the cell.
    known_names : collection of str
        Names in the user's namespace before the cell. Only names are used, never
        values: they tell a shadowed builtin from the real one and let the plan
        warn about inputs that do not exist.
    for_cpu : bool
        Rewrite ``.cuda()``/``device="cuda"`` selections to the engine's device.
    raise_errors : bool
        When false, refusals are returned in ``plan.diagnostics`` (for
        ``--dry-run``) instead of raised.

    Returns
    -------
    LoopPlan

    Raises
    ------
    SyntaxError
        As Python reports it, with the cell's own line numbers.
    NotParallelizable
        With every refusal (``err.diagnostics``) when ``raise_errors`` is true.
    """
    module = parse_cell(source, filename)
    known = frozenset(known_names)
    cell_bound = scope_bindings(list(module.body))
    split = split_cell(module, lambda n: n in known or n in cell_bound)
    diag = DiagnosticSink()
    scope = _cell_scope(split, known)
    is_builtin = scope.is_builtin

    loop = split.loop
    common: dict[str, Any] = dict(
        source=source,
        filename=filename,
        prelude_source=source_of(source, split.prelude),
        prelude_lines=line_span(split.prelude),
        prelude=split.prelude,
        layers=split.layers,
    )
    if loop is None:
        return _no_loop(common, diag, raise_errors, no_loop_refusal(module))

    loop_lines = (loop.lineno, loop.end_lineno or loop.lineno)
    parts = _loop_parts(loop, diag)
    target, iterable, body = parts.target, parts.iterable, parts.body
    kind, result_name = parts.kind, parts.result_name
    replayed = replay_loop_statements(body, target, iterable, False, is_builtin)
    own = _own_subscripts(parts, scope, diag)  # `models[i]`: an own item
    if own is not None:
        target, iterable, body = own.target, own.iterable, own.body
    cl, spelled = _classify(
        body, target, iterable, is_builtin, scope.prelude_modules, diag, replayed
    )
    hidden = parts.hidden | spelled.hidden | set(own.names.values() if own else ())
    nonempty, unless_nonempty = _nonempty_checks(
        cl, diag, body, target, iterable, scope
    )
    contexts = _engine_contexts(split.layers, cl.inputs, scope.with_targets, diag)
    _context_inputs(contexts, cl, is_builtin)
    space = describe_iterable(parts.iterable, scope.shadowed)
    space = with_own_items(space, own.keys if own else {})
    # names the iterable reads are inputs of the kernel, not of the engines
    warnings = _undefined_inputs(cl, scope)

    locals_ = tuple(n for n in cl.locals if n not in hidden)
    diagnostics = diag.sorted()
    epi_src = source_of(source, split.epilogue, avoid=loop_lines)
    chunk_ast = None
    cuda_lines: tuple[int, ...] = ()
    if not diagnostics:
        chunk_ast, cuda_lines = _chunk_program(
            loop, target, body, contexts, locals_, cl, for_cpu
        )
    elif raise_errors:
        raise_if_any(diagnostics)

    return LoopPlan(
        **common,
        kind=kind,
        loop_lines=loop_lines,
        loop_header=parts.header,
        iter_space=space,
        **_classified_fields(cl, locals_, hidden, result_name),
        spelled=spelled,
        result_name=result_name,
        result_kind=parts.result_kind,
        facts=_facts(
            source,
            kind + ("+own" if own else ""),
            loop_lines,
            filename,
            line_span(split.epilogue) if epi_src.strip() else None,
        ),  # fmt: skip
        nonempty=nonempty,
        unless_nonempty=unless_nonempty,
        chunk_ast=chunk_ast,
        epilogue_source=epi_src,
        epilogue_lines=line_span(split.epilogue),
        cuda_rewritten=bool(cuda_lines),
        cuda_lines=cuda_lines,
        diagnostics=diagnostics,
        warnings=warnings.sorted(),
        epilogue=split.epilogue,
        choice=_choice(loop, split.others),
    )
