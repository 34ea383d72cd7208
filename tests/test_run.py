"""The dispatcher's Run, driven by a fake cluster: lost engines, cancels, failures.

The one place a stand-in for ipyparallel is used: a fake view whose tasks run the
real engine code (``gpucell.engine.worker.run``) in this process, or hang, or lose
their engine, on cue.  The same paths run on real clusters in test_failures.py and
test_parallel.py; here each transition can be provoked exactly and its state read.
The run state alone, driven by events, is tested in test_run_state.py.
"""

from __future__ import annotations

import concurrent.futures
import itertools
from dataclasses import dataclass, field
from typing import Any

import pytest
from ipyparallel.error import EngineError, RemoteError

import gpucell.cluster.lifecycle as gc_mod
from gpucell.core.analysis import analyse, make_chunker
from gpucell.core.merge import merge
from gpucell.core.provenance import LastRun
from gpucell.core.schedule import Chunk
from gpucell.core.states import (
    CANCELLED,
    CHUNK_MOVES,
    DONE,
    FAILED,
    LOST,
    PENDING,
    InvalidTransition,
    move,
)
from gpucell.core.timeline import timeline
from gpucell.errors import CellTimeout, EnginesLost
from gpucell.kernel.dispatch import Options, Run

_ids = itertools.count()


class FakeTask(concurrent.futures.Future):  # type: ignore[type-arg]
    """What ``apply_async`` returns, as much of an AsyncResult as a Run reads."""

    def __init__(self, engine: int) -> None:
        super().__init__()
        self.engine = engine
        self.msg_ids = [f"msg-{next(_ids)}"]
        self.metadata = {"stdout": "", "stderr": "", "outputs": []}
        self.running_ = False  # started on its engine (else queued behind another)

    def get(self, timeout: float | None = None) -> Any:
        return self.result(timeout)

    def wait_for_output(self, timeout: float = 0) -> bool:
        return True


@dataclass
class FakeEngine:
    id: int
    host: str = "elsewhere"  # not this host: liveness is the client's ids
    pid: int = 0
    kind: str = "cpu"
    index: int = -1
    name: str = "CPU"
    device: str = "CPU"
    local: bool = False
    # what its tasks do: "run" (the real engine code), "hang" (until aborted or
    # signalled), or "die" once it has run `runs_before_death` tasks
    behaviour: str = "run"
    runs_before_death: int = 0
    tasks: int = 0


class FakeView:
    def __init__(self, cluster: FakeCluster, eid: int) -> None:
        self.cluster, self.eid = cluster, eid

    def apply_async(self, fn: Any, *args: Any) -> FakeTask:
        return self.cluster.apply(self.eid, fn, args)


class FakeWave:
    """What ``direct_view(eids).apply_async(worker.run_each, table)`` returns:
    each engine's task runs its own part (as the real engines find theirs by id)."""

    def __init__(self, cluster: FakeCluster, eids: list[int]) -> None:
        self.cluster, self.eids = cluster, eids

    def apply_async(self, fn: Any, table: dict[int, tuple[Any, ...]]) -> Any:
        from types import SimpleNamespace

        from gpucell.engine import worker

        assert fn is worker.RUN_EACH
        tasks = [self.cluster.apply(e, worker.run, table[e]) for e in self.eids]
        return SimpleNamespace(split=lambda: tuple(tasks))


@dataclass
class FakeClient:
    cluster: FakeCluster
    ids: list[int] = field(default_factory=list)
    aborted: list[str] = field(default_factory=list)
    signalled: list[int] = field(default_factory=list)

    def direct_view(self, eids: list[int]) -> FakeWave:
        return FakeWave(self.cluster, list(eids))

    def abort(self, msg_ids: list[str], block: bool = False) -> None:
        self.aborted.extend(msg_ids)
        for t in self.cluster.pending:  # only tasks still queued can be aborted
            if t.msg_ids[0] in msg_ids and not t.done() and not t.running_:
                t.set_exception(RemoteError("TaskAborted", "aborted", ""))

    def send_signal(self, sig: int, targets: list[int], block: bool = False) -> None:
        self.signalled.extend(targets)
        for t in self.cluster.pending:  # SIGINT stops the running task
            if t.engine in targets and not t.done() and t.running_:
                t.set_exception(RemoteError("KeyboardInterrupt", "", ""))


