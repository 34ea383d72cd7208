"""The schedule is pure arithmetic: property-test it with simulated engines."""

from __future__ import annotations

import heapq
import importlib.util
import math
import random
import statistics
import sys
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gpucell.core.schedule import DONE, Schedule, covers


def simulate(
    sched: Schedule,
    speeds: dict[int, float],
    cost,
    kill: dict[int, float] | None = None,
):
    """Event simulation: engine e runs an iteration i in cost(i) / speeds[e] s.

    Returns (makespan, per-engine busy time).
    """
    kill = dict(kill or {})
    now = 0.0
    free_at = dict.fromkeys(speeds, 0.0)
    busy = dict.fromkeys(speeds, 0.0)
    events: list[tuple[float, int, int]] = []  # (end time, chunk id, engine)

    def feed(_e: int = -1) -> None:
        for c in sched.fill():
            e = c.engine
            t = sum(cost(i) for i in range(c.start, c.stop)) / speeds[e]
            start = max(now, free_at[e])
            free_at[e] = start + t
            busy[e] += t
            heapq.heappush(events, (free_at[e], c.id, e))

    for e in speeds:
        feed(e)
    guard = 0
    while events:
        guard += 1
        assert guard < 100_000
        now, cid, e = heapq.heappop(events)
        if e in kill and now >= kill[e]:
            del kill[e]
            sched.lose_engine(e)
            events = [ev for ev in events if ev[2] != e]
            heapq.heapify(events)
            for o in sched.alive:
                feed(o)
            continue
        if e not in sched.alive:
            continue
        c = sched.chunks[cid]
        sched.complete(cid, sum(cost(i) for i in range(c.start, c.stop)) / speeds[e])
        feed(e)
        for o in sched.alive:
            feed(o)
    return now, busy


@settings(max_examples=200, deadline=None)
@given(
    n=st.integers(0, 500),
    k=st.integers(1, 5),
    mode=st.sampled_from(["guided", "dynamic", "static"]),
    chunksize=st.one_of(st.none(), st.integers(1, 50)),
    speeds=st.lists(st.floats(0.2, 5.0), min_size=5, max_size=5),
    kill_one=st.booleans(),
)
def test_chunks_are_disjoint_and_cover_every_iteration(
    n, k, mode, chunksize, speeds, kill_one
):
    engines = list(range(k))
    s = Schedule(n, engines, mode=mode, chunksize=chunksize)
    kill = {0: 0.0} if kill_one and k > 1 else None
    simulate(s, {e: speeds[e] for e in engines}, lambda i: 0.01, kill)
    assert s.finished
    assert covers(s.chunks, n)
    done = [c for c in s.chunks if c.state == DONE]
    assert sum(c.size for c in done) == n
    if kill:
        assert all(
            c.engine != 0
            for c in done
            if c.start >= 0 and c.state == DONE and c.attempt > 0
        )


def test_guided_chunks_shrink_towards_the_end():
    s = Schedule(1000, [0, 1], mode="guided")
    simulate(s, {0: 1.0, 1: 1.0}, lambda i: 0.01)
    sizes = [c.size for c in s.chunks]
    assert sizes[0] > sizes[-1]
    assert sizes[0] == 63  # calibration: a quarter of remaining / (2 x engines)
    # then large chunks once speeds are known, up to chunk_seconds (1 s) each
    assert 90 <= max(sizes) <= 100


def test_uneven_loop_is_balanced():
    """Iteration i costs i x 5 ms; efficiency = serial / (engines x makespan)."""
    n = 40
    cost = lambda i: i * 0.005  # noqa: E731
    s = Schedule(n, [0, 1], mode="guided", overhead=0.002)
    makespan, _ = simulate(s, {0: 1.0, 1: 1.0}, cost)
    serial = sum(cost(i) for i in range(n))
    assert serial / (2 * makespan) >= 0.95


def test_a_faster_engine_gets_more_work():
    s = Schedule(2000, [0, 1], mode="guided", heterogeneous=True)
    _, busy = simulate(s, {0: 4.0, 1: 1.0}, lambda i: 0.001)
    done0 = sum(c.size for c in s.chunks if c.engine == 0 and c.state == DONE)
    assert done0 > 1400  # ~4/5 of the work
    assert abs(busy[0] - busy[1]) < 0.15 * max(busy.values())


def test_calibration_raises_the_minimum_chunk_for_tiny_iterations():
    s = Schedule(100_000, [0, 1], mode="dynamic", overhead=0.002)
    c = s.next_chunk(0)
    assert c.size == 1  # uncalibrated: one iteration
    s.complete(c.id, 1e-6)  # 1 us per iteration
    assert s.min_chunk() >= 0.002 / (0.05 * 1e-6)


def test_static_gives_one_block_per_engine():
    s = Schedule(10, [3, 7], mode="static")
    a, b = s.next_chunk(3), s.next_chunk(7)
    assert (a.start, a.stop, b.start, b.stop) == (0, 5, 5, 10)
    assert s.next_chunk(3) is None


