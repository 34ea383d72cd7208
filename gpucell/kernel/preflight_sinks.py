"""Pre-flight checks on the objects the loop writes, as its merge needs them:
unique labels, rows that are each iteration's own, ``.add``/``.update`` on sets
and dicts only, replayed methods on standard containers (and a progress bar's
drawing methods) only, no container
method bound before the loop, and no input that is or shares memory with one of
them."""

from __future__ import annotations

from collections import deque
from typing import TYPE_CHECKING, Any

from gpucell.core.analysis.diagnostics import Diagnostic
from gpucell.core.progressbars import (
    DRAWING_METHODS,
    PROGRESS_METHODS,
    is_progress_bar,
)
from gpucell.kernel.preflight_problem import Namespace, line_of, problem

#: the containers whose methods change only themselves (Counter, defaultdict,
#: OrderedDict included): replayed on the kernel
_CONTAINERS = (set, dict, list, deque)

if TYPE_CHECKING:
    from gpucell.core.analysis import LoopPlan

__all__ = [
    "duplicate_labels",
    "inputs_shared_with_sinks",
    "rows_that_are_not_own",
    "bound_methods_of_inputs",
    "replayed_on_other_types",
    "unions_of_other_types",
]


def unions_of_other_types(plan: LoopPlan, ns: Namespace) -> list[Diagnostic]:
    """``x.add(...)``/``x.update(...)`` in the body is merged as a set union or
    a dict update; on any other object (a notebook class, ``hashlib``'s
    hashes, a tqdm bar) the method does something the merge cannot replay."""
    out = []
    for name in plan.unions:
        # (Counter, OrderedDict, defaultdict and other subclasses included)
        if name not in ns or isinstance(ns[name], (set, dict)):
            continue
        if is_progress_bar(ns[name]):
            continue  # `bar.update(1)`: made on the bar in iteration order
        kind = type(ns[name])
        where = (
            "defined in this notebook"
            if kind.__module__ == "__main__"
            else (f"from `{kind.__module__}`")
        )
        out.append(
            problem(
                line_of(plan, name),
                name,
                "union-of-other-type",
                f"`{name}.add(...)`/`{name}.update(...)` (line "
                f"{line_of(plan, name)}) changes `{name}`, a `{kind.__name__}` "
                f"({where}). gpucell merges `.add`/`.update` only on sets, dicts "
                "and Counters, replaying them in iteration order; another object's "
                "method would run on each engine's copy. Collect the arguments in "
                f"a list in the loop (`args.append(...)`) and call `{name}.update` "
                "on each after the loop, or run the cell without %%gpu_parallel.",
            )
        )
    return out


def bound_methods_of_inputs(
    plan: LoopPlan, ns: Namespace, inputs: Namespace
) -> list[Diagnostic]:
    """``add = seen.add`` before the loop, ``add(w)`` in it: the method changes
    ``seen``, which each engine holds a copy of; the sinks gpucell merges are
    the methods called on the object by name (``seen.add(w)``)."""
    import types

    out = []
    watched = set(plan.watched()["names"])
    for name, value in inputs.items():
        owner = getattr(value, "__self__", None)
        if (
            name not in watched
            or not isinstance(value, types.BuiltinMethodType)
            or owner is None
            or isinstance(owner, (types.ModuleType, type))
            or not isinstance(owner, (*_CONTAINERS, bytearray))
        ):
            continue
        method = value.__name__
        line = line_of(plan, name)
        obj = next(
            (k for k, v in ns.items() if v is owner and not k.startswith("_")), "obj"
        )
        out.append(
            problem(
                line,
                name,
                "bound-method-input",
                f"`{name}` (line {line}) is the `{method}` method of a "
                f"`{type(owner).__name__}` from before the loop: calling it "
                "changes that object, of which each engine holds its own copy, "
                "so the changes would be lost. Call the method on the object "
                f"itself in the loop (`{obj}.{method}(...)`): gpucell merges "
                "that.",
            )
        )
    return out


