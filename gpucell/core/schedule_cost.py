"""Cutting chunks by cost: a profile of each iteration's seconds (an earlier
run's, or a provisional one the trials measure) and the chunks cut from it,
costliest first (see :mod:`gpucell.core.schedule`'s docstring)."""

from __future__ import annotations

import math
from bisect import bisect_left, bisect_right
from collections.abc import Sequence
from itertools import accumulate

from gpucell.core.schedule_fields import (
    PROVISIONAL_MAX,
    Chunk,
    _EngineStats,
)
from gpucell.core.schedule_pace import PaceModel
from gpucell.core.states import (
    DONE,
    RUNNING,
)

__all__ = ["CostCutting", "interpolate"]


class CostCutting(PaceModel):
    """The profile and the cost-cut chunks."""

    def observe_trial(self, chunk_id: int, done: int, seconds: float) -> None:
        """A running trial chunk reached its budget after ``done`` iterations
        in ``seconds`` (a stamped measure) and runs on while the verdict is
        out: its pace counts until the chunk completes."""
        if not 0 <= chunk_id < len(self.chunks):
            return
        c = self.chunks[chunk_id]
        if c.state == RUNNING and c.trial and done > 0 and seconds > 0:
            self._provisional[c.id] = seconds / done
            if self._may_estimate():
                # its median iteration's pace, at the middle of what it ran
                # (the stamps of each iteration come when it completes)
                at = c.start + (done - 1) // 2
                if at not in self._measured:
                    self._measured[at] = seconds / done
                    self._measures += 1

    @property
    def takes_costs(self) -> bool:
        """:meth:`complete` would use a trial's ``costs`` (so the caller need
        not build a list of 10^5 seconds for a cheap loop's trial that it would
        not read)."""
        return self._may_estimate()

    def _use_profile(self, profile: Sequence[float]) -> None:
        try:
            costs = list(map(float, profile))
        except (TypeError, ValueError):
            return
        total = sum(costs)
        if len(costs) != self.n or not 0 < total < math.inf or min(costs) < 0:
            return  # (a NaN makes the sum NaN)
        self._set_costs(costs)
        self._taken = bytearray(self.n)
        self._free = [(0, self.n, 0)]
        self._cursor = self.n
        mean = total / self.n
        for e in self._stats:
            # equal devices: assume the profile's pace, so no calibration chunks;
            # different devices must be measured before they get a large share
            self._stats[e] = (
                _EngineStats() if self.heterogeneous else _EngineStats(1, mean, mean)
            )

    def _set_costs(self, costs: list[float]) -> None:
        """Cost prefix sums and the seeding order of ``costs`` (one per
        iteration): the schedule is profiled from now on."""
        self.profiled = True
        self._prefix = list(accumulate(costs, initial=0.0))
        # Only iterations costing over a quarter of the smallest chunk need seeding
        # in cost order; chunks of cheaper ones are as fine-grained wherever they
        # are cut (and sorting a million cheap iterations would cost ~0.3 s).
        some = self.overhead / self.target_overhead / 4
        heavy = [i for i, x in enumerate(costs) if x > some]
        heavy.sort(key=costs.__getitem__, reverse=True)
        self._order = heavy + [i for i, x in enumerate(costs) if x <= some]
        self._seek, self._back = 0, self.n - 1

    def _may_estimate(self) -> bool:
        """A first run's trials may stand in for a profile: equal devices (a
        GPU's seconds beside a CPU engine's are no one cost), a guided
        schedule cut by time (not a fixed size), no real profile, the whole
        loop run here (not resumed), and few enough iterations to re-estimate
        as each trial comes back."""
        return (
            self.trial
            and self.mode == "guided"
            and not self.chunksize
            and not self.heterogeneous
            and not self.kept
            and (self.provisional or not self.profiled)
            and self.n <= PROVISIONAL_MAX
        )

    def _keep_costs(self, start: int, size: int, costs: Sequence[float]) -> None:
        """Keep a stamped chunk's iteration seconds; its first iteration also
        paid the chunk's one-time costs (imports, warm-up), so it counts no
        more than the chunk's median."""
        xs = [float(x) for x in costs[:size]]
        if not xs or not all(0 <= x < math.inf for x in xs):
            return
        xs[0] = min(xs[0], sorted(xs)[len(xs) // 2])
        for i, x in enumerate(xs):
            self._measured[start + i] = x
        self._measures += 1

    def _estimate_rest(self) -> None:
        """Once trials found the loop uneven, cost the iterations not measured
        by interpolation and schedule the rest as profiled; redone when more
        iterations were measured since."""
        if (
            not self._may_estimate()
            or self._measures == self._estimated_at
            or self._paced_count() < min(len(self._alive), 3)
            or self._factor() == 1.0  # looks uniform: the trials run whole
        ):
            return
        costs = interpolate(self.n, self._measured)
        if not 0 < sum(costs) < math.inf:
            return
        self._estimated_at = self._measures
        if self._cursor < self.n:  # (unassigned past the cursor: free now)
            self._free.append((self._cursor, self.n, 0))
            self._free.sort()
            self._cursor = self.n
        self._set_costs(costs)
        self.provisional = True
        taken = bytearray(b"\x01" * self.n)
        for a, b, _attempt in self._free:
            taken[a:b] = bytes(b - a)
        self._taken = taken
        for e, st in self._stats.items():  # each engine's pace against the estimate
            st.cost = sum(
                self._cost(c.start, c.stop)
                for c in self.chunks
                if c.engine == e and c.state == DONE
            )

    def _untake(self, start: int, stop: int) -> None:
        """Iterations ``[start, stop)`` are free again (a lost chunk's, a
        trial's rest): the seeds' search starts over."""
        self._taken[start:stop] = bytes(stop - start)
        self._seek, self._back = 0, self.n - 1

    def _cost(self, start: int, stop: int) -> float:
        return self._prefix[stop] - self._prefix[start]

    def _remaining_cost(self) -> float:
        return sum(self._cost(a, b) for a, b, _ in self._free)

    def _floor_cost(self, engine: int | None) -> float:
        """Profile seconds below which a chunk's dispatch overhead exceeds the
        target, on ``engine`` (or on the mean measured engine)."""
        pace = self._pace(engine) if engine is not None else None
        if pace is None:
            paces = [p for e in self._alive if (p := self._pace(e))]
            pace = sum(paces) / len(paces) if paces else 1.0
        return self.overhead / self.target_overhead / pace

    def _next_by_cost(self, engine: int) -> Chunk | None:
        """The guided share of the cost left, grown around the costliest
        unassigned iteration (the cheapest, for a slower or not yet measured
        engine that the costliest would hold past its share)."""
        if not self._free:
            return None
        target, fair = self._cost_target(engine)
        seed = self._seed(costliest=True)
        # an iteration this engine could not finish within its part is left to
        # the others; one not yet measured may be the slow engine
        if self._pace(engine) is None and len(self._alive) > 1:
            limit = target
        else:
            limit = fair if self._speed_share(engine) < 1 else math.inf
        if self._cost(seed, seed + 1) > limit:
            seed = self._seed(costliest=False)
        j = bisect_right(self._free, (seed, self.n + 1, 0)) - 1
        a, b, attempt = self._free[j]
        lo, hi = self._window(a, b, seed, target)
        lo, hi = self._trim(engine, a, b, seed, lo, hi)
        self._free[j : j + 1] = [
            (x, y, attempt) for x, y in ((a, lo), (hi, b)) if y > x
        ]
        self._taken[lo:hi] = b"\x01" * (hi - lo)
        return self._new(lo, hi, engine, attempt)

    def _trim(
        self, engine: int, a: int, b: int, seed: int, lo: int, hi: int
    ) -> tuple[int, int]:
        """Window ``[lo, hi)`` of free range ``[a, b)`` as it should be sent."""
        # a leftover too cheap to be worth its own message joins the chunk
        crumb = min(self._floor_cost(engine), self._cost(lo, hi)) / 4
        lo = a if self._cost(a, lo) <= crumb else lo
        hi = b if self._cost(hi, b) <= crumb else hi
        # and no chunk holds more iterations than guided-by-count would give it,
        # so a profile that calls costly iterations cheap cannot make a tail chunk
        # worse than the schedule without a profile
        k = max(1, len(self._alive))
        share = self._remaining() * self._speed_share(engine) / (self.factor * k)
        cap = max(self.min_chunk(engine), math.ceil(share))
        if hi - lo > cap:
            lo = max(lo, min(seed - (cap - 1) // 2, hi - cap))
            hi = lo + cap
        return lo, hi

    def _dearest(self) -> float:
        """The estimated cost of the dearest iteration not yet handed out."""
        if not self._free:
            return 0.0
        seed = self._seed(costliest=True)
        return self._cost(seed, seed + 1)

    def _seed(self, costliest: bool) -> int:
        """The costliest (or cheapest) unassigned iteration; there is one."""
        order, taken = self._order, self._taken
        if costliest:
            while taken[order[self._seek]]:
                self._seek += 1
            return order[self._seek]
        while taken[order[self._back]]:
            self._back -= 1
        return order[self._back]

    def _cost_target(self, engine: int) -> tuple[float, float]:
        """As :meth:`_size_for`, in profile seconds: the chunk's cost, and the
        most ``engine`` should take (its fair part of what is left)."""
        remaining = self._remaining_cost()
        k = max(1, len(self._alive))
        held = {
            e: sum(self._cost(c.start, c.stop) for c in self.outstanding(e))
            for e in self._alive
        }
        share = self._speed_share(engine)
        part = min(1.0, share / k)
        fair = (remaining + sum(held.values())) * part - held.get(engine, 0.0)
        floor = min(self._floor_cost(engine), fair)
        guided = remaining / (self.factor * k) * share
        if self._pace(engine) is None and k > 1:
            guided /= 4  # calibration, as in _size_for
        return min(remaining, fair, max(floor, guided)), fair

    def _window(self, a: int, b: int, seed: int, target: float) -> tuple[int, int]:
        """``[lo, hi)`` inside ``[a, b)``, holding ``seed``, costing about
        ``target`` (never less than the seed itself)."""
        p = self._prefix
        budget = target - self._cost(seed, seed + 1)
        if budget <= 0:
            return seed, seed + 1
        # half the budget each side; what one side cannot use goes to the other
        hi = bisect_right(p, p[seed + 1] + budget / 2, seed + 1, b + 1) - 1
        budget -= p[hi] - p[seed + 1]
        lo = bisect_left(p, p[seed] - budget, a, seed + 1)
        budget -= p[seed] - p[lo]
        hi = bisect_right(p, p[hi] + budget, hi, b + 1) - 1
        return lo, hi


def interpolate(n: int, known: dict[int, float]) -> list[float]:
    """A value for each of ``0..n-1`` from the ``known`` ones: between two
    known indices linearly, before the first and after the last the nearest
    known value (costs rising along a range are not projected past what was
    measured).  All zeros when nothing is known."""
    points = sorted((i, x) for i, x in known.items() if 0 <= i < n)
    if not points:
        return [0.0] * n
    out = [points[0][1]] * points[0][0]
    for (i0, x0), (i1, x1) in zip(points, points[1:], strict=False):
        step = (x1 - x0) / (i1 - i0)
        out.extend(x0 + step * j for j in range(i1 - i0))
    last_i, last_x = points[-1]
    out.extend([last_x] * (n - last_i))
    return out
