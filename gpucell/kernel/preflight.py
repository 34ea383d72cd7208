"""Pre-flight checks: what the namespace shows, after the prelude, that the
cell's text could not (the run-time refusals).

Each check looks at the live objects the loop will read (a generator's code,
a notebook function's globals, an index's labels, a row's identity) and
returns the problems it finds as :class:`~gpucell.core.analysis.Diagnostic`
values; nothing here runs the loop or writes the namespace.  :func:`refuse`
raises one :class:`~gpucell.errors.NotParallelizable` listing every problem,
as the static analysis does, so the cell is fixed in one edit.

This module runs the checks in order, before the loop's items are drawn and
after, and holds the checks on drawing them (a generator interleaving with the
body, drawing that changes an input).  The others live by what they read: the
notebook's functions' code (``preflight_functions``), what an engine's process
would keep (``preflight_process``), the objects the loop writes
(``preflight_sinks``, ``keyed_stores``); ``preflight_problem`` words a problem.
"""

from __future__ import annotations

import types
from collections.abc import Iterable
from typing import TYPE_CHECKING, Any

from gpucell.core.analysis.diagnostics import Diagnostic, in_order
from gpucell.errors import NotParallelizable
from gpucell.kernel import (
    keyed_stores,
    preflight_functions,
    preflight_process,
    preflight_sinks,
)
from gpucell.kernel.preflight_problem import Namespace, line_of, problem

if TYPE_CHECKING:
    from gpucell.core.analysis import LoopPlan


__all__ = [
    "after_drawing",
    "before_drawing",
    "fingerprints",
    "format_problems",
    "refuse",
]

#: what the one-problem message ends with (the prelude ran, as serially)
NOTHING_RAN = "Nothing from the loop ran."
#: ... and the message about drawing a lazy iterable's items
ITEMS_DRAWN = (
    "The items were drawn (as serially, the generator ran); nothing of the loop "
    "body ran."
)


def refuse(problems: Iterable[Diagnostic], ending: str = NOTHING_RAN) -> None:
    """Raise one :class:`NotParallelizable` naming every problem (none: return)."""
    items = in_order(problems)
    if items:
        err = NotParallelizable(format_problems(items, ending))
        err.diagnostics = items  # type: ignore[attr-defined]
        raise err


def format_problems(items: tuple[Diagnostic, ...], ending: str = NOTHING_RAN) -> str:
    """One problem reads as it always has (its text, then ``ending``); several
    are listed as the static analysis lists them."""
    if len(items) == 1:
        return f"%%gpu_parallel: {items[0].text} {ending}"
    lines = [
        "%%gpu_parallel cannot run this loop in parallel and keep the result "
        f"identical to running it serially ({len(items)} problems):"
    ]
    lines += [f"  - line {d.line}: {d.text}" for d in items]
    lines.append(f"{ending} (The cell's code before the loop ran, as serially.)")
    return "\n".join(lines)


def before_drawing(
    plan: LoopPlan, ns: Namespace, inputs: Namespace, values: list[Any]
) -> list[Diagnostic]:
    """Every problem found before the loop's items are drawn (the prelude ran;
    ``values`` are the iterable's parts as evaluated, ``inputs`` what the body
    reads)."""
    out: list[Diagnostic] = []
    out += _interleaved_generators(plan, values, ns)
    out += _iterated_objects_read(plan, values, inputs)
    out += preflight_sinks.duplicate_labels(plan, ns)
    out += preflight_functions.helpers_reading_what_the_loop_changes(plan, ns, inputs)
    out += preflight_process.one_file_written_by_every_iteration(plan, ns)
    out += preflight_process.user_module_state_changes(plan, inputs)
    out += preflight_process.process_state_changes(plan, ns)
    out += preflight_functions.helpers_changing_data(plan, ns)
    out += preflight_functions.helpers_changing_modules(plan, ns)
    out += preflight_functions.hooks_recording_into_the_notebook(plan, inputs)
    out += preflight_sinks.unions_of_other_types(plan, ns)
    out += preflight_sinks.replayed_on_other_types(plan, ns)
    out += preflight_sinks.bound_methods_of_inputs(plan, ns, inputs)
    out += keyed_stores.of_other_types(plan, ns)
    out += preflight_sinks.inputs_shared_with_sinks(plan, ns, inputs, values)
    out += preflight_process.contexts_that_cannot_travel(plan, ns)
    out += preflight_sinks.rows_that_are_not_own(plan, ns)
    out += preflight_functions.helpers_changing_own_rows(plan, ns)
    return out


