"""Engine side: run one chunk of a parallel loop and return what it produced.

Imported on every engine, so it needs only the standard library (and torch, lazily,
when the program uses the engine's device). Only data travels: the chunk program
(marshalled code plus the cell's text for tracebacks), the inputs, and a chunk
object; the result is a plain, picklable :class:`ChunkResult`.
"""

from __future__ import annotations

import ast
import builtins
import dis
import functools
import itertools
import linecache
import marshal
import math
import time
from collections.abc import Callable, Iterable, Iterator, Mapping
from types import CodeType, FunctionType
from typing import Any, Protocol

from gpucell.engine.recorder import Recorder, as_device, private_copy, resolve_device
from gpucell.engine.where import Where
from gpucell.errors import add_note
from gpucell.protocol.chunks import DETAIL_MAX, ChunkResult, chunk_items
from gpucell.protocol.program import ITEMS, REC

# (Recorder, the device helpers and Where live in their own modules; these
# names stay importable from here)
__all__ = [
    "ChunkResult",
    "Recorder",
    "Where",
    "as_device",
    "private_copy",
    "resolve_device",
    "run_chunk",
]


#: a chunk of more items than this runs the unstamped program (a stamp per
#: iteration costs more than a cheap body, and the worker sends a chunk's stamps
#: only up to DETAIL_MAX anyway)
UNSTAMPED_MIN = DETAIL_MAX
#: ... and so does a chunk of more than CHEAP_MIN items once this cell's
#: iterations took less than CHEAP_ITERATION seconds each here: a stamp (about
#: 0.25 us) would cost more than 1% of such an iteration, and their times say
#: nothing the chunk's own time does not
CHEAP_ITERATION = 20e-6
CHEAP_MIN = 1000


def _as_code(program: Any) -> CodeType:
    if isinstance(program, CodeType):
        return program
    if isinstance(program, tuple) and len(program) in (3, 4):
        filename, source, code = program[:3]
        if source and filename not in linecache.cache:
            lines = source.splitlines(True)
            linecache.cache[filename] = (len(source), None, lines, filename)
        return _as_code(code)
    if isinstance(program, (bytes, bytearray)):
        code = marshal.loads(program)
        if not isinstance(code, CodeType):
            raise TypeError("marshalled program is not a code object")
        return code
    if isinstance(program, ast.Module):
        return compile(program, "<gpucell-chunk>", "exec", dont_inherit=True)
    if isinstance(program, str):
        return compile(program, "<gpucell-chunk>", "exec", dont_inherit=True)
    raise TypeError(f"cannot run a chunk program of type {type(program).__name__}")


def _unstamped_code(program: Any) -> CodeType | None:
    """The program's unstamped variant (``LoopPlan.engine_program()[3]``)."""
    if isinstance(program, tuple) and len(program) == 4 and program[3] is not None:
        _as_code(program[:3])  # the cell's lines for tracebacks
        return _as_code(program[3])
    return None


def _unstamped_items(chunk_obj: tuple[Any, ...], cheap: bool) -> Any:
    """The chunk's own range, list or tuple when it is one long enough for the
    unstamped program (``None`` otherwise)."""
    if chunk_obj[0] not in ("range", "seq"):
        return None
    seq = chunk_obj[1]
    if type(seq) not in (range, list, tuple):
        return None
    if len(seq) <= (CHEAP_MIN if cheap else UNSTAMPED_MIN):
        return None
    return seq


class _TimedBlocks:
    """A trial chunk's range, list or tuple for the unstamped program: handed
    to the loop in blocks (``itertools.chain``: no Python code per item), the
    deadline checked between blocks, so the chunk stops at a block's end once
    it passed.  Blocks double from ``FIRST`` items while one takes under
    ``BLOCK_SECONDS``, so a trial overshoots its budget by about that at most.
    For iterations the engine already measured cheap in this cell: a stamp
    each cost five times a cheap body (``acc += i``: 0.33 us against 0.06 us),
    and a trial's stamps are not needed to see warm-up once it is over."""

    FIRST = 64
    BLOCK_SECONDS = 0.002
    MAX_BLOCK = 1 << 16

    __slots__ = ("_base", "_cur", "_end", "_len", "_seq", "_stop", "deadline")

    def __init__(
        self,
        seq: range | list[Any] | tuple[Any, ...],
        deadline: float,
        end: Callable[[int, float], bool | None] | None = None,
        stop: Callable[[int, float], bool] | None = None,
    ):
        self._seq = seq
        self.deadline = deadline
        self._end = end
        self._stop = stop
        self._base = 0
        self._len = 0
        self._cur: Any = iter(())

    def __length_hint__(self) -> int:
        """Items not taken yet (as a list iterator says): ``Where`` reads it."""
        taken = self._base + self._len - self._cur.__length_hint__()
        return int(len(self._seq) - taken)

    def blocks(self) -> Iterator[Iterator[Any]]:
        clock = time.perf_counter
        n, pos, size = len(self._seq), 0, self.FIRST
        began = clock()
        while pos < n:
            t = clock()
            if pos and t >= self.deadline:
                if self._end is None or (go := self._end(pos, t - began)) is False:
                    return
                if go:
                    self.deadline = math.inf  # the kernel says: run it whole
            if pos and self._stop is not None and self._stop(pos, t - began):
                return  # the rest goes to engines that are idle
            stop = min(n, pos + size)
            self._base, self._len = pos, stop - pos
            self._cur = iter(self._seq[pos:stop])
            yield self._cur
            pos = stop
            if clock() - t < self.BLOCK_SECONDS:
                size = min(self.MAX_BLOCK, size * 2)


