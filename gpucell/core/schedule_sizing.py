"""How big an engine's next chunk is, whether it wants one, and what a running
chunk hands back to idle engines."""

from __future__ import annotations

import math

from gpucell.core.schedule_cost import CostCutting
from gpucell.core.schedule_fields import (
    HAND_BACK_MIN_SECONDS,
    HAND_BACK_PIECE,
    HAND_BACK_ROUND_TRIPS,
)

__all__ = ["ChunkSizing"]


class ChunkSizing(CostCutting):
    """Chunk sizes by count (guided shares, speed shares, trial parts)."""

    def wants_work(self, engine: int) -> bool:
        """True when ``engine`` has fewer chunks outstanding than it should."""
        if engine not in self._alive or not self._has_unassigned(engine):
            return False
        trial = self._trial_for(engine)
        depth = self.depth if self._plenty_left() or (trial and not self.heard) else 1
        if trial and self.heard and self.outstanding(engine):
            return False  # its one trial is its whole part
        if any(c.attempt > 0 for c in self.outstanding(engine)):
            # a re-run of iterations whose engine died runs alone on its engine:
            # if this one dies too, the chunk that killed it is known
            return False
        if (
            self.trial
            and not self._trial_for(engine)
            and self._paced_count() < min(len(self._alive), 3)
            and self.outstanding(engine)
        ):
            # an engine busy with its second trial waits for enough trials to
            # tell whether the loop looks uniform before its rest is cut: cut by
            # guided shares first, a uniform loop's last pieces unbalance it
            return False
        if self._pace(engine) is None and not self._trial_for(engine):
            # one calibration chunk at a time: queueing a second before the first
            # is measured would commit work at a guessed size (and, for cheap
            # loops, cost a message more than it saves).  Trial chunks are the
            # exception: an engine's part goes out as two, both cut short by
            # time, so the second runs while the first's result travels
            depth = 1
        return len(self.outstanding(engine)) < depth

    def idle_engines(self) -> list[int]:
        """Live engines with no chunk outstanding and nothing left to hand
        them: what stopping a running chunk early would put to work."""
        return [
            e
            for e in self._alive
            if not self._running.get(e) and not self._has_unassigned(e)
        ]

    def hand_back_seconds(self) -> float:
        """A running chunk stops early for idle engines only when its unrun
        rest would take longer than this at its pace: ``HAND_BACK_ROUND_TRIPS``
        dispatch overheads, so that sharing it out gains more than the
        messages cost."""
        return max(HAND_BACK_MIN_SECONDS, HAND_BACK_ROUND_TRIPS * self.overhead)

    def _hand_back_piece(self, engine: int, run: int, pace: float | None) -> int:
        """A piece of a handed-back rest of ``run`` iterations: an equal share
        for every live engine (by speed, where devices differ), but lasting
        at least ``HAND_BACK_PIECE`` dispatch overheads (``pace``: seconds per
        iteration where the rest was cut off)."""
        k = max(1, len(self._alive))
        share = math.ceil(run * self._speed_share(engine) / k)
        pace = pace or self._pace(engine) or self._mean_pace()
        if self.profiled or not pace or pace <= 0:
            return max(1, min(run, share))
        least = HAND_BACK_PIECE * self.overhead / pace  # (inf: pace underflowed)
        return max(1, min(run, max(share, math.ceil(min(least, run)))))

    def _plenty_left(self) -> bool:
        """Queue ahead only while there is enough work that it cannot unbalance."""
        if self.mode == "static":
            return True
        k = max(1, len(self._alive))
        if self.profiled:
            left = self._remaining_cost()
            if (self.provisional and self._trials) or left < k * self._dearest():
                # once the work left is no more than one dearest iteration per
                # engine, one queued behind a running chunk could wait there
                # while other engines idle (16 engines, i x 5 ms: a re-run
                # 0.890 -> 0.92); and an estimate learns of the dearest
                # iterations late (trials still out have not measured theirs)
                return False
            return left >= 2 * k * self._floor_cost(None)
        if self._factor() == 1.0 and not self.heterogeneous:
            return True  # looks uniform: equal counts, nothing to unbalance
        left = self._remaining() + self._trial_rests()
        return left >= 2 * k * max(1, self.min_chunk())

    def _pick_free(self, engine: int) -> int:
        """Which free run goes out next: re-runs of lost work first (in order);
        then, in a loop that looks uniform, the rest of this engine's own trial
        (every engine's part was equal, so each finishing its own keeps them
        equal); else the run whose trial measured the costliest iterations, so
        a loop whose costs rise along its range does not end on its dearest
        part."""
        uniform = self._factor() == 1.0
        best, key = 0, (-1, -1, -1.0)
        for j, (start, _stop, attempt) in enumerate(self._free):
            own = uniform and self._rest_owner.get(start) == engine
            k = (
                1 if attempt > 0 else 0,
                1 if own else 0,
                self._rest_pace.get(start, -1.0),
            )
            if k > key:
                best, key = j, k
        return best

    def _size_at_pace(self, engine: int, pace: float, run: int) -> int:
        """Iterations of a free run whose trial measured ``pace`` seconds each
        that make a guided share of the work's estimated seconds left."""
        known = [self._rest_pace.get(a) for a, _b, _t in self._free]
        mean = self._mean_pace() or pace
        left = (
            sum(
                (b - a) * (p if p is not None else mean)
                for (a, b, _t), p in zip(self._free, known, strict=True)
            )
            + (self.n - self._cursor + self._trial_rests()) * mean
            + run * pace  # the run being cut
        )
        k = max(1, len(self._alive))
        share = left / (self._factor() * k) * self._speed_share(engine)
        if pace <= 0:  # (underflowed: too cheap to measure)
            return run
        return max(1, int(min(run, share / pace)))

    def _size_for(self, engine: int) -> int:
        """The next chunk's size for ``engine``, cut to last at most about
        :meth:`_span` at its measured pace."""
        size = self._share_for(engine)
        pace = None if self.chunksize or self.profiled else self._pace(engine)
        if not pace or size <= 1:
            return size
        parts = math.ceil(size * pace / self._span(pace))
        return size if parts <= 1 else max(1, math.ceil(size / parts))

    def _share_for(self, engine: int) -> int:
        remaining = self._remaining()
        if remaining <= 0:
            return 1
        k = max(1, len(self._alive))
        # No engine takes more than its fair part of the work not yet done (left
        # to assign plus already outstanding), less what it already holds,
        # whatever the overhead floor says: cheap iterations must not leave the
        # others idle, and an engine served while the others are busy with
        # their part may take the rest.
        held = {
            e: sum(self._will_run(c) for c in self.outstanding(e)) for e in self._alive
        }
        # what trial chunks still out will not reach comes back to be shared
        remaining += self._trial_rests()
        total = remaining + sum(held.values())
        # weighted by speed only once a clear gap is established (a GPU beside a
        # CPU engine); iterations' own costs vary too much to read more into it
        part = min(1.0, self._speed_share(engine) / k)
        fair = max(1, math.ceil(total * part) - held.get(engine, 0))
        if self._factor() == 1.0 and not self.heterogeneous:
            # a loop that looks uniform: every engine ends with an equal count
            # (a fair part of what is left favours whoever asks first)
            mine = int(self._done[engine][0]) + held.get(engine, 0)
            fair = max(1, math.ceil((self.n - self._kept_iterations) / k) - mine)
            if not self.calibrating(engine):
                return max(1, min(remaining, fair))  # no tail to balance
        floor = min(self.min_chunk(engine), fair)
        if self.mode == "dynamic":
            return max(1, min(remaining, floor))
        share = remaining / (self._factor() * k) * self._speed_share(engine)
        if self.calibrating(engine):
            if self._trial_for(engine):
                # cut short on the engine: the first half of its part, then the
                # rest queued behind it (no idle round trip after the first);
                # one trial when it hears the verdict (it may run whole)
                if not self._running.get(engine) and fair > 1 and not self.heard:
                    return max(1, min(remaining, (fair + 1) // 2))
                return max(1, min(remaining, fair))
            if len(self._alive) > 1:
                # calibration: an unmeasured engine gets a small first chunk, so
                # a slow engine cannot be handed a quarter of the loop before
                # anyone knows it is slow
                share /= 4
        return max(1, min(remaining, fair, max(floor, math.ceil(share))))