class FakeCluster:
    """Shaped like GpuCluster as far as a Run reads it."""

    def __init__(self, engines: list[FakeEngine]) -> None:
        self.engines = {e.id: e for e in engines}
        self.client = FakeClient(self, ids=[e.id for e in engines])
        self.input_cache: dict[int, dict[str, Any]] = {}
        self.dead: set[int] = set()
        self.pending: list[FakeTask] = []

    def view(self, eid: int) -> FakeView:
        return FakeView(self, eid)

    def mark_dead(self, eid: int) -> None:
        self.dead.add(eid)

    def results_channel(self) -> None:
        return None

    def sees_shm(self, eid: int) -> bool:
        return False

    def sweep_results(self) -> None:
        pass

    # the real bookkeeping of what engines cache (pure: reads input_cache only)
    forget_cached = gc_mod.GpuCluster.forget_cached

    def apply(self, eid: int, fn: Any, args: tuple[Any, ...]) -> FakeTask:
        engine, task = self.engines[eid], FakeTask(eid)
        engine.tasks += 1
        if engine.behaviour == "die" and engine.tasks > engine.runs_before_death:
            if eid in self.client.ids:
                self.client.ids.remove(eid)
            task.set_exception(EngineError(f"engine {eid} died"))
        elif engine.behaviour == "hang":
            task.running_ = not any(
                t.engine == eid and not t.done() for t in self.pending
            )
            self.pending.append(task)
        else:
            task.set_result(fn(*args))
        return task


CELL = (
    "total = 0\nout = []\nfor i in range(n):\n    total += i * i\n    out.append(i)\n"
)


def make_run(
    gc: FakeCluster, n: int = 40, body: str = CELL, **options: Any
) -> tuple[Run, Any, LastRun]:
    ns = {"n": n}
    plan = analyse(body, known_names=ns.keys())
    assert plan.iter_space is not None
    values = [eval(e, dict(ns)) for e in plan.iter_space.leaves]
    chunker = make_chunker(plan.iter_space, values)
    program = plan.engine_program()
    record = LastRun(plan=plan)
    opts = {"schedule": "dynamic", "chunksize": 5, "interrupt_grace": 0.2, **options}
    run = Run(
        gc,  # type: ignore[arg-type]
        sorted(gc.engines),
        programs=dict.fromkeys(gc.engines, program),
        inputs={k: ns[k] for k in plan.inputs},
        n=chunker.count,
        chunk_of=chunker.chunk,
        options=Options(**opts),
        record=record,
        echo=lambda _s: None,
        relay=lambda _s: None,
    )
    return run, plan, record


def serial(n: int) -> dict[str, Any]:
    ns: dict[str, Any] = {"n": n}
    exec(CELL, ns)
    return {k: ns[k] for k in ("total", "out", "i")}


def test_a_run_gives_the_serial_result_and_records_every_chunk_done() -> None:
    gc = FakeCluster([FakeEngine(0), FakeEngine(1)])
    run, plan, record = make_run(gc)
    run.ship_inputs()
    assert set(run.setups) == {0, 1}  # program and inputs ride the first chunks
    results = run.execute()
    ns: dict[str, Any] = {"n": 40, "total": 0, "out": []}  # after the prelude
    merge(plan, results, ns)
    assert {k: ns[k] for k in ("total", "out", "i")} == serial(40)
    assert run.status == record.status == "ok"
    assert not run.inflight
    assert {c.state for c in run.sched.chunks} == {DONE}
    spans = sorted((c.start, c.stop) for c in record.chunks)
    assert [a for a, _ in spans[1:]] == [b for _, b in spans[:-1]]  # no gap, no overlap
    assert spans[0][0] == 0 and spans[-1][1] == 40
    assert {c.engine for c in record.chunks} == {0, 1}
    assert run.snapshot().done == 40


def test_a_lost_engine_s_chunks_run_on_the_other_and_are_recorded_lost() -> None:
    gc = FakeCluster(
        [FakeEngine(0), FakeEngine(1, behaviour="die", runs_before_death=1)]
    )
    run, plan, record = make_run(gc)
    run.ship_inputs()
    results = run.execute()
    ns: dict[str, Any] = {"n": 40, "total": 0, "out": []}  # after the prelude
    merge(plan, results, ns)
    assert {k: ns[k] for k in ("total", "out", "i")} == serial(40)
    assert 1 in gc.dead and run.sched.alive == [0]
    lost = [c for c in record.chunks if c.state == LOST]
    assert lost and all(c.engine == 1 for c in lost)
    # every lost iteration was done again, on engine 0, as a retry
    for c in lost:
        again = [
            d
            for d in record.chunks
            if d.state == DONE and d.start < c.stop and c.start < d.stop
        ]
        assert again and all(d.engine == 0 and d.attempt > 0 for d in again)
    assert any("engine 1 died" in w for w in record.warnings)


def test_every_engine_lost_raises_and_names_the_missing_iterations() -> None:
    gc = FakeCluster([FakeEngine(0, behaviour="die"), FakeEngine(1, behaviour="die")])
    run, _plan, record = make_run(gc)
    run.ship_inputs()
    with pytest.raises(EnginesLost, match=r"Every engine died; iterations 0-39"):
        run.execute()
    assert record.status == "error"


