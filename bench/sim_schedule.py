"""Schedule simulation: :class:`gpucell.core.schedule.Schedule` and simulated engines.

No cluster, no clock: an event loop plays the dispatcher.  A chunk sent at time t
reaches its engine after half the round trip (``--rtt``, 2 ms), runs after the
engine's queued chunks (depth 2: a queued chunk starts as soon as the previous one
ends), costs ``--per-chunk`` engine time (0.3 ms: unpacking, the chunk wrapper)
plus its iterations, and its result arrives half a round trip later; then the
schedule hears ``complete`` and ``observe_overhead`` (the round trip less compute,
or for a chunk that waited behind another, the engine's per-chunk time, as the
dispatcher measures it) and ``fill`` sends more.  Iteration i on engine e takes
``cost[i] x factor[e] x U(0.9, 1.1)``; a chunk's seconds are reported as the
dispatcher does: its whole time when profiled, else ``_robust_seconds`` (median
iteration x count, from 3 on).

Loops: 1 iteration i costs i x 5 ms (n=40, benchmark c; and n=64 on 8 and 16
engines, bench_scale's uneven loop); 2 the reverse; 3 50 ms
each; 4 log-normal, median 10 ms (n=200, seeded); 5 one 500 ms iteration among
10 ms ones (n=100); 6 2,000 x 1 us.  "noisy": loop 3 with one engine 15%
slower though the devices are equal (a shared host).  "wrong prof": loop 1
scheduled with loop 2's profile; "stale prof": loop 4 with another draw's;
"hetero 5:1": loop 1 on a GPU 5x faster than the CPU engine beside it.

Efficiency = ideal / makespan, ideal = total cost / sum of engine speeds (for equal
engines: total / (k x makespan)).  Each cell is the mean of ``--seeds`` runs.

Schedules
  static        one block per engine
  dynamic/1     chunksize 1 on demand
  guided        guided, no history and no trials (engines elsewhere, or a
                schedule that cannot resend what a trial did not reach)
  first run     a first run as the dispatcher drives one on the kernel's host:
                each engine's part a trial chunk that stops starting iterations
                after ``--budget`` (50 ms), publishes its median pace then and
                comes back with each iteration's seconds (see
                :func:`simulate`)
  guided+hint   guided with last run's seconds per iteration (today's re-run)
  guided+prof   guided with last run's per-iteration profile

Usage:  python bench/sim_schedule.py [--seeds 5] [--json PATH]
"""

from __future__ import annotations

import argparse
import heapq
import json
import random
import statistics
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from gpucell.core.schedule import Schedule


@dataclass(frozen=True)
class Case:
    """A loop: true costs, the profile the last run left, engine speed factors."""

    name: str
    cost: Sequence[float]
    factors: Sequence[float]
    profile: Sequence[float] | None = None  # defaults to cost (a faithful profile)
    heterogeneous: bool = False


def _cases() -> list[Case]:
    linear = [i * 0.005 for i in range(40)]
    reverse = [(39 - i) * 0.005 for i in range(40)]
    rng = random.Random(4)
    heavy = [rng.lognormvariate(-4.6, 1.0) for _ in range(200)]  # median 10 ms
    stale = [rng.lognormvariate(-4.6, 1.0) for _ in range(200)]  # other data
    spike = [0.5 if i == 17 else 0.01 for i in range(100)]
    linear64 = [i * 0.005 for i in range(64)]
    return [
        Case("1 linear k=2", linear, (1.0, 1.0)),
        Case("1 linear k=4", linear, (1.0,) * 4),
        Case("1 linear64 k=8", linear64, (1.0,) * 8),
        Case("1 linear64 k=16", linear64, (1.0,) * 16),
        Case("2 reverse k=2", reverse, (1.0, 1.0)),
        Case("3 uniform k=2", [0.05] * 40, (1.0, 1.0)),
        # equal devices, one 15% slower for the whole loop: a shared host's core
        # (measured: 200 ms apart on 1 s halves, bench/bench_parallel.py (b))
        Case("3 uniform noisy", [0.05] * 40, (1.0, 1.15)),
        Case("4 heavy k=2", heavy, (1.0, 1.0)),
        Case("4 heavy k=4", heavy, (1.0,) * 4),
        Case("5 spike k=2", spike, (1.0, 1.0)),
        Case("6 cheap k=2", [1e-6] * 2000, (1.0, 1.0)),
        Case("1 wrong prof", linear, (1.0, 1.0), profile=reverse),
        Case("4 stale prof", heavy, (1.0, 1.0), profile=stale),
        Case("1 hetero 5:1", linear, (0.2, 1.0), heterogeneous=True),
    ]


SCHEDULES: dict[str, Callable[[Case], dict[str, Any]]] = {
    "static": lambda c: {"mode": "static"},
    "dynamic/1": lambda c: {"mode": "dynamic", "chunksize": 1},
    "guided": lambda c: {},
    "first run": lambda c: {"trial": True, "heard": True},
    "guided+hint": lambda c: {"hint": sum(c.profile or c.cost) / len(c.cost)},
    "guided+prof": lambda c: {"profile": list(c.profile or c.cost)},
}


