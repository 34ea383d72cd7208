"""The pure run state, driven by events alone: no cluster, no clock, no fakes.

Unit tests provoke each rule (a misplaced reply, a killer iteration, out of
memory, a hung engine, the verdict, the hand-back flag, a stop); property
tests (hypothesis) drive whole runs with random event orders and check what
a run promises: every iteration ends in exactly one result or the run fails,
nothing is merged twice, a lost chunk is always re-run, a stop ends the run.
"""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from gpucell.core.run_events import (
    Blame,
    Cancel,
    Cancelled,
    ChunkFailed,
    Completed,
    EngineBack,
    EngineGone,
    EngineStalled,
    Fail,
    Failed,
    FailUnlessRestarting,
    Fill,
    Finish,
    Forget,
    HandBack,
    Instruction,
    Keep,
    Kill,
    MarkDead,
    PaceHeard,
    Record,
    Reload,
    Replied,
    Send,
    Sent,
    Stop,
    Stopping,
    Tick,
    TrialsHeard,
    Verdict,
    VerdictGiven,
    Warn,
)
from gpucell.core.run_state import HUNG_AFTER, RunState
from gpucell.core.schedule import Schedule
from gpucell.core.states import CANCELLED, DONE, FAILED, LOST, RUNNING
from gpucell.errors import CellTimeout, ClusterError, ClusterStopped, EnginesLost


def timing(start: int, done: int, compute: float = 0.01, **kw: Any) -> Any:
    """A reply's Timing, as the engine writes it."""
    t = {
        "start": 1.0,
        "entered": 1.0,
        "end": 1.0 + compute,
        "compute": compute,
        "starts": [],
        "median": None,
        "done": done,
        "handed_back": False,
        "unstamped": True,
        "host": "h",
        "pid": 1,
        "first": start,
        "cached": None,
        "drew": [],
    }
    t.update(kw)
    return t


def state_for(n: int = 20, engines: tuple[int, ...] = (0, 1), **kw: Any) -> RunState:
    kw.setdefault("mode", "dynamic")
    kw.setdefault("chunksize", 5)
    channel = kw.pop("channel", False)
    near = set(kw.pop("near", ()))
    return RunState(Schedule(n, list(engines), **kw), channel=channel, near=near)


def send(state: RunState, now: float = 0.0) -> list[Send]:
    """Fill and say the chunks left (what the dispatcher does each turn)."""
    out = state.handle(Fill())
    sends = [i for i in out if isinstance(i, Send)]
    if sends:
        state.handle(Sent(tuple(s.chunk.id for s in sends), now))
    return sends


def reply(state: RunState, cid: int, done: int | None = None, **kw: Any):
    c = state.flights[cid].chunk
    k = c.size if done is None else done
    payload = list(range(c.start, c.start + k))
    return state.handle(Replied(cid, "ok", payload, timing(c.start, k, **kw), 0.0))


def kinds(out: list[Instruction]) -> list[type]:
    return [type(i) for i in out]


# -- each rule -------------------------------------------------------------------


def test_a_whole_run_by_events_gives_each_iteration_once_in_order() -> None:
    state = state_for()
    while not state.finished:
        for s in send(state):
            out = reply(state, s.chunk.id)
            assert kinds(out) == [Record, Keep]
            assert out[0].state == DONE
    assert kinds(state.handle(Completed())) == [Finish]
    assert state.status == "ok"
    assert [x for part in state.in_order() for x in part] == list(range(20))


def test_each_engine_keeps_its_next_chunk_queued_and_the_first_is_timed() -> None:
    state = state_for(n=200, hint=0.01)  # measured paces: two deep at once
    sends = send(state, now=5.0)
    assert sorted(s.chunk.engine for s in sends) == [0, 0, 1, 1]
    timed = {cid: f.timed_from for cid, f in state.flights.items()}
    # the first chunk per engine measures a round trip, the queued one cannot
    assert sorted(t is not None for t in timed.values()) == [False, False, True, True]
    # an engine whose program and inputs ride its first chunk is not timed
    state = state_for(n=200, hint=0.01)
    out = state.handle(Fill(unset=frozenset({0, 1})))
    state.handle(Sent(tuple(i.chunk.id for i in out if isinstance(i, Send)), 0.0))
    assert all(f.timed_from is None for f in state.flights.values())