def test_lost_engine_work_is_rerun_elsewhere():
    s = Schedule(10, [0, 1], mode="static")
    a = s.next_chunk(0)
    lost = s.lose_engine(0)
    assert [c.id for c in lost] == [a.id]
    assert s.pending_ranges() == [(0, 10)]
    got = []
    while (c := s.next_chunk(1)) is not None:
        got.append(c)
        s.complete(c.id, 0.1)
    assert covers(s.chunks, 10)
    assert all(c.engine == 1 for c in got)
    assert any(c.attempt == 1 for c in got)  # re-runs are counted


@pytest.mark.parametrize("bad", [{"mode": "fast"}, {"chunksize": 0}, {"engines": []}])
def test_bad_parameters(bad):
    kw = {"n": 5, "engines": [0], **bad}
    with pytest.raises(ValueError):
        Schedule(**kw)


def test_a_loop_measured_uniform_goes_static_next_time():
    s = Schedule(40, [0, 1], hint=0.05, uniform=True)
    assert [(c.engine, c.size) for c in s.fill()] == [(0, 20), (1, 20)]
    s = Schedule(40, [0, 1], hint=0.05, uniform=False)
    assert len(s.fill()) == 4  # guided: two queued chunks each


def test_last_run_tells_uniform_from_uneven_paces():
    from gpucell.core.provenance import ChunkRecord, LastRun

    def rec(paces):
        lr = LastRun(engines=(0, 1))
        for k, p in enumerate(paces):
            lr.chunks.append(
                ChunkRecord(
                    10 * k, 10 * k + 10, k % 2, "h", "CPU", 0, 1, p * 10, 0, "done"
                )
            )
        return lr

    assert rec([0.05, 0.051, 0.049, 0.05]).uniform
    assert not rec([0.01, 0.05, 0.09, 0.13]).uniform
    assert not rec([0.05, 0.05]).uniform  # too few chunks to tell


def test_a_cheap_loop_takes_one_calibration_chunk_then_one_chunk_per_engine():
    s = Schedule(2000, [0, 1], overhead=0.003)
    simulate(s, {0: 1.0, 1: 1.0}, lambda i: 1e-6)
    assert len(s.chunks) == 4
    assert covers(s.chunks, 2000)
    per_engine = {e: sum(c.size for c in s.chunks if c.engine == e) for e in (0, 1)}
    assert abs(per_engine[0] - per_engine[1]) <= 2000 * 0.1


# -- guided with a profile (last run's seconds per iteration) ---------------------

LINEAR = [i * 0.005 for i in range(40)]  # benchmark (c): the costly end comes last


@pytest.fixture(scope="module")
def bench_sim():
    """bench/sim_schedule.py: engines with dispatch overhead, noise, and chunk
    times reported as the dispatcher does."""
    path = Path(__file__).resolve().parent.parent / "bench" / "sim_schedule.py"
    spec = importlib.util.spec_from_file_location("sim_schedule", path)
    mod = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = mod  # its dataclasses look their module up
    try:
        spec.loader.exec_module(mod)
    finally:
        del sys.modules[spec.name]
    return mod


def noisy_makespan(bench_sim, n_engines, cost, seeds=5, factors=None, **kw):
    """Mean makespan of ``Schedule(**kw)`` over a few noise seeds."""
    factors = factors or (1.0,) * n_engines
    spans = []
    for seed in range(seeds):
        s = Schedule(len(cost), list(range(n_engines)), **kw)
        spans.append(bench_sim.simulate(s, cost, factors, random.Random(seed)))
    return sum(spans) / len(spans)


