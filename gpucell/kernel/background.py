"""``%%gpu_parallel --background``: the cell returns, its run goes on, and the
merge waits for the first later cell that needs it.

A background cell does everything a foreground cell does up to its first
chunks (analysis and refusals, the prelude, the loop's iterable and inputs,
shipping), then returns.  Its :class:`~gpucell.kernel.dispatch.Run` is driven
step by step: in a Jupyter kernel by callbacks on the kernel's event loop
(``loop.call_later``; each step waits for nothing, so the kernel stays
responsive), in a terminal by a daemon thread.  Neither touches the namespace:
engine output is kept (shown in iteration order at the merge) and results wait
in kernel memory.

The namespace changes only where a serial run would already have finished:
before a later cell that could touch the run.  ``pre_run_cell`` scans the
cell's words (:func:`gpucell.core.waitrule.might_wait`): most cells run at
once.  For the others an AST transformer looks at the cell's code as IPython
parsed it (:func:`gpucell.core.waitrule.why_wait_source`, names, pure):
whether it uses a name the run writes, reads, the epilogue uses, or another
name of one of the run's objects; if so it drives the run to its end in the
main thread, merges it, runs the epilogue, and only then lets the cell run.
An error to raise (the run's, the epilogue's, an interrupted wait) replaces
the cell's code with code that raises it (IPython would swallow it from a
hook): the cell's own code does not run.  The transformer alone decides for
executions that skip ``pre_run_cell`` (silent ones).

One run is pending at a time on a cluster: a new ``%%gpu_parallel`` cell (and
``%gpu_cluster stop``/``select``) waits for it first; several pending runs,
were there any, merge in the order they started.
"""

from __future__ import annotations

import contextlib
import threading
import time
from collections.abc import Iterator
from typing import Any

from gpucell.core import waitrule
from gpucell.kernel import background_wait as wait_
from gpucell.kernel import session
from gpucell.kernel.background_drivers import (
    TICK,
    LoopDriver,
    ThreadDriver,
    interrupt_flag,
    running_loop,
)
from gpucell.kernel.background_footprint import footprint
from gpucell.kernel.background_wait import (
    might_touch,
    settle_for,
    shutdown,
    wait_for_all,
    wait_magic,
)

__all__ = [
    "TICK",
    "BackgroundRun",
    "Runs",
    "footprint",
    "launch",
    "might_touch",
    "refuse_layers",
    "runs",
    "settle_for",
    "shutdown",
    "wait_for_all",
    "wait_magic",
]

#: while a cell runs, a thread steps a pending run (the event loop does not
#: run then, and the engines would go idle); False: steps only between cells
FEED_DURING_CELLS = True
#: runs listed by ``gpucell.runs`` once they are merged, cancelled or raised
RECENT = 8


def _pending() -> list[BackgroundRun]:
    """Runs not yet merged, raised or cancelled, in start order (the Session's)."""
    return session.current().pending


def _recent() -> list[BackgroundRun]:
    """Every run this kernel started lately, newest last (the Session's)."""
    return session.current().recent


# -- the handle ----------------------------------------------------------------------


