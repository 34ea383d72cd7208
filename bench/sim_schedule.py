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

from gpucell.core.run_events import (
    Fill,
    HandBack,
    Keep,
    PaceHeard,
    Record,
    Replied,
    Send,
    Sent,
    Tick,
    TrialsHeard,
    Verdict,
    VerdictGiven,
)
from gpucell.core.run_state import RunState
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
    "first, no hb": lambda c: {"trial": True, "heard": True},
    "first run": lambda c: {"trial": True, "heard": True, "stealing": True},
    "guided+hint": lambda c: {
        "hint": sum(c.profile or c.cost) / len(c.cost),
        "stealing": True,
    },
    "guided+prof": lambda c: {"profile": list(c.profile or c.cost), "stealing": True},
}


def _timing(cid: int, start: int, its: list[float], begin: float, handed: bool) -> Any:
    """A reply's Timing as an engine writes it: each iteration stamped, the
    median from 3 iterations on, engine-clock start and end."""
    starts = [begin + sum(its[:j]) for j in range(len(its))]
    return {
        "start": begin,
        "entered": begin,
        "end": begin + sum(its),
        "compute": sum(its),
        "starts": starts,
        "median": sorted(its)[len(its) // 2] if len(its) >= 3 else None,
        "done": len(its),
        "handed_back": handed,
        "unstamped": False,
        "host": "sim",
        "pid": 0,
        "first": start,
        "cached": None,
        "drew": [],
    }


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

    The kernel side is the real run state (:class:`gpucell.core.run_state.RunState`,
    every engine on the kernel's host): this loop only plays the engines and
    the wire, turning what they do into its events (``Fill``/``Sent``, a
    ``Replied`` with the engine's Timing, ``PaceHeard``, ``Tick``) and
    carrying out its ``Send``, ``Verdict`` and ``HandBack`` instructions.
    Engines run their chunks in arrival order, iteration by iteration.  Trial
    chunks (a first run's) run as on the kernel's host: once ``budget`` has
    passed (after at least one iteration) a trial publishes its median pace;
    if its rest would take over ``EXTEND_MAX_SECONDS`` at that pace, or the
    schedule was not ``heard``, it stops there; else it runs on, for at most
    ``VERDICT_WAIT``, until the verdict says run whole (``True``) or stop
    (``False``).  While the hand-back flag is raised, a stoppable chunk whose
    rest would take longer than the flag's threshold at its pace so far stops
    after its current iteration and hands the rest back (engine/chunk.py's
    ``_HandBack``)."""
    from gpucell.engine.chunk import EXTEND_MAX_SECONDS, VERDICT_WAIT

    k = len(factors)
    run = RunState(sched, near=set(range(k)), channel=True)
    now = 0.0
    queue: list[list[int]] = [[] for _ in range(k)]  # chunk ids arrived, waiting
    busy: list[int | None] = [None] * k  # chunk running on each engine
    state: dict[int, dict[str, Any]] = {}  # running chunk -> its progress
    # what the engines read off /dev/shm: the hand-back flag and the verdict
    flags: dict[str, Any] = {"hand_back": None, "verdict": None}
    # (time, order, kind, chunk id, payload): kind 0 a chunk reaches its engine,
    # 1 an iteration ends, 2 a result reaches the kernel
    events: list[tuple[float, int, int, int, Any]] = []
    order = [0]

    def push(t: float, kind: int, cid: int, payload: Any = None) -> None:
        order[0] += 1
        heapq.heappush(events, (t, order[0], kind, cid, payload))

    def do(out: list[Any]) -> None:
        for ins in out:
            if isinstance(ins, Verdict):
                flags["verdict"] = ins.uniform
                do(run.handle(VerdictGiven()))
            elif isinstance(ins, HandBack):
                flags["hand_back"] = ins.threshold
            elif not isinstance(ins, Record | Keep):
                raise AssertionError(f"the simulation met {ins}")

    def send() -> None:
        out = run.handle(Fill())
        sends = [i for i in out if isinstance(i, Send)]
        do([i for i in out if not isinstance(i, Send)])
        for s in sends:
            push(now + rtt / 2, 0, s.chunk.id)
        if sends:
            run.handle(Sent(tuple(s.chunk.id for s in sends), now))
        do(run.handle(Tick()))

    def start_next(e: int) -> None:
        if busy[e] is not None or not queue[e]:
            return
        cid = queue[e].pop(0)
        c = sched.chunks[cid]
        f = factors[e]
        its = [cost[i] * f * rng.uniform(0.9, 1.1) for i in range(c.start, c.stop)]
        begin = now + per_chunk
        busy[e] = cid
        state[cid] = {
            "its": its,
            "done": 0,
            "begin": begin,
            "published": False,
            "give_up": None,
            "whole": not c.trial,
        }
        push(begin + its[0], 1, cid)

    def finish(cid: int, handed: bool) -> None:
        c = sched.chunks[cid]
        st = state.pop(cid)
        assert c.engine is not None
        busy[c.engine] = None
        its = st["its"][: st["done"]]
        push(now + rtt / 2, 2, cid, _timing(cid, c.start, its, st["begin"], handed))
        start_next(c.engine)

    def iteration_ended(cid: int) -> None:
        c, st = sched.chunks[cid], state[cid]
        st["done"] += 1
        done, its = st["done"], st["its"]
        if done == len(its):
            return finish(cid, False)
        ran = now - st["begin"]
        if not st["whole"] and ran >= budget:
            if not st["published"]:
                st["published"] = True
                median = sorted(its[:done])[done // 2]
                run.handle(PaceHeard(cid, done, median * done, True))
                do(run.handle(TrialsHeard()))
                left = (len(its) - done) * ran / done
                if sched.heard and left <= EXTEND_MAX_SECONDS:
                    st["give_up"] = now + VERDICT_WAIT
            said = flags["verdict"] if st["give_up"] is not None else False
            if said is True:
                st["whole"] = True
            elif said is False or now >= st["give_up"]:
                return finish(cid, False)
        thr = flags["hand_back"]
        if (
            thr is not None
            and c.stoppable
            and len(its) - done >= 2
            and (len(its) - done) * ran / done > thr
        ):
            return finish(cid, True)
        push(now + its[done], 1, cid)

    send()
    while events:
        now, _o, kind, cid, payload = heapq.heappop(events)
        c = sched.chunks[cid]
        if kind == 0:
            assert c.engine is not None
            queue[c.engine].append(cid)
            start_next(c.engine)
        elif kind == 1:
            iteration_ended(cid)
        else:
            do(run.handle(Replied(cid, "ok", None, payload, now)))
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
