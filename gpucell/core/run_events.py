"""The run's vocabulary: the events a dispatcher tells the run state, and the
instructions the state answers with (see :mod:`gpucell.core.run_state`).

Events are what happened, as plain values: a reply decoded, an engine found
dead or stopped, a pace read off ``/dev/shm``, the stop button, the clock.
Instructions are what to do, as plain values: send a chunk, tell trials the
verdict, raise or lower the hand-back flag, end an engine, keep a result,
record a chunk, warn, fail.  The dispatcher (:mod:`gpucell.kernel.dispatch`)
carries them out in order; it decides nothing the state could.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Literal

from gpucell.core.schedule_fields import Chunk
from gpucell.core.states import ChunkState, RunStatus
from gpucell.protocol.conversation import Status, Timing

__all__ = [
    "Cancel",
    "Cancelled",
    "ChunkFailed",
    "Completed",
    "EngineBack",
    "EngineGone",
    "EngineStalled",
    "Event",
    "Fail",
    "FailUnlessRestarting",
    "Failed",
    "Fill",
    "Finish",
    "Flight",
    "Forget",
    "HandBack",
    "Instruction",
    "Keep",
    "Kill",
    "MarkDead",
    "PaceHeard",
    "Raised",
    "Record",
    "Blame",
    "Reload",
    "Replied",
    "Send",
    "Sent",
    "Stop",
    "Stopping",
    "Tick",
    "TrialsHeard",
    "Verdict",
    "VerdictGiven",
    "Warn",
]


@dataclass
class Flight:
    """A chunk task in flight: what it carries and when it left."""

    chunk: Chunk
    # perf_counter at submission when the round trip measures a chunk's dispatch
    # cost (the engine had nothing queued and its program was loaded), else None
    timed_from: float | None
    sent: float = 0.0  # perf_counter when it was submitted

    @property
    def engine(self) -> int:
        """The engine the chunk was sent to (always set once it is in flight)."""
        assert self.chunk.engine is not None
        return self.chunk.engine


# -- events --------------------------------------------------------------------


@dataclass(frozen=True)
class Fill:
    """The dispatcher may send: hand out what the schedule has.  ``unset``:
    engines whose program and inputs ride their next chunk (its round trip
    measures no dispatch cost)."""

    unset: frozenset[int] = frozenset()


@dataclass(frozen=True)
class Sent:
    """The chunks of the last :class:`Send` instructions left at ``now``."""

    chunks: tuple[int, ...]
    now: float


@dataclass(frozen=True)
class Replied:
    """A chunk's reply, decoded.  ``free_memory``: free device bytes per live
    engine, read only for an out-of-memory error (where to retry it)."""

    chunk: int
    status: Status
    payload: Any
    timing: Timing
    now: float
    free_memory: dict[int, float] = field(default_factory=dict)


@dataclass(frozen=True)
class Raised:
    """A chunk's task raised outside the chunk runner on a live engine."""

    chunk: int
    text: str  # ``ename: evalue`` and the remote traceback


@dataclass(frozen=True)
class EngineGone:
    """The engine died (its process, or the controller says so)."""

    engine: int
    #: its batch job ended (Slurm's time limit, preemption, scancel): the loss
    #: is not counted against the iterations it ran
    job_ended: bool = False


@dataclass(frozen=True)
class EngineStalled:
    """The engine no longer answers: its process is stopped, or its chunk ran
    far past its pace (:meth:`RunState.overdue`).  It is ended and lost."""

    engine: int
    why: str


@dataclass(frozen=True)
class EngineBack:
    """A restarted engine joins the run (``near``: it reads this host's
    ``/dev/shm``)."""

    engine: int
    replaces: int
    device: str
    near: bool


@dataclass(frozen=True)
class PaceHeard:
    """A running trial published its pace at its budget."""

    chunk: int
    done: int
    seconds: float
    stamped: bool


@dataclass(frozen=True)
class TrialsHeard:
    """Every published pace was read: the verdict may be due."""