class BackgroundRun:
    """One ``%%gpu_parallel --background`` cell's run (``gpucell.runs[-1]``).

    ``state``: ``running``, then ``finished`` or ``failed`` (its engines are
    idle), then ``merged`` (its results are in the namespace), ``raised`` (its
    error was raised in a cell) or ``cancelled``.  ``progress`` says how far it
    is; :meth:`wait` merges it (and every run started before it) now;
    :meth:`cancel` stops it, nothing merged (finished chunks kept for
    ``--resume``)."""

    def __init__(self, tail: Any, cell: int) -> None:
        self.tail = tail
        self.cell = cell
        self.state = "running"
        self.error: BaseException | None = None
        self.results: list[Any] | None = None
        self.footprint = waitrule.Footprint()
        self.output: list[str] = []  # engine output and notes, shown at the merge
        self.watched: Any = None
        self.run: Any = None
        self.last: Any = None  # the last snapshot, once the run is let go
        self.started = time.monotonic()
        self.started_at = time.time()  # wall clock, for the Lab panel
        self.ended: float | None = None
        self.status_line: Any = None  # a display handle in Jupyter
        self.said_failed = False
        self.error_tb: Any = None
        self._driver: LoopDriver | ThreadDriver | None = None
        self._stepping = threading.RLock()  # one driver steps at a time

    # -- what users see

    @property
    def pending(self) -> bool:
        """Not merged, raised or cancelled yet."""
        return self in _pending()

    @property
    def progress(self) -> str:
        """``"37 of 120 iterations (31%), 12.3 s, running"``."""
        return f"{self._figures()}, {self.state}"

    def _let_go(self) -> None:
        """Merged, raised or cancelled: what it held (its inputs and results,
        the plan) is let go; its figures stay for ``gpucell.runs``."""
        if self.watched is not None:
            self.last = self.watched.last
        self.watched = self.run = self.tail = self.results = None
        self.output = []

    def _figures(self) -> str:
        snap = getattr(self.watched, "last", None) or self.last
        done, total = (snap.done, snap.total) if snap is not None else (0, 0)
        end = self.ended if self.ended is not None else time.monotonic()
        pct = f" ({100 * done // total}%)" if total else ""
        return f"{done} of {total} iterations{pct}, {end - self.started:.1f} s"

    def __repr__(self) -> str:
        return f"<gpucell background run of cell [{self.cell}]: {self.progress}>"

    def wait(self) -> None:
        """Wait for this run (and every run started before it), merge it and
        run the code after its loop; raises the run's error if it failed."""
        _main_thread_only("run.wait()")
        wait_.settle_through(_shell(), self, "`run.wait()`")

    def cancel(self) -> None:
        """Stop the run: engines stop their work, nothing is merged; the chunks
        that finished are kept, so ``%%gpu_parallel --resume`` runs only the rest."""
        _main_thread_only("run.cancel()")
        self._stop_driver()  # (and a step under way ended)
        if self.state == "running":
            try:
                self.run.abort(KeyboardInterrupt())
            except BaseException as e:  # what an interrupt says, kept
                self.error = e
            self._ended("cancelled")
            self.tail.keeping.echo = print
            self.tail.keeping.failed("cancelled")
        elif self.state in ("finished", "failed"):
            if self.results:
                self.tail.keeping.echo = print
                self.tail.keeping.failed("cancelled")
            self.state = "cancelled"
        else:
            return
        if self in _pending():
            _pending().remove(self)
        print(
            f"gpucell: the background run of cell [{self.cell}] was cancelled "
            f"({self.progress}); nothing was merged."
        )
        self._let_go()
        wait_.after_change()

    # -- driving (never touches the namespace)

    def step(self, wait: float | None, blocking: bool = True) -> None:
        """One turn of the run; at its end, its results kept (or its error).
        ``blocking=False``: nothing when another driver is in a step."""
        if self.state != "running":
            return
        if not self._stepping.acquire(blocking):
            return
        try:
            if self.state != "running":
                return
            self.run.step(wait)
            if self.run.finished:
                self.results = list(self.run.end())
                self._ended("finished")
        except BaseException as e:
            self._failed(e)
        finally:
            self._stepping.release()

    def _failed(self, error: BaseException) -> None:
        try:
            self.run.abort(error)  # cancels, tidies, raises what the user sees
        except BaseException as e:
            self.error = e
        else:  # (abort always raises)
            self.error = error
        self.error_tb = self.error.__traceback__
        self.tail.keeping.failed(type(self.error).__name__)
        self._ended("failed")

    def _ended(self, state: str) -> None:
        self.ended = time.monotonic()
        if self.watched is not None:
            with contextlib.suppress(Exception):
                self.watched.close()  # the widget's final figures
        self.state = state  # last: a thread that drives it is done with it
        if state == "failed":
            self._show_status(
                f"gpucell: the background run of cell [{self.cell}] failed: "
                f"{wait_.one_line(self.error)} (raised in the next cell that waits "
                "for it, or by `%gpu_wait`)"
            )
        elif state == "finished":
            self._show_status(
                f"gpucell: the background run of cell [{self.cell}] finished "
                f"({self._figures()}); it is merged when a later cell uses its "
                "names (`%gpu_wait` merges it now)"
            )

    def _show_status(self, text: str) -> None:
        handle = self.status_line
        if handle is not None:
            with contextlib.suppress(Exception):
                handle.update({"text/plain": text}, raw=True)

    def _start_driver(self) -> None:
        if self.state != "running" or self._driver is not None:
            return
        loop = running_loop()
        self._driver = LoopDriver(self, loop) if loop else ThreadDriver(self)

    def _stop_driver(self) -> None:
        """No driver steps the run from now on (a step under way ends first:
        a thread handed over to the event loop may still be in one)."""
        driver, self._driver = self._driver, None
        if driver is not None:
            driver.stop()
        with self._stepping:
            pass

    def _drive_to_end(self) -> None:
        """Steps in this (the main) thread until the run ends.  An interrupt
        stops the wait, not the run: it goes on in the background."""
        self._stop_driver()
        with interrupt_flag() as pressed:
            while self.state == "running":
                if pressed:
                    self._start_driver()
                    raise KeyboardInterrupt(
                        f"gpucell: stopped waiting for the background run of cell "
                        f"[{self.cell}]; it goes on ({self.progress}). This "
                        "cell's own code did not run. `%gpu_wait` waits again; "
                        f"`gpucell.runs.cell({self.cell}).cancel()` stops the run."
                    )
                self.step(None)

    # -- sinks of the run's output (shown at the merge)

    def _out(self, text: str) -> None:
        self.output.append(text)

    def _note(self, line: str) -> None:
        self.output.append(line if line.endswith("\n") else line + "\n")