def replayed_on_other_types(plan: LoopPlan, ns: Namespace) -> list[Diagnostic]:
    """``T.subtract(c)``, ``T[k].add(v)``, ``res.scores.append(x)`` are
    replayed on the kernel after the engines ran: right for the standard
    containers, whose methods change only themselves; another object's
    method (a progress bar's ``update``, a session's ``add``) may do more, at
    the wrong time."""
    out = []
    for rep in plan.spelled.replayed.values():
        name = rep.target
        if name not in ns:
            continue
        for k in sorted(rep.method_calls):
            path = rep.owners.get(k, ())
            obj, spelled = ns[name], name
            try:
                for attr in path or ():
                    obj, spelled = getattr(obj, attr), f"{spelled}.{attr}"
            except Exception:
                continue  # (serially the statement would fail the same way)
            method = rep.methods.get(k)
            if method in DRAWING_METHODS:
                if is_progress_bar(obj):
                    continue  # (`bar.set_postfix(...)`: it only draws)
            elif isinstance(obj, _CONTAINERS):
                continue  # (Counter, defaultdict, OrderedDict included)
            elif is_progress_bar(obj) and method in PROGRESS_METHODS:
                continue  # (`bar.update(1)`)
            line = rep.lines[k]
            out.append(
                problem(
                    line,
                    name,
                    "replayed-on-other-type",
                    f"line {line} changes `{spelled}`, a `{type(obj).__name__}`, "
                    "by a method call that gpucell would make on the kernel after "
                    "the engines ran (in iteration order), which it does only for "
                    "sets, dicts, lists and deques: another object's method may "
                    f"do more than change `{spelled}`. Collect the arguments in a "
                    "list in the loop (`args.append(...)`) and make the calls on "
                    f"`{spelled}` after the loop, or run the cell without "
                    "%%gpu_parallel.",
                )
            )
            break
    return out


def inputs_shared_with_sinks(
    plan: LoopPlan, ns: Namespace, inputs: Namespace, values: list[Any]
) -> list[Diagnostic]:
    """An input that is, holds or shares memory with an object the loop changes
    (``y = out`` in an earlier cell): serially iterations see earlier ones'
    changes through it, on an engine it is a copy from before the loop."""
    from gpucell.core.aliasing import shared_with_sinks

    growing = [
        *plan.gathers,
        *plan.unions,
        *(k for k, _ in plan.keyed),
        *plan.keyed_gathers,
        *(r.name for r in plan.reductions),
    ]
    sinks = {n: ns[n] for n in (*growing, *plan.writes) if n in ns}
    found = shared_with_sinks(sinks, inputs, frozenset(plan.deep_writes))
    iterable = {n: ns[n] for n in growing if n in ns}
    found += [
        s._replace(input="the loop's iterable")
        for v in values
        for s in shared_with_sinks(iterable, {"": v})
    ]
    out, seen = [], set()
    for s in found:
        if s.input in seen:
            continue  # (one problem per input: the first object it shares)
        seen.add(s.input)
        named = s.input != "the loop's iterable"
        reader = f"`{s.input}`" if named else s.input
        copy_hint = (
            f"`{s.input} = copy.copy({s.input})`" if named else "`items = list(...)`"
        )
        out.append(
            problem(
                line_of(plan, s.sink),
                s.input,
                "input-shares-sink",
                f"{reader} {s.how} `{s.sink}`, which the loop changes (line "
                f"{line_of(plan, s.sink)}). Serially each iteration would see "
                f"through {reader} what the iterations before it changed; on an "
                "engine it is a copy from before the loop, so the results would "
                f"differ. Make a copy before the loop ({copy_hint}), or run the "
                "cell without %%gpu_parallel.",
            )
        )
    return out