@dataclass(frozen=True)
class VerdictGiven:
    """The verdict reached the trials (its file is written)."""


@dataclass(frozen=True)
class Tick:
    """A turn of the wait loop ended: raise or lower the hand-back flag."""


@dataclass(frozen=True)
class Stop:
    """The stop button, or the timeout: the run ends, nothing merged."""

    reason: Literal["interrupt", "timeout"]
    timeout: float | None = None


@dataclass(frozen=True)
class Failed:
    """The run ends with an error (an instruction's :class:`Fail`, or one the
    dispatcher met): what is in flight is cancelled."""


@dataclass(frozen=True)
class Cancelled:
    """Queued work was aborted and running work interrupted (:class:`Cancel`)."""


@dataclass(frozen=True)
class Stopping:
    """The cluster is being stopped under the run: its tasks went with it."""


@dataclass(frozen=True)
class Completed:
    """Every iteration is done."""


Event = (
    Fill
    | Sent
    | Replied
    | Raised
    | EngineGone
    | EngineStalled
    | EngineBack
    | PaceHeard
    | TrialsHeard
    | VerdictGiven
    | Tick
    | Stop
    | Failed
    | Cancelled
    | Stopping
    | Completed
)


# -- instructions ----------------------------------------------------------------


@dataclass(frozen=True)
class Send:
    """Send ``chunk`` to its engine (``budget``: a trial's seconds)."""

    chunk: Chunk
    budget: float | None
    stoppable: bool  # may hand its rest back (its engine hears the flag)


@dataclass(frozen=True)
class Reload:
    """The engine tidied the cell away before the chunk came: ship its program
    and inputs with its next chunk (the chunk is queued for it again)."""

    engine: int


@dataclass(frozen=True)
class Verdict:
    """Tell running trials: ``True`` run whole, ``False`` stop, hand back."""

    uniform: bool


@dataclass(frozen=True)
class HandBack:
    """Raise the hand-back flag at ``threshold`` seconds, or lower it (None)."""

    threshold: float | None


@dataclass(frozen=True)
class Kill:
    """End the engine's process (a hung engine: no stale result later)."""

    engine: int


@dataclass(frozen=True)
class MarkDead:
    """The engine is dead: say so in the cluster's status and restart it."""

    engine: int


@dataclass(frozen=True)
class Forget:
    """The chunk's task left flight (``lost``: with its engine)."""

    chunk: int
    lost: bool


@dataclass(frozen=True)
class Cancel:
    """Abort every queued task, interrupt the running ones, wait for the
    engines to be idle, then tell :class:`Cancelled`."""


@dataclass(frozen=True)
class Record:
    """Add the chunk's provenance in ``state`` (``timing``: its reply's)."""

    chunk: Chunk
    timing: Timing | None
    state: ChunkState


@dataclass(frozen=True)
class Keep:
    """A chunk's result, for ``--resume`` (and ``--checkpoint``)."""

    start: int
    stop: int
    payload: Any


@dataclass(frozen=True)
class Warn:
    """Say this to the user and keep it in the run's record."""

    text: str


@dataclass(frozen=True)
class Blame:
    """Keep this in the run's record of errors (an iteration that ended engines)."""

    text: str


@dataclass(frozen=True)
class ChunkFailed:
    """An iteration raised: the cell fails with it, in its context."""

    chunk: Chunk
    payload: Any
    timing: Timing


@dataclass(frozen=True)
class Fail:
    """The run ends with ``error`` (raised by the dispatcher, nothing merged)."""

    error: BaseException


@dataclass(frozen=True)
class FailUnlessRestarting:
    """Every engine is lost: fail, unless one is being restarted."""

    error: BaseException


@dataclass(frozen=True)
class Finish:
    """The run ended with ``status``."""

    status: RunStatus


Instruction = (
    Send
    | Reload
    | Verdict
    | HandBack
    | Kill
    | MarkDead
    | Forget
    | Cancel
    | Record
    | Keep
    | Warn
    | Blame
    | ChunkFailed
    | Fail
    | FailUnlessRestarting
    | Finish
)
