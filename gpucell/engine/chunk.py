"""Engine side: run one chunk of a parallel loop and return what it produced.

Imported on every engine, so it needs only the standard library (and torch, lazily,
when the program uses the engine's device). Only data travels: the chunk program
(marshalled code plus the cell's text for tracebacks), the inputs, and a chunk
object; the result is a plain, picklable :class:`ChunkResult`.
"""

from __future__ import annotations

import ast
import builtins
import copy
import functools
import itertools
import linecache
import marshal
import math
import time
from collections.abc import Callable, Iterable, Iterator, Mapping
from types import CodeType, ModuleType
from typing import Any, Protocol

from gpucell.protocol.chunks import DETAIL_MAX, ChunkResult, chunk_items
from gpucell.protocol.fold import fold, is_numpy, is_torch, own, unordered
from gpucell.protocol.program import (
    AS_DEVICE,
    BEGIN,
    DEVICE,
    ITEM_ERROR,
    ITEMS,
    NATIVE_REDUCTIONS,
    NOW,
    REC,
    Indexed,
    ItemError,
    Row,
    gather_name,
    is_cuda_device,
    partial_name,
)

__all__ = ["ChunkResult", "Recorder", "run_chunk", "resolve_device"]

_MISSING = object()

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


class _Start:
    """A chunk partial before its first contribution: ``p op= e`` on it gives
    the recorder's private copy of ``e`` (:func:`own`); from then on the
    operator folds the partial as the merge would (lists and sets in place,
    numbers out of place), with no recorder call per iteration."""

    __slots__ = ("op",)

    def __init__(self, op: str) -> None:
        self.op = op

    def _first(self, value: Any) -> Any:
        return own(self.op, value)

    __iadd__ = __imul__ = __ior__ = __iand__ = __ixor__ = _first


def private_copy(row: Any) -> Any:
    """A copy of a row the iteration may write without touching the original:
    one level deep (its writes are one level deep), writable even when the
    shipped input is read-only."""
    if is_numpy(row):
        return row.copy()
    if is_torch(row):
        return row.clone()
    if type(row) in (list, dict, set, bytearray):
        return type(row)(row)
    return copy.copy(row)


def resolve_device(device: Any = None) -> Any:
    """The value of ``__gpucell_device__``: a ``torch.device`` when torch exists."""
    try:
        import torch
    except ImportError:
        return device or "cpu"
    if device is None:
        device = "cuda" if torch.cuda.is_available() else "cpu"
    return torch.device(device)


def as_device(target: Any, value: Any) -> Any:
    """``target`` for a CUDA device held in a value (``"cuda"``, ``"cuda:1"``, a
    ``torch.device``); anything else (a dtype, a tensor, ``"cpu"``) unchanged.
    CPU engines standing in for GPUs call it where the cell passes a device."""
    return target if is_cuda_device(value) else value


