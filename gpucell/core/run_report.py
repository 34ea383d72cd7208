"""What a run shows and keeps of itself, from its schedule: the progress
snapshot the display draws and each chunk's provenance record (pure; the
engines' descriptions are passed in)."""

from __future__ import annotations

from collections.abc import Collection, Mapping, Sequence
from typing import Any

from gpucell.core.provenance import ChunkRecord
from gpucell.core.runstate import EngineProgress, RunSnapshot
from gpucell.core.schedule import Schedule
from gpucell.core.schedule_fields import Chunk
from gpucell.core.states import (
    BUSY,
    DEAD,
    IDLE,
    RESTARTING,
    RETRYING,
    ChunkState,
    EngineState,
    RunStatus,
)
from gpucell.protocol.conversation import Timing

__all__ = ["chunk_record", "snapshot"]


def _engine_state(sched: Schedule, eid: int, status: RunStatus) -> EngineState:
    running = sched.outstanding(eid)
    if eid not in sched.alive:
        return DEAD
    if any(c.attempt > 0 for c in running):
        return RETRYING
    if running and status == "running":
        return BUSY
    return IDLE


def snapshot(
    infos: Mapping[int, Any],
    engines: Sequence[int],
    sched: Schedule,
    elapsed: float,
    status: RunStatus,
    restarting: Collection[int] = (),
    replaces: Mapping[int, int] | None = None,
) -> RunSnapshot:
    """The run as the display shows it (``infos``: engine id -> its
    description, ``gpucell.cluster`` ``EngineInfo``-shaped).

    One row per device: an engine restarted after dying (``replaces``: new
    engine -> the one it replaced) takes its predecessor's row and iterations;
    a dead engine being restarted now (``restarting``) is ``restarting``, and
    ``dead`` only once nothing restarts it."""
    replaces = replaces or {}
    after = {old: new for new, old in replaces.items() if new in engines}
    rows, shown = [], set()
    for first in engines:  # each device where its first engine was
        chain = [first]
        while chain[-1] in after and after[chain[-1]] not in chain:
            chain.append(after[chain[-1]])
        if chain[-1] in shown:
            continue
        shown.add(chain[-1])
        rows.append(_row(infos, chain[::-1], sched, status, restarting))
    return RunSnapshot(
        total=sched.n,
        done=sched.done_iterations,
        elapsed=elapsed,
        engines=tuple(rows),
        status=status,
    )


def _row(
    infos: Mapping[int, Any],
    chain: list[int],
    sched: Schedule,
    status: RunStatus,
    restarting: Collection[int],
) -> EngineProgress:
    """The row of the device whose engines were ``chain`` (newest first)."""
    eid = chain[0]
    info = infos.get(eid)
    done_its, done_secs = 0, 0.0
    for e in chain:
        its, secs = sched.engine_progress(e)
        done_its, done_secs = done_its + its, done_secs + secs
    state = _engine_state(sched, eid, status)
    if state == DEAD and eid in restarting:
        state = RESTARTING
    return EngineProgress(
        engine=eid,
        host=info.host if info else "",
        device=info.device if info else "",
        name=info.name if info else "",
        pid=info.pid if info else 0,
        kind=info.kind if info else "cpu",
        index=info.index if info else -1,
        done=done_its,
        busy_seconds=done_secs,
        state=state,
        slot=chain[-1],
    )


def chunk_record(
    chunk: Chunk, info: Any, timing: Timing | None, state: ChunkState
) -> ChunkRecord:
    """The provenance of ``chunk`` (``info``: its engine's description)."""
    return ChunkRecord(
        start=chunk.start,
        stop=chunk.stop,
        engine=chunk.engine if chunk.engine is not None else -1,
        host=timing["host"] if timing else (info.host if info else ""),
        device=info.device if info else "",
        t_start=timing["start"] if timing else 0.0,
        t_end=timing["end"] if timing else 0.0,
        compute=timing["compute"] if timing else 0.0,
        attempt=chunk.attempt,
        state=state,
        iteration_starts=tuple(timing["starts"]) if timing else (),
    )
