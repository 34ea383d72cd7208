"""Keyed reductions into containers that cast what they store, checked before
the loop runs (a pre-flight check of kernel/preflight.py).

``D[k] += e`` is merged by folding each key's contributions and storing once;
a pandas Series (and any container but a dict, a list, a DataFrame's columns,
a numpy array or a torch tensor, whose merge checks what it stores) casts every
store to its dtype, so two iterations on one key would be cast once instead of
twice.  Keys that are the loop's own positions cannot repeat, so those run.
"""

from __future__ import annotations

from typing import Any

from gpucell.core.analysis.diagnostics import Diagnostic
from gpucell.core.analysis.plan import LoopPlan
from gpucell.kernel.preflight_problem import Namespace, line_of, problem

__all__ = ["of_other_types"]


def of_other_types(plan: LoopPlan, ns: Namespace) -> list[Diagnostic]:
    """``D[k] += e`` (also ``D[k] = D[k] + e``, ``D.get`` spellings) is merged by
    folding each key's contributions and storing once.  Exact for a dict, a list
    (they store what they are given) and a DataFrame's columns (a column is
    replaced whole); an array, tensor or Series casts every store to its dtype,
    so two iterations on one key would be cast once instead of twice
    (``y[0] += 0.5`` twice on an int array stays 1 serially).  Keys that are
    the loop's own positions cannot repeat, so those loops run."""
    out = []
    for name, _op in plan.keyed:
        if name not in ns or _stores_what_it_is_given(ns[name]):
            continue
        if name in plan.facts.position_keyed:
            continue  # each key once (the loop's own position): as serially
        kind = type(ns[name])
        line = line_of(plan, name)
        out.append(
            problem(
                line,
                name,
                "keyed-reduction-of-other-type",
                f"`{name}[...]` is combined across iterations (line {line}), and "
                f"`{name}` is a `{kind.__module__}.{kind.__qualname__}`, which casts "
                "each value stored into it to its dtype, and its keys may repeat: "
                "folding one key's contributions before storing them can differ "
                "from storing after each iteration. Gather per-key contributions "
                f"in a dict (`parts[k] = parts.get(k, 0) + e`) and add them into "
                f"`{name}` after the loop, or key it by the loop's own position "
                "(`for i in range(n): ...[i] += ...`).",
            )
        )
    return out


def _stores_what_it_is_given(target: Any) -> bool:
    """A dict or list (subclasses included), or a pandas DataFrame; a numpy
    array or torch tensor too, whose merge fails, nothing merged, where a
    key's folded value is of another kind than the dtype (core/merge_keyed.py)."""
    from gpucell.protocol.fold import is_numpy, is_torch

    if isinstance(target, (dict, list)) or is_numpy(target) or is_torch(target):
        return True
    kind = type(target)
    return kind.__name__ == "DataFrame" and kind.__module__.startswith("pandas")
