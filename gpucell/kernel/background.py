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

import ast
import atexit
import contextlib
import signal
import sys
import threading
import time
import types
import weakref
from collections.abc import Iterator, Mapping
from typing import Any

from gpucell.core import waitrule

__all__ = [
    "BackgroundRun",
    "Runs",
    "launch",
    "refuse_layers",
    "runs",
    "settle_for",
    "shutdown",
    "wait_for_all",
    "wait_magic",
]

#: seconds between two steps of a run driven by the kernel's event loop
TICK = 0.02
#: runs listed by ``gpucell.runs`` once they are merged, cancelled or raised
RECENT = 8

_PENDING: list[BackgroundRun] = []  # not yet merged, raised or cancelled: start order
_RECENT: list[BackgroundRun] = []  # every run this kernel started, newest last


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
        self.ended: float | None = None
        self.status_line: Any = None  # a display handle in Jupyter
        self.said_failed = False
        self.error_tb: Any = None
        self._driver: _LoopDriver | _ThreadDriver | None = None

    # -- what users see

    @property
    def pending(self) -> bool:
        """Not merged, raised or cancelled yet."""
        return self in _PENDING

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
        _settle_through(_shell(), self, "`run.wait()`")

    def cancel(self) -> None:
        """Stop the run: engines stop their work, nothing is merged; the chunks
        that finished are kept, so ``%%gpu_parallel --resume`` runs only the rest."""
        _main_thread_only("run.cancel()")
        if self.state == "running":
            self._stop_driver()
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
        if self in _PENDING:
            _PENDING.remove(self)
        print(
            f"gpucell: the background run of cell [{self.cell}] was cancelled "
            f"({self.progress}); nothing was merged."
        )
        self._let_go()
        _after_change()

    # -- driving (never touches the namespace)

    def step(self, wait: float | None) -> None:
        """One turn of the run; at its end, its results kept (or its error)."""
        if self.state != "running":
            return
        try:
            self.run.step(wait)
            if self.run.finished:
                self.results = list(self.run.end())
                self._ended("finished")
        except BaseException as e:
            self._failed(e)

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
                f"{_one_line(self.error)} (raised in the next cell that waits "
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
        loop = _running_loop()
        self._driver = _LoopDriver(self, loop) if loop else _ThreadDriver(self)

    def _stop_driver(self) -> None:
        driver, self._driver = self._driver, None
        if driver is not None:
            driver.stop()

    def _drive_to_end(self) -> None:
        """Steps in this (the main) thread until the run ends.  An interrupt
        stops the wait, not the run: it goes on in the background."""
        self._stop_driver()
        with _interrupt_flag() as pressed:
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


class _LoopDriver:
    """Steps a run from the kernel's event loop, every :data:`TICK` seconds;
    each step waits for nothing.  SIGINT is ignored by an idle kernel, so an
    interrupt never lands in a step."""

    def __init__(self, bg: BackgroundRun, loop: Any) -> None:
        self.bg, self.loop, self.stopped = bg, loop, False
        self.handle = loop.call_later(TICK, self.tick)

    def tick(self) -> None:
        self.handle = None
        if self.stopped or self.bg.state != "running":
            return
        try:
            with _no_interrupt():
                self.bg.step(0.0)
        finally:  # (step keeps its own errors; the next tick comes regardless)
            if self.bg.state == "running" and not self.stopped:
                self.handle = self.loop.call_later(TICK, self.tick)

    def stop(self) -> None:
        self.stopped = True
        if self.handle is not None:
            self.handle.cancel()
            self.handle = None


@contextlib.contextmanager
def _no_interrupt() -> Iterator[None]:
    """A step from the event loop is no place for the stop button: an idle
    kernel ignores SIGINT anyway; while an async cell awaits, a press landing
    in a step (a few ms) is dropped rather than cancelling the run."""
    previous = signal.getsignal(signal.SIGINT)
    if previous is signal.SIG_IGN or previous is None:
        yield
        return
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    try:
        yield
    finally:
        signal.signal(signal.SIGINT, previous)


class _ThreadDriver:
    """Steps a run from a daemon thread (a terminal IPython has no event loop
    between prompts); only the main thread touches the namespace, after
    stopping this one."""

    def __init__(self, bg: BackgroundRun) -> None:
        self.bg = bg
        self.halt = threading.Event()
        self.thread = threading.Thread(
            target=self._loop, name=f"gpucell-background-{bg.cell}", daemon=True
        )
        self.thread.start()

    def _loop(self) -> None:
        while not self.halt.is_set() and self.bg.state == "running":
            self.bg.step(None)

    def stop(self) -> None:
        self.halt.set()
        if threading.current_thread() is not self.thread:
            self.thread.join()