def _reported(its: list[float]) -> float:
    """A chunk's seconds as the dispatcher reports them (``_robust_seconds``): the
    median iteration times the count, from 3 iterations on."""
    if len(its) < 3:
        return sum(its)
    return sorted(its)[len(its) // 2] * len(its)


def simulate(
    sched: Schedule,
    cost: Sequence[float],
    factors: Sequence[float],
    rng: random.Random,
    rtt: float = 0.002,
    per_chunk: float = 0.0003,
    budget: float = 0.05,
) -> float:
    """Run ``sched`` to the end on simulated engines; return the makespan.

    Trial chunks (a first run's) run as the dispatcher runs them on the
    kernel's host: a trial starts no iteration once ``budget`` has passed (it
    runs at least one), publishes its median pace at that moment
    (``observe_trial``; heard when its next iteration ends) and completes with
    the iterations it ran and, when the schedule takes them, each one's
    seconds.  Other chunks run whole."""
    now = 0.0
    free_at = [0.0] * len(factors)
    # (time, kind, chunk id, payload, waited): kind 0 a trial's published
    # pace, 1 a chunk's result arriving
    events: list[tuple[float, int, int, Any, bool]] = []

    def send() -> None:
        for c in sched.fill():
            e = c.engine
            assert e is not None
            f = factors[e]
            its = [cost[i] * f * rng.uniform(0.9, 1.1) for i in range(c.start, c.stop)]
            arrive = now + rtt / 2
            waited = free_at[e] > arrive
            begin = max(arrive, free_at[e]) + per_chunk
            if c.trial:
                done, t = 0, 0.0
                for x in its:
                    if done and t >= budget:
                        break
                    t, done = t + x, done + 1
                its = its[:done]
                if t >= budget:
                    pace = (done, sorted(its)[done // 2])
                    heapq.heappush(
                        events, (begin + max(budget, its[0]), 0, c.id, pace, False)
                    )
            free_at[e] = begin + sum(its)
            heapq.heappush(events, (free_at[e] + rtt / 2, 1, c.id, its, waited))

    send()
    while events:
        now, kind, cid, payload, waited = heapq.heappop(events)
        c = sched.chunks[cid]
        if kind == 0:
            done, median = payload
            sched.observe_trial(cid, done, median * done)
            continue
        its = payload
        secs = sum(its) if sched.profiled else _reported(its)
        if c.trial:
            costs = its if sched.takes_costs else None
            sched.complete(cid, secs, done=len(its), costs=costs)
        else:
            sched.complete(cid, secs)
        # as the dispatcher: a round trip minus compute, or for a chunk that
        # waited behind another, the engine's dead time between the two
        sched.observe_overhead(per_chunk if waited else rtt + per_chunk)
        send()
    assert sched.finished and sched.pending_ranges() == []
    return now


def run_case(
    case: Case, name: str, seeds: int, rtt: float = 0.002, per_chunk: float = 0.0003
) -> dict[str, Any] | None:
    """Mean makespan, efficiency and chunk count of one schedule on one loop."""
    k = len(case.factors)
    ideal = sum(case.cost) / sum(1 / f for f in case.factors)
    spans, chunks = [], []
    for seed in range(seeds):
        kw = SCHEDULES[name](case)
        try:
            s = Schedule(
                len(case.cost), list(range(k)), heterogeneous=case.heterogeneous, **kw
            )
        except TypeError:  # a Schedule without profiles (before the change)
            return None
        rng = random.Random(seed)
        spans.append(simulate(s, case.cost, case.factors, rng, rtt, per_chunk))
        chunks.append(len(s.chunks))
    span = statistics.fmean(spans)
    return {
        "makespan": span,
        "efficiency": ideal / span,
        "chunks": statistics.fmean(chunks),
        "profiled": bool(getattr(s, "profiled", False)),
    }


def _eff_cell(r: dict[str, Any]) -> str:
    return f"{r['efficiency']:>9.3f}{r['chunks']:>6.0f}"


def _print(
    table: dict[str, dict[str, Any]], title: str, cell: Callable[[Any], str]
) -> None:
    print(f"{title:<16}" + "".join(f"{n:>15}" for n in SCHEDULES))
    for name, row in table.items():
        print(
            f"{name:<16}"
            + "".join(cell(r) if r else f"{'n/a':>15}" for r in row.values())
        )


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--seeds", type=int, default=5)
    ap.add_argument("--rtt", type=float, default=0.002, help="round trip, s")
    ap.add_argument("--per-chunk", type=float, default=0.0003, help="engine s/chunk")
    ap.add_argument("--json", type=Path, default=None)
    args = ap.parse_args()
    t0 = time.perf_counter()
    table: dict[str, dict[str, Any]] = {}
    for case in _cases():
        table[case.name] = {
            n: run_case(case, n, args.seeds, args.rtt, args.per_chunk)
            for n in SCHEDULES
        }
    _print(table, "efficiency, chunks", _eff_cell)
    print()
    _print(table, "makespan (s)", lambda r: f"{r['makespan']:>15.3f}")
    print(f"\n{args.seeds} seeds per cell, {time.perf_counter() - t0:.1f} s")
    if args.json:
        args.json.write_text(
            json.dumps(
                {**vars(args), "json": str(args.json), "results": table}, indent=1
            )
        )


if __name__ == "__main__":
    main()