class Recorder:
    """Receives the rewritten body's contributions (``__gpucell_rec__``).

    Never touches the shipped inputs: every contribution goes to this object.
    """

    def __init__(
        self,
        ns: dict[str, Any],
        start: int,
        *,
        seed_fn: Callable[[int], Any] | None = None,
        device: Any = None,
        stamps: dict[int, float] | None = None,
        to_host: Any = None,
        where: Where | None = None,
    ) -> None:
        self.ns = ns
        # GPU engines: starts each recorded value's copy to the host at once
        # (gpucell.engine.tohost.HostCopier); None records values as they are
        self.to_host = to_host
        self.result = ChunkResult(start=start)
        self.seed_fn = seed_fn
        self.device = device
        # iteration index -> wall-clock start: provenance, and which iteration
        # is running (the last key) for output tags and error reports
        self.stamps: dict[int, float] = {} if stamps is None else stamps
        self.where = where if where is not None else Where(self.stamps, start)
        self.locals: tuple[str, ...] = ()
        self.red_ops: dict[str, str] = {}
        self.keyed_ops: dict[str, str] = {}
        self._partials: dict[str, Any] = {}
        self._unhashable_keys: dict[int, list[Any]] = {}
        self._keyed: dict[str, list[list[Any]]] = {}
        self._keyed_index: dict[str, dict[Any, int]] = {}
        self._deleted: set[str] = set()
        self._per_iteration_end = False
        self.suppressed: BaseException | None = None

    @property
    def current(self) -> int | None:
        """The iteration running (or that ran last)."""
        return self.where.current()

    # -- called by the program ---------------------------------------------------

    def setup(self, spec: Mapping[str, Any]) -> None:
        """Bind what the program calls per iteration to the cheapest callables.

        The common case costs no Python frame per iteration: ``begin`` is the
        stamps dict's ``__setitem__`` and each gather its list's ``append``.
        """
        ns = self.ns
        self.locals = tuple(spec.get("locals", ()))
        self.red_ops = dict(spec.get("reductions", {}))
        self.keyed_ops = dict(spec.get("keyed", {}))
        self._per_iteration_end = bool(spec.get("end", True))
        if spec.get("device"):
            target = resolve_device(self.device)
            ns[DEVICE] = target
            ns[AS_DEVICE] = functools.partial(as_device, target)
        ns[NOW] = time.time
        ns[ITEM_ERROR] = ItemError
        for name, op in self.red_ops.items():
            if op in NATIVE_REDUCTIONS:  # folded by ``p op= e`` in the program
                ns[partial_name(name)] = _Start(op)
        stamp, seed = self.stamps.__setitem__, self.seed_fn
        if seed is None:
            ns[BEGIN] = stamp
        else:

            def begin(index: int, t: float) -> None:
                stamp(index, t)
                seed(index)

            ns[BEGIN] = begin
        gathers = self.result.gathers
        to_host = self.to_host
        for name in spec.get("gathers", ()):
            add = gathers.setdefault(name, []).append
            if to_host is None:
                ns[gather_name(name)] = add
            else:
                ns[gather_name(name)] = lambda v, add=add: add(to_host(v))

    def end(self, index: int) -> None:
        ns, last = self.ns, self.result.last_values
        for name in self.locals:
            value = ns.pop(name, _MISSING)
            if value is not _MISSING:
                if isinstance(value, ModuleType):
                    last[name] = (index, "module", value.__name__)
                else:
                    last[name] = (index, "value", value)
            elif name in self._deleted:
                last[name] = (index, "deleted", None)
        self._deleted.clear()
        self.result.count += 1

    def raised(self, exc: BaseException) -> None:
        """The loop raised inside a ``with`` around it (which may swallow it)."""
        self.suppressed = exc

    def deleted(self, names: tuple[str, ...]) -> None:
        self._deleted.update(names)

    def append(self, name: str, value: Any) -> None:
        if self.to_host is not None:
            value = self.to_host(value)
        self.result.gathers.setdefault(name, []).append(value)

    def extend(self, name: str, values: Any) -> None:
        if self.to_host is not None:
            values = [self.to_host(v) for v in values]
        self.result.gathers.setdefault(name, []).extend(values)

    def setitem(self, value: Any, name: str, key: Any) -> None:
        if self.to_host is not None:
            value = self.to_host(value)
        self.result.writes.setdefault(name, []).append((key, value))

    def keyed_append(self, name: str, key: Any, value: Any) -> None:
        self.keyed_extend(name, key, [value])

    def keyed_extend(self, name: str, key: Any, values: Any) -> None:
        if self.to_host is not None:
            values = [self.to_host(v) for v in values]
        runs = self.result.keyed_gathers.setdefault(name, [])
        if runs and runs[-1][0] is key:
            runs[-1][1].extend(values)
        else:
            runs.append((key, list(values)))

    def setindexed(self, value: Any, name: str, accessor: str, key: Any) -> None:
        if self.to_host is not None:
            value = self.to_host(value)
        self.result.writes.setdefault(name, []).append((Indexed(accessor, key), value))

    def own_copy(self, seq: Any, index: Any) -> Any:
        """The iteration's private copy of its row ``seq[index]``: its reads see
        its own writes (as serially) while the shipped input stays as it was.
        A row that does not exist yet (a dict's new key) starts as missing."""
        try:
            row = seq[index]
        except (KeyError, IndexError):
            return _MISSING
        return private_copy(row)

    def touch(self, keys: dict[Any, None], key: Any) -> None:
        try:
            keys[key] = None
        except TypeError:  # a slice or a list of positions: kept, in order
            self._unhashable_keys.setdefault(id(keys), []).append(key)

    def own_done(self, name: str, index: Any, row: Any, written: Any) -> None:
        """Record what the iteration wrote in its row: the final value of each
        key it wrote (``written``: the keys), or the whole element (``True``)."""
        if written is True:
            if row is not _MISSING:
                self.setitem(row, name, index)
            return
        if not written and id(written) not in self._unhashable_keys:
            return
        keys = [*written, *self._unhashable_keys.pop(id(written), ())]
        out = self.result.writes.setdefault(name, [])
        for key in keys:
            value = row[key]
            if self.to_host is not None:
                value = self.to_host(value)
            out.append((Row(index, key), value))

    def reduce(self, name: str, value: Any) -> None:
        op = self.red_ops[name]
        if op in ("max", "min") and unordered(value):
            # ``acc = max(acc, nan)`` keeps ``acc`` (nan > acc is false), and
            # an ``acc`` that is nan stays nan whatever comes: serially a nan
            # contribution never changes the result, but as a chunk's first
            # value it would become the chunk's partial and hide the rest
            return
        cur = self._partials.get(name, _MISSING)
        if cur is _MISSING:
            self._partials[name] = own(op, value)
        else:
            self._partials[name] = fold(op, cur, value)

    def keyed(self, name: str, key: Any, value: Any) -> None:
        op = self.keyed_ops[name]
        entries = self._keyed.setdefault(name, [])
        index = self._keyed_index.setdefault(name, {})
        try:
            pos = index.get(key)
            hashable = True
        except TypeError:  # unhashable keys (slices, lists) stay separate, in order
            pos, hashable = None, False
        if pos is None:
            if hashable:
                index[key] = len(entries)
            entries.append([key, own(op, value)])
        else:
            entries[pos][1] = fold(op, entries[pos][1], value)

    def add(self, name: str, value: Any) -> None:
        ops = self.result.unions.setdefault(name, [])
        if ops and ops[-1][0] == "add":
            ops[-1][1].append(value)
        else:
            ops.append(("add", [value]))

    def update(self, name: str, *args: Any) -> None:
        ops = self.result.unions.setdefault(name, [])
        for a in args:
            ops.append(("update", dict(a) if isinstance(a, Mapping) else list(a)))

    # -- called by run_chunk ---------------------------------------------------

    def finish(self) -> ChunkResult:
        r = self.result
        if not self._per_iteration_end:
            # Locals were not popped after each iteration (nothing deletes
            # them), so the namespace holds each one's last value in this chunk,
            # exactly as a serial run would; merge only compares chunks, so the
            # chunk's last index orders them.
            r.count = self.where.done()
            last_index = self.where.current()
            if last_index is None:
                last_index = r.start
            ns, last = self.ns, r.last_values
            for name in self.locals:
                value = ns.get(name, _MISSING)
                if value is _MISSING:
                    continue
                if isinstance(value, ModuleType):
                    last[name] = (last_index, "module", value.__name__)
                else:
                    last[name] = (last_index, "value", value)
        for name, op in self.red_ops.items():
            if op in NATIVE_REDUCTIONS:
                p = self.ns.get(partial_name(name), _MISSING)
                if p is not _MISSING and not isinstance(p, _Start):
                    self._partials[name] = p
        for name, partial in self._partials.items():
            r.reductions[name] = (self.red_ops[name], partial)
        for name, entries in self._keyed.items():
            r.keyed[name] = (self.keyed_ops[name], [(k, p) for k, p in entries])
        move = self.to_host
        if move is not None:
            # what is only known at the end goes now, then every copy is awaited
            r.reductions = {k: (op, move(v)) for k, (op, v) in r.reductions.items()}
            r.keyed = {
                k: (op, [(key, move(p)) for key, p in es])
                for k, (op, es) in r.keyed.items()
            }
            r.last_values = {
                k: (i, kind, move(v) if kind == "value" else v)
                for k, (i, kind, v) in r.last_values.items()
            }
            r.unions = {
                k: [(op, move(x)) for op, x in ops] for k, ops in r.unions.items()
            }
            move.wait()
        return r


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