def test_a_timeout_cancels_what_is_in_flight_and_the_timeline_shows_it() -> None:
    gc = FakeCluster([FakeEngine(0), FakeEngine(1, behaviour="hang")])
    run, _plan, record = make_run(gc, timeout=0.3)
    run.ship_inputs()
    with pytest.raises(CellTimeout, match="outstanding work was cancelled"):
        run.execute()
    assert run.status == record.status == "timeout"
    assert not run.inflight
    cancelled = [c for c in record.chunks if c.state == CANCELLED]
    assert cancelled and all(c.engine == 1 for c in cancelled)
    # the hung engine was aborted and signalled; nothing is left running
    assert gc.client.aborted and 1 in gc.client.signalled
    assert all(t.done() for t in gc.pending)
    assert not any(c.state == "running" for c in run.sched.chunks)
    picture = timeline(record)
    bars = [b for lane in picture.lanes for b in lane.bars if b.kind == CANCELLED]
    assert len(bars) == len(cancelled)
    assert "cancelled" in picture.svg()
    assert run.snapshot().status == "timeout"


def test_an_iteration_error_fails_its_chunk_and_cancels_the_rest() -> None:
    body = (
        "out = []\nfor i in range(n):\n"
        "    if i == 23:\n        raise ValueError(f'bad {i}')\n    out.append(i)\n"
    )
    gc = FakeCluster([FakeEngine(0), FakeEngine(1, behaviour="hang")])
    run, _plan, record = make_run(gc, body=body)
    run.ship_inputs()
    with pytest.raises(ValueError, match="bad 23") as info:
        run.execute()
    assert "iteration 23" in "\n".join(getattr(info.value, "__notes__", []))
    assert record.status == "error"
    failed = [c for c in record.chunks if c.state == FAILED]
    assert [(c.start, c.stop) for c in failed] == [(20, 25)]
    assert {c.state for c in record.chunks if c.engine == 1} == {CANCELLED}


def test_chunk_states_move_only_as_the_table_allows() -> None:
    c = Chunk(0, 0, 4)
    assert c.state == PENDING
    move(c, "running")
    move(c, DONE)
    with pytest.raises(InvalidTransition, match="chunk 0 cannot go from done"):
        move(c, "running")
    # final states are final; every state is reachable from pending
    reached, frontier = {PENDING}, [PENDING]
    while frontier:
        for nxt in CHUNK_MOVES[frontier.pop()]:
            if nxt not in reached:
                reached.add(nxt)
                frontier.append(nxt)
    assert reached == set(CHUNK_MOVES)
    assert all(not CHUNK_MOVES[s] for s in (DONE, LOST, FAILED, CANCELLED))


def test_a_first_wave_goes_as_one_message_only_when_small_and_one_per_engine():
    from types import SimpleNamespace

    from gpucell.kernel.sending import WAVE_BYTES
    from gpucell.kernel.sending import one_message as _one_message
    from gpucell.protocol.conversation import ChunkTask as _RunArgs

    def item(eid: int, nbytes: int = 10) -> tuple[Any, _RunArgs, bool]:
        frames = [b"x" * nbytes]
        args = _RunArgs("cell", frames, 0, eid, None, None, None, None, None, "k", True)
        return (SimpleNamespace(engine=eid), args, True)

    three = [item(0), item(1), item(2)]
    assert _one_message(three) == three
    # an engine's second chunk, and what follows it, go alone (in order)
    assert _one_message([item(0), item(1), item(0), item(2)]) == [item(0), item(1)]
    assert _one_message([item(0)]) == []  # one engine: nothing to share
    # every engine receives every engine's part: big parts go alone
    assert _one_message([item(0, WAVE_BYTES), item(1, WAVE_BYTES)]) == []


def test_a_reply_for_another_chunk_than_was_sent_fails_the_cell_unmerged(
    monkeypatch,
) -> None:
    """If a first wave's replies were ever matched to the wrong chunks (each
    engine running another's part), the values would land on the wrong
    iterations: the run fails instead, with nothing returned to merge."""
    from gpucell.errors import ClusterError

    def swapped_apply(self, fn, table):
        from types import SimpleNamespace

        from gpucell.engine import worker

        eids = list(reversed(self.eids))  # each engine runs the other's part
        tasks = [
            self.cluster.apply(e, worker.run, table[o])
            for e, o in zip(self.eids, eids, strict=True)
        ]
        return SimpleNamespace(split=lambda: tuple(tasks))

    monkeypatch.setattr(FakeWave, "apply_async", swapped_apply)
    gc = FakeCluster([FakeEngine(0), FakeEngine(1)])
    run, _plan, record = make_run(gc)
    run.ship_inputs()
    with pytest.raises(ClusterError, match="nothing was merged"):
        run.execute()
    assert record.status == "error"


def test_a_trials_iteration_seconds_come_from_its_stamps():
    """What a trial tells the schedule of each iteration (for the provisional
    profile): the gaps between its stamps and the last one to the chunk's end;
    nothing when the chunk was not stamped throughout."""
    from gpucell.core.run_state import trial_costs as _iteration_seconds

    timing = {"starts": [1.0, 1.5, 3.0], "end": 3.25}
    assert _iteration_seconds(timing, 3) == [0.5, 1.5, 0.25]
    assert _iteration_seconds(timing, 4) is None  # an unstamped stretch
    assert _iteration_seconds({"starts": [], "end": 1.0}, 0) is None