def test_a_reply_for_another_chunk_fails_the_run_unmerged() -> None:
    state = state_for()
    s = send(state)[0]
    c = s.chunk
    out = state.handle(Replied(c.id, "ok", [], timing(c.start + 1, c.size), 0.0))
    assert kinds(out) == [Fail]
    assert isinstance(out[0].error, ClusterError)
    assert "nothing was merged" in str(out[0].error)
    assert state.results == {}


def test_a_lost_engine_s_chunks_are_recorded_lost_and_re_run_on_the_other() -> None:
    state = state_for()
    send(state)
    on_1 = sorted(cid for cid, f in state.flights.items() if f.engine == 1)
    lost = sum(f.chunk.size for f in state.flights.values() if f.engine == 1)
    out = state.handle(EngineGone(1))
    m = len(on_1)
    assert kinds(out) == [MarkDead] + [Forget] * m + [Record] * m + [Warn]
    assert [i.chunk for i in out if isinstance(i, Forget)] == on_1
    assert {i.state for i in out if isinstance(i, Record)} == {LOST}
    assert f"engine 1 died; re-running its {lost} iteration(s)" in out[-1].text
    while not state.finished:
        assert all(s.chunk.engine == 0 for s in send(state))
        for cid in list(state.flights):
            reply(state, cid)
    assert [x for part in state.in_order() for x in part] == list(range(20))


def test_every_engine_lost_fails_unless_one_is_restarting() -> None:
    state = state_for()
    send(state)
    state.handle(EngineGone(0))
    out = state.handle(EngineGone(1))
    assert isinstance(out[-1], FailUnlessRestarting)
    assert "iterations 0-19 never completed" in str(out[-1].error)
    # a restarted engine takes the rest
    out = state.handle(EngineBack(7, replaces=1, device="CPU", near=False))
    assert kinds(out) == [Warn] and "restarted as engine 7" in out[0].text
    assert {s.chunk.engine for s in send(state)} == {7}


def test_an_iteration_that_ends_two_engines_is_blamed_not_retried() -> None:
    state = state_for(n=4, engines=(0, 1, 2), chunksize=4, mode="dynamic")
    send(state)
    state.handle(EngineGone(0))  # its chunk 0-3 is re-run one iteration each
    rerun = send(state)
    first = next(s.chunk for s in rerun if s.chunk.start == 0)
    out = state.handle(EngineGone(first.engine))
    assert kinds(out)[-2:] == [Blame, Fail]
    assert "iteration 0 ended engine 0 and then engine" in str(out[-1].error)


def test_an_iteration_is_not_blamed_for_a_device_that_keeps_dying() -> None:
    """Engine 0 dies, is restarted on its device as engine 5, which dies too
    while re-running iteration 0: the device, not the iteration, is the
    common cause, so the iteration is re-run, not blamed (the restart budget
    is what stops a dying device)."""
    state = state_for(n=4, engines=(0,), chunksize=4, mode="dynamic")
    send(state)
    state.handle(EngineGone(0))
    state.handle(EngineBack(engine=5, replaces=0, device="cpu0", near=False))
    rerun = send(state)
    zero = next(s.chunk for s in rerun if s.chunk.start == 0)
    assert zero.engine == 5 and zero.size == 1
    out = state.handle(EngineGone(5))
    assert Blame not in kinds(out) and Fail not in kinds(out), out
    assert any(isinstance(i, Warn) and "engine 5 died" in i.text for i in out)


def test_a_chunk_lost_more_often_than_retries_fails_the_run() -> None:
    state = state_for(n=40, engines=(0, 1, 2, 3, 4), chunksize=40)
    state.retries = 0
    send(state)
    state.handle(EngineGone(0))
    for cid in list(state.flights):  # the others are free for the re-run
        reply(state, cid)
    out = state.handle(Fill())
    assert kinds(out) == [Fail]
    assert "were lost 1 times" in str(out[0].error)


def test_out_of_memory_retries_same_engine_then_the_freest_then_fails() -> None:
    state = state_for(n=3, engines=(0, 1, 2), chunksize=1)
    c = next(s.chunk for s in send(state) if s.chunk.engine == 0)
    for cid in [k for k, f in state.flights.items() if f.engine != 0]:
        reply(state, cid)  # engines 1 and 2 are idle
    oom = {"oom": "CUDA out of memory", "iteration": 0}

    def fail_once() -> list[Instruction]:
        return state.handle(
            Replied(c.id, "error", oom, timing(c.start, 0), 0.0, {1: 5.0, 2: 9.0})
        )

    out = fail_once()
    assert kinds(out) == [Warn, Record] and "on the same engine" in out[0].text

    def again(engine: int) -> None:
        nonlocal c
        (x,) = send(state)  # the same iterations (a new chunk) on ``engine``
        assert (x.chunk.start, x.chunk.stop, x.chunk.engine) == (0, 1, engine)
        c = x.chunk

    again(0)
    out = fail_once()
    assert "on engine 2" in out[0].text  # the most free memory
    again(2)
    out = fail_once()
    assert kinds(out) == [Record, ChunkFailed] and out[0].state == FAILED


