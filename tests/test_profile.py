"""A cell's second run is scheduled from its first run's per-iteration times."""

from __future__ import annotations

import pytest

import gpucell
from gpucell.core.provenance import ChunkRecord, LastRun


def record(engine, start, stops_at, t_end):
    """A done chunk whose iterations started at ``stops_at``."""
    return ChunkRecord(
        start=start,
        stop=start + len(stops_at),
        engine=engine,
        host="h",
        device="CPU",
        t_start=stops_at[0],
        t_end=t_end,
        compute=t_end - stops_at[0],
        attempt=0,
        state="done",
        iteration_starts=tuple(stops_at),
    )


def test_profile_is_each_iterations_time_with_warm_up_capped():
    run = LastRun(iterations=7, engines=(0, 1))
    # engine 0's first iteration paid 5 s of imports; engine 1's chunks are clean
    run.chunks = [
        record(0, 0, [0.0, 5.0, 6.0], 7.0),
        record(1, 3, [0.0, 1.0], 3.0),
        record(0, 5, [7.0, 7.5], 8.5),
    ]
    assert run.profile() == (1.0, 1.0, 1.0, 1.0, 2.0, 0.5, 1.0)
    assert run.profile(limit=6) is None  # too long to keep


def test_no_profile_when_an_iteration_is_missing():
    run = LastRun(iterations=4, engines=(0,))
    run.chunks = [record(0, 0, [0.0, 1.0], 2.0)]  # iterations 2-3 never ran
    assert run.profile() is None
    lost = record(0, 2, [2.0, 3.0], 4.0)
    run.chunks.append(
        ChunkRecord(**{**lost.__dict__, "state": "lost", "iteration_starts": ()})
    )
    assert run.profile() is None


@pytest.mark.cluster
def test_second_run_of_an_uneven_cell_is_profiled_and_serial_equivalent(ip, cluster):
    cell = (
        "import time\nwaits = []\nfor i in range(16):\n"
        "    time.sleep(0.002 * i)\n    waits.append(i * i)\n"
    )
    ip.run_cell_magic("gpu_parallel", "--quiet", cell)
    assert "profiled" not in gpucell.last_run.schedule
    ip.user_ns["waits"] = None
    ip.run_cell_magic("gpu_parallel", "--quiet", cell)
    assert gpucell.last_run.schedule == "guided (profiled)"
    assert ip.user_ns["waits"] == [i * i for i in range(16)]
    # the costliest iterations went out first, to each engine
    chunks = gpucell.last_run.chunks
    for e in {c.engine for c in chunks}:
        first = min((c for c in chunks if c.engine == e), key=lambda c: c.t_start)
        assert first.start >= 8, chunks