def duplicate_labels(plan: LoopPlan, ns: Namespace) -> list[Diagnostic]:
    """Rows written by label (``df.at[idx, "c"] = ...`` in ``df.iterrows()``) are
    each iteration's own only when no two rows share a label."""
    out = []
    for name in plan.writes:
        value = ns.get(name)
        # rows by the index; a DataFrame's columns too (`for col, s in
        # df.items(): df[col] = ...`)
        for axis, what, fix in (
            ("index", "rows", f"`{name} = {name}.reset_index(drop=True)`"),
            ("columns", "columns", f"`{name}.columns = [...]`"),
        ):
            labels = getattr(value, axis, None)
            if labels is not None and getattr(labels, "is_unique", True) is False:
                out.append(
                    problem(
                        line_of(plan, name),
                        name,
                        "duplicate-labels",
                        f"`{name}` is written by label and its {axis} has "
                        "duplicate labels, so two iterations may write the same "
                        f"{what} (and serially a later one could read what an "
                        f"earlier one wrote). Make the labels unique ({fix}), or "
                        "run the cell without %%gpu_parallel.",
                    )
                )
                break
    return out


def rows_that_are_not_own(plan: LoopPlan, ns: Namespace) -> list[Diagnostic]:
    """Own-row writes (``C[i][j] += ...``) are serial-equivalent only when no two
    rows are one object (``[[0] * m] * n`` makes n names for one list: serially
    a write to one row shows in all) and, for whole-element writes, when the
    elements are values (a list element changed by ``+=`` keeps its identity
    serially, which a copy from an engine would not)."""
    out = []
    for row in plan.own_rows:
        target = ns.get(row.name)
        if target is None:
            continue
        where = f"`{row.name}` (line {row.line})"
        if row.mode == "row":
            why = _shared_row(row.name, where, target)
        else:
            why = _element_not_value(row.name, where, target)
        if why is not None:
            out.append(
                problem(
                    row.line,
                    row.name,
                    "row-not-own",
                    f"{why}. Or run the cell without %%gpu_parallel.",
                )
            )
    return out


def _shared_row(name: str, where: str, target: Any) -> str | None:
    """Why rows of ``target`` are not each iteration's own, or ``None``."""
    from gpucell.core.aliasing import first_shared_element
    from gpucell.protocol.fold import is_numpy, is_torch

    array = is_numpy(target) or is_torch(target)
    if not isinstance(target, (list, dict)) and not array:
        return (
            f"{where} is a {type(target).__name__}; gpucell writes the rows of "
            "lists, dicts, numpy arrays and tensors"
        )
    if array and (target.ndim == 0 or _first_stride(target) == 0):
        return f"{where} repeats one row in memory (a broadcast view)"
    pair = first_shared_element(target)
    if pair is None:
        return None
    a, b = pair
    return (
        f"`{name}[{a!r}]` and `{name}[{b!r}]` are the same object (as "
        "`[[0] * m] * n` makes them), so serially a write to one row shows in the "
        "other. Build the rows separately (`[[0] * m for _ in range(n)]`)"
    )


def _element_not_value(name: str, where: str, target: Any) -> str | None:
    """Why whole elements of ``target`` cannot be written back, or ``None``."""
    from gpucell.core.aliasing import first_mutable_element
    from gpucell.protocol.fold import is_numpy, is_torch

    if is_numpy(target) or is_torch(target):
        # serially `y[i] = v` stores v cast to the array's dtype and a later
        # `y[i]` reads the cast value back; an engine's private element is
        # a plain value, so an int or float32 array would read back more
        # than it stored: numbers that differ without a word
        return (
            f"{where} is a {type(target).__name__} whose elements the loop "
            "assigns whole and reads back; the array would cast each value to its "
            "dtype, an engine's private copy would not. Accumulate in a local and "
            f"store it once (`acc = 0.0`, ..., `{name}[i] = acc`)"
        )
    if isinstance(target, (list, dict)):
        key = first_mutable_element(target)
        if key is not None:
            return (
                f"{where} holds a {type(target[key]).__name__} at "
                f"`{name}[{key!r}]`, and the loop assigns whole elements and reads "
                "them back; serially such an element keeps its identity, which a "
                "copy from an engine would not"
            )
    return None


def _first_stride(array: Any) -> int:
    from gpucell.protocol.fold import is_torch

    return int(array.stride(0) if is_torch(array) else array.strides[0])
