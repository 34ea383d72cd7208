"""Finished work kept for ``%%gpu_parallel --resume``.

A cell interrupted, timed out, left without engines, or failed in an iteration
has chunks that finished.  They are kept, keyed by what makes them valid: the
cell's text, the content of every input, the loop's items and the seed.  A
resumed run hands out only the missing iterations (``Schedule(kept=...)``) and
merges kept and new chunk results together, in iteration order, as one run:
the merge cannot tell them apart, so the result is the serial one.  A key that
differs refuses the resume and names what differs.

Pure: digests in, decisions out (computing the digests is the kernel's job).
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

from gpucell.core.schedule import missing_ranges

__all__ = ["CellKey", "Kept", "describe_ranges", "missing_ranges"]


@dataclass(frozen=True)
class CellKey:
    """What a chunk result depends on, as digests (``None``: no digest could be
    made, so it can never be shown unchanged)."""

    cell: str
    inputs: tuple[tuple[str, str | None], ...]
    items: str | None
    count: int
    seed: int | None = None

    def differences(self, earlier: CellKey) -> list[str]:
        """What changed since ``earlier``, in words (empty: nothing did)."""
        out: list[str] = []
        if self.cell != earlier.cell:
            out.append("the cell's code changed")
        if self.count != earlier.count:
            out.append(f"the loop now has {self.count} iterations, not {earlier.count}")
        elif self.items is None or self.items != earlier.items:
            out.append(
                "the loop's items changed"
                if self.items is not None
                else "the loop's items cannot be compared (no content digest)"
            )
        if self.seed != earlier.seed:
            out.append(f"--seed is {self.seed}, it was {earlier.seed}")
        mine, theirs = dict(self.inputs), dict(earlier.inputs)
        for name in sorted(mine.keys() | theirs.keys()):
            if name not in theirs:
                out.append(f"the loop now reads `{name}`")
            elif name not in mine:
                out.append(f"the loop no longer reads `{name}`")
            elif mine[name] is None:
                out.append(f"`{name}` cannot be compared (no content digest)")
            elif mine[name] != theirs[name]:
                out.append(f"`{name}` changed")
        return out

    def as_json(self) -> dict[str, Any]:
        return {
            "cell": self.cell,
            "inputs": [list(p) for p in self.inputs],
            "items": self.items,
            "count": self.count,
            "seed": self.seed,
        }

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> CellKey:
        return cls(
            cell=str(data["cell"]),
            inputs=tuple((str(n), d) for n, d in data["inputs"]),
            items=data["items"],
            count=int(data["count"]),
            seed=data.get("seed"),
        )


@dataclass
class Kept:
    """Chunk results of one cell's unfinished runs: ``done[start] = (stop, result)``."""

    key: CellKey | None  # None until it is needed (computing it costs a pass)
    done: dict[int, tuple[int, Any]] = field(default_factory=dict)
    reason: str = ""

    def add(self, start: int, stop: int, result: Any) -> None:
        self.done[start] = (stop, result)

    def ranges(self) -> list[tuple[int, int]]:
        return sorted((a, b) for a, (b, _r) in self.done.items())

    @property
    def iterations(self) -> int:
        return sum(b - a for a, b in self.ranges())

    def missing(self, count: int) -> list[tuple[int, int]]:
        return missing_ranges(count, self.ranges())

    def results(self) -> list[tuple[int, Any]]:
        """``(start, result)`` in iteration order."""
        return sorted(((a, r) for a, (_b, r) in self.done.items()), key=_first)

    def merge_with(self, new: Iterable[tuple[int, Any]]) -> list[Any]:
        """Kept and new chunk results together, in iteration order."""
        both = [*self.results(), *new]
        return [r for _a, r in sorted(both, key=_first)]


def _first(pair: tuple[int, Any]) -> int:
    return pair[0]


def describe_ranges(ranges: Iterable[tuple[int, int]]) -> str:
    """``0-9, 20-24`` for ``[(0, 10), (20, 25)]``."""
    return ", ".join(f"{a}-{b - 1}" if b - a > 1 else f"{a}" for a, b in ranges)
