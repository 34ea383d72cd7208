"""A running best kept with what goes with it (selections.running_bests
finds it; the merge picks the chunk whose final best the test takes)."""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["RunningBest"]


@dataclass(frozen=True)
class RunningBest:
    """``if score < best: best = score; best_epoch = epoch``: a running
    minimum or maximum kept with what goes with it (its payloads), run as
    written on each chunk (which starts from the kernel's ``best``) and merged
    by replaying the test over the chunks' final values in chunk order: for
    values that are totally ordered that is the serial fold, ties included
    (``<`` keeps the first of equal scores, ``<=`` the last).

    ``op`` is the test's operator as written, ``best_left`` whether ``best``
    is its left side (``best > score``), ``none_first`` whether the test is
    ``best is None or ...`` (the first score is taken)."""

    name: str
    payloads: tuple[str, ...]
    op: str
    best_left: bool
    none_first: bool
    line: int

    @property
    def names(self) -> tuple[str, ...]:
        return (self.name, *self.payloads)

    @property
    def strict(self) -> bool:
        return self.op in ("<", ">")

    @property
    def kind(self) -> str:
        """``"min"`` or ``"max"``: which way the test takes a new score."""
        smaller = self.op in ("<", "<=")
        return "min" if smaller != self.best_left else "max"

    def describe(self) -> str:
        ties = "first" if self.strict else "last"
        with_ = f" with {', '.join(self.payloads)}" if self.payloads else ""
        return (
            f"running {'minimum' if self.kind == 'min' else 'maximum'}{with_} "
            f"(the {ties} of equal scores)"
        )
