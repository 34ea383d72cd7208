"""Everything around a chunk's iterations on an engine, as one context
(:class:`Envelope`): its output tagged and streams put back, the kernel's
working directory and warnings filters, the inputs checked in (and out: an
iteration may change only its own item), the ``/dev/shm`` feedback handles,
the copy of results to the host, and the process-wide generators watched.
Whatever way the chunk ends, an interrupt included, what it changed in the
engine is put back.
"""

from __future__ import annotations

import contextlib
import os
import sys
import time
import warnings
from collections.abc import Iterator
from typing import Any

from gpucell.engine import (
    checkin,
    checkout,
    fileaccess,
    logs,
    processstate,
    rngstate,
    runtime,
    tohost,
    writebehind,
)
from gpucell.engine.feedback import ShmHandBack, ShmVerdict, feedback
from gpucell.engine.runtime import interrupts_held
from gpucell.engine.sessions import Session
from gpucell.engine.streams import Tagged, untagged
from gpucell.engine.where import Where
from gpucell.protocol.chunks import ChunkResult, chunk_items
from gpucell.protocol.conversation import ChunkTask

__all__ = ["Envelope"]


class Envelope:
    """One chunk's surroundings on the engine; ``with Envelope(...) as env``
    around its iterations.  While open: ``verdict``/``hand_back`` (the
    kernel's line, when reachable), ``to_host`` (GPU results copied as they
    come), ``tag`` (the reply's name in /dev/shm); once closed: ``end``
    (time.time) and ``compute`` (seconds since it opened)."""

    def __init__(
        self, st: Session, task: ChunkTask, chunk_obj: Any, where: Where, device: str
    ) -> None:
        self.st, self.task, self.chunk_obj, self.where = st, task, chunk_obj, where
        self.device = device
        self.verdict: ShmVerdict | None = None
        self.hand_back: ShmHandBack | None = None
        self.to_host: Any = None
        self.behind: Any = None
        self.tag = ""
        self.items: Any = None
        self.checked_in: dict[str, Any] = {}
        self.own_before: checkout.ItemsBefore | None = None
        # process-wide settings the iterations changed (processstate.py)
        self.settings_changed: list[tuple[str, str]] = []
        self._caught: Any = None
        self._home: str | None = None
        self._rng_before: dict[str, Any] | None = None
        self.opened: fileaccess.FileAccess | None = None
        self.end = self.compute = 0.0

    def __enter__(self) -> Envelope:
        # a wrapper an earlier chunk left (interrupted between its swap and its
        # restore) is dropped: output goes to ipykernel's own streams again
        self._out, self._err = untagged(sys.stdout), untagged(sys.stderr)
        self.t0, self.c0 = time.time(), time.perf_counter()
        try:
            self._open()
        except BaseException as exc:
            self.__exit__(type(exc), exc, exc.__traceback__)
            raise
        return self

    def _open(self) -> None:
        """Everything from the swap on is undone by ``__exit__``: an interrupt
        (a cancelled run signals engines at any moment) must not leave the
        wrapper installed; ipykernel tags later output with its request
        through ``sys.stdout.set_parent``, and every later chunk's output was
        filed under the interrupted request (lost, silently)."""
        st, task = self.st, self.task
        sys.stdout = Tagged(self._out, task.engine_id, self.where)
        sys.stderr = Tagged(self._err, task.engine_id, self.where)
        if st.watch["items"]:
            checkin.freeze(self.chunk_obj)
            chunk_obj = self.chunk_obj
            self.items = lambda: chunk_items(chunk_obj)
        self.checked_in = checkin.snapshot(st.inputs, st.watch["names"], self.items)
        if self.items is not None:
            self.own_before = checkout.before(self.items(), task.start)
        self._caught = _kernel_warning_filters(st)
        self._home = _enter_cwd(st.cwd)
        self.tag = f"{task.engine_id}-{task.start}-{os.urandom(4).hex()}"
        self.verdict, self.hand_back = feedback(
            task.results_to,
            task.cell,
            task.engine_id,
            task.start,
            self.where.stamps,
            task.budget,
            task.stoppable,
        )
        self.to_host = tohost.copier(self.device)
        if self.to_host is not None:
            self.behind = writebehind.start(task.results_to, self.tag)
            if self.behind is not None:
                self.to_host.sink = self.behind.add
        # which process-wide generators the chunk drew from: without --seed
        # every one (the kernel warns); with it, those not reseeded (the loop
        # was found unable to reach them: a draw would be a gpucell bug)
        if task.seed is None:
            self._rng_before = rngstate.states()
        elif task.reseed is not None:
            self._rng_before = rngstate.states(skip=task.reseed)

    def __exit__(self, kind: Any, exc: Any, tb: Any) -> None:
        if kind is not None and issubclass(kind, KeyboardInterrupt):
            if self.behind is not None:
                self.behind.discard()
        # the chunk is over: an interrupt (a cancelled run signals every engine
        # with unfinished work) must not land inside ipykernel's output flush,
        # where it can leave the stream unable to deliver later output
        with interrupts_held():
            if self._caught is not None:
                self._caught.__exit__(None, None, None)
            _leave_cwd(self._home)
            self.end, self.compute = time.time(), time.perf_counter() - self.c0
            # ipykernel's flush waits for its I/O thread (about a millisecond on
            # a busy host): only a stream that was written to needs it
            for tagged in (sys.stdout, sys.stderr):
                if getattr(tagged, "written", True):
                    tagged.flush()
            sys.stdout, sys.stderr = self._out, self._err

    @contextlib.contextmanager
    def running(self) -> Iterator[logs.Capture]:
        """Around the iterations alone: the kernel's logging levels (records
        captured), the files each iteration opens (``opened``), imports an
        interrupt waits for, the kernel's settings."""
        with (
            logs.Capture(self.st.log_levels) as logged,
            fileaccess.FileAccess(self.where) as self.opened,
            runtime.imports_finish_first(),
            _kernel_state(self.st.state),
        ):
            before = processstate.snapshot()
            try:
                yield logged
            finally:
                self.settings_changed = processstate.changes(before, self.st.state)
                processstate.put_back(before)

    def drew(self) -> list[str]:
        """The generators watched whose state the chunk changed."""
        return rngstate.drew(self._rng_before)

    def check_out(self, result: ChunkResult) -> list[tuple[str, str]]:
        """Inputs the iterations changed (see :func:`_check_out`)."""
        return _check_out(
            self.st,
            self.checked_in,
            self.own_before,
            self.items,
            self.task.start,
            result,
        )


