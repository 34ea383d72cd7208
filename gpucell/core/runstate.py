"""Snapshots of a running ``%%gpu_parallel`` cell, for the progress display.

Pure data built by the dispatcher from its schedule (at 2-4 Hz and once at the
end); the widget and the text display only read them.  Nothing here talks to
engines or front ends.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from gpucell.core.states import (
    BUSY,
    DEAD,
    IDLE,
    RESTARTING,
    RETRYING,
    EngineState,
    RunStatus,
)

__all__ = [
    "BUSY",
    "DEAD",
    "IDLE",
    "RESTARTING",
    "RETRYING",
    "EngineProgress",
    "RunSnapshot",
]


@dataclass(frozen=True)
class EngineProgress:
    """One engine's row: who it is and how far it got."""

    engine: int
    host: str
    device: str  # "GPU 0" or "CPU"
    name: str  # device model
    pid: int = 0
    kind: str = "cpu"  # "gpu" or "cpu"
    index: int = -1  # GPU index on its host
    done: int = 0  # iterations finished
    busy_seconds: float = 0.0  # engine compute time of finished chunks
    state: EngineState = IDLE
    # the first engine of its device in this run (-1: the engine itself): an
    # engine restarted after dying is the same device's row, not a new one
    slot: int = -1

    @property
    def rate(self) -> float:
        """Iterations per second of compute (0 before the first chunk ends)."""
        return self.done / self.busy_seconds if self.busy_seconds > 0 else 0.0


@dataclass(frozen=True)
class RunSnapshot:
    """The whole run at one moment."""

    total: int
    done: int
    elapsed: float
    engines: tuple[EngineProgress, ...] = field(default=())
    status: RunStatus = "running"

    @property
    def fraction(self) -> float:
        return self.done / self.total if self.total else 1.0

    @property
    def eta(self) -> float | None:
        """Seconds left at the current pace (None before any progress)."""
        if self.status != "running":
            return 0.0
        if self.done == 0 or self.elapsed <= 0:
            return None
        return self.elapsed * (self.total - self.done) / self.done
