"""What happened in the last ``%%gpu_parallel`` cell: ``gpucell.last_run``.

Plain data recorded by the dispatcher: per chunk (and so per iteration) the engine,
host, device, start and end times and attempt; per engine its busy time; the plan;
the errors and warnings.  ``table()`` gives one row per iteration (a pandas
DataFrame when pandas is installed).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from typing import Any

from gpucell.core.states import ChunkState, RunStatus
from gpucell.protocol.chunks import DETAIL_MAX

__all__ = ["ChunkRecord", "LastRun", "iteration_seconds"]


@dataclass(frozen=True)
class ChunkRecord:
    """One chunk as it ran (or was lost)."""

    start: int
    stop: int
    engine: int
    host: str
    device: str
    t_start: float  # wall clock (time.time) on the engine
    t_end: float
    compute: float  # seconds of engine compute
    attempt: int
    state: ChunkState  # done, lost, failed or cancelled
    iteration_starts: tuple[float, ...] = ()


#: Loops longer than this keep no per-iteration profile for their next run.
PROFILE_MAX = DETAIL_MAX


@dataclass
class LastRun:
    """Provenance of one ``%%gpu_parallel`` run."""

    iterations: int = 0
    engines: tuple[int, ...] = ()
    schedule: str = ""
    wall: float = 0.0
    plan: Any = None
    chunks: list[ChunkRecord] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)
    # process-wide random generators the engines' chunks drew from (no --seed)
    drew: set[str] = field(default_factory=set)
    status: RunStatus = "running"
    shared_bytes: int = 0  # bytes of inputs (per engine) and results via /dev/shm
    inline: bool = False  # run in the kernel: too little work to send (inline.py)
    # (start, stop) ranges kept from an unfinished earlier run (--resume): their
    # results were merged with this run's, their chunks ran before it
    resumed: tuple[tuple[int, int], ...] = ()
    detail: int = 0  # iteration stamps kept in ``chunks`` (at most DETAIL_MAX)
    # chunks sent again with the program: their engine had tidied the cell away
    # while idle (worker.after_cell) before they came
    reloads: int = 0
    # chunks that stopped early to hand their unrun rest to idle engines
    # (Schedule.stealing): the rest ran in chunks of its own
    hand_backs: int = 0

    def add_chunk(self, rec: ChunkRecord) -> None:
        """Record a chunk; its per-iteration stamps only while the run's total
        stays within :data:`DETAIL_MAX` (a loop of 10^8 iterations keeps
        per-chunk records only)."""
        n = len(rec.iteration_starts)
        if n and self.detail + n > DETAIL_MAX:
            rec = replace(rec, iteration_starts=())
            n = 0
        self.detail += n
        self.chunks.append(rec)

    def done_chunks(self) -> int:
        """Chunks that came back with a result."""
        return sum(1 for c in self.chunks if c.state == "done")

    @property
    def busy(self) -> dict[int, float]:
        """Seconds each engine spent computing (done chunks)."""
        out = dict.fromkeys(self.engines, 0.0)
        for c in self.chunks:
            if c.state == "done":
                out[c.engine] = out.get(c.engine, 0.0) + c.compute
        return out

    @property
    def uniform(self) -> bool:
        """True when every chunk ran at about the same pace (within 25%: a shared host
        is that noisy) on every engine.

        Such a loop is best split statically next time: one chunk per engine, no
        tail.  Needs at least 4 chunks to tell.
        """
        done = [c for c in self.chunks if c.state == "done" and c.stop > c.start]
        if len(done) < 4:
            return False
        paces = [c.compute / (c.stop - c.start) for c in done]
        mean = sum(paces) / len(paces)
        if mean <= 0:
            return False
        return max(abs(p - mean) for p in paces) <= 0.25 * mean

    @property
    def serial_estimate(self) -> float:
        """The loop's compute time summed over engines (a serial run's estimate)."""
        return sum(self.busy.values())

    @property
    def work_estimate(self) -> float:
        """The loop's work in seconds without one-time costs: each chunk's first
        iteration (which pays the engine's first imports and warm-ups) is
        replaced by the chunk's mean of the others.  What a re-run will cost."""
        total = 0.0
        for c in self.chunks:
            if c.state != "done":
                continue
            size, starts = c.stop - c.start, c.iteration_starts
            if size >= 2 and len(starts) == size:
                rest = max(0.0, c.t_end - starts[1])
                total += rest * size / (size - 1)
            else:
                total += c.compute
        return total

    def profile(self, limit: int = PROFILE_MAX) -> tuple[float, ...] | None:
        """Seconds of each iteration, for the schedule of the cell's next run.

        ``None`` unless every iteration ran and was stamped (and there are at
        most ``limit``).  Each engine's first chunk's first iteration also paid
        the engine's one-time costs (imports, warm-up): it counts no more than
        that chunk's median iteration.
        """
        done = sorted(
            (c for c in self.chunks if c.state == "done"), key=lambda c: c.start
        )
        if not done or self.iterations > limit:
            return None
        out: list[float] = []
        earliest: dict[int, ChunkRecord] = {}
        for c in done:
            if c.engine not in earliest or c.t_start < earliest[c.engine].t_start:
                earliest[c.engine] = c
        firsts = {c.start for c in earliest.values()}
        for c in done:
            starts = c.iteration_starts
            if len(starts) != c.stop - c.start or (out and len(out) != c.start):
                return None
            if not out and c.start != 0:
                return None
            durations = iteration_seconds(starts, c.t_end)
            if durations and min(durations) < 0:  # a clock step back
                durations = [max(0.0, d) for d in durations]
            if c.start in firsts and len(durations) >= 3:
                median = sorted(durations)[len(durations) // 2]
                durations[0] = min(durations[0], median)
            out.extend(durations)
        return tuple(out) if len(out) == self.iterations else None

    @property
    def speedup(self) -> float:
        return self.serial_estimate / self.wall if self.wall > 0 else 0.0

    def rows(self) -> list[dict[str, Any]]:
        """One row per iteration: where and when it ran, how often it was retried."""
        retries: dict[int, int] = {}
        for c in self.chunks:
            if c.state == "lost":
                for i in range(c.start, c.stop):
                    retries[i] = retries.get(i, 0) + 1
        out = []
        for c in sorted(self.chunks, key=lambda c: c.start):
            if c.state != "done":
                continue
            starts = list(c.iteration_starts)
            for k, i in enumerate(range(c.start, c.stop)):
                begin = starts[k] if k < len(starts) else c.t_start
                end = starts[k + 1] if k + 1 < len(starts) else c.t_end
                out.append(
                    {
                        "iteration": i,
                        "engine": c.engine,
                        "host": c.host,
                        "device": c.device,
                        "start": begin,
                        "end": end,
                        "retries": retries.get(i, 0),
                    }
                )
        return out

    def table(self) -> Any:
        """:meth:`rows` as a pandas DataFrame when pandas is installed, else rows."""
        rows = self.rows()
        try:
            import pandas
        except ImportError:
            return rows
        return pandas.DataFrame(rows)

    def timeline(self) -> Any:
        """A picture of this run (SVG in Jupyter, text in a terminal)."""
        from gpucell.core.timeline import timeline

        return timeline(self)

    def summary(self) -> str:
        """The one line printed after a cell."""
        if self.inline:
            return (
                f"gpucell: {self.iterations} iterations in the kernel in "
                f"{self.wall * 1e3:.1f} ms (its last run measured less work than "
                "sending it to the engines costs; `%config GpuCell.inline_below = 0` "
                "always sends)"
            )
        n = len(self.engines)
        s = (
            f"gpucell: {self.iterations} iterations on {n} engine"
            f"{'s' if n != 1 else ''} in {self.wall:.2f} s"
        )
        if self.resumed:
            kept = sum(b - a for a, b in self.resumed)
            s += f", {kept} of them kept from the unfinished run"
        if self.status == "ok" and self.wall > 0:
            extra = f"{len(self.chunks)} chunks, {self.schedule}"
            # what was measured, said as such: the engines' summed busy time is
            # not a serial run's time (engine-side printing, first imports and
            # warm-up inflate it), so no "speedup" is claimed from it
            if self.serial_estimate >= 0.25:
                extra = (
                    f"engines busy {self.serial_estimate:.2f} s in all, "
                    f"{self.speedup:.2f}x the wall time; " + extra
                )
            s += f" ({extra})"
        return s


def iteration_seconds(starts: Sequence[float], end: float) -> list[float]:
    """Each iteration's seconds: from its start stamp to the next one's, the
    last one's to the chunk's ``end`` (a clock step back shows as negative)."""
    return [b - a for a, b in zip(starts, [*starts[1:], end], strict=True)]