def _enter_cwd(cwd: str | None) -> str | None:
    """Run in the kernel's working directory (``Setup["cwd"]``), so a relative
    path in the loop names the file it names serially; returns the directory
    to go back to (``None``: nothing changed).  A directory this host does
    not have is left alone."""
    if not cwd:
        return None
    try:
        here = os.getcwd()
    except OSError:  # (this engine's own directory was removed)
        here = None
    if here == cwd:
        return None
    try:
        os.chdir(cwd)
    except OSError:
        return None
    return here or "/"


def _leave_cwd(home: str | None) -> None:
    if home is not None:
        with contextlib.suppress(OSError):
            os.chdir(home)


def _kernel_warning_filters(st: Session) -> Any:
    """A ``catch_warnings`` context (entered) holding the kernel's filters: a
    warning the notebook silenced stays silent here."""
    caught = warnings.catch_warnings()
    caught.__enter__()
    if st.warning_filters is not None:
        # (typeshed declares the list a Sequence; it is the module's own list)
        warnings.filters[:] = st.warning_filters  # type: ignore[index]
        for name in ("_filters_mutated", "_filters_mutated_lock_held"):
            mutated = getattr(warnings, name, None)
            if mutated is not None:  # drop the per-module "already warned" caches
                mutated()
                break
    return caught


@contextlib.contextmanager
def _kernel_state(state: dict[str, Any]) -> Any:
    """The kernel's process-wide settings while a chunk runs, this engine's
    own put back after (a later cell of another kernel gets its own)."""
    torch = sys.modules.get("torch") if "torch_dtype" in state else None
    np = sys.modules.get("numpy") if "numpy_err" in state else None
    dtype = err = None
    if torch is not None:
        dtype = torch.get_default_dtype()
        torch.set_default_dtype(getattr(torch, state["torch_dtype"]))
    elif "torch_dtype" in state:  # torch not loaded here yet: load it to set it
        import torch as _torch

        torch, dtype = _torch, _torch.get_default_dtype()
        torch.set_default_dtype(getattr(torch, state["torch_dtype"]))
    if np is not None:
        err = np.seterr(**state["numpy_err"])
    try:
        yield
    finally:
        if torch is not None and dtype is not None:
            torch.set_default_dtype(dtype)
        if np is not None and err is not None:
            np.seterr(**err)


def _check_out(
    st: Session,
    checked_in: dict[str, Any],
    own_before: checkout.ItemsBefore | None,
    items: Any,
    start: int,
    result: ChunkResult,
) -> list[tuple[str, str]]:
    """Inputs are read-only to iterations, but for each iteration's own item:
    the inputs a call changed (``""``: the items, where their changes cannot
    be written back), or none, the items' changes put in the result."""
    changed = checkin.changes(checked_in, st.inputs, items)
    modes = st.watch.get("modes") or ()
    changed = [
        (n, w)
        for n, w in changed
        if not (n in modes and checkin.only_mode_changed(checked_in[n], st.inputs[n]))
    ]
    if [n for n, _ in changed] == [""] and own_before is not None and items is not None:
        # only the items changed: each iteration's own, written back in place
        # by the kernel, unless some change cannot be
        own, cannot = checkout.changes(own_before, items(), start, st.inputs)
        if not cannot:
            result.own_items, changed = own, []
        else:
            changed = [("", "; ".join(cannot[:3]))]
    return changed