class _LaterSummary:
    """The display of a background run without a widget (a terminal): nothing
    drawn while the prompt is in use; the final figures shown at the merge."""

    def __init__(self) -> None:
        self.last: Any = None

    def update(self, snap: Any) -> None:
        pass

    def close(self, snap: Any) -> None:
        self.last = snap

    def text(self) -> str:
        from gpucell.ui import model

        if self.last is None:
            return ""
        return "\n".join(model.summary_lines(self.last, [])) + "\n"


# -- starting --------------------------------------------------------------------------


def refuse_layers(plan: Any) -> None:
    """A loop inside ``with`` blocks cannot run in the background: the kernel
    stays inside the contexts until the loop ends, and later cells would run
    inside them."""
    from IPython.core.error import UsageError

    line = plan.layers[0].node.lineno
    raise UsageError(
        f"%%gpu_parallel --background: the loop is inside a `with` block (line "
        f"{line}); the kernel stays inside it until the loop ends, so later cells "
        "would run inside it too. Put the `with` inside the loop body, or run "
        "the cell without --background. Nothing ran."
    )


def launch(tail: Any, targets: list[int], options: Any) -> BackgroundRun:
    """Start the run of a cell whose prelude ran and whose loop is ready (see
    ``execute.run_cell``); return once its first chunks are sent."""
    from gpucell.kernel.watched import Watched
    from gpucell.ui.progress import has_widget_frontend

    shell = tail.shell
    bg = BackgroundRun(tail, _cell_number(shell))
    quiet = tail.req.quiet
    display = None if quiet or has_widget_frontend(shell) else _LaterSummary()
    bg.watched = Watched(
        tail,
        targets,
        options,
        relay=bg._out,
        echo=bg._note,
        display=display,
    )
    run = bg.run = bg.watched.run
    try:
        bg.footprint = footprint(tail.prep.plan, tail.loop, shell)
    except Exception as e:  # never a silent miss: every later cell waits
        bg.footprint = waitrule.Footprint(always=f"its names were not read ({e!r})")
    try:
        run.ship_inputs()
    except BaseException:
        bg.watched.close()
        raise
    try:
        run.begin()
    except BaseException as e:
        try:
            run.abort(e)  # raises what a foreground run would
        finally:
            bg.watched.close()
    tail.keeping.echo = bg._note  # what it says from now on is shown at the merge
    _pending().append(bg)
    _recent().append(bg)
    del _recent()[: -max(RECENT, len(_pending()))]
    wait_.install(shell)
    bg._start_driver()
    line = (
        f"gpucell: cell [{bg.cell}] runs in the background ({run.n} iterations on "
        f"{len(run.alive)} engine{'s' if len(run.alive) != 1 else ''}); a later "
        "cell that uses its names waits for it (`gpucell.runs`, `%gpu_wait`)."
    )
    if not quiet:
        if has_widget_frontend(shell):
            from IPython.display import display as show

            bg.status_line = show({"text/plain": line}, raw=True, display_id=True)
        else:
            print(line)
    return bg


def _cell_number(shell: Any) -> int:
    """The running cell's ``In [N]`` number."""
    result = getattr(getattr(shell, "displayhook", None), "exec_result", None)
    count = getattr(result, "execution_count", None)
    if isinstance(count, int):
        return count
    return int(getattr(shell, "execution_count", 1)) - 1


# -- gpucell.runs ----------------------------------------------------------------------


class Runs:
    """``gpucell.runs``: this kernel's background runs, oldest first (pending
    ones, and the last few merged, raised or cancelled).  ``runs[-1]`` is the
    newest, ``runs.cell(5)`` the run of cell [5], ``runs.pending`` those not
    merged yet, ``runs.wait()`` waits for every one."""

    def __iter__(self) -> Iterator[BackgroundRun]:
        return iter(list(_recent()))

    def __len__(self) -> int:
        return len(_recent())

    def __getitem__(self, i: int) -> BackgroundRun:
        return _recent()[i]

    @property
    def pending(self) -> list[BackgroundRun]:
        return list(_pending())

    def cell(self, n: int) -> BackgroundRun:
        for bg in reversed(_recent()):
            if bg.cell == n:
                return bg
        raise KeyError(f"no background run of cell [{n}]")

    def wait(self) -> None:
        """Wait for every pending run, merging each (``%gpu_wait``)."""
        _main_thread_only("gpucell.runs.wait()")
        wait_for_all(_shell(), "`gpucell.runs.wait()`")

    def __repr__(self) -> str:
        if not _recent():
            return "gpucell.runs: no background run yet"
        lines = [f"cell [{bg.cell}]: {bg.progress}" for bg in _recent()]
        return "gpucell.runs:\n  " + "\n  ".join(lines)


runs = Runs()


def _shell() -> Any:
    hooks = wait_._HOOKS
    if hooks is not None:
        return hooks.shell
    from IPython import get_ipython

    return get_ipython()


def _main_thread_only(what: str) -> None:
    if threading.current_thread() is not threading.main_thread():
        raise RuntimeError(f"gpucell: {what} works in the kernel's main thread only.")
