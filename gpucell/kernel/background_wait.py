"""Before a cell runs: does it wait for a pending ``--background`` run, and
the wait itself (drive the run to its end in the main thread, merge, run the
code after its loop, or raise its error in the cell).

``pre_run_cell`` scans the cell's words (:func:`gpucell.core.waitrule.might_wait`);
for the few cells it cannot clear, an AST transformer (:class:`_Gate`) looks at
the code as IPython parsed it and settles there.  IPython swallows a hook's
exceptions, so an error to raise replaces the cell's code with code that
raises it.  The runs themselves (and their order) are :mod:`.background`'s."""

from __future__ import annotations

import ast
import atexit
import contextlib
import sys
from typing import TYPE_CHECKING, Any

from gpucell.core import waitrule
from gpucell.errors import add_note
from gpucell.kernel.background_drivers import after_cell, during_cell
from gpucell.kernel.background_footprint import notebook_code

if TYPE_CHECKING:
    from gpucell.kernel.background import BackgroundRun

__all__ = [
    "after_change",
    "install",
    "might_touch",
    "one_line",
    "shutdown",
    "settle_for",
    "settle_through",
    "wait_for_all",
    "wait_magic",
]

# -- deciding and settling, before a cell runs ---------------------------------------


def settle_for(shell: Any, source: str | None, tree: ast.Module | None = None) -> None:
    """Before a cell (its transformed text, its code as IPython parsed it, or
    both) runs: wait for, and merge, every pending run it could touch, and the
    runs started before those."""
    if not B._pending():
        return
    ns = shell.user_ns
    if source is not None:
        code = notebook_code(ns, waitrule.identifiers(source))
        reasons = [
            waitrule.why_wait_source(source, bg.footprint, code, tree)
            for bg in B._pending()
        ]
    else:
        assert tree is not None
        use = waitrule.cell_use_of(tree)
        code = notebook_code(ns, use.names)
        reasons = [waitrule.why_wait(use, bg.footprint, code) for bg in B._pending()]
    last = max((i for i, r in enumerate(reasons) if r), default=-1)
    if last >= 0:
        target, why = B._pending()[last], reasons[last]
        settle_through(shell, target, f"this cell {why}")
    _note_failures()


def might_touch(shell: Any, source: str) -> bool:
    """The quick check before a cell: could it touch a pending run at all?
    (A scan of its text's words; ``False`` for most cells.)"""
    if not B._pending():
        return False
    code = notebook_code(shell.user_ns, waitrule.identifiers(source))
    return any(waitrule.might_wait(source, bg.footprint, code) for bg in B._pending())


def _note_failures() -> None:
    """A run that failed is said once, in the next cell, whether it waits or not."""
    for bg in list(B._pending()):
        if bg.state == "failed" and not bg.said_failed:
            bg.said_failed = True
            print(
                f"gpucell: note: the background run of cell [{bg.cell}] failed "
                f"({one_line(bg.error)}); the next cell that uses its names "
                "raises it (`%gpu_wait` raises it now)."
            )


def settle_through(shell: Any, target: BackgroundRun, why: str) -> None:
    """Wait for and merge every pending run up to ``target``, in start order."""
    if target not in B._pending():
        if target.state == "raised" or target.state == "merged":
            return
        if target.state == "cancelled":
            return
    while B._pending():
        bg = B._pending()[0]
        reason = why if bg is target else f"before the run of cell [{target.cell}]"
        _settle(shell, bg, reason)
        if bg is target:
            break


def _settle(shell: Any, bg: BackgroundRun, why: str) -> None:
    """Drive ``bg`` to its end here, then merge it and run the code after its
    loop, or raise its error (a note says which cell it came from)."""
    from gpucell.kernel.finish import conclude, run_epilogue

    bg._stop_driver()  # (a thread that drove it is done with it)
    if bg.state == "running":
        print(
            f"gpucell: waiting for the background run of cell [{bg.cell}] ({why}) ..."
        )
        print(_how_to_stop(bg, why))
        sys.stdout.flush()
        bg._drive_to_end()  # an interrupt raises here: the run goes on
    else:
        print(f"gpucell: merging the background run of cell [{bg.cell}] ({why}).")
    B._pending().remove(bg)
    tail = bg.tail
    try:
        sys.stdout.write("".join(bg.output))
        display = getattr(bg.watched, "display", None)
        if isinstance(display, B._LaterSummary):
            sys.stdout.write(display.text())
        tail.keeping.echo = print
        if bg.state == "failed":
            bg.state = "raised"
            error = bg.error
            assert error is not None
            _add_note(error, f"raised by the background run of cell [{bg.cell}]")
            _RAISED[:] = [error, bg.error_tb]
            raise error
        bg.state = "merging"
        try:
            conclude(tail, bg.results or [])
        except BaseException as e:
            bg.state = "raised"
            _add_note(e, f"raised merging the background run of cell [{bg.cell}]")
            raise
        bg.state = "merged"
        bg._show_status(
            f"gpucell: the background run of cell [{bg.cell}] was merged "
            f"({bg._figures()})"
        )
        bg._let_go()
        try:
            run_epilogue(shell, tail.prep)
        except BaseException as e:
            _add_note(e, f"raised by the code after the loop of cell [{bg.cell}]")
            raise
    finally:
        bg._let_go()
        after_change()


