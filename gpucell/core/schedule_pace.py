"""The schedule's pace model: what engines' measured speeds say (a chunk's
floor, each engine's share, whether the loop looks uniform to the trials)."""

from __future__ import annotations

import math

from gpucell.core.schedule_fields import (
    PROGRESS_STEPS,
    Chunk,
    ScheduleFields,
)

__all__ = ["PaceModel"]


class PaceModel(ScheduleFields):
    """Paces measured per engine, and what follows from them."""

    def pace(self, engine: int) -> float | None:
        """Measured seconds per iteration on ``engine`` (``None``: not yet)."""
        st = self._stats.get(engine)
        return None if st is None else st.per_iteration

    def slowest_pace(self) -> float | None:
        """The slowest seconds per iteration of any finished chunk (``None``:
        none finished yet)."""
        return self._max_pace or None

    def calibrating(self, engine: int) -> bool:
        """``engine``'s pace is not measured yet (its next chunk calibrates)."""
        return self._pace(engine) is None

    def _trial_for(self, engine: int) -> bool:
        return self.trial and self.calibrating(engine)

    def _pace(self, engine: int) -> float | None:
        """Engine's measured seconds per unit of work (an iteration, or a profile
        second when profiled); ``None`` until measured."""
        st = self._stats[engine]
        return st.per_cost if self.profiled else st.per_iteration

    def _paced_count(self) -> int:
        """Stamped trial paces known: of done trials, and published by
        running ones."""
        return self._paced + len(self._provisional)

    def _factor(self) -> float:
        """Guided's divisor: ``factor``, or 1 (classic guided self-scheduling:
        fewer, larger chunks) once trials spread over the whole range all
        measured the same pace (within 25%): the loop looks uniform."""
        k = max(1, len(self._alive))
        if not self.trial or self._paced_count() < min(k, 3):
            return self.factor
        paces = self._provisional.values()
        hi, lo = max([self._max_pace, *paces]), min([self._min_pace, *paces])
        return 1.0 if hi <= 1.25 * lo else self.factor

    def _mean_pace(self) -> float | None:
        its = sum(st.iterations for st in self._stats.values())
        secs = sum(st.seconds for st in self._stats.values())
        return secs / its if its and secs > 0 else None

    def _speed_share(self, engine: int) -> float:
        """Engine's speed relative to the mean of the live engines (1.0 unknown,
        or equal devices)."""
        if not self.heterogeneous:
            return 1.0
        rates: dict[int, float] = {e: r for e in self._alive if (r := self._pace(e))}
        mine = rates.get(engine)
        if not mine or len(rates) < 2:
            return 1.0
        speeds = {e: 1.0 / r for e, r in rates.items()}
        share = speeds[engine] / (sum(speeds.values()) / len(speeds))
        # Engines measured on different iterations also differ by the iterations'
        # own costs; only a clear gap (a GPU beside a CPU engine) is taken as speed.
        if 1 / 1.5 < share < 1.5:
            return 1.0
        return min(4.0, max(0.25, share))

    def _will_run(self, c: Chunk) -> int:
        """Iterations a running chunk is expected to run: all of them, or for a
        trial chunk those that fit its time budget at the pace measured so far
        (the slowest seen: the first iteration also pays warm-up)."""
        if not c.trial:
            return c.size
        pace = self._max_pace
        if pace <= 0:
            return c.size  # not measured yet, or cheap so far
        fit = self.trial_seconds / pace  # (inf for a pace that underflows)
        return max(1, c.size if fit >= c.size else math.ceil(fit))

    def _trial_rests(self) -> int:
        """Iterations of trial chunks still running that they will likely not
        reach (they come back to be handed out again)."""
        return sum(c.size - self._will_run(c) for c in self._trials.values())

    def _span(self, pace: float) -> float:
        """Longest a chunk should run: ``chunk_seconds``, or for a long loop a
        ``1 / PROGRESS_STEPS`` share of an engine's whole part (so an hour's
        cell is not cut into thousands of messages)."""
        k = max(1, len(self._alive))
        whole = self.n * (self._mean_pace() or pace) / k
        return max(self.chunk_seconds, whole / PROGRESS_STEPS)

    def min_chunk(self, engine: int | None = None) -> int:
        """Smallest chunk that keeps dispatch overhead under the target.

        Per engine when it has been measured (a slow engine's chunks can be
        smaller), else from the mean over every engine.
        """
        if self.mode == "dynamic" and self.chunksize:
            return self.chunksize
        floor = self.chunksize or 1
        st = self._stats.get(engine) if engine is not None else None
        if st is not None and st.per_iteration:
            t = st.per_iteration
        else:
            its = sum(s.iterations for s in self._stats.values())
            secs = sum(s.seconds for s in self._stats.values())
            if its == 0 or secs <= 0:
                return floor
            t = secs / its
        if not self.heterogeneous:
            # Equal devices: a chunk that ran slower ran costlier iterations, and
            # the loop may have more of them (costs rising along the range).  The
            # floor comes from the costliest pace seen, or a cheap calibration
            # chunk at the start of such a loop would make every later chunk huge.
            t = max(t, self._max_pace)
        # rounded down: with the next chunk already queued the engine does not
        # wait for a round trip, so a tail of single iterations costs little
        # (a pace that underflowed to 0: iterations too cheap to measure)
        most = (
            self.n if t <= 0 else min(self.n, self.overhead / self.target_overhead / t)
        )
        return max(floor, int(most))

    @property
    def looks_uniform(self) -> bool:
        """Trials spread over the range agree and the devices are equal: trial
        chunks still running may as well run whole (their rest would go back
        to the same engine)."""
        return self.trial and not self.heterogeneous and self._factor() == 1.0

    @property
    def verdict(self) -> bool | None:
        """What running trials are told: ``True`` the loop looks uniform (run
        whole), ``False`` enough trials measured it and it does not, or the
        devices differ (stop at the budget, the rest is shared out by cost),
        ``None`` not known yet."""
        if not self.trial:
            return None
        if self.looks_uniform:
            return True
        if self.heterogeneous or self._paced_count() >= min(len(self._alive), 3):
            return False
        return None