def _running_loop() -> Any:
    """The kernel's asyncio loop when this (main) thread runs one."""
    import asyncio

    if threading.current_thread() is not threading.main_thread():
        return None
    try:
        return asyncio.get_running_loop()
    except RuntimeError:
        return None


@contextlib.contextmanager
def _interrupt_flag() -> Iterator[list[int]]:
    """SIGINT recorded while the main thread waits for a run (as the
    dispatcher's stop button): acted on between steps, never mid-step."""
    pressed: list[int] = []
    if threading.current_thread() is not threading.main_thread():
        yield pressed
        return
    previous = signal.signal(signal.SIGINT, lambda signum, frame: pressed.append(1))
    try:
        yield pressed
    finally:
        signal.signal(signal.SIGINT, previous)


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


def launch(tail: Any, targets: list[int], programs: Any, options: Any) -> BackgroundRun:
    """Start the run of a cell whose prelude ran and whose loop is ready (see
    ``execute.run_cell``); return once its first chunks are sent."""
    from gpucell.kernel.execute import Watched
    from gpucell.ui.progress import has_widget_frontend

    shell = tail.shell
    bg = BackgroundRun(tail, _cell_number(shell))
    quiet = tail.req.quiet
    display = None if quiet or has_widget_frontend(shell) else _LaterSummary()
    bg.watched = Watched(
        shell,
        tail.gc,
        targets,
        programs,
        tail.loop,
        options,
        tail.record,
        quiet,
        tail.kept,
        tail.keeping.add,
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
    _PENDING.append(bg)
    _RECENT.append(bg)
    del _RECENT[: -max(RECENT, len(_PENDING))]
    _install(shell)
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


# -- the run's footprint: names, computed once from the plan and the objects --------

#: builtins whose call depends on no state a later cell could change
_PURE_BUILTINS = frozenset(
    {
        "abs", "all", "any", "ascii", "bin", "bool", "bytes", "callable", "chr",
        "complex", "dict", "divmod", "enumerate", "filter", "float", "format",
        "frozenset", "getattr", "hasattr", "hash", "hex", "id", "int",
        "isinstance", "issubclass", "iter", "len", "list", "map", "max", "min",
        "next", "object", "oct", "ord", "pow", "print", "range", "repr",
        "reversed", "round", "set", "slice", "sorted", "str", "sum", "tuple",
        "type", "zip",
    }
)  # fmt: skip


def footprint(plan: Any, loop: Any, shell: Any) -> waitrule.Footprint:
    """What the run will still do to the notebook (:class:`waitrule.Footprint`):
    names it writes, objects it reads, the epilogue's names, and other names of
    those objects (``y = out``, a dict holding an input, a view of an array:
    :func:`gpucell.core.aliasing.shared_with_sinks`, one level deep)."""
    import builtins

    from gpucell.core.aliasing import shared_with_sinks

    ns = shell.user_ns
    own = lambda n: not n.startswith("__gpucell_")  # noqa: E731
    hidden = set(plan.hidden)
    writes = {i.name for i in plan.names if i.cls != "input"}
    writes |= {*plan.affected_names, *plan.locals, *plan.deep_writes}
    writes |= {r.name for r in plan.own_rows}
    if plan.result_name:
        writes.add(plan.result_name)
    writes = {n for n in writes if own(n) and n not in hidden}
    leaves: set[str] = set()
    for leaf in plan.iter_space.leaves if plan.iter_space is not None else ():
        with contextlib.suppress(SyntaxError):
            leaves |= waitrule.cell_use(leaf).names
    reads = {
        n
        for n in (*plan.inputs, *leaves)
        if own(n)
        and not _harmless(
            ns[n] if n in ns else getattr(builtins, n, _MISSING),
            n in ns or hasattr(builtins, n),
        )
    }
    if any(_logs(v) for v in loop.inputs.values()):
        reads.add("logging")  # its records reach the handlers at the merge
    always = None
    epilogue: set[str] = set()
    bound_only: set[str] = set()
    if plan.epilogue:
        use = waitrule.cell_use_of(
            ast.Module(body=list(plan.epilogue), type_ignores=[])
        )
        if use.unknowable is not None:
            always = f"the code after its loop {use.unknowable}"
        for n in use.names:
            value = ns.get(n, getattr(builtins, n, _MISSING))
            if n in _PURE_BUILTINS and value is getattr(builtins, n, None):
                bound_only.add(n)
            else:
                epilogue.add(n)
        inner = _notebook_code(ns, frozenset(use.names))
        for n, uses in inner.items():
            if uses is None:
                always = f"the code after its loop uses `{n}`, code gpucell cannot read"
            else:
                epilogue |= {u for u in uses if u in ns}
    touched = writes | reads | epilogue
    objects = {n: ns[n] for n in touched if n in ns and not _harmless(ns[n], True)}
    candidates = {n: v for n, v in ns.items() if n not in touched}
    aliases: dict[str, str] = {}
    for s in shared_with_sinks(objects, candidates, frozenset(objects)):
        aliases.setdefault(s.input, f"{s.how} `{s.sink}`")
    by_id = {id(v): n for n, v in objects.items()}
    for n, v in candidates.items():  # notebook functions holding a run's object
        if n in aliases or not _notebook_function(v):
            continue
        held = [c.cell_contents for c in v.__closure__ or () if _filled(c)]
        held += [*(v.__defaults__ or ()), *(v.__kwdefaults__ or {}).values()]
        for obj in held:
            if id(obj) in by_id:
                aliases[n] = f"holds `{by_id[id(obj)]}` (in its closure or defaults)"
                break
    return waitrule.Footprint(
        writes=frozenset(writes),
        reads=frozenset(reads),
        epilogue=frozenset(epilogue),
        bound_only=frozenset(bound_only),
        aliases=tuple(sorted(aliases.items())),
        always=always,
    )


_MISSING = object()


def _harmless(value: Any, defined: bool) -> bool:
    """An input whose use by a later cell cannot change what the run reads: an
    immutable value, a module, a function or class of a library."""
    from gpucell.core.aliasing import _mutable

    if not defined or value is _MISSING:
        return False
    if isinstance(value, types.ModuleType):
        return True
    if isinstance(value, (types.BuiltinFunctionType, types.FunctionType, type)):
        return getattr(value, "__module__", "__main__") != "__main__"
    return not _mutable(value)


def _logs(value: Any) -> bool:
    import logging

    return value is logging or isinstance(value, (logging.Logger, logging.Handler))


def _filled(cell: Any) -> bool:
    try:
        cell.cell_contents  # noqa: B018
    except ValueError:
        return False
    return True


def _notebook_function(value: Any) -> bool:
    return isinstance(value, types.FunctionType) and value.__module__ == "__main__"


# -- notebook code a later cell uses: what its code may use -------------------------

_CODE_USES: weakref.WeakKeyDictionary[Any, frozenset[str]] = weakref.WeakKeyDictionary()
_NOT_CODE = object()


def _notebook_code(ns: Mapping[str, Any], words: frozenset[str]) -> dict[str, Any]:
    """``{name: names its code may use}`` for the words of a cell that name
    notebook code (a function or class defined in the notebook, an instance of
    such a class), following the notebook functions and classes that code
    names; ``None`` where it cannot be read."""
    out: dict[str, Any] = {}
    for w in words:
        value = ns.get(w, _NOT_CODE)
        if value is _NOT_CODE:
            continue
        uses = _uses_of(value, ns, set(), 0)
        if uses is not _NOT_CODE:
            out[w] = uses
    return out


def _code_parts(value: Any) -> list[Any] | None:
    """The functions whose code ``value`` runs when used, or ``None`` when it
    is not notebook code."""
    if isinstance(value, types.MethodType):
        value = value.__func__
    if isinstance(value, types.FunctionType):
        return [value] if value.__module__ == "__main__" else None
    cls = value if isinstance(value, type) else type(value)
    if getattr(cls, "__module__", None) != "__main__":
        return None
    parts: list[Any] = []
    for klass in cls.__mro__:
        if getattr(klass, "__module__", None) != "__main__":
            continue
        for attr in vars(klass).values():
            if isinstance(attr, (staticmethod, classmethod)):
                attr = attr.__func__
            if isinstance(attr, property):
                parts += [f for f in (attr.fget, attr.fset, attr.fdel) if f]
            elif isinstance(attr, types.FunctionType):
                parts.append(attr)
    return parts


def _uses_of(value: Any, ns: Mapping[str, Any], seen: set[int], depth: int) -> Any:
    parts = _code_parts(value)
    if parts is None:
        return _NOT_CODE
    if depth > 8:
        return None  # too deep to follow: unknown
    out: set[str] = set()
    for fn in parts:
        if id(fn) in seen:
            continue
        seen.add(id(fn))
        code = getattr(fn, "__code__", None)
        if code is None:
            return None
        names = _CODE_USES.get(fn)
        if names is None:
            names = _CODE_USES[fn] = waitrule.code_uses(code)
        out |= names
        nested = [ns.get(n, _NOT_CODE) for n in names]
        nested += [c.cell_contents for c in fn.__closure__ or () if _filled(c)]
        for inner in nested:
            if inner is _NOT_CODE or id(inner) in seen:
                continue
            more = _uses_of(inner, ns, seen, depth + 1)
            if more is None:
                return None
            if more is not _NOT_CODE:
                out |= more
    return frozenset(out)


# -- deciding and settling, before a cell runs ---------------------------------------


def settle_for(shell: Any, source: str | None, tree: ast.Module | None = None) -> None:
    """Before a cell (its transformed text, its code as IPython parsed it, or
    both) runs: wait for, and merge, every pending run it could touch, and the
    runs started before those."""
    if not _PENDING:
        return
    ns = shell.user_ns
    if source is not None:
        code = _notebook_code(ns, waitrule.identifiers(source))
        reasons = [
            waitrule.why_wait_source(source, bg.footprint, code, tree)
            for bg in _PENDING
        ]
    else:
        assert tree is not None
        use = waitrule.cell_use_of(tree)
        code = _notebook_code(ns, use.names)
        reasons = [waitrule.why_wait(use, bg.footprint, code) for bg in _PENDING]
    last = max((i for i, r in enumerate(reasons) if r), default=-1)
    if last >= 0:
        target, why = _PENDING[last], reasons[last]
        _settle_through(shell, target, f"this cell {why}")
    _note_failures()


def might_touch(shell: Any, source: str) -> bool:
    """The quick check before a cell: could it touch a pending run at all?
    (A scan of its text's words; ``False`` for most cells.)"""
    if not _PENDING:
        return False
    code = _notebook_code(shell.user_ns, waitrule.identifiers(source))
    return any(waitrule.might_wait(source, bg.footprint, code) for bg in _PENDING)


def _note_failures() -> None:
    """A run that failed is said once, in the next cell, whether it waits or not."""
    for bg in list(_PENDING):
        if bg.state == "failed" and not bg.said_failed:
            bg.said_failed = True
            print(
                f"gpucell: note: the background run of cell [{bg.cell}] failed "
                f"({_one_line(bg.error)}); the next cell that uses its names "
                "raises it (`%gpu_wait` raises it now)."
            )


def _settle_through(shell: Any, target: BackgroundRun, why: str) -> None:
    """Wait for and merge every pending run up to ``target``, in start order."""
    if target not in _PENDING:
        if target.state == "raised" or target.state == "merged":
            return
        if target.state == "cancelled":
            return
    while _PENDING:
        bg = _PENDING[0]
        reason = why if bg is target else f"before the run of cell [{target.cell}]"
        _settle(shell, bg, reason)
        if bg is target:
            break


def _settle(shell: Any, bg: BackgroundRun, why: str) -> None:
    """Drive ``bg`` to its end here, then merge it and run the code after its
    loop, or raise its error (a note says which cell it came from)."""
    from gpucell.kernel.execute import _conclude, run_epilogue

    bg._stop_driver()  # (a thread that drove it is done with it)
    if bg.state == "running":
        print(
            f"gpucell: waiting for the background run of cell [{bg.cell}] ({why}) ..."
        )
        sys.stdout.flush()
        bg._drive_to_end()  # an interrupt raises here: the run goes on
    else:
        print(f"gpucell: merging the background run of cell [{bg.cell}] ({why}).")
    _PENDING.remove(bg)
    tail = bg.tail
    try:
        sys.stdout.write("".join(bg.output))
        display = getattr(bg.watched, "display", None)
        if isinstance(display, _LaterSummary):
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
            _conclude(tail, bg.results or [])
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
        _after_change()


#: the last run error raised again by a wait, with the traceback it had
_RAISED: list[Any] = []


def _add_note(error: BaseException, where: str) -> None:
    note = (
        f"gpucell: {where}, which this cell waited for; this cell's own code "
        "did not run."
    )
    add = getattr(error, "add_note", None)
    if add is not None and note not in getattr(error, "__notes__", ()):
        add(note)


def _one_line(error: BaseException | None) -> str:
    if error is None:
        return "no error"
    text = str(error).strip().splitlines()
    return f"{type(error).__name__}: {text[0] if text else ''}"


def wait_for_all(shell: Any, why: str) -> None:
    """Every pending run waited for and merged, in start order (``%gpu_wait``,
    a new ``%%gpu_parallel`` cell, ``%gpu_cluster stop``)."""
    if _PENDING:
        _settle_through(shell, _PENDING[-1], why)


def wait_magic(shell: Any, line: str) -> None:
    """``%gpu_wait`` (every pending run) or ``%gpu_wait N`` (the run of cell
    [N], and the runs started before it)."""
    from IPython.core.error import UsageError

    arg = line.strip()
    if not arg:
        if not _PENDING:
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
    found = [bg for bg in _RECENT if bg.cell == cell]
    if not found:
        started = ", ".join(f"[{bg.cell}]" for bg in _RECENT) or "none"
        raise UsageError(
            f"%gpu_wait {cell}: no background run of cell [{cell}] (runs of cells: "
            f"{started})."
        )
    bg = found[-1]
    if bg not in _PENDING:
        print(f"gpucell: the background run of cell [{cell}] is {bg.state}.")
        return
    _settle_through(shell, bg, f"`%gpu_wait {cell}`")


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
            "raise __import__('gpucell.kernel.background', fromlist=['_'])._pop()"
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
        if not _PENDING:
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


def _install(shell: Any) -> None:
    global _HOOKS, _EXIT_REGISTERED
    if _HOOKS is None or _HOOKS.shell is not shell:
        if _HOOKS is not None:
            _HOOKS.remove()
        _HOOKS = _Hooks(shell)
    if not _EXIT_REGISTERED:
        _EXIT_REGISTERED = True
        atexit.register(shutdown)


def _after_change() -> None:
    """Outside a cell (``%gpu_wait`` from a comm, ``run.cancel()`` from a widget)
    nothing else removes the hooks once no run is pending."""
    if not _PENDING and _HOOKS is not None and not _HOOKS.executing:
        _HOOKS.remove()


def _in_cell(shell: Any) -> bool:
    return getattr(getattr(shell, "displayhook", None), "exec_result", None) is not None


def shutdown() -> None:
    """Kernel exit, ``%unload_ext gpucell``: every running background run's
    engines stop their work (queued chunks aborted, running ones interrupted),
    its /dev/shm files released; nothing is merged."""
    for bg in list(_PENDING):
        if bg.state == "running":
            bg._stop_driver()
            with contextlib.suppress(BaseException):
                bg.run.abort(KeyboardInterrupt())
            bg.state = "cancelled"
            with contextlib.suppress(BaseException):
                bg.tail.keeping.echo = lambda line: None
                bg.tail.keeping.failed("shutdown")  # --checkpoint files complete
            with contextlib.suppress(BaseException):
                bg.watched.close()
        _PENDING.remove(bg)
    if _HOOKS is not None:
        _HOOKS.remove()


# -- gpucell.runs ----------------------------------------------------------------------


class Runs:
    """``gpucell.runs``: this kernel's background runs, oldest first (pending
    ones, and the last few merged, raised or cancelled).  ``runs[-1]`` is the
    newest, ``runs.cell(5)`` the run of cell [5], ``runs.pending`` those not
    merged yet, ``runs.wait()`` waits for every one."""

    def __iter__(self) -> Iterator[BackgroundRun]:
        return iter(list(_RECENT))

    def __len__(self) -> int:
        return len(_RECENT)

    def __getitem__(self, i: int) -> BackgroundRun:
        return _RECENT[i]

    @property
    def pending(self) -> list[BackgroundRun]:
        return list(_PENDING)

    def cell(self, n: int) -> BackgroundRun:
        for bg in reversed(_RECENT):
            if bg.cell == n:
                return bg
        raise KeyError(f"no background run of cell [{n}]")

    def wait(self) -> None:
        """Wait for every pending run, merging each (``%gpu_wait``)."""
        _main_thread_only("gpucell.runs.wait()")
        wait_for_all(_shell(), "`gpucell.runs.wait()`")

    def __repr__(self) -> str:
        if not _RECENT:
            return "gpucell.runs: no background run yet"
        lines = [f"cell [{bg.cell}]: {bg.progress}" for bg in _RECENT]
        return "gpucell.runs:\n  " + "\n  ".join(lines)


runs = Runs()


def _shell() -> Any:
    if _HOOKS is not None:
        return _HOOKS.shell
    from IPython import get_ipython

    return get_ipython()


def _main_thread_only(what: str) -> None:
    if threading.current_thread() is not threading.main_thread():
        raise RuntimeError(f"gpucell: {what} works in the kernel's main thread only.")