def test_an_unloaded_reply_goes_to_the_same_engine_again_not_as_an_attempt() -> None:
    state = state_for(n=5, chunksize=5)
    c = send(state)[0].chunk
    out = state.handle(Replied(c.id, "unloaded", None, timing(c.start, 0), 0.0))
    assert kinds(out) == [Reload] and out[0].engine == c.engine
    again = [s.chunk for s in send(state)]
    assert [(a.start, a.stop, a.engine, a.attempt) for a in again] == [
        (c.start, c.stop, c.engine, 0)
    ]


def test_an_engine_is_overdue_only_far_past_the_slowest_pace() -> None:
    state = state_for(n=40)
    send(state, now=0.0)
    assert state.overdue(0, now=10**6) is None  # nothing measured: no bound
    done = next(cid for cid, f in state.flights.items() if f.engine == 1)
    reply(state, done, compute=0.5)  # 0.1 s per iteration
    assert state.overdue(0, now=HUNG_AFTER - 1) is None
    why = state.overdue(0, now=HUNG_AFTER + 1)
    assert why is not None and "more than 20x" in why
    out = state.handle(EngineStalled(0, why))
    assert kinds(out)[:3] == [Kill, Warn, MarkDead]


def test_the_verdict_is_given_once_from_the_trials_paces() -> None:
    state = state_for(
        n=400,
        engines=(0, 1),
        mode="guided",
        chunksize=None,
        trial=True,
        heard=True,
        channel=True,
        near={0, 1},
    )
    sends = send(state)
    assert all(s.budget is not None for s in sends)  # trials
    assert state.awaiting_verdict(now=0.01)
    for c in state.listening():
        assert state.handle(PaceHeard(c.id, 5, 0.05, True)) == []
    assert state.listening() == []
    out = state.handle(TrialsHeard())
    assert out == [Verdict(True)]  # equal paces: the loop looks uniform
    state.handle(VerdictGiven())
    assert state.handle(TrialsHeard()) == []
    assert not state.awaiting_verdict(now=0.01)


def test_the_hand_back_flag_is_raised_for_an_idle_engine_and_lowered_after() -> None:
    state = state_for(
        n=8,
        engines=(0, 1),
        mode="guided",
        chunksize=None,
        stealing=True,
        channel=True,
        near={0, 1},
        hint=1.0,
    )
    send(state)
    assert state.handle(Tick()) == []  # every engine busy
    out: list[Instruction] = []
    while not out:  # engine 1 works through the rest; engine 0 holds its chunks
        for cid in [k for k, f in state.flights.items() if f.engine == 1]:
            reply(state, cid)
        send(state)
        out = state.handle(Tick())
    assert kinds(out) == [HandBack] and out[0].threshold is not None
    assert state.sched.idle_engines() == [1]
    assert state.handle(Tick()) == []  # raised once
    for cid in list(state.flights):
        reply(state, cid)
    assert state.handle(Tick()) == [HandBack(None)]


def test_a_stop_cancels_what_is_in_flight_and_ends_the_run() -> None:
    state = state_for()
    send(state)
    out = state.handle(Stop("timeout", 3.0))
    assert kinds(out) == [Cancel, Finish, Fail]
    assert isinstance(out[2].error, CellTimeout)
    assert "--timeout 3 s reached after 0 of 20" in str(out[2].error)
    assert state.status == "timeout"
    out = state.handle(Cancelled())
    assert {i.state for i in out if isinstance(i, Record)} == {CANCELLED}
    assert not state.flights
    assert not any(c.state == RUNNING for c in state.sched.chunks)
    state = state_for()
    send(state)
    out = state.handle(Stop("interrupt"))
    assert isinstance(out[2].error, KeyboardInterrupt)
    assert state.handle(Failed()) == [Cancel(), Finish("error")]


def test_a_stopped_cluster_ends_the_run_and_forgets_its_tasks() -> None:
    state = state_for()
    send(state)
    m = len(state.flights)
    out = state.handle(Stopping())
    assert kinds(out) == [Forget] * m + [Fail]
    assert isinstance(out[-1].error, ClusterStopped)
    assert not state.flights


