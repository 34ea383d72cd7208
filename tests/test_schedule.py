"""The schedule is pure arithmetic: property-test it with simulated engines."""

from __future__ import annotations

import heapq

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gpucell.schedule import DONE, Schedule, covers


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
    assert max(sizes) > 150  # then large chunks once speeds are known


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
    from gpucell.provenance import ChunkRecord, LastRun

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