def _until(
    items: Iterable[Any],
    deadline: float,
    end: Callable[[int, float], bool | None] | None = None,
    stop: Callable[[int, float], bool] | None = None,
) -> Iterator[Any]:
    """``items`` until ``deadline`` passes, checked after each iteration (so the
    first always runs): the loop's own ``for`` ends, the program is unchanged.
    ``end(done, seconds)``: asked after each iteration once the deadline passed:
    true runs them all, false stops, ``None`` runs one more and asks again.
    ``stop(done, seconds)``: asked after each iteration; true stops (the rest
    is handed back for idle engines: :class:`_HandBack`)."""
    clock = time.perf_counter
    began = clock()
    it = iter(items)
    for done, item in enumerate(it, 1):
        yield item
        now = clock()
        if now >= deadline:
            if end is None or (go := end(done, now - began)) is False:
                return
            if go:
                if stop is None:
                    yield from it
                    return
                deadline = math.inf
        if stop is not None and stop(done, now - began):
            return


#: a running chunk asks whether idle engines want its rest at most this often
#: (a file read in /dev/shm, ~10 us)
HAND_BACK_POLL = 0.001


class HandBackFlag(Protocol):
    """A running chunk's line to the kernel's hand-back flag (``engine/worker``:
    a file in the host's /dev/shm); ``stopped`` is set when the chunk stopped
    early because of it."""

    stopped: bool

    def threshold(self) -> float | None: ...


class _HandBack:
    """Whether a chunk should stop after the iteration just done and hand its
    rest back: the kernel raises a flag (with a threshold in seconds) once an
    engine is idle with nothing left to hand out, and a chunk whose unrun rest
    would take longer than that at its pace so far, and is at least two
    iterations, stops.  So a rare costly iteration, or an engine slower than
    its equals, does not keep the rest of its chunk from engines that idle."""

    __slots__ = ("_flag", "_n", "_next")

    def __init__(self, flag: HandBackFlag, n: int):
        self._flag = flag
        self._n = n
        self._next = 0.0

    def __call__(self, done: int, seconds: float) -> bool:
        rest = self._n - done
        if rest < 2 or done <= 0:
            return False
        now = time.perf_counter()
        if now < self._next:
            return False
        self._next = now + HAND_BACK_POLL
        threshold = self._flag.threshold()
        if threshold is None or rest * seconds / done <= threshold:
            return False
        self._flag.stopped = True
        return True


#: a trial told it may run whole does so only when what is left of it would
#: take at most this long at its own pace: the rest of a long trial goes back
#: as usual, so progress and the work kept on an interrupt stay fine-grained
EXTEND_MAX_SECONDS = 0.5

#: a trial with such a short rest runs on past its budget (its own iterations:
#: nothing is wasted) for at most this long while the kernel, which reads the
#: paces the trials publish at their budget, decides whether the loop is uniform
#: (it needs 3 trials', or every engine's: one engine slow to start on a loaded
#: host must not make the others give up first)
VERDICT_WAIT = 0.2

#: and asks for the verdict at most this often (a file read, ~10 us)
VERDICT_POLL = 0.0005


class TrialVerdict(Protocol):
    """A trial's line to the kernel while it runs (``engine/worker``: files in
    the host's /dev/shm): what it measured at its budget, and what to do."""

    def publish(self, done: int, seconds: float, stamped: bool) -> None: ...

    def poll(self) -> bool | None: ...