# -- random event orders -------------------------------------------------------------

EVENTS = ["reply"] * 10 + ["gone", "stop", "unloaded", "oom", "back", "partial"]


def drive(data: st.DataObject, state: RunState) -> tuple[list[Any], Any]:
    """Play a run: after each turn's sends, one random event.  Returns every
    instruction in order (with the turn's index) and how it ended (None: ok)."""
    log: list[tuple[int, Instruction]] = []
    dead: set[int] = set()
    fresh = 100

    def tell(event: Any) -> list[Instruction]:
        out = state.handle(event)
        log.extend((len(log), i) for i in out)
        return out

    def failure(out: list[Instruction]) -> Any:
        return next(
            (
                i
                for i in out
                if isinstance(i, Fail | FailUnlessRestarting | ChunkFailed)
            ),
            None,
        )

    for _turn in range(600):
        out = tell(Fill())
        if (f := failure(out)) is not None:
            return log, f
        sends = [i for i in out if isinstance(i, Send)]
        assert not {s.chunk.engine for s in sends} & dead  # no work to the dead
        if sends:
            tell(Sent(tuple(s.chunk.id for s in sends), 0.0))
        if state.finished:
            tell(Completed())
            return log, None
        assert state.flights, "nothing in flight and the loop is not finished"
        kind = data.draw(st.sampled_from(EVENTS))
        cid = data.draw(st.sampled_from(sorted(state.flights)))
        c = state.flights[cid].chunk
        if kind in ("reply", "partial"):
            done = c.size
            if kind == "partial" and c.trial:
                done = data.draw(st.integers(1, c.size))
            out = tell(
                Replied(
                    cid,
                    "ok",
                    list(range(c.start, c.start + done)),
                    timing(c.start, done),
                    0.0,
                )
            )
        elif kind == "gone":
            eid = data.draw(st.sampled_from(state.sched.alive))
            dead.add(eid)
            out = tell(EngineGone(eid))
        elif kind == "back" and dead:
            fresh += 1
            out = tell(EngineBack(fresh, replaces=min(dead), device="CPU", near=False))
        elif kind == "stop":
            out = tell(Stop("interrupt"))
            assert kinds(out) == [Cancel, Finish, Fail]
            tell(Cancelled())
            return log, out[-1]
        elif kind == "unloaded":
            out = tell(Replied(cid, "unloaded", None, timing(c.start, 0), 0.0))
        elif kind == "oom":
            oom = {"oom": "out of memory", "iteration": c.start}
            out = tell(Replied(cid, "error", oom, timing(c.start, 0), 0.0))
        if (f := failure(out)) is not None:
            if isinstance(f, FailUnlessRestarting):
                assert not state.sched.alive
            return log, f
    raise AssertionError("the run did not end in 600 turns")


def check_run(state: RunState, log: list[Any], end: Any, n: int) -> None:
    records = [(k, i) for k, i in log if isinstance(i, Record)]
    done = sorted(
        (i.chunk.start, i.chunk.start + i.timing["done"])
        for _k, i in records
        if i.state == DONE
    )
    # nothing merged twice: done ranges never overlap, one result per chunk
    for (_a, b), (c, _d) in zip(done, done[1:], strict=False):
        assert b <= c
    assert len(state.results) == len(done)
    if end is None:
        # every iteration in exactly one result, in order
        assert state.status == "ok"
        assert [x for part in state.in_order() for x in part] == list(range(n))
        # a lost chunk is always re-run (after it was lost)
        for k, lost in records:
            if lost.state != LOST:
                continue
            again = [
                (i.chunk.start, i.chunk.start + i.timing["done"])
                for j, i in records
                if j > k and i.state == DONE
            ]
            for it in range(lost.chunk.start, lost.chunk.stop):
                assert any(a <= it < b for a, b in again), (it, lost.chunk)
    else:
        # or the run fails, with nothing returned as a whole
        assert isinstance(end, Fail | FailUnlessRestarting | ChunkFailed)
        if isinstance(end, Fail):
            assert isinstance(end.error, EnginesLost | KeyboardInterrupt)
    if isinstance(end, Fail) and isinstance(end.error, KeyboardInterrupt):
        # a stop ends the run: nothing in flight, no chunk left running
        assert state.status == "interrupted"
        assert not state.flights
        assert not any(c.state == RUNNING for c in state.sched.chunks)


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    data=st.data(),
    n=st.integers(1, 60),
    k=st.integers(1, 4),
    mode=st.sampled_from(["dynamic", "guided", "static"]),
    chunksize=st.sampled_from([None, 1, 3, 7]),
)
def test_random_event_orders_keep_the_run_s_promises(
    data: st.DataObject, n: int, k: int, mode: str, chunksize: int | None
) -> None:
    state = RunState(
        Schedule(n, list(range(k)), mode=mode, chunksize=chunksize), retries=2
    )
    log, end = drive(data, state)
    check_run(state, log, end, n)


