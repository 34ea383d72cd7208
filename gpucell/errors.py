"""One exception hierarchy for gpucell.

Messages say what happened, where, and the next step, so a user never has to read
our source to know what to do.
"""

from __future__ import annotations


def add_note(error: BaseException, note: str) -> None:
    """``error.add_note(note)`` where Python has it (3.11 and later; before,
    the error goes on without it)."""
    add = getattr(error, "add_note", None)
    if add is not None:
        add(note)


class GpucellError(Exception):
    """Base class of every error gpucell raises on purpose."""


class NotParallelizable(GpucellError, ValueError):
    """The cell's loop cannot be run in parallel with serial-equivalent results.

    Raised by the analysis before anything runs; the message names the variable, the
    cell line, why parallel execution would differ, and how to rewrite the loop.
    """


class ClusterError(GpucellError, RuntimeError):
    """Starting, connecting to or stopping a cluster failed; nothing is left running."""


class NoCluster(ClusterError):
    """An operation needs a cluster and none is started or connected."""

    def __init__(self, message: str | None = None) -> None:
        super().__init__(
            message
            or "No cluster. Start one with `%gpu_cluster start` "
            "(or `gpucell.start_cluster()`), or attach with `%gpu_cluster connect`."
        )


class DeviceSelectionError(GpucellError, ValueError):
    """A device selection names a device this machine does not have."""


class IterationError(GpucellError, RuntimeError):
    """An iteration raised on an engine and its exception could not be rebuilt here.

    (When it can be, the user's own exception type is raised instead, with
    gpucell's context attached as a note.)
    """


class EnginesLost(GpucellError, RuntimeError):
    """Every engine died before the loop finished; nothing was merged."""


class CellTimeout(GpucellError, TimeoutError):
    """``%%gpu_parallel --timeout`` expired; outstanding work was cancelled."""


class InputNotSendable(GpucellError, TypeError):
    """A name the loop reads cannot be serialised to the engines."""


class InputChanged(GpucellError, RuntimeError):
    """An iteration changed an input in place (inputs are read-only to iterations).

    Found by the engines' check of the inputs before and after each chunk; nothing
    was merged.  Serially the change would have stayed in the user's object (and
    later iterations would have seen it): the message names the input, the
    iterations and the lines that could have done it, and how to rewrite.
    """


class ResumeRefused(GpucellError, ValueError):
    """``--resume`` found kept results of this cell that do not belong to this
    run (the cell, an input, the loop's items or the seed changed): the message
    names what changed.  Nothing from the loop ran."""


class CheckpointRefused(GpucellError, ValueError):
    """``--checkpoint DIR`` names a folder gpucell will not use: not a folder,
    unreadable, or not this user's alone (kept chunks are unpickled, so a folder
    another user can write into could run that user's code).  Checked before
    the prelude runs: nothing ran."""


class ClusterStopped(EnginesLost):
    """The cluster was stopped (``%gpu_cluster stop``, ``gpucell.stop()`` from
    another thread) while a cell ran on it; nothing was merged."""


class ControllerLost(ClusterError):
    """The cluster's controller process is gone (killed, crashed): no engine can
    be reached through it.  ``%gpu_cluster stop`` then ``start`` recovers."""


class RankFailed(GpucellError, RuntimeError):
    """A ``%%gpu_distributed`` cell failed on a rank (it raised, died, or waited
    in a collective past ``--timeout``): every rank was stopped, the message
    names the rank, its host and the cell line, and the next cell re-forms the
    process group.  Nothing in the notebook's namespace changed."""

    def _render_traceback_(self) -> list[str]:
        # IPython shows this instead of a traceback through gpucell's own code:
        # the message holds the rank's traceback, which is the one that matters
        return f"{type(self).__name__}: {self}".splitlines()
