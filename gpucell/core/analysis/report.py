"""``format_plan``: the ``%%gpu_parallel --dry-run`` text, readable in ten seconds."""

from __future__ import annotations

import ast

from gpucell.core.analysis.plan import CLASS_ORDER, LoopPlan

__all__ = ["format_plan"]

_CLASS_NOTE = {
    "input": "shipped to every engine",
    "local": "value from the last iteration that assigned it",
    "ordered gather": "items appended in iteration order",
    "indexed write": "item writes applied in iteration order",
    "reduction": "partials per chunk, combined in chunk order",
    "keyed reduction": "per-key partials, combined in chunk order",
    "keyed gather": "items per key, in iteration order",
    "set union": "union of all additions",
}


def _span(span: tuple[int, int] | None) -> str:
    if span is None:
        return "none"
    a, b = span
    return f"line {a}" if a == b else f"lines {a}-{b}"


def _stmt_span(stmts: tuple[ast.stmt, ...]) -> str:
    end = max(getattr(s, "end_lineno", None) or s.lineno for s in stmts)
    return _span((stmts[0].lineno, end))


def _layers(plan: LoopPlan) -> list[str]:
    """The ``with`` blocks around the loop, outermost first: where each context
    is entered, and which of its statements run in the kernel around the loop."""
    out = []
    for layer in plan.layers:
        items = ", ".join(ast.unparse(i) for i in layer.node.items)
        engines = [
            ast.unparse(i.context_expr)
            for i in layer.node.items
            if i.optional_vars is None
        ]
        where = (
            f"entered in the kernel; engines re-enter {', '.join(engines)} around "
            "each chunk"
            if engines
            else "entered in the kernel only"
        )
        out.append(f"with {items} (line {layer.node.lineno}): {where}")
        if layer.before:
            out.append(
                f"  inside it, before the loop (kernel): {_stmt_span(layer.before)}"
            )
        if layer.after:
            out.append(
                f"  inside it, after the loop (kernel):  {_stmt_span(layer.after)}"
            )
    return out


def _at(plan: LoopPlan) -> list[str]:
    return list(plan.spelled.ufunc_at.values())


def _rows(plan: LoopPlan) -> list[str]:
    return list(plan.spelled.frame_rows.values())


def format_plan(plan: LoopPlan) -> str:
    """Render a plan (or its refusals) as plain text for ``--dry-run``."""
    out: list[str] = []
    if plan.kind is None:
        out.append("gpucell plan: no parallel loop in this cell")
    else:
        form = "list comprehension" if plan.kind == "listcomp" else "for loop"
        out.append(f"gpucell plan: parallel {form} on {_span(plan.loop_lines)}")
        out.append(f"  {plan.loop_header}")
        if plan.choice:
            out.append(f"chosen: {plan.choice}")
    out.append(f"prelude  (kernel, before): {_span(plan.prelude_lines)}")
    out.append(f"epilogue (kernel, after):  {_span(plan.epilogue_lines)}")
    out.extend(_layers(plan))
    if plan.iter_space is not None:
        out.append(f"iteration space: {plan.iter_space.describe()}")
    by_class = plan.names_by_class()
    if by_class:
        out.append("names:")
        width = max(len(c) for c in by_class)
        for cls in CLASS_ORDER:
            names = tuple(n for n in by_class.get(cls, ()) if n not in plan.hidden)
            if names:
                out.append(
                    f"  {cls:<{width}}  {', '.join(names)}   ({_CLASS_NOTE[cls]})"
                )
    if plan.kind is not None:
        ships = ", ".join(plan.inputs) or "nothing but the items"
        out.append(f"ships to engines: {ships} (+ each chunk's items)")
        back = []
        if plan.result_name:
            what = plan.result_kind or "list"
            built = f"new {what}" if what in ("list", "set", "dict") else f"{what}(...)"
            back.append(f"{plan.result_name} ({built})")
        back += [f"{n} (gather)" for n in plan.gathers if n not in plan.hidden]
        back += [f"{n} (ufunc.at calls, replayed)" for n in _at(plan)]
        back += [f"{n} (own rows' written cells)" for n in _rows(plan)]
        back += [
            f"{n} (concatenation, replayed from its value before the loop)"
            for n in plan.spelled.concats.values()
        ]
        back += [
            f"{r.target} (its changes, replayed in iteration order)"
            for r in plan.spelled.replayed.values()
        ]
        back += [f"{n} (writes)" for n in plan.writes]
        back += [f"{r.name} ({r.op} reduction)" for r in plan.reductions]
        back += [f"{n} (keyed {op})" for n, op in plan.keyed]
        back += [f"{n} (lists per key)" for n in plan.keyed_gathers]
        back += [f"{n} (union)" for n in plan.unions]
        kept = {n: b for b in plan.bests for n in b.names}
        back += [
            f"{n} ({kept[n].describe()}, by the test)"
            if n == getattr(kept.get(n), "name", None)
            else f"{n} (kept with {kept[n].name})"
            if n in kept
            else f"{n} (last value)"
            for n in plan.locals
        ]
        out.append(f"comes back: {', '.join(back) or 'nothing'}")
    if plan.prints:
        lines = ", ".join(str(n) for n in plan.prints)
        out.append(f"output: print on line(s) {lines}, forwarded per engine")
    if plan.cuda_rewritten:
        lines = ", ".join(str(n) for n in plan.cuda_lines)
        out.append(f"cuda: device selections on line(s) {lines} use the engine device")
    if plan.nonempty:
        checks = ", ".join(f"`{t}` (line {n})" for n, t in plan.nonempty)
        out.append(f"checked before the run: {checks} yield an item (nested loops run)")
    for w in plan.warnings:
        out.append(f"warning: line {w.line}: {w.text}")
    if plan.diagnostics:
        out.append(f"REFUSED ({len(plan.diagnostics)}):")
        for d in plan.diagnostics:
            out.append(f"  line {d.line}: {d.text}")
    else:
        out.append("refusals: none")
    return "\n".join(out)