def _iterated_objects_read(
    plan: LoopPlan, values: list[Any], inputs: Namespace
) -> list[Diagnostic]:
    """The body reads the object the loop iterates, and that object keeps where
    its iteration is (an iterator, a progress bar): serially the body sees it
    one item along each iteration; here every item is drawn before any
    iteration runs, and each engine would get a copy of it."""
    out = []
    for name, value in inputs.items():
        if not any(value is v for v in values) or not _keeps_its_position(value):
            continue
        out.append(
            problem(
                line_of(plan, name),
                name,
                "iterated-object-read",
                f"the body uses `{name}` (line {line_of(plan, name)}), the object "
                "the loop iterates, which keeps where its iteration is (a "
                f"`{type(value).__name__}`): serially the body sees it one item "
                "along each iteration; here every item is drawn before any "
                "iteration runs, so it would be used exhausted, as a copy on each "
                f"engine. Iterate over the items themselves and use `{name}` after "
                "the loop (a progress bar: wrap the items, `for x in tqdm(items):`, "
                "and call nothing on the bar in the body).",
            )
        )
    return out


def _keeps_its_position(value: Any) -> bool:
    """An iterator (its ``__next__`` moves it), or a progress bar that counts
    the items drawn through it (tqdm's, whose ``__iter__`` advances ``n``)."""
    kind = type(value)
    if isinstance(value, type) or kind in (list, tuple, dict, set, frozenset, str):
        return False
    return hasattr(kind, "__next__") or (kind.__module__ or "").startswith("tqdm")


def _interleaved_generators(
    plan: LoopPlan, values: list[Any], ns: Namespace
) -> list[Diagnostic]:
    """A generator whose items depend on what the body changes (``yield len(out)``
    while the body appends to ``out``) interleaves with the body serially; here
    its items are all drawn first, so they would differ."""
    from gpucell.core.globalreads import generator_reads

    changed = set(plan.affected_names) | set(plan.locals)
    out = []
    for value in values:
        code = getattr(value, "gi_code", None)
        if not isinstance(value, types.GeneratorType) or code is None:
            continue
        # globals notebook code reads (never attribute names: iterrows reads
        # `self.index`, no global `index`), and what the generator was given
        reads = {r.name for r in generator_reads(value, ns, changed)}
        if reads:
            names = ", ".join(f"`{n}`" for n in sorted(reads))
            out.append(
                problem(
                    line_of(plan),
                    code.co_name,
                    "interleaved-generator",
                    f"the loop iterates over the generator `{code.co_name}`, which "
                    f"reads {names}, which the loop body changes (line "
                    f"{line_of(plan)}): serially each item is made after the "
                    "iterations before it, here all items are made first, so they "
                    "would differ. Build the items first (`items = list(...)` in a "
                    "cell of its own, then loop over `items`), or run the cell "
                    "without %%gpu_parallel.",
                )
            )
    return out


def fingerprints(plan: LoopPlan, ns: Namespace) -> dict[str, Any]:
    """The inputs' fingerprints (to see what drawing a lazy iterable changed)."""
    from gpucell.protocol.fingerprint import fingerprint

    return {n: fingerprint(ns[n]) for n in plan.inputs if n in ns}


def after_drawing(
    plan: LoopPlan, ns: Namespace, before: dict[str, Any], lazy: list[Any]
) -> list[Diagnostic]:
    """Drawing a generator's items changed a name the body reads (``def
    gen(): log.append(...); yield ...`` while the body reads ``len(log)``):
    serially each iteration sees what the items drawn before it changed; here
    every item was drawn first.  (An input without a fingerprint, an object
    gpucell cannot summarise, is not checked.)"""
    after = fingerprints(plan, ns)
    changed = sorted(
        n
        for n, fp in before.items()
        if fp is not None and (n not in after or after[n] != fp)
    )
    if not changed:
        return []
    what = getattr(getattr(lazy[0], "gi_code", None), "co_name", None)
    source = f"the generator `{what}`" if what else f"a {type(lazy[0]).__name__}"
    names = ", ".join(f"`{n}`" for n in changed)
    return [
        problem(
            line_of(plan),
            changed[0],
            "changed-by-drawing",
            f"drawing the loop's items from {source} changed {names}, which the "
            f"loop body reads (line {line_of(plan)}): serially each iteration "
            "sees what drawing the items before it changed; here every item is "
            "drawn first, so the iterations would see another value. Draw the "
            "items in a cell of their own (`items = list(...)`) and loop over "
            "`items`, or run the cell without %%gpu_parallel.",
        )
    ]
