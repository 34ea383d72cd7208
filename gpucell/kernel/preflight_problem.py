"""How a pre-flight check states a problem: a
:class:`~gpucell.core.analysis.Diagnostic` at the line where the cell names
what it is about, so every check (``kernel/preflight*.py``,
``kernel/keyed_stores.py``) points at the same place the static analysis
would."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from gpucell.core.analysis.diagnostics import Diagnostic

if TYPE_CHECKING:
    from gpucell.core.analysis import LoopPlan

__all__ = ["Namespace", "line_of", "problem"]

#: the notebook's namespace (``user_ns``), as the checks read it
Namespace = dict[str, Any]


def line_of(plan: LoopPlan, name: str | None = None) -> int:
    """Where the cell names ``name`` (the loop's line when it does not)."""
    loop = plan.loop_lines[0] if plan.loop_lines is not None else 1
    lines = {info.name: info.line for info in plan.names}
    return lines.get(name, loop) if name is not None else loop


def problem(line: int, name: str, kind: str, text: str) -> Diagnostic:
    """A run-time refusal, as the static analysis states one (no column)."""
    return Diagnostic(line, 0, name, kind, text)
