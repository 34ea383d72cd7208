"""What the classification of a loop body found (classify.classify_body),
name by name: re-exported by sinks.py, the sink kinds' home."""

from __future__ import annotations

from dataclasses import dataclass, field

from gpucell.core.analysis.bests import RunningBest
from gpucell.core.analysis.ownrows import OwnRow

__all__ = ["Classification"]


@dataclass
class Classification:
    """Result of classifying a loop body. Line numbers are the cell's."""

    inputs: dict[str, int] = field(default_factory=dict)
    locals: dict[str, int] = field(default_factory=dict)
    gathers: dict[str, int] = field(default_factory=dict)
    writes: dict[str, int] = field(default_factory=dict)
    reductions: dict[str, tuple[str, bool, int]] = field(default_factory=dict)
    keyed: dict[str, tuple[str, int]] = field(default_factory=dict)
    unions: dict[str, int] = field(default_factory=dict)
    deleted_locals: set[str] = field(default_factory=set)
    keyed_gathers: dict[str, int] = field(default_factory=dict)
    # writes whose iteration reads its own row back (see ownrows.py)
    own_rows: dict[str, OwnRow] = field(default_factory=dict)
    prints: list[int] = field(default_factory=list)
    # inputs a call could change in place (receivers, arguments, callees), with
    # the lines: the engines check them before and after each chunk
    watch: dict[str, list[int]] = field(default_factory=dict)
    # lines where an item of the loop's data is a receiver or an argument
    watch_items: list[int] = field(default_factory=list)
    # an alias of outer data is a receiver or argument: check every input
    watch_all: bool = False
    # (line, call) drawing from a global random generator
    random_calls: list[tuple[int, str]] = field(default_factory=list)
    # (line, iterable) of nested loops taken to run at least once because
    # their iterable, made of inputs, is checked non-empty before the run
    nonempty: list[tuple[int, str]] = field(default_factory=list)
    # own elements and own rows whose keys may name one element twice:
    # sink -> (the loop's key, "range" or "any"); `y[-3]` and `y[0]` are one
    # element of a 3-item list, `a[True]` and `a[(0, 1)]` overlap `a[0]`: the
    # engine program checks each key of a sink that is not a dict
    key_checks: dict[str, tuple[str, str]] = field(default_factory=dict)
    # running bests kept with their payloads (selections.running_bests)
    bests: dict[str, RunningBest] = field(default_factory=dict)
