"""What a cell's last run says about its next: one cost model, in one place.

After a run the kernel remembers, per cell text and set of engines, what the loop
cost (:class:`Measured`).  Before the next run of the same cell on the same
engines, :meth:`CostMemory.advise` turns that memory into the decisions a run
needs (:class:`Advice`):

* **inline**: the whole loop measured less work than sending it costs, so it
  runs in the kernel (OpenMP's ``if`` clause), but only while the values it
  reads have the shapes they had when it was measured, and only for the plainest
  runs (no CUDA, no explicit engines, schedule, chunk size, seed or timeout);
* **static**: every chunk ran at the same pace, so the schedule splits it once
  per engine (no tail to balance);
* **profile**: an uneven loop worth balancing keeps each iteration's seconds, so
  the next schedule cuts chunks by cost, costliest first.

Pure: no I/O, no clocks.  The memory is bounded (least recently used cells go).
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Hashable
from dataclasses import dataclass
from typing import Any, Protocol

__all__ = ["Advice", "CostMemory", "Measured", "RunLike", "shape_of"]

#: cells remembered per cluster (each entry holds at most one profile of
#: PROFILE_MAX floats, so the memory stays bounded whatever the notebook does)
DEFAULT_CELLS = 256
#: a loop with less work than this (seconds) is not worth a per-iteration
#: profile: it is split statically next time
PROFILE_WORTH = 0.05


def shape_of(value: Any, depth: int = 2) -> Any:
    """A cheap summary of a value's size: what a loop's cost scales with.

    Arrays and tensors by shape and dtype, sequences by length and their first
    and last items, strings by length.  A measured cost holds only while the
    values a cell reads keep the shape they had when it was measured.
    """
    t = type(value)
    if isinstance(value, type):  # a class: its `shape` is not a size
        return t.__name__
    try:
        shape = getattr(value, "shape", None)
        if shape is not None:  # arrays, tensors, data frames
            return (t.__name__, tuple(shape), str(getattr(value, "dtype", "")))
    except Exception:  # a shape that is not one, or raises: no size known
        pass
    if t in (str, bytes, bytearray):
        return (t.__name__, len(value))
    if t in (list, tuple) or t.__name__ in ("range", "deque"):
        n = len(value)
        if depth == 0 or n == 0:
            return (t.__name__, n)
        return (t.__name__, n, shape_of(value[0], depth - 1), shape_of(value[-1], 0))
    if t is dict:
        return ("dict", len(value))
    return t.__name__


@dataclass(frozen=True)
class Measured:
    """A finished run of a cell, as the next run needs it."""

    per_iteration: float  # seconds of work per iteration (one-time costs removed)
    uniform: bool  # every chunk ran at about the same pace
    profile: tuple[float, ...] | None  # seconds of each iteration, when worth it
    shapes: Hashable  # shape_of the values it read


@dataclass(frozen=True)
class Advice:
    """How to run a cell, from its last measured run (all empty the first time)."""

    inline: bool = False
    per_iteration: float | None = None  # the schedule's cost hint
    uniform: bool = False
    profile: tuple[float, ...] | None = None


class RunLike(Protocol):
    """What :meth:`CostMemory.learn` reads of a finished run (a ``LastRun``)."""

    @property
    def work_estimate(self) -> float: ...

    @property
    def uniform(self) -> bool: ...

    def profile(self) -> tuple[float, ...] | None: ...

    def done_chunks(self) -> int: ...


class CostMemory:
    """Per (cell, engines): the last measured cost, least recently used forgotten."""

    def __init__(self, cells: int = DEFAULT_CELLS) -> None:
        self.cells = cells
        self._memory: OrderedDict[Hashable, Measured] = OrderedDict()

    def __len__(self) -> int:
        return len(self._memory)

    def clear(self) -> None:
        self._memory.clear()

    def get(self, key: Hashable) -> Measured | None:
        m = self._memory.get(key)
        if m is not None:
            self._memory.move_to_end(key)
        return m

    def advise(
        self,
        key: Hashable,
        *,
        iterations: int,
        shapes: Hashable,
        plain: bool,
        inline_below: float,
    ) -> Advice:
        """The decisions for this run of ``key``'s cell.

        ``plain``: nothing asks for the engines (no CUDA, explicit engines,
        schedule, chunk size, seed or timeout); ``inline_below``: seconds of
        whole-loop work under which the kernel is the quicker place (0: never).
        """
        m = self.get(key)
        if m is None:
            return Advice()
        inline = (
            plain
            and inline_below > 0
            and iterations > 0
            and m.shapes == shapes
            and m.per_iteration * iterations < inline_below
        )
        return Advice(inline, m.per_iteration, m.uniform, m.profile)

    def learn(
        self,
        key: Hashable,
        run: RunLike,
        *,
        iterations: int,
        shapes: Hashable,
        previous: Advice,
    ) -> Measured:
        """Remember a successful run of ``key``'s cell over ``iterations``."""
        work = run.work_estimate
        # a statically split run has too few chunks to judge uniformity: it
        # keeps the verdict that made it static
        same = run.uniform if run.done_chunks() >= 4 else previous.uniform
        # a per-iteration profile only steers a loop worth balancing: a cheap or
        # uniform one is split statically next time (and computing it costs
        # ~0.2 us per iteration, in the kernel, after every cell)
        worth = work > PROFILE_WORTH and not same
        m = Measured(
            work / iterations if iterations else 0.0,
            same,
            run.profile() if worth else None,
            shapes,
        )
        self._memory[key] = m
        self._memory.move_to_end(key)
        while len(self._memory) > self.cells:
            self._memory.popitem(last=False)
        return m