#: words of a reason that needs the cluster the pending run holds
_CLUSTER_USES = ("%%gpu_parallel", "%gpu_cluster", "%%gpu_distributed")


def _how_to_stop(bg: BackgroundRun, why: str) -> str:
    """The line after "waiting for ...": which run holds the cluster when the
    cell needs it (one run at a time), and how to stop waiting or cancel."""
    head = ""
    if any(word in why for word in _CLUSTER_USES):
        head = (
            f"gpucell: one run at a time on a cluster: the background run of cell "
            f"[{bg.cell}] holds it ({bg.progress}). "
        )
    return (
        f"{head or 'gpucell: '}The stop button stops this wait, not the run; "
        f"`gpucell.runs.cell({bg.cell}).cancel()` cancels the run (its finished "
        "chunks are kept for --resume)."
    )


#: the last run error raised again by a wait, with the traceback it had
_RAISED: list[Any] = []


def _add_note(error: BaseException, where: str) -> None:
    note = (
        f"gpucell: {where}, which this cell waited for; this cell's own code "
        "did not run."
    )
    if note not in getattr(error, "__notes__", ()):
        add_note(error, note)


def one_line(error: BaseException | None) -> str:
    if error is None:
        return "no error"
    text = str(error).strip().splitlines()
    return f"{type(error).__name__}: {text[0] if text else ''}"


def wait_for_all(shell: Any, why: str) -> None:
    """Every pending run waited for and merged, in start order (``%gpu_wait``,
    a new ``%%gpu_parallel`` cell, ``%gpu_cluster stop``)."""
    if B._pending():
        settle_through(shell, B._pending()[-1], why)


def wait_magic(shell: Any, line: str) -> None:
    """``%gpu_wait`` (every pending run) or ``%gpu_wait N`` (the run of cell
    [N], and the runs started before it)."""
    from IPython.core.error import UsageError

    arg = line.strip()
    if not arg:
        if not B._pending():
            print("gpucell: no background run is pending.")
        wait_for_all(shell, "`%gpu_wait`")
        return
    try:
        cell = int(arg.lstrip("[").rstrip("]"))
    except ValueError:
        raise UsageError(
            f"%gpu_wait: {arg!r} is not a cell number; `%gpu_wait` waits for every "
            "background run, `%gpu_wait 5` for the run of cell [5]."
        ) from None
    found = [bg for bg in B._recent() if bg.cell == cell]
    if not found:
        started = ", ".join(f"[{bg.cell}]" for bg in B._recent()) or "none"
        raise UsageError(
            f"%gpu_wait {cell}: no background run of cell [{cell}] (runs of cells: "
            f"{started})."
        )
    bg = found[-1]
    if bg not in B._pending():
        print(f"gpucell: the background run of cell [{cell}] is {bg.state}.")
        return
    settle_through(shell, bg, f"`%gpu_wait {cell}`")


# -- the hooks: pre_run_cell decides, an AST transformer raises ------------------------


class _Gate(ast.NodeTransformer):
    """Where a cell that could touch a pending run waits: ``pre_run_cell``
    found a word of its text that could matter (or did not run: a silent
    execution), and here the cell's code, as IPython parsed it, says whether
    it does.  Settling's errors (IPython swallows a hook's exceptions) replace
    the cell's code with code that raises them."""

    def __init__(self, hooks: _Hooks) -> None:
        self.hooks = hooks

    def visit(self, node: Any) -> Any:
        hooks = self.hooks
        armed, hooks.armed = hooks.armed, None
        source, hooks.source = hooks.source, None
        if armed is None and isinstance(node, ast.Module):
            armed = hooks.check(source, node)
        if armed is None or armed is _CLEAR:
            return node
        _RAISE.append(armed)
        stmt = ast.parse(
            "raise __import__('gpucell.kernel.background_wait', fromlist=['_'])._pop()"
        ).body
        return ast.Module(body=stmt, type_ignores=[])