class _TrialEnd:
    """What a trial does once its budget is spent (asked after each iteration
    or block): publish its pace once; with a rest longer than
    ``EXTEND_MAX_SECONDS`` stop; else follow the kernel's verdict (``True`` run
    whole, ``False`` stop), running on meanwhile for at most ``VERDICT_WAIT``."""

    __slots__ = ("_give_up", "_n", "_next", "_short", "_stamped", "_verdict")

    def __init__(self, verdict: TrialVerdict, n: int | None, stamped: bool):
        self._verdict = verdict
        self._n = n
        self._stamped = stamped
        self._give_up: float | None = None
        self._short = False
        self._next = 0.0

    def __call__(self, done: int, seconds: float) -> bool | None:
        now = time.perf_counter()
        if self._give_up is None:
            self._give_up = now + VERDICT_WAIT
            self._verdict.publish(done, seconds, self._stamped)
            if self._n is not None:
                left = (self._n - done) * seconds / max(done, 1)
                self._short = left <= EXTEND_MAX_SECONDS
        if not self._short:
            return False
        if now < self._next and now < self._give_up:
            return None
        self._next = now + VERDICT_POLL
        said = self._verdict.poll()
        if said is not None:
            return said
        return None if now < self._give_up else False


def _chunk_length(chunk_obj: tuple[Any, ...]) -> int | None:
    """Items in a range or sequence chunk (``None``: a chunk of unknown length)."""
    if chunk_obj[0] not in ("range", "seq"):
        return None
    try:
        return len(chunk_obj[1])
    except TypeError:
        return None


def run_chunk(
    program: Any,
    namespace: Mapping[str, Any],
    chunk_obj: tuple[Any, ...],
    start_index: int,
    *,
    seed_fn: Callable[[int], Any] | None = None,
    device: Any = None,
    stamps: dict[int, float] | None = None,
    to_host: Any = None,
    deadline: float | None = None,
    where: Where | None = None,
    cheap: bool = False,
    verdict: TrialVerdict | None = None,
    hand_back: HandBackFlag | None = None,
) -> ChunkResult:
    """Run the chunk program (``LoopPlan.engine_program()``: code, bytes,
    ``(filename, source, bytes[, unstamped])``, ast.Module or str) over one
    chunk's items (``chunk_obj``, from ``Chunker.chunk``; ``start_index`` its
    first iteration).  ``namespace`` (the inputs) is copied shallowly, so it
    can be cached across chunks.

    ``seed_fn(i)`` runs before iteration ``i`` (``--seed``).  ``device``: the
    engine's ``__gpucell_device__`` (default ``cuda`` when available).
    ``stamps`` is filled with ``{iteration: time.time() at its start}`` as the
    chunk runs (its last key is the iteration running).  ``to_host`` (GPU
    engines, ``tohost.HostCopier``) copies recorded tensors to the host as
    they come, awaited before returning.  ``deadline`` (``perf_counter``): a
    trial starts no iteration after it (``count`` says how many ran, at least
    one); with ``verdict`` (see :class:`_TrialEnd`) it publishes its pace then
    and, when its rest is short, follows the kernel's verdict.  ``hand_back``
    (see :class:`_HandBack`): the chunk may stop early for idle engines.
    ``where`` says which iteration runs and how many ran.

    A chunk of more than ``UNSTAMPED_MIN`` items of a range, list or tuple,
    without ``seed_fn`` or ``deadline``, runs the program's unstamped variant
    when it has one (``stamps`` stays empty); so does a ``deadline`` chunk of
    more than ``CHEAP_MIN`` such items when ``cheap`` (this cell's iterations
    were measured cheap here), its items in timed blocks (:class:`_TimedBlocks`).

    Raises whatever the body raised, with its original traceback (cell lines)
    and a note naming the iteration; ``exc.gpucell_iteration`` holds its index.
    """
    if where is None:
        where = Where({} if stamps is None else stamps, start_index)
    if stamps is None:
        stamps = where.stamps
    code, seq = _as_code(program), None
    # a trial chunk (``deadline``) runs unstamped only when already measured cheap
    if seed_fn is None and (deadline is None or cheap):
        seq = _unstamped_items(chunk_obj, cheap)
        fast = _unstamped_code(program) if seq is not None else None
        code, seq = (fast, seq) if fast is not None else (code, None)
    ns: dict[str, Any] = dict(namespace)
    where.namespace = ns
    ns.setdefault("__builtins__", builtins)
    ns.setdefault("__name__", "__main__")
    rec = Recorder(
        ns,
        start_index,
        seed_fn=seed_fn,
        device=device,
        stamps=stamps,
        to_host=to_host,
        where=where,
    )
    _bind_readers_at_setup(rec, ns)
    ns[REC] = rec
    ns[ITEMS] = _items(chunk_obj, start_index, seq, where, deadline, verdict, hand_back)
    _execute(code, ns, rec)
    return rec.finish()


_LOADS = frozenset({"LOAD_NAME", "LOAD_GLOBAL"})


@functools.lru_cache(maxsize=1024)
def _names(code: CodeType, ops: frozenset[str], deep: bool) -> frozenset[str]:
    """Names ``code`` (and, when ``deep``, the code nested in it) uses by
    ``ops`` (cached: every chunk of a cell asks about the same code)."""
    out = {
        i.argval
        for i in dis.get_instructions(code)
        if i.opname in ops and isinstance(i.argval, str)
    }
    if deep:
        for c in code.co_consts:
            if isinstance(c, CodeType):
                out |= _names(c, ops, deep)
    return frozenset(out)


