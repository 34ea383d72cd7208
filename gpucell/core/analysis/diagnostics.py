"""Diagnostics: every problem the analysis finds, collected and raised once.

Modelled on pyflakes' ``Message`` classes: a problem is data (line, column, name,
kind, text), so the dry-run report, the error message and tests all read the same
record instead of parsing strings.  The analysis's refusals are instances of a
class per kind (``refusals.py``), which also carry their template's arguments.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field

from gpucell.errors import NotParallelizable

__all__ = [
    "Diagnostic",
    "DiagnosticSink",
    "FIRST_KINDS",
    "format_diagnostics",
    "in_order",
    "raise_if_any",
]


@dataclass(frozen=True, eq=False)
class Diagnostic:
    """One problem (or warning) found in a cell.

    Attributes
    ----------
    line : int
        1-based line in the cell as the user sees it.
    col : int
        0-based column, as in ``ast`` and pyflakes.
    name : str
        The variable (or statement keyword) the problem is about.
    kind : str
        A short machine-readable tag, e.g. ``"loop-carried"`` or ``"break"``.
    text : str
        What would go wrong and how to rewrite the loop.
    args : tuple of (str, str)
        A refusal class's template arguments (``refusals.py``); not compared.
    """

    line: int
    col: int
    name: str
    kind: str
    text: str
    args: tuple[tuple[str, str], ...] = field(default=(), repr=False)

    def __str__(self) -> str:
        return f"line {self.line}: {self.text}"

    # compared and ordered as the record (line, col, name, kind, text), whatever
    # its class: a refusal class's instance equals the record it makes
    def _key(self) -> tuple[int, int, str, str, str]:
        return (self.line, self.col, self.name, self.kind, self.text)

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, Diagnostic):
            return NotImplemented
        return self._key() == other._key()

    def __hash__(self) -> int:
        return hash(self._key())

    def __lt__(self, other: Diagnostic) -> bool:
        return self._key() < other._key()

    def __le__(self, other: Diagnostic) -> bool:
        return self._key() <= other._key()

    def __gt__(self, other: Diagnostic) -> bool:
        return self._key() > other._key()

    def __ge__(self, other: Diagnostic) -> bool:
        return self._key() >= other._key()


#: kinds named before the others: the change that matters most (a `fit` on an
#: estimator from before the loop), whatever its line
FIRST_KINDS = ("input-refit",)


def in_order(items: Iterable[Diagnostic]) -> tuple[Diagnostic, ...]:
    """Diagnostics as the user reads them: :data:`FIRST_KINDS` first, then in
    cell order, so messages read top to bottom."""
    return tuple(sorted(items, key=lambda d: (d.kind not in FIRST_KINDS, d)))


class DiagnosticSink:
    """Collects diagnostics, dropping exact duplicates.

    Flow analysis walks some statements more than once (loop fixpoints, ``finally``
    blocks); de-duplicating here keeps each walk simple.
    """

    def __init__(self) -> None:
        self._seen: set[tuple[int, int, str, str]] = set()
        self._texts: set[tuple[int, str, str, str]] = set()
        self._items: list[Diagnostic] = []

    def add(self, line: int, col: int, name: str, kind: str, text: str) -> None:
        """Record a problem given as words (the kernel's run-time checks; the
        analysis reports instances of its refusal classes)."""
        self.report(Diagnostic(line, col, name, kind, text))

    def report(self, d: Diagnostic) -> None:
        """Record a problem unless the same one was recorded already: at the
        same place, or with the same words on the same line (``d[k] + d[k]``
        would otherwise repeat one sentence per read)."""
        key = (d.line, d.col, d.name, d.kind)
        said = (d.line, d.name, d.kind, d.text)
        if key in self._seen or said in self._texts:
            return
        self._seen.add(key)
        self._texts.add(said)
        self._items.append(d)

    def extend(self, items: Iterable[Diagnostic]) -> None:
        """Record several diagnostics."""
        for d in items:
            self.report(d)

    def sorted(self) -> tuple[Diagnostic, ...]:
        """All diagnostics in reading order (:func:`in_order`)."""
        return in_order(self._items)

    def __bool__(self) -> bool:
        return bool(self._items)


def format_diagnostics(diagnostics: Iterable[Diagnostic]) -> str:
    """The user-facing error message for a list of refusals."""
    items = in_order(diagnostics)
    n = len(items)
    head = (
        "%%gpu_parallel cannot run this loop in parallel and keep the result "
        f"identical to running it serially ({n} problem{'s' if n != 1 else ''}):"
    )
    lines = [head]
    for d in items:
        lines.append(f"  - line {d.line}: {d.text}")
    lines.append(
        "Nothing was run. Fix the lines above, or run the cell without %%gpu_parallel."
    )
    return "\n".join(lines)


def raise_if_any(diagnostics: Iterable[Diagnostic]) -> None:
    """Raise one :class:`NotParallelizable` carrying every diagnostic.

    Raising once with all problems lets the user fix the whole cell in one edit,
    instead of discovering the problems one run at a time.
    """
    items = in_order(diagnostics)
    if not items:
        return
    err = NotParallelizable(format_diagnostics(items))
    err.diagnostics = items  # type: ignore[attr-defined]
    raise err
