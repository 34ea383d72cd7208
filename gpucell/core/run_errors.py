"""The errors a run ends with, worded for the user (each says what was merged:
nothing).  Built by :class:`gpucell.core.run_state.RunState`, raised by the
dispatcher when it carries out a ``Fail``."""

from __future__ import annotations

from gpucell.core.schedule_fields import Chunk
from gpucell.errors import (
    CellTimeout,
    ClusterError,
    ClusterStopped,
    EnginesLost,
    IterationError,
)
from gpucell.protocol.conversation import Timing

__all__ = [
    "a_killer",
    "quiet",
    "cluster_stopped",
    "every_engine_died",
    "interrupted",
    "lost_too_often",
    "misplaced",
    "task_raised",
    "timed_out",
]


def quiet(error: BaseException) -> BaseException:
    """``error`` shown without the exception it was raised while handling
    (``raise ... from None``): the dispatcher's own control flow."""
    error.__suppress_context__ = True
    return error


def lost_too_often(c: Chunk) -> EnginesLost:
    return EnginesLost(
        f"Iterations {c.start}-{c.stop - 1} were lost {c.attempt} times "
        "(the engines running them died). Nothing was merged. If an "
        "iteration kills its engine (out of memory, a crash), fix it, or "
        "raise --retries."
    )


def misplaced(c: Chunk, timing: Timing) -> ClusterError:
    return ClusterError(
        f"gpucell: engine {c.engine} answered for iterations from "
        f"{timing['first']} where iterations {c.start}-{c.stop - 1} "
        "were sent; nothing was merged. Please report this."
    )


def task_raised(c: Chunk, text: str) -> BaseException:
    return quiet(
        IterationError(
            f"gpucell: engine {c.engine} failed running iterations "
            f"{c.start}-{c.stop - 1}: {text}"
        )
    )


def every_engine_died(ranges: list[tuple[int, int]]) -> EnginesLost:
    missing = ", ".join(f"{a}-{b - 1}" for a, b in ranges)
    return EnginesLost(
        f"Every engine died; iterations {missing} never completed. "
        "Nothing was merged. Restart the cluster (`%gpu_cluster "
        "stop` then `start`)."
    )


def a_killer(iteration: int, first: int, then: int) -> EnginesLost:
    return EnginesLost(
        f"iteration {iteration} ended engine {first} and then engine "
        f"{then}: it is not retried again (it would end the next one). "
        "Nothing was merged; the chunks that finished are kept, so "
        "`%%gpu_parallel --resume` runs only the rest once it is "
        "fixed. Run that iteration alone (serially) to see why: out of "
        "memory, a crash in a library, os._exit..."
    )


def timed_out(timeout: float | None, done: int, n: int) -> BaseException:
    return quiet(
        CellTimeout(
            f"%%gpu_parallel --timeout {timeout:g} s reached after {done} "
            f"of {n} iterations; outstanding work was cancelled and nothing "
            "was merged."
        )
    )


def interrupted(done: int, n: int) -> BaseException:
    return quiet(
        KeyboardInterrupt(
            f"gpucell: interrupted after {done} of {n} iterations; engines "
            "stopped their work, nothing was merged"
        )
    )


def cluster_stopped(done: int, n: int) -> ClusterStopped:
    return ClusterStopped(
        "%%gpu_parallel: the cluster was stopped while the cell ran "
        f"(after {done} of {n} iterations): "
        "nothing was merged. Start a cluster and run the cell again "
        "(`--resume` runs only the iterations that did not finish)."
    )