def _notebook_function(value: Any) -> bool:
    return type(value) is FunctionType and value.__module__ == "__main__"


def _bind_readers_at_setup(rec: Recorder, ns: dict[str, Any]) -> None:
    """Bind the readers (:func:`_bind_readers`) of the names the program's
    ``setup`` says are the loop's own (``Spec.locals``): never a
    comprehension's variable, which serially a function reads as the
    notebook's global, not the comprehension's."""
    setup = rec.setup

    def setup_and_bind(spec: Mapping[str, Any]) -> None:
        setup(spec)
        _bind_readers(ns, frozenset(spec.get("locals", ())))

    rec.setup = setup_and_bind  # type: ignore[method-assign]


def _bind_readers(ns: dict[str, Any], bound: frozenset[str]) -> None:
    """Notebook functions that read, as globals, names the loop binds
    (``def scaled(v): return v * factor`` in ``for factor in ...``) run with
    the chunk's namespace as their globals, as serially they run with the
    notebook's: each call sees its own iteration's value.  (The kernel lets
    the loop run only where that is exact: kernel.preflight.)  Followed
    through the notebook functions they read as globals; others keep the
    globals they came with."""
    if not bound:
        return
    memo: dict[int, Any] = {}

    def reads(fn: Any, seen: set[int]) -> bool:
        if id(fn) in seen:
            return False
        seen.add(id(fn))
        used = _names(fn.__code__, _LOADS, deep=True)
        if used & bound:
            return True
        return any(
            _notebook_function(v) and reads(v, seen)
            for n in used
            for v in (ns.get(n, fn.__globals__.get(n)),)
        )

    def rebound(fn: FunctionType) -> FunctionType:
        if id(fn) in memo:
            return memo[id(fn)]
        new = FunctionType(
            fn.__code__, ns, fn.__name__, fn.__defaults__, fn.__closure__
        )
        memo[id(fn)] = new
        new.__kwdefaults__ = fn.__kwdefaults__
        new.__qualname__ = fn.__qualname__
        new.__module__ = fn.__module__
        new.__doc__ = fn.__doc__
        new.__dict__.update(fn.__dict__)
        for n in _names(fn.__code__, _LOADS, deep=True):
            if n in ns or n not in fn.__globals__:
                continue
            v = fn.__globals__[n]
            ns[n] = rebound(v) if _notebook_function(v) and reads(v, set()) else v
        return new

    for name, value in list(ns.items()):
        if _notebook_function(value) and value.__globals__ is not ns:
            if reads(value, set()):
                ns[name] = rebound(value)


def _items(
    chunk_obj: tuple[Any, ...],
    start_index: int,
    seq: Any,
    where: Where,
    deadline: float | None,
    verdict: TrialVerdict | None,
    hand_back: HandBackFlag | None,
) -> Iterable[Any]:
    """What the program's loop iterates: the unstamped program's items
    (``seq``, followed by ``where``), else ``(index, item)`` pairs; cut short
    by a trial's deadline or a hand-back."""
    end = None
    if deadline is not None and verdict is not None:
        end = _TrialEnd(verdict, _chunk_length(chunk_obj), stamped=seq is None)
    length = _chunk_length(chunk_obj) if hand_back is not None else None
    stop = None if hand_back is None or length is None else _HandBack(hand_back, length)
    if seq is not None and deadline is None and stop is None:
        it = iter(seq)
        where.follow(it, len(seq))
        return it
    if seq is not None:
        blocks = _TimedBlocks(
            seq, math.inf if deadline is None else deadline, end, stop
        )
        where.follow(blocks, len(seq))
        return itertools.chain.from_iterable(blocks.blocks())
    items: Iterable[Any] = zip(
        itertools.count(start_index), chunk_items(chunk_obj), strict=False
    )
    if deadline is not None or stop is not None:
        items = _until(items, math.inf if deadline is None else deadline, end, stop)
    return items


def _execute(code: CodeType, ns: dict[str, Any], rec: Recorder) -> None:
    """Run the program; an exception is noted with the iteration it came from."""
    try:
        exec(code, ns)
        if rec.suppressed is not None:
            # a `with` around the loop swallowed it; serially the iterations
            # after it would not have run, so this chunk has no result
            exc = rec.suppressed
            add_note(exc, "gpucell: a `with` around the loop suppressed this exception")
            raise exc
    except BaseException as exc:
        if rec.current is not None:
            try:
                exc.gpucell_iteration = rec.current  # type: ignore[attr-defined]
            except AttributeError:
                pass
            add_note(exc, f"gpucell: raised in iteration {rec.current} of the loop")
        raise
