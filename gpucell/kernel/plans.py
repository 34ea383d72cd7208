"""The plans of the cells run lately, each with the code compiled from it.

A plan depends only on the cell's text and on which of its names exist, so a
re-run of a cell analyses and compiles nothing.
"""

from __future__ import annotations

import re
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from gpucell.core.analysis import LoopPlan

__all__ = ["PlanCache", "Prepared", "identifiers"]


@dataclass
class Prepared:
    """A cell's plan and the code compiled from it, kept together so a re-run
    compiles nothing and dropping the plan drops its code."""

    plan: LoopPlan
    codes: dict[str, Any] = field(default_factory=dict)

    def code(self, what: str, make: Callable[[], Any]) -> Any:
        if what not in self.codes:
            self.codes[what] = make()
        return self.codes[what]


class PlanCache:
    """Plans of the cells run lately (least recently used dropped)."""

    def __init__(self, size: int = 64) -> None:
        self.size = size
        self._entries: OrderedDict[Any, Prepared] = OrderedDict()

    def __len__(self) -> int:
        return len(self._entries)

    def plans(self) -> list[LoopPlan]:
        """The plans held, least recently used first."""
        return [p.plan for p in self._entries.values()]

    def get(
        self,
        src: str,
        filename: str,
        ns: dict[str, Any],
        *,
        for_cpu: bool,
        dry_run: bool,
        exclude: frozenset[str] = frozenset(),
    ) -> Prepared:
        from gpucell.core.analysis import analyse

        known = frozenset(identifiers(src) & ns.keys()) - exclude
        key = (src, filename, for_cpu, not dry_run, known)
        prep = self._entries.get(key)
        if prep is None:
            plan = analyse(
                src,
                filename=filename,
                known_names=known,
                for_cpu=for_cpu,
                raise_errors=not dry_run,
            )
            prep = self._entries[key] = Prepared(plan)
            while len(self._entries) > self.size:
                self._entries.popitem(last=False)
        self._entries.move_to_end(key)
        return prep


def identifiers(src: str) -> set[str]:
    """Every identifier-like token of the cell (a superset of its names)."""
    return set(re.findall(r"[A-Za-z_][A-Za-z0-9_]*", src))