class Where:
    """Which iteration of a chunk runs now, and how many have started.

    A stamped program records each iteration's start (``stamps``: the last key
    is the iteration running).  The unstamped one records nothing: the items'
    iterator says how far it got (``__length_hint__`` of a range, list or tuple
    iterator), so a print is still tagged and an error still names its iteration.
    """

    __slots__ = ("_it", "_n", "namespace", "stamps", "start")

    def __init__(self, stamps: dict[int, float], start: int) -> None:
        self.stamps = stamps
        self.start = start
        self._it: Any = None
        self._n = 0
        # the namespace the chunk's code runs in (functions it makes have it
        # as their globals: see wire.dumps's cell_globals)
        self.namespace: dict[str, Any] | None = None

    def follow(self, it: Any, n: int) -> None:
        """Read the position off ``it``'s ``__length_hint__`` (items not taken
        yet) among ``n``: a range, list or tuple iterator, or _TimedBlocks."""
        self._it, self._n = it, n

    @property
    def unstamped(self) -> bool:
        return self._it is not None

    def done(self) -> int:
        """Iterations started (all of them once the chunk finished)."""
        if self._it is not None:
            return int(self._n - self._it.__length_hint__())
        return len(self.stamps)

    def current(self) -> int | None:
        """The iteration running (or that ran last); ``None`` before the first."""
        if self._it is not None:
            done = self.done()
            return self.start + done - 1 if done > 0 else None
        return next(reversed(self.stamps), None)


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
    """Run the chunk program over one chunk's items.

    Parameters
    ----------
    program : code, bytes, (filename, source, bytes), ast.Module or str
        ``LoopPlan.engine_program()`` (or ``compile_chunk()``) from the kernel.
    namespace : mapping
        The inputs. Copied (shallowly) so it can be cached and reused across
        chunks; the rewritten body never changes an input object in place.
    chunk_obj : tuple
        From ``Chunker.chunk(start, stop)``.
    start_index : int
        Index of the chunk's first iteration in the whole loop.
    seed_fn : callable, optional
        ``seed_fn(i)`` before iteration ``i`` runs (per-iteration seeding hook).
    device : str or torch.device, optional
        The engine's device for ``__gpucell_device__`` (CUDA-rewritten programs);
        default: ``cuda`` when available, else ``cpu``.
    stamps : dict, optional
        Filled with ``{iteration: time.time() at its start}`` as the chunk runs
        (the caller may read it while it runs: its last key is the iteration
        running).
    to_host : gpucell.engine.tohost.HostCopier, optional
        On GPU engines: copies recorded CUDA tensors to the host as they are
        recorded, overlapping later iterations; awaited before returning.
    deadline : float, optional
        ``time.perf_counter()`` after which no further iteration starts (a trial
        chunk); the result's ``count`` says how many ran (at least one).
    where : Where, optional
        Filled so the caller can ask which iteration runs (output tags, errors)
        and how many ran.  A chunk of more than ``UNSTAMPED_MIN`` items of a
        range, list or tuple, without ``seed_fn`` or ``deadline``, runs the
        program's unstamped variant when it has one: ``stamps`` stays empty.
        So does a ``deadline`` chunk of more than ``CHEAP_MIN`` such items when
        ``cheap``, its items in timed blocks (:class:`_TimedBlocks`).
    cheap : bool
        This cell's iterations were measured cheap here: chunks of more than
        ``CHEAP_MIN`` items run unstamped too.
    verdict : TrialVerdict, optional
        A ``deadline`` chunk's line to the kernel (see :class:`_TrialEnd`):
        when the deadline passes it publishes its pace and, if its unrun items
        would take at most ``EXTEND_MAX_SECONDS`` at that pace, runs on while
        the kernel judges every trial's pace: told the loop is uniform, it
        runs whole; told otherwise, or told nothing for ``VERDICT_WAIT``, it
        stops.
    hand_back : HandBackFlag, optional
        The kernel's hand-back flag (see :class:`_HandBack`): the seconds a
        rest must exceed to be worth handing to idle engines, while one is
        raised.  The chunk may then stop early (``hand_back.stopped``);
        ``count`` says how many ran.

    Raises
    ------
    BaseException
        Whatever the body raised, with its original traceback (cell lines) and a
        note naming the iteration; ``exc.gpucell_iteration`` holds its index.
    """
    code = _as_code(program)
    where = (
        where
        if where is not None
        else Where({} if stamps is None else stamps, start_index)
    )
    if stamps is None:
        stamps = where.stamps
    seq = None
    # a trial chunk (``deadline``) runs unstamped only when already measured cheap
    if seed_fn is None and (deadline is None or cheap):
        seq = _unstamped_items(chunk_obj, cheap)
        fast = _unstamped_code(program) if seq is not None else None
        if fast is not None:
            code = fast
        else:
            seq = None
    end = None
    if deadline is not None and verdict is not None:
        end = _TrialEnd(verdict, _chunk_length(chunk_obj), stamped=seq is None)
    length = _chunk_length(chunk_obj) if hand_back is not None else None
    stop = None if hand_back is None or length is None else _HandBack(hand_back, length)
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
    ns[REC] = rec
    if seq is not None and deadline is None and stop is None:
        it = iter(seq)
        where.follow(it, len(seq))
        ns[ITEMS] = it
    elif seq is not None:
        blocks = _TimedBlocks(
            seq, math.inf if deadline is None else deadline, end, stop
        )
        where.follow(blocks, len(seq))
        ns[ITEMS] = itertools.chain.from_iterable(blocks.blocks())
    else:
        items: Iterable[Any] = zip(
            itertools.count(start_index), chunk_items(chunk_obj), strict=False
        )
        if deadline is not None or stop is not None:
            items = _until(items, math.inf if deadline is None else deadline, end, stop)
        ns[ITEMS] = items
    try:
        exec(code, ns)
        if rec.suppressed is not None:
            # a `with` around the loop swallowed it; serially the iterations
            # after it would not have run, so this chunk has no result
            exc = rec.suppressed
            if hasattr(exc, "add_note"):
                exc.add_note(
                    "gpucell: a `with` around the loop suppressed this exception"
                )
            raise exc
    except BaseException as exc:
        if rec.current is not None:
            try:
                exc.gpucell_iteration = rec.current  # type: ignore[attr-defined]
            except AttributeError:
                pass
            if hasattr(exc, "add_note"):
                exc.add_note(f"gpucell: raised in iteration {rec.current} of the loop")
        raise
    return rec.finish()