_CLEAR = object()
_RAISE: list[BaseException] = []


def _pop() -> BaseException:
    """The error the gate's code raises in the waiting cell (a run's error with
    the traceback it had, not the frames of the wait that raised it again)."""
    error = _RAISE.pop()
    if _RAISED and _RAISED[0] is error:
        error = error.with_traceback(_RAISED[1])
        _RAISED.clear()
    return error


class _Hooks:
    def __init__(self, shell: Any) -> None:
        self.shell = shell
        self.armed: Any = None
        self.source: str | None = None
        self.executing = _in_cell(shell)  # (installed by a running cell)
        self.gate = _Gate(self)
        shell.events.register("pre_execute", self.pre_execute)
        shell.events.register("pre_run_cell", self.pre_run_cell)
        shell.events.register("post_execute", self.post_execute)
        shell.ast_transformers.append(self.gate)

    def check(self, source: str | None, tree: ast.Module | None) -> Any:
        try:
            settle_for(self.shell, source, tree)
        except BaseException as e:
            return e
        return _CLEAR

    def pre_execute(self) -> None:
        self.armed = None  # (a cell that does not parse never reaches the gate)
        self.source = None
        self.executing = True
        if B.FEED_DURING_CELLS:
            for bg in B._pending():
                during_cell(bg)  # the event loop stops while the cell runs

    def pre_run_cell(self, info: Any) -> None:
        source = getattr(info, "transformed_cell", None) or getattr(
            info, "raw_cell", ""
        )
        try:
            look = might_touch(self.shell, source)
        except Exception:
            look = True  # when unsure, the gate looks
        if look:
            self.source = source  # the gate decides, with IPython's parse
        else:
            self.armed = _CLEAR
            _note_failures()

    def post_execute(self) -> None:
        self.executing = False
        for bg in B._pending():
            after_cell(bg)
        if not B._pending():
            self.remove()

    def remove(self) -> None:
        global _HOOKS
        events = self.shell.events
        for name, fn in (
            ("pre_execute", self.pre_execute),
            ("pre_run_cell", self.pre_run_cell),
            ("post_execute", self.post_execute),
        ):
            with contextlib.suppress(ValueError):
                events.unregister(name, fn)
        with contextlib.suppress(ValueError):
            self.shell.ast_transformers.remove(self.gate)
        if _HOOKS is self:
            _HOOKS = None


_HOOKS: _Hooks | None = None
_EXIT_REGISTERED = False


def install(shell: Any) -> None:
    global _HOOKS, _EXIT_REGISTERED
    if _HOOKS is None or _HOOKS.shell is not shell:
        if _HOOKS is not None:
            _HOOKS.remove()
        _HOOKS = _Hooks(shell)
    if not _EXIT_REGISTERED:
        _EXIT_REGISTERED = True
        atexit.register(shutdown)


def after_change() -> None:
    """Outside a cell (``%gpu_wait`` from a comm, ``run.cancel()`` from a widget)
    nothing else removes the hooks once no run is pending."""
    if not B._pending() and _HOOKS is not None and not _HOOKS.executing:
        _HOOKS.remove()


def _in_cell(shell: Any) -> bool:
    return getattr(getattr(shell, "displayhook", None), "exec_result", None) is not None


def shutdown() -> None:
    """Kernel exit, ``%unload_ext gpucell``: every running background run's
    engines stop their work (queued chunks aborted, running ones interrupted),
    its /dev/shm files released; nothing is merged."""
    for bg in list(B._pending()):
        bg._stop_driver()
        if bg.state == "running":
            with contextlib.suppress(BaseException):
                bg.run.abort(KeyboardInterrupt())
            bg.state = "cancelled"
            with contextlib.suppress(BaseException):
                bg.tail.keeping.echo = lambda line: None
                bg.tail.keeping.failed("shutdown")  # --checkpoint files complete
            with contextlib.suppress(BaseException):
                bg.watched.close()
        B._pending().remove(bg)
    if _HOOKS is not None:
        _HOOKS.remove()


# last: background.py imports this module while it starts, so either may be
# imported first (this module reads background's runs only when called)
from gpucell.kernel import background as B  # noqa: E402
