"""The one vocabulary of states in a run: chunks, engines and the run itself.

The schedule, the run state (:class:`gpucell.core.run_state.RunState`), the record of a
run (:mod:`gpucell.core.provenance`), the progress snapshots
(:mod:`gpucell.core.runstate`) and the timeline all speak it, so a state one of
them writes is a state the others know.  Chunk states change only through
:func:`move`, which refuses a transition the table does not allow (a bug, said
at once, rather than a chunk merged twice or silently dropped).
"""

from __future__ import annotations

from typing import Final, Literal, Protocol

__all__ = [
    "BUSY",
    "CANCELLED",
    "CHUNK_MOVES",
    "DEAD",
    "DONE",
    "FAILED",
    "IDLE",
    "LOST",
    "PENDING",
    "RESTARTING",
    "RETRYING",
    "RUNNING",
    "ChunkState",
    "EngineState",
    "InvalidTransition",
    "RunStatus",
    "move",
]

ChunkState = Literal["pending", "running", "done", "lost", "failed", "cancelled"]
EngineState = Literal["idle", "busy", "retrying", "restarting", "dead"]
RunStatus = Literal["running", "ok", "error", "interrupted", "timeout"]

PENDING: Final = "pending"  # cut, not yet sent
RUNNING: Final = "running"  # sent to an engine (queued there or computing)
DONE: Final = "done"  # its result came back
LOST: Final = "lost"  # its engine died; its iterations are cut again
FAILED: Final = "failed"  # an iteration raised
CANCELLED: Final = "cancelled"  # aborted by an interrupt, a timeout or an error

IDLE: Final = "idle"
BUSY: Final = "busy"
RETRYING: Final = "retrying"  # running chunks that were lost once
# dead, and a new engine is being started on its device (dead is final: the
# restart budget gave up, or nothing restarts it)
RESTARTING: Final = "restarting"
DEAD: Final = "dead"

#: chunk state -> the states it may move to; done, lost, failed and cancelled
#: are final (a lost chunk's iterations go out again as new chunks)
CHUNK_MOVES: Final[dict[ChunkState, frozenset[ChunkState]]] = {
    "pending": frozenset({"running", "cancelled"}),
    "running": frozenset({"done", "lost", "failed", "cancelled"}),
    "done": frozenset(),
    "lost": frozenset(),
    "failed": frozenset(),
    "cancelled": frozenset(),
}


class InvalidTransition(RuntimeError):
    """A chunk was asked to move where the table does not allow: a gpucell bug."""


class HasState(Protocol):
    id: int
    state: ChunkState


def move(chunk: HasState, new: ChunkState) -> None:
    """Move ``chunk`` to ``new``, or raise :class:`InvalidTransition`."""
    old = chunk.state
    if new not in CHUNK_MOVES[old]:
        raise InvalidTransition(
            f"gpucell: chunk {chunk.id} cannot go from {old} to {new}"
        )
    chunk.state = new