@settings(max_examples=100, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(data=st.data(), n=st.integers(1, 80), k=st.integers(1, 4))
def test_random_event_orders_with_trials_that_stop_early(
    data: st.DataObject, n: int, k: int
) -> None:
    """Trials come back having run part of their chunk: the rest is cut again."""
    state = RunState(
        Schedule(n, list(range(k)), trial=True, heard=True),
        retries=2,
        channel=True,
        near=set(range(k)),
    )
    log, end = drive(data, state)
    check_run(state, log, end, n)


@pytest.mark.parametrize("retries", [0, 2])
def test_every_engine_dying_in_turn_fails_or_completes(retries: int) -> None:
    """Engines dying one after another, each after its first reply."""
    state = state_for(n=30, engines=(0, 1, 2), chunksize=3)
    state.retries = retries
    end = None
    for victim in (0, 1, 2):
        sends = send(state)
        if sends:
            reply(state, next(iter(state.flights)))
        out = state.handle(EngineGone(victim))
        end = next((i for i in out if isinstance(i, Fail | FailUnlessRestarting)), None)
        if end is not None:
            break
    assert end is not None and isinstance(end.error, EnginesLost)


# -- queued chunks (an engine's next chunk sent before its current one ends) ---------


def queued_state(n: int = 200, engines: tuple[int, ...] = (0, 1)) -> RunState:
    """Measured paces: every engine holds a chunk running and one queued."""
    state = state_for(n=n, engines=engines, hint=0.01)
    sends = send(state)
    for e in engines:
        assert sum(s.chunk.engine == e for s in sends) == 2
    return state


def test_a_queued_chunk_on_a_lost_engine_is_re_run_on_another() -> None:
    state = queued_state()
    mine = sorted(
        (f.chunk.start, f.chunk.stop) for f in state.flights.values() if f.engine == 0
    )
    out = state.handle(EngineGone(0))
    lost = sorted((i.chunk.start, i.chunk.stop) for i in out if isinstance(i, Record))
    assert lost == mine  # the running chunk and the queued one, both lost
    assert sum(isinstance(i, Forget) and i.lost for i in out) == 2
    while not state.finished:
        send(state)
        assert all(f.engine == 1 for f in state.flights.values())
        reply(state, min(state.flights))
    state.handle(Completed())
    assert [x for part in state.in_order() for x in part] == list(range(200))


def test_a_stop_cancels_queued_chunks_too() -> None:
    state = queued_state()
    m = len(state.flights)
    assert m == 4
    out = state.handle(Stop("interrupt"))
    assert kinds(out) == [Cancel, Finish, Fail]
    out = state.handle(Cancelled())
    assert [i.state for i in out if isinstance(i, Record)] == [CANCELLED] * m
    assert not state.flights
    assert not any(c.state == RUNNING for c in state.sched.chunks)
    assert not state.results


def test_a_queued_chunk_answering_after_its_engine_was_lost_is_not_merged() -> None:
    state = queued_state()
    queued = max(k for k, f in state.flights.items() if f.engine == 0)
    c = state.flights[queued].chunk
    state.handle(EngineGone(0))
    late = Replied(
        queued, "ok", list(range(c.start, c.stop)), timing(c.start, c.size), 0
    )
    assert state.handle(late) == []  # forgotten: its iterations are re-run instead
    assert c.start not in state.results


@settings(max_examples=100, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(data=st.data(), n=st.integers(100, 200), k=st.integers(1, 4))
def test_random_event_orders_with_queued_chunks(
    data: st.DataObject, n: int, k: int
) -> None:
    """Engines two chunks deep (a measured pace): losses, stops, out-of-memory
    and unloaded replies land on running and queued chunks alike."""
    state = RunState(Schedule(n, list(range(k)), mode="dynamic", hint=0.01), retries=2)
    log, end = drive(data, state)
    check_run(state, log, end, n)
