"""Nested loops over inputs taken to run: checked in the kernel before the run.

``for xb, yb in loader:`` then ``loss.item()`` is how every training loop is
written; read after the nested loop, ``loss`` is the iteration's own only if
the nested loop ran.  Its iterable is made of inputs (``loader``,
``range(epochs)``), the same object in every iteration, so the analysis takes
it to run (``LoopPlan.nonempty``) and the kernel checks here, once, after the
prelude, that it yields an item.  If it does not, the loop is refused with
what it would have been refused for without the assumption.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from gpucell.core.analysis.diagnostics import format_diagnostics
from gpucell.errors import NotParallelizable

__all__ = ["check"]


def _empty_because(text: str, ns: Mapping[str, Any]) -> str | None:
    """Why iterating the expression ``text`` may yield nothing (``None``: it
    surely yields an item)."""
    try:
        value = eval(compile(text, "<gpucell: nested loop>", "eval"), dict(ns))
    except Exception as e:  # noqa: BLE001 - said in the refusal
        return f"could not be evaluated before the loop ({type(e).__name__}: {e})"
    if hasattr(type(value), "__next__"):
        return (
            "is an iterator: the first iteration would use it up and the later "
            "ones would find it empty (make it a list, or build it in the loop)"
        )
    try:
        n = len(value)
    except Exception:  # noqa: BLE001
        return f"is a {type(value).__name__} without a length"
    return "is empty" if n == 0 else None


def check(plan: Any, ns: Mapping[str, Any]) -> None:
    """Raise ``NotParallelizable`` if a nested loop the plan takes to run may
    not (its iterable is empty, an iterator, or has no length)."""
    why = [
        f"  - line {line}: `{text}` {reason}"
        for line, text in plan.nonempty
        if (reason := _empty_because(text, ns)) is not None
    ]
    if not why:
        return
    message = format_diagnostics(plan.unless_nonempty).replace(
        "Nothing was run.",
        "The lines before the loop ran, as serially; nothing of the loop ran.",
    )
    raise NotParallelizable(
        message + "\ngpucell accepts these reads when the nested loops surely run, and "
        "here they may not:\n" + "\n".join(why)
    )
