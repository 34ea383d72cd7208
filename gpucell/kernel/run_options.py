"""The knobs of one ``%%gpu_parallel`` run, as the dispatcher takes them."""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["Options"]


@dataclass(frozen=True)
class Options:
    """The knobs of one run (from the magic line and the GpuCell settings)."""

    schedule: str = "guided"
    chunksize: int | None = None
    seed: int | None = None
    timeout: float | None = None
    retries: int = 2
    interrupt_grace: float = 2.0
    cost_hint: float | None = None  # seconds per iteration, from an earlier run
    uniform: bool = False  # that run's iterations all took the same time
    profile: tuple[float, ...] | None = None  # that run's seconds per iteration
    # --seed: the generators the loop can draw from (core/seeding); None: all
    reseed: tuple[str, ...] | None = None