@settings(max_examples=150, deadline=None)
@given(
    profile=st.lists(st.floats(0.0, 0.05), min_size=1, max_size=300),
    k=st.integers(1, 4),
    speeds=st.lists(st.floats(0.2, 5.0), min_size=4, max_size=4),
    wrong=st.booleans(),
    heterogeneous=st.booleans(),
    kill_at=st.one_of(st.none(), st.floats(0.0, 1.0)),
)
def test_profiled_chunks_cover_every_iteration_once(
    profile, k, speeds, wrong, heterogeneous, kill_at
):
    profile[len(profile) // 2] += 0.001  # a positive sum: the profile is used
    n = len(profile)
    real = profile[::-1] if wrong else profile
    s = Schedule(n, list(range(k)), profile=profile, heterogeneous=heterogeneous)
    assert s.profiled
    kill = {0: kill_at} if kill_at is not None and k > 1 else None
    simulate(s, {e: speeds[e] for e in range(k)}, real.__getitem__, kill)
    assert s.finished
    assert covers(s.chunks, n)
    assert sum(c.size for c in s.chunks if c.state == DONE) == n
    assert s.pending_ranges() == []
    assert sum(s.engine_progress(e)[0] for e in range(k)) == n


def test_profiled_chunks_go_out_costliest_first():
    s = Schedule(40, [0, 1], profile=LINEAR)
    simulate(s, {0: 1.0, 1: 1.0}, LINEAR.__getitem__)
    costs = [sum(LINEAR[c.start : c.stop]) for c in s.chunks]
    assert s.chunks[0].stop == 40  # the costliest iterations, though they come last
    assert costs[0] == max(costs)
    assert costs[1] >= max(costs[2:])
    assert max(costs[-4:]) < costs[0] / 10  # the loop ends on cheap chunks


def test_profiled_uneven_loop_is_balanced(bench_sim):
    """Benchmark (c) with the cost of dispatch and noisy engines: >= 95%."""
    serial = sum(LINEAR)
    for k in (2, 4):
        guided = noisy_makespan(bench_sim, k, LINEAR, hint=serial / 40)
        profiled = noisy_makespan(bench_sim, k, LINEAR, profile=LINEAR)
        assert serial / (k * profiled) >= 0.95
        assert profiled < guided


def test_a_wrong_profile_costs_about_what_none_does(bench_sim):
    """The loop changed since the profile was taken: its costs are reversed."""
    for k in (2, 4):
        guided = noisy_makespan(bench_sim, k, LINEAR)
        wrong = noisy_makespan(bench_sim, k, LINEAR, profile=LINEAR[::-1])
        assert wrong <= 1.1 * guided


@pytest.mark.parametrize("k", [2, 4])
@pytest.mark.parametrize("hint", [None, 1e-6])
def test_a_cheap_profiled_loop_takes_one_chunk_per_engine(k, hint):
    s = Schedule(2000, list(range(k)), profile=[1e-6] * 2000, hint=hint)
    simulate(s, dict.fromkeys(range(k), 1.0), lambda i: 1e-6)
    assert len(s.chunks) == k
    assert covers(s.chunks, 2000)


@pytest.mark.parametrize(
    ("profile", "kw"),
    [
        (LINEAR[:-1], {}),  # not one value per iteration
        ([*LINEAR[:-1], -0.1], {}),
        ([*LINEAR[:-1], math.nan], {}),
        ([*LINEAR[:-1], math.inf], {}),
        ([0.0] * 40, {}),
        (["fast"] * 40, {}),
        (LINEAR, {"mode": "static"}),
        (LINEAR, {"mode": "dynamic"}),
        (LINEAR, {"chunksize": 4}),
    ],
)
def test_an_unusable_profile_is_ignored(profile, kw):
    s = Schedule(40, [0, 1], profile=profile, **kw)
    assert not s.profiled
    plain = Schedule(40, [0, 1], **kw)
    assert [(c.start, c.stop) for c in s.fill()] == [
        (c.start, c.stop) for c in plain.fill()
    ]


@pytest.mark.parametrize(
    "cost", [LINEAR, [5.0 if i == 17 else 0.1 for i in range(100)]]
)
@pytest.mark.parametrize("speeds", [(5.0, 1.0), (1.0, 5.0, 5.0)])
def test_profiled_faster_engines_get_more_and_all_finish_together(cost, speeds):
    """A GPU 5x faster than a CPU engine: profile seconds are not its seconds.

    (Loops long enough that the GPU's smallest worthwhile chunk, 60 ms of its
    time, is small beside its part.)
    """
    s = Schedule(len(cost), list(range(len(speeds))), profile=cost, heterogeneous=True)
    _, busy = simulate(s, dict(enumerate(speeds)), cost.__getitem__)
    assert max(busy.values()) - min(busy.values()) <= 0.1 * max(busy.values())


def test_profiled_lost_work_is_rerun_elsewhere_and_may_be_split():
    s = Schedule(40, [0, 1], profile=LINEAR)
    first = s.fill()
    lost = s.lose_engine(0)
    assert lost and all(c.engine == 0 for c in lost)
    assert s.fill() == []  # engine 1 already holds its two chunks
    for c in first:
        if c.engine == 1:
            s.complete(c.id, 0.1)
    rerun = []
    while not s.finished:
        for c in s.fill():
            rerun.append(c)
            s.complete(c.id, 0.1)
    assert covers(s.chunks, 40)
    assert all(c.engine == 1 for c in rerun)
    again = [c for c in rerun if c.attempt == 1]
    assert sum(c.size for c in again) == sum(c.size for c in lost)


def test_a_cheap_start_does_not_make_later_chunks_huge_on_equal_devices():
    """Costs rising along the range: engine 0's calibration chunk ran the cheap
    start; the floor must follow the costlier pace engine 1 measured."""
    s = Schedule(40, [0, 1])
    c0, c1 = s.fill()
    s.complete(c0.id, 0.0001 * c0.size)
    s.complete(c1.id, 0.02 * c1.size)
    assert s.min_chunk(0) <= 0.003 / (0.05 * 0.02)
    nxt = s.fill()
    assert nxt and all(c.size <= 10 for c in nxt)
    # different devices: an engine's own pace is its speed
    h = Schedule(40, [0, 1], heterogeneous=True)
    d0, d1 = h.fill()
    h.complete(d0.id, 0.0001 * d0.size)
    h.complete(d1.id, 0.02 * d1.size)
    assert h.min_chunk(0) > h.min_chunk(1)


def test_trial_chunks_are_the_whole_part_in_two_and_the_unrun_rest_goes_out_first():
    s = Schedule(1000, [0, 1], trial=True)
    first = s.fill()
    # each engine's part in two trial chunks sent at once: the second is queued
    # behind the first, so the engine works on while the first's result travels
    assert [(c.engine, c.start, c.stop) for c in first] == [
        (0, 0, 250),
        (1, 250, 500),
        (0, 500, 750),
        (1, 750, 1000),
    ]
    assert all(c.trial for c in first)
    assert s.calibrating(0) and s.calibrating(1)
    s.complete(first[0].id, 0.05, done=7)  # the engine stopped after 7 iterations
    assert (first[0].start, first[0].stop) == (0, 7)
    assert not s.calibrating(0)
    # engine 0 is busy with its second trial: its rest waits until enough trials
    # say whether the loop looks uniform (here both engines' first)
    assert s.fill() == []
    s.complete(first[1].id, 0.05 * 250 / 7)
    nxt = s.fill()
    assert nxt and nxt[0].engine == 0 and nxt[0].start == 7  # the rest, first
    for c in first[2:]:
        s.complete(c.id, 0.01 * c.size)  # ran whole
    while not s.finished:
        for c in s.fill():
            s.complete(c.id, 0.01 * c.size)
        for e in (0, 1):
            for c in s.outstanding(e):
                s.complete(c.id, 0.01 * c.size)
    assert covers(s.chunks, 1000)


def _after_stopped_trials(s: Schedule, pace: float) -> list[int]:
    """Drive ``s``: every trial stops after its first iteration (its budget
    spent), later chunks run whole at ``pace`` s per iteration; the sizes of
    the chunks after the trials."""
    trials = s.fill()
    assert trials and all(c.trial for c in trials)
    for c in trials:
        s.complete(c.id, pace, done=1)
    sizes = []
    while not s.finished:
        out = [c for e in s.alive for c in s.outstanding(e)] or s.fill()
        assert out
        for c in out:
            sizes.append(c.size)
            s.complete(c.id, pace * c.size)
        s.fill()
    assert covers(s.chunks, s.n)
    return sizes


def test_chunks_last_about_chunk_seconds_so_progress_stays_fine_grained():
    """A uniform loop of 0.5 s iterations on 2 engines (10 s each): after the
    trials, rests go out in pieces of about 1 s (2 iterations), not one 9.5 s
    chunk per engine; a long loop's pieces are a 1/PROGRESS_STEPS share of an
    engine's part instead; a fixed chunksize is what was asked for."""
    from gpucell.core.schedule import PROGRESS_STEPS

    sizes = _after_stopped_trials(Schedule(40, [0, 1], trial=True, heard=True), 0.5)
    assert max(sizes) <= 2 and len(sizes) >= 16, sizes

    sizes = _after_stopped_trials(Schedule(4000, [0, 1], trial=True, heard=True), 0.5)
    assert max(sizes) <= 2000 // PROGRESS_STEPS + 1  # 1000 s per engine
    assert len(sizes) < 3 * 2 * PROGRESS_STEPS, len(sizes)

    fixed = Schedule(40, [0, 1], mode="dynamic", chunksize=10)
    simulate(fixed, {0: 1.0, 1: 1.0}, lambda i: 0.5)
    assert {c.size for c in fixed.chunks} == {10}

    # a re-run of a uniform loop: static, each engine's block in ~1 s pieces,
    # in order; a short one stays one block per engine; asked-for static whole
    rerun = Schedule(40, [0, 1], hint=0.5, uniform=True)
    simulate(rerun, {0: 1.0, 1: 1.0}, lambda i: 0.5)
    assert rerun.mode == "static" and {c.size for c in rerun.chunks} == {2}
    mine = [(c.start, c.stop) for c in rerun.chunks if c.engine == 0]
    assert mine == [(i, i + 2) for i in range(0, 20, 2)]
    short = Schedule(40, [0, 1], hint=0.01, uniform=True)
    simulate(short, {0: 1.0, 1: 1.0}, lambda i: 0.01)
    assert [c.size for c in short.chunks] == [20, 20]
    asked = Schedule(40, [0, 1], mode="static", hint=0.5, uniform=True)
    simulate(asked, {0: 1.0, 1: 1.0}, lambda i: 0.5)
    assert [c.size for c in asked.chunks] == [20, 20]


def test_an_idle_engine_is_served_before_a_busy_one_queues_its_work():
    """4 iterations of 2 s on 2 engines, one trial each, both stopped after one
    iteration: engine 0 comes back first and takes its rest; when engine 1
    comes back its rest must go to it (idle), not be queued behind engine 0's
    (a 6 s cell instead of 4 s)."""
    s = Schedule(4, [0, 1], trial=True, heard=True)
    t0, t1 = s.fill()
    s.complete(t0.id, 2.0, done=1)
    (r0,) = s.fill()
    assert (r0.engine, r0.start, r0.stop) == (0, 1, 2)
    s.complete(t1.id, 2.0, done=1)
    got = s.fill()
    assert [(c.engine, c.start, c.stop) for c in got] == [(1, 3, 4)]


def test_running_trials_published_paces_give_the_verdict():
    """Paces published by trials still running count until they complete: 3
    that agree say run whole, before any trial is back; 3 that disagree say
    stop; fewer say nothing yet.  A trial that completes replaces its
    published pace with its measured one (never counted twice)."""
    s = Schedule(64, list(range(8)), trial=True)
    first = s.fill()
    assert s.verdict is None
    s.observe_trial(first[0].id, 1, 0.050)
    s.observe_trial(first[1].id, 1, 0.051)
    assert s.verdict is None  # 2 of the 3 needed
    s.observe_trial(first[2].id, 1, 0.052)
    assert s.verdict is True and s.looks_uniform
    s.complete(first[0].id, 0.050 * first[0].size)  # ran whole
    assert s._paced_count() == 3

    u = Schedule(64, list(range(8)), trial=True)
    trials = u.fill()
    for k, c in enumerate(trials[:3]):
        u.observe_trial(c.id, 1, 0.01 * (1 + 4 * k))  # 10, 50, 90 ms: uneven
    assert u.verdict is False and not u.looks_uniform
    u.observe_trial(trials[3].id, 0, 0.0)  # nothing measured: ignored
    u.observe_trial(10**6, 1, 0.01)  # no such chunk: ignored
    assert u._paced_count() == 3

    one = Schedule(10, [0], trial=True)
    (c, _) = one.fill()
    one.observe_trial(c.id, 2, 0.1)
    assert one.verdict is True  # a lone engine: nothing to balance
    mixed = Schedule(10, [0, 1], trial=True, heterogeneous=True)
    assert mixed.verdict is False  # devices differ: shares follow speeds
    assert Schedule(10, [0, 1]).verdict is None  # no trials, no verdict


@settings(max_examples=200, deadline=None)
@given(
    n=st.integers(1, 300),
    engines=st.integers(1, 4),
    cuts=st.lists(st.floats(0.0, 1.0), min_size=1, max_size=50),
)
def test_trial_chunks_cut_anywhere_still_cover_the_loop_once(n, engines, cuts):
    s = Schedule(n, list(range(engines)), trial=True)
    cuts = iter(cuts * 1000)
    while not s.finished:
        out = s.fill() or [c for e in s.alive for c in s.outstanding(e)]
        for c in out:
            trial = s.calibrating(c.engine)
            done = max(1, round(c.size * next(cuts))) if trial else None
            s.complete(c.id, 0.001 * c.size, done=done)
    assert covers(s.chunks, n)
    spans = sorted((c.start, c.stop) for c in s.chunks if c.state == "done")
    assert sum(b - a for a, b in spans) == n


@pytest.mark.parametrize(
    "kw",
    [
        {"mode": "guided"},
        {"mode": "static"},
        {"mode": "dynamic", "chunksize": 3},
        {"mode": "guided", "hint": 0.01, "uniform": True},  # would go static
        {"mode": "guided", "profile": [0.01] * 50},
    ],
)
def test_a_resumed_schedule_hands_out_only_the_missing_iterations(kw):
    kept = [(0, 10), (14, 30), (45, 50)]
    s = Schedule(50, [0, 1], kept=kept, **kw)
    assert s.done_iterations == 31
    handed: list[int] = []
    while not s.finished:
        chunks = s.fill()
        assert chunks
        for c in chunks:
            handed.extend(range(c.start, c.stop))
            s.complete(c.id, 0.01 * c.size)
    assert sorted(handed) == [*range(10, 14), *range(30, 45)]
    assert s.pending_ranges() == []


def test_missing_ranges_of_overlapping_and_unsorted_done_ranges():
    from gpucell.core.schedule import missing_ranges

    assert missing_ranges(10, [(4, 6), (0, 2), (5, 7)]) == [(2, 4), (7, 10)]
    assert missing_ranges(3, []) == [(0, 3)]
    assert missing_ranges(3, [(0, 3)]) == []


def _cheap_first_run(trial_paces: list[float], later_pace: float) -> Schedule:
    """A first run of 10^7 cheap iterations on 2 engines: each trial chunk stops
    after 50 ms at the pace given (the engine's first pays warm-up), later
    chunks run at ``later_pace`` (the unstamped program, faster per iteration).
    The engine that asks next is the one whose outstanding chunks end first."""
    s = Schedule(10**7, [0, 1], trial=True, overhead=0.004)
    paces = iter(trial_paces)
    clock = {0: 0.0, 1: 0.0}
    while not s.finished:
        s.fill()
        e = min((e for e in (0, 1) if s.outstanding(e)), key=lambda e: clock[e])
        c = s.outstanding(e)[0]
        if c.trial:
            pace = next(paces)
            done = min(c.size, int(0.05 / pace))
            s.complete(c.id, done * pace, done=done)
            clock[e] += done * pace + 0.004
        else:
            s.complete(c.id, c.size * later_pace)
            clock[e] += c.size * later_pace + 0.004
    assert covers(s.chunks, 10**7)
    return s


def test_a_cheap_loop_whose_trials_agree_ends_without_a_tail():
    """Later chunks run faster per iteration than the trials did (unstamped):
    that is no sign of uneven costs, so each engine finishes its own part."""
    s = _cheap_first_run([3.6e-7, 3.4e-7, 3.5e-7, 3.3e-7], later_pace=7e-8)
    assert len(s.chunks) <= 8, [(c.engine, c.start, c.size) for c in s.chunks]


def test_trial_rests_of_a_cheap_loop_are_not_cut_below_the_overhead_floor():
    """Trials that disagree (warm-up made the first slow) make guided cut the
    rests by their pace, but never into a tail of tiny chunks, each of which
    costs a round trip."""
    s = _cheap_first_run([5.3e-7, 3.4e-7, 3.5e-7, 3.3e-7], later_pace=7e-8)
    assert len(s.chunks) <= 24, [(c.engine, c.start, c.size) for c in s.chunks]
    assert min(c.size for c in s.chunks) >= 1000, sorted(c.size for c in s.chunks)


# -- first runs of uneven loops: a provisional profile from the trials ---------


def _first_run(sim, cost, k: int, *, provisional: bool = True, seed: int = 0, **kw):
    """A first run as the dispatcher drives it on the kernel's host (trial
    chunks stop at their budget, publish their pace, come back with each
    iteration's seconds: ``sim_schedule.simulate``), with or without
    the provisional profile.  Returns (schedule, makespan)."""
    import gpucell.core.schedule_cost as S  # where the limit is read

    saved = S.PROVISIONAL_MAX
    S.PROVISIONAL_MAX = saved if provisional else 0
    try:
        kw.setdefault("heard", True)
        s = Schedule(len(cost), list(range(k)), trial=True, overhead=0.004, **kw)
        span = sim.simulate(
            s, cost, (1.0,) * k, random.Random(seed), rtt=0.004, per_chunk=0.0
        )
        return s, span
    finally:
        S.PROVISIONAL_MAX = saved


@pytest.mark.parametrize("k", [8, 16])
def test_a_first_run_of_rising_costs_is_scheduled_by_the_trials_estimate(bench_sim, k):
    """Iteration i costs i x 5 ms (64 of them): the trials find it uneven and
    the rest goes out by an estimate interpolated between what they measured,
    the dearest first, nothing queued behind a running chunk at the end.  On
    the simulated engines (bench/sim_schedule.py's first run) it ends closer to
    the ideal than by the trials' paces alone (measured on 8 / 16 real
    engines: 0.936 -> 0.952 and 0.883 -> 0.910)."""
    cost = [i * 0.005 for i in range(64)]
    ideal = sum(cost) / k
    # (no hand-backs: they make up for much of a poor cut at the end, which
    # would hide what the estimate does)
    with_estimate = [_first_run(bench_sim, cost, k, seed=sd) for sd in range(3)]
    without = [
        _first_run(bench_sim, cost, k, seed=sd, provisional=False) for sd in range(3)
    ]
    assert all(s.provisional and s.profiled for s, _ in with_estimate)
    assert not any(s.provisional for s, _ in without)
    eff = ideal / statistics.fmean(m for _, m in with_estimate)
    eff_without = ideal / statistics.fmean(m for _, m in without)
    assert eff > eff_without + 0.004, (eff, eff_without)
    # (the simulation's iterations vary by +-10% each: 0.966 and 0.868 here;
    # trials wait for the verdict iteration by iteration, as on the engines)
    assert eff >= (0.95 if k == 8 else 0.86), eff


def test_no_estimate_where_the_trials_agree_or_cannot_tell(bench_sim):
    """A uniform loop (trials agree), devices that differ, a fixed chunk size,
    a resumed loop, a real profile or a loop too long to re-estimate: the
    schedule goes on as it would without trials' stamps."""
    import gpucell.core.schedule_cost as S  # where the limit is read

    sim = bench_sim
    linear = [i * 0.005 for i in range(64)]
    s, _ = _first_run(sim, [0.05] * 64, 8)
    assert not s.provisional
    mixed, _ = _first_run(sim, linear, 4, heterogeneous=True)
    assert not mixed.provisional
    fixed, _ = _first_run(sim, linear, 4, chunksize=2)
    assert not fixed.provisional
    kept, _ = _first_run(sim, linear, 4, kept=[(0, 8)])
    assert not kept.provisional
    real, _ = _first_run(sim, linear, 4, profile=linear)
    assert real.profiled and not real.provisional
    n = S.PROVISIONAL_MAX + 1
    long, _ = _first_run(sim, [i * 1e-5 for i in range(n)], 4)
    assert not long.provisional


def test_interpolate_between_known_values_and_flat_beyond():
    from gpucell.core.schedule import interpolate

    assert interpolate(6, {1: 1.0, 3: 3.0}) == [1.0, 1.0, 2.0, 3.0, 3.0, 3.0]
    assert interpolate(3, {}) == [0.0, 0.0, 0.0]
    assert interpolate(3, {0: 2.0, 7: 9.0}) == [2.0, 2.0, 2.0]  # (7 is out)
    assert interpolate(4, {3: 1.0, 0: 4.0}) == [4.0, 3.0, 2.0, 1.0]


@settings(max_examples=150, deadline=None)
@given(
    costs=st.lists(st.floats(0.0, 0.2), min_size=1, max_size=120),
    k=st.integers(1, 5),
    heard=st.booleans(),
    order=st.randoms(use_true_random=False),
    kill=st.one_of(st.none(), st.integers(0, 4)),
)
def test_a_provisional_profile_still_runs_every_iteration_once(
    costs, k, heard, order, kill
):
    """Trials cut anywhere, published paces, stamps, chunks completed in any
    order and an engine lost midway: with the estimate switched on mid-run,
    every iteration is still handed out exactly once (re-runs of lost work
    aside) and the loop finishes."""
    s = Schedule(len(costs), list(range(k)), trial=True, heard=heard, overhead=0.001)

    def finish(c, its):
        if not c.trial:
            s.complete(c.id, sum(its))
            return len(its)
        done = order.randint(1, c.size)
        if order.random() < 0.5:
            s.observe_trial(c.id, done, sum(its[:done]) or 1e-9)
        s.complete(c.id, sum(its[:done]), done=done, costs=its[:done])
        return done

    handed = _drive(s, costs, order, kill, finish)
    assert covers(s.chunks, len(costs))
    assert handed == [1] * len(costs)


def _drive(s, costs, order, kill, finish, check=lambda c: None):
    """Run schedule ``s`` to the end: every chunk handed out is counted, a
    running one is picked at random, engine ``kill`` (if any) is lost once
    midway, and ``finish(chunk, its)`` completes the picked chunk and says how
    many of its iterations ran (the rest went back).  Returns how many times
    each iteration was handed out, less the times it came back unrun."""
    handed = [0] * len(costs)
    killed = False
    guard = 0
    while not s.finished:
        guard += 1
        assert guard < 10_000
        for c in s.fill():
            check(c)
            handed[c.start : c.stop] = [h + 1 for h in handed[c.start : c.stop]]
        running = [c for e in s.alive for c in s.outstanding(e)]
        assert running, "nothing in flight and the loop is not finished"
        c = order.choice(running)
        its = costs[c.start : c.stop]
        if kill is not None and not killed and kill < len(s.engines):
            if len(s.alive) > 1 and order.random() < 0.1 and c.engine == kill:
                killed = True
                for lost in s.lose_engine(kill):
                    for i in range(lost.start, lost.stop):
                        handed[i] -= 1
                continue
        done = finish(c, its)
        for i in range(c.start + done, c.start + len(its)):
            handed[i] -= 1
    return handed


def test_a_profiled_schedule_queues_nothing_once_one_dearest_iteration_each_is_left():
    """With a profile (a re-run's or the trials' estimate), once the work not
    yet handed out is at most one dearest iteration per engine, an engine
    with a chunk running gets no second one queued behind it: that one could
    wait there while another engine idles (16 real engines, i x 5 ms: a
    re-run's efficiency 0.890 -> 0.92 with this rule)."""
    cost = [i * 0.005 for i in range(64)]
    k = 16
    # (a 1 ms dispatch overhead, as measured on a quiet host: the overhead
    # floor alone would stop queueing only later)
    s = Schedule(64, list(range(k)), profile=cost, overhead=0.001)
    assert s.profiled
    rng = random.Random(1)
    near_end = 0
    while not s.finished:
        window = bool(s._free) and s._remaining_cost() < k * s._dearest()
        held = {e: len(s.outstanding(e)) for e in s.alive}
        for c in s.fill():
            if window:
                near_end += 1
                assert held[c.engine] == 0, (c, held)
        running = [c for e in s.alive for c in s.outstanding(e)]
        c = rng.choice(running)
        s.complete(c.id, sum(cost[c.start : c.stop]))
    assert near_end > 0  # (the end was reached with work still to hand out)


# -- hand-backs: a running chunk stops early for idle engines ------------------------


@settings(max_examples=200, deadline=None)
@given(
    costs=st.lists(st.floats(0.0, 0.2), min_size=1, max_size=120),
    k=st.integers(1, 5),
    kind=st.sampled_from(["first", "hint", "profile", "guided", "resumed"]),
    order=st.randoms(use_true_random=False),
    kill=st.one_of(st.none(), st.integers(0, 4)),
)
def test_handed_back_rests_still_run_every_iteration_once(costs, k, kind, order, kill):
    """Chunks stopped early anywhere to hand their rest back (and trials cut
    short, and an engine lost midway), completed in any order, in a first
    run, a uniform re-run's static split, a profiled or a plain guided
    schedule, or a resumed one: every iteration is still handed out exactly
    once (re-runs of lost work aside) and the loop finishes."""
    n = len(costs)
    kw: dict = {
        "first": {"trial": True, "heard": True},
        "hint": {"hint": 0.01, "uniform": True},
        "profile": {"profile": costs},
        "guided": {},
        "resumed": {"kept": [(0, n // 2)]},
    }[kind]
    s = Schedule(n, list(range(k)), overhead=0.001, stealing=True, **kw)
    assert s.stealing
    expect = [0 if kind == "resumed" and i < n // 2 else 1 for i in range(n)]

    def stoppable(c):
        assert c.stoppable

    def finish(c, its):
        back = c.size >= 2 and order.random() < 0.3
        if not (back or c.trial):
            s.complete(c.id, sum(its))
            return len(its)
        done = order.randint(1, c.size - 1) if back else order.randint(1, c.size)
        s.complete(
            c.id,
            sum(its[:done]),
            done=done,
            costs=its[:done] if c.trial else None,
            handed_back=back,
        )
        return done

    handed = _drive(s, costs, order, kill, finish, stoppable)
    assert handed == expect
    assert covers([c for c in s.chunks if c.state == "done"], n) or kind == "resumed"


def test_a_handed_back_rest_is_shared_among_the_engines():
    """A uniform re-run's static split on 4 engines: three finish their 10
    iterations, the fourth hands back the 8 it had not started.  Those go out
    as one piece per engine (not one iteration per round trip, as a uniform
    loop's fair count would give an engine that did its part), and the
    hand-back threshold follows the measured dispatch overhead."""
    s = Schedule(40, [0, 1, 2, 3], hint=0.05, uniform=True, stealing=True)
    s.overhead = 0.003
    first = {c.engine: c for c in s.fill()}
    assert [c.size for c in first.values()] == [10] * 4
    assert s.idle_engines() == []
    for e in (1, 2, 3):
        s.complete(first[e].id, 0.5)
    assert s.idle_engines() == [1, 2, 3]
    assert s.hand_back_seconds() == pytest.approx(4 * 0.003)
    s.complete(first[0].id, 0.1, done=2, handed_back=True)
    pieces = s.fill()
    assert sorted((c.start, c.stop) for c in pieces) == [
        (2, 4),
        (4, 6),
        (6, 8),
        (8, 10),
    ]
    assert {c.engine for c in pieces} == {0, 1, 2, 3}
    # pieces last at least HAND_BACK_PIECE dispatch overheads: cheap
    # iterations are not sent one by one
    t = Schedule(4000, [0, 1], hint=1e-4, uniform=True, stealing=True)
    t.overhead = 0.003
    a, b = t.fill()
    t.complete(b.id, 0.2)
    t.complete(a.id, 0.01, done=100, handed_back=True)
    sizes = [c.size for c in t.fill()]
    assert min(sizes) >= 2 * 0.003 / 1e-4 and sum(sizes) == 1900


def test_no_hand_backs_where_the_chunks_were_asked_for():
    """A fixed chunk size, a static or dynamic schedule asked for: chunks are
    what was asked, so none is stoppable, and a chunk said to be handed back
    is taken as run whole (it cannot have stopped)."""
    for kw in (
        {"chunksize": 4},
        {"mode": "static"},
        {"mode": "dynamic"},
        {"mode": "static", "hint": 0.01},
    ):
        s = Schedule(20, [0, 1], stealing=True, **kw)
        assert not s.stealing, kw
        c = s.fill()[0]
        size = c.size
        assert not c.stoppable
        s.complete(c.id, 0.01, done=1, handed_back=True)
        assert c.size == size and c.state == "done"
    assert not Schedule(20, [0, 1]).stealing  # (off unless the dispatcher asks)


@pytest.mark.parametrize(
    ("name", "gain"),
    [("5 spike k=2", 0.08), ("3 uniform noisy", 0.03), ("1 linear64 k=16", 0.02)],
)
def test_hand_backs_rebalance_a_first_runs_end(bench_sim, name, gain):
    """On the simulated engines (bench/sim_schedule.py), a first run whose
    uniform verdict sent each engine its whole part: one rare costly
    iteration, or an engine 15% slower than its equals, held the rest of its
    part while the others idled (0.725, 0.925); with hand-backs the rest is
    shared out (0.843, 0.969).  Rising costs on 16 engines: 0.875 -> 0.916."""
    case = {c.name: c for c in bench_sim._cases()}[name]
    k = len(case.factors)
    ideal = sum(case.cost) / k

    def eff(stealing: bool) -> float:
        spans = []
        for seed in range(4):
            s = Schedule(
                len(case.cost),
                list(range(k)),
                trial=True,
                heard=True,
                stealing=stealing,
            )
            spans.append(
                bench_sim.simulate(s, case.cost, case.factors, random.Random(seed))
            )
        return ideal / statistics.fmean(spans)

    with_, without = eff(True), eff(False)
    assert with_ >= without + gain, (with_, without)


@pytest.mark.parametrize("name", ["3 uniform k=2", "1 linear64 k=8", "4 heavy k=4"])
def test_hand_backs_cost_nothing_where_the_end_is_balanced(bench_sim, name):
    case = {c.name: c for c in bench_sim._cases()}[name]
    k = len(case.factors)
    spans = {}
    for stealing in (False, True):
        out = []
        for seed in range(4):
            s = Schedule(
                len(case.cost),
                list(range(k)),
                trial=True,
                heard=True,
                stealing=stealing,
            )
            out.append(
                bench_sim.simulate(s, case.cost, case.factors, random.Random(seed))
            )
        spans[stealing] = statistics.fmean(out)
    assert spans[True] <= spans[False] * 1.01, spans
