"""Engine-side entry points of ``%%gpu_parallel`` (imported on engines by name).

The kernel calls two functions through ipyparallel:

* :func:`load` once per engine per cell: the chunk program and the inputs that are
  not already cached on this engine (big inputs are cached across cells by
  fingerprint, so an unchanged model or dataset travels once);
* :func:`run` per chunk: runs the iterations with :func:`gpucell.engine.chunk.run_chunk`
  and returns the result as :mod:`gpucell.protocol.wire` frames (zero-copy for arrays
  and
  tensors).

An exception in an iteration comes back as data (type, message, the cell-line
traceback, the iteration and its loop values), so the kernel can re-raise the
user's own exception type with gpucell's context attached.
"""

from __future__ import annotations

import contextlib
import hashlib
import io
import os
import socket
import sys
import time
import traceback
import warnings
from array import array
from dataclasses import dataclass, field
from typing import Any

from gpucell.engine import (
    checkin,
    checkout,
    hostcopy,
    logs,
    runtime,
    tohost,
    writebehind,
)
from gpucell.engine.chunk import CHEAP_ITERATION, Where, run_chunk
from gpucell.engine.runtime import collect, interrupts_held
from gpucell.protocol import shm, wire
from gpucell.protocol.chunks import DETAIL_MAX, ChunkResult, chunk_items, item_refs
from gpucell.protocol.conversation import ChunkError, Timing
from gpucell.protocol.fold import is_torch
from gpucell.protocol.program import LogLevels, Setup, Watch

__all__ = ["load", "run", "clear"]


@dataclass
class _Session:
    """One kernel's state on this engine: several notebooks may share a cluster,
    and each one's cells, programs and cached inputs stay its own."""

    # name -> (fingerprint, value); survives across cells
    cache: dict[str, tuple[Any, Any]] = field(default_factory=dict)
    program: Any = None
    cell: str | None = None
    inputs: dict[str, Any] = field(default_factory=dict)
    # what the cell's chunks check in and out (gpucell.engine.checkin)
    watch: Watch = field(default_factory=lambda: _no_watch())
    # the kernel's warnings filters, applied while this cell's chunks run
    warning_filters: list[Any] | None = None
    # the kernel's logging levels, applied while this cell's chunks run (the
    # records they make go back to the kernel's handlers)
    log_levels: LogLevels | None = None
    # the kernel's process-wide settings (torch's default dtype, numpy's error
    # modes), applied around each chunk of this cell
    state: dict[str, Any] = field(default_factory=dict)
    # seconds per iteration of this cell's last chunk here: cheap iterations
    # run the unstamped program (gpucell.engine.chunk.CHEAP_ITERATION)
    iteration_mean: float | None = None
    # the kernel's working directory, where this cell's chunks run (if it
    # exists here: on another host it may not)
    cwd: str | None = None


def _no_watch() -> Watch:
    return {"names": [], "items": False}


#: kernel key (``gpucell.devices.host.kernel_key``) -> its state here, the most
#: recently used last
_sessions: dict[str, _Session] = {}

#: kernels whose state an engine keeps: a kernel that died without saying so
#: (killed) leaves its cached inputs here until this many others came after it
MAX_SESSIONS = 16


def _session(kernel: str) -> _Session:
    s = _sessions.pop(kernel, None)
    if s is None:
        s = _Session()
        while len(_sessions) >= MAX_SESSIONS:
            _sessions.pop(next(iter(_sessions)))  # the least recently used
    _sessions[kernel] = s
    return s


def cached(name: str) -> Any:
    """The cached input ``name`` of any kernel (for tests and the GPU proof)."""
    for s in _sessions.values():
        if name in s.cache:
            return s.cache[name][1]
    raise KeyError(name)


def cached_names() -> list[str]:
    """Names cached for every kernel, sorted (for tests)."""
    return sorted({n for s in _sessions.values() for n in s.cache})


def clear(kernel: str = "") -> None:
    """Forget a kernel's cached inputs and program (frees engine memory)."""
    _sessions.pop(kernel, None)
    hostcopy.unpublish(kernel)


def _nbytes(value: Any) -> int:
    """Bytes an input holds: the buffers of arrays and tensors (in containers
    too, one level), else a shallow size."""
    n = None if isinstance(value, type) else getattr(value, "nbytes", None)
    if isinstance(n, int):
        return n
    if is_torch(value):
        try:
            return int(value.element_size() * value.nelement())
        except Exception:
            return 0
    if isinstance(value, (list, tuple)):
        return sum(_nbytes(v) for v in value[:10_000]) + sys.getsizeof(value)
    if isinstance(value, dict):
        vals = list(value.values())[:10_000]
        return sum(_nbytes(v) for v in vals) + sys.getsizeof(value)
    return sys.getsizeof(value)


def _evict(cache: dict[str, Any], budget: int | None, keep: set[str]) -> None:
    """Drop the least recently used cached inputs the running cell does not
    read until the cache fits ``budget`` bytes (``None``: no budget)."""
    if budget is None:
        return
    sizes = {name: _nbytes(v) for name, (_k, v) in cache.items()}
    total = sum(sizes.values())
    for name in list(cache):  # oldest first: used entries move to the end
        if total <= budget:
            break
        if name in keep:
            continue
        total -= sizes[name]
        cache.pop(name, None)


#: seconds an engine waits, idle, after a chunk before it tidies the cell away
#: (:func:`after_cell`): well above the gap between two chunks of a running cell
#: (the kernel keeps each engine's next chunk queued), well below a person's pause
AFTER_CELL_IDLE = 0.25


def after_cell(kernel: str, cell: str) -> None:
    """The engine has been idle since its last chunk of ``cell``: free what the
    cell left (its inputs' references, its program, reference cycles, cached
    CUDA blocks) without a message from the kernel.  Should another chunk of the
    same cell come after all, it is answered ``unloaded`` and the kernel sends
    it again with the program (:func:`run`).  Files this engine published for
    its host stay until the kernel's :func:`tidy`: another engine of the host
    may not have mapped them yet."""
    s = _sessions.get(kernel)
    if s is not None and s.cell == cell and s.program is not None:
        _release(s)
        collect()
    _release_cuda_cache()


def _release(s: _Session) -> None:
    s.inputs.clear()
    s.program = None


def _cached_keys(s: _Session) -> dict[str, Any]:
    """Name -> fingerprint of what this engine caches for the kernel (what the
    kernel's ``input_cache`` mirrors)."""
    return {n: k for n, (k, _) in s.cache.items()}


class ByName:
    """One of this module's functions, sent to engines by name.

    ipyparallel sends a plain function by value: its code object, defaults
    and annotations, canned in the kernel and rebuilt on the engine for every
    message (the ~30 annotations and defaults of :func:`run` alone are ~7,000
    ``isinstance`` checks per chunk on the engine).  An instance of this class
    pickles as this module's path and the function's name."""

    __slots__ = ("name",)

    def __init__(self, name: str) -> None:
        if not callable(globals().get(name)):
            raise ValueError(f"gpucell.engine.worker has no function {name!r}")
        self.name = name

    @property
    def __name__(self) -> str:  # what ipyparallel labels the task with
        return self.name

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        return globals()[self.name](*args, **kwargs)

    def __reduce__(self) -> tuple[Any, ...]:
        return (ByName, (self.name,))

    def __repr__(self) -> str:
        return f"gpucell.engine.worker.{self.name}"


def _engine_id() -> int | None:
    from IPython import get_ipython

    me = getattr(getattr(get_ipython(), "kernel", None), "engine_id", None)
    return me if isinstance(me, int) else None


def tidy_each(drops: dict[int, list[str]], kernel: str = "") -> None:
    """:func:`tidy` sent to several engines as one task (one message to build
    in the kernel, not one per engine): each finds its own ``drop`` by its id."""
    me = _engine_id()
    tidy(drops.get(me, []) if me is not None else [], kernel)


def run_each(table: dict[int, tuple[Any, ...]]) -> list[Any]:
    """:func:`run` sent to several engines as one task (a cell's first chunks):
    each runs its own chunk, found by its engine id."""
    me = _engine_id()
    if me is None or me not in table:
        raise RuntimeError(
            f"gpucell: engine {me} was sent a cell's first chunks without its own"
        )
    return run(*table[me])


def tidy(drop: list[str] | None = None, kernel: str = "") -> None:
    """After a cell, while the engine is idle: forget the cached inputs the
    kernel no longer holds (``drop``) and what this cell left behind (its
    program's namespace, reference cycles, cached CUDA blocks), so the memory
    returns now rather than when the next collection happens to run."""
    s = _sessions.get(kernel)  # none: nothing of this kernel's is left here
    dropped = False
    if s is not None:
        for name in drop or ():
            dropped = s.cache.pop(name, None) is not None or dropped
        _release(s)
    hostcopy.unpublish(kernel)  # the host's engines all mapped it by now
    collect(full=dropped)
    _release_cuda_cache()


def leave(kernel: str = "") -> None:
    """A kernel disconnects from engines it does not own: take back what gpucell
    left in them for it (cached inputs; the telemetry sampler thread once no
    kernel is left)."""
    clear(kernel)
    from gpucell.engine import telemetry

    if not _sessions:
        telemetry.stop()
    collect(full=True)


def load(
    cell: str,
    program: Any,
    names: list[str],
    keys: dict[str, Any],
    frames: list[Any],
    watch: Watch | None = None,
    kernel: str = "",
) -> dict[str, Any]:
    """Install a cell's program and inputs; reply what this engine now caches.

    ``frames`` is a :mod:`gpucell.protocol.wire` encoding of ``{name: value}`` for the
    inputs
    the kernel decided to send; the others are expected in the cache with the
    fingerprint in ``keys``.
    """
    st = _session(kernel)
    cache = st.cache
    if frames:
        frames = hostcopy.receive(frames, cell, kernel)  # one copy per host
    if frames and shm.spilled(frames):
        frames = shm.unspill(frames, shared=True)  # mapped, copy-on-write
    sent = wire.loads(frames, cuda_to=_cuda_target()) if frames else {}
    missing = []
    inputs: dict[str, Any] = {}
    for name in names:
        if name in sent:
            inputs[name] = sent[name]
            if keys.get(name) is not None:
                cache.pop(name, None)  # (re)inserted last: most recently used
                cache[name] = (keys[name], sent[name])
            else:
                cache.pop(name, None)
        elif (
            name in cache
            and keys.get(name) is not None
            and cache[name][0] == keys[name]
        ):
            inputs[name] = cache[name][1]
            cache[name] = cache.pop(name)  # most recently used last
        else:
            missing.append(name)
    st.inputs.clear()
    st.inputs.update(inputs)
    st.program = program
    st.cell = cell
    st.iteration_mean = None
    st.watch = watch or {"names": [], "items": False}
    return {"missing": missing, "cached": _cached_keys(st)}


def _set_warning_filters(st: _Session, frames: list[Any]) -> None:
    try:
        st.warning_filters = wire.loads(frames) if frames else None
    except Exception:  # a filter's category class that cannot load here
        st.warning_filters = None


def _set_up(
    cell: str, setup: Setup, input_frames: list[Any], kernel: str = ""
) -> dict[str, Any]:
    """An engine's first chunk of a cell: program, inputs, checks, filters."""
    loaded = load(
        cell,
        setup["program"],
        setup["names"],
        setup["keys"],
        input_frames,
        setup["watch"],
        kernel,
    )
    st = _session(kernel)
    st.cwd = setup.get("cwd")
    _set_warning_filters(st, setup.get("warnings") or [])
    st.log_levels = setup.get("logging")
    st.state = dict(setup.get("state") or {})
    _evict(st.cache, setup.get("cache_bytes"), keep=set(setup["names"]))
    loaded["cached"] = _cached_keys(st)
    if loaded["missing"]:
        clear(kernel)
        raise RuntimeError(
            "gpucell: inputs expected in this engine's cache are missing: "
            f"{', '.join(loaded['missing'])}. The cache was reset; run the cell "
            "again."
        )
    return loaded


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


def _kernel_warning_filters(st: _Session) -> Any:
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


def _unloaded_timing(st: _Session, start: int, entered: float) -> Timing:
    """An ``unloaded`` answer's timing: nothing ran; what the engine caches."""
    now = time.time()
    return {
        "start": now,
        "entered": entered,
        "end": now,
        "compute": 0.0,
        "starts": [],
        "median": 0.0,
        "done": 0,
        "handed_back": False,
        "unstamped": False,
        "host": socket.gethostname(),
        "pid": os.getpid(),
        "first": start,
        "cached": _cached_keys(st),
        "drew": [],
    }


def _error_payload(
    exc: BaseException, where: Where, start: int, chunk_obj: Any
) -> ChunkError:
    """An iteration's exception as data the kernel can re-raise with context."""
    it = getattr(exc, "gpucell_iteration", None)
    if it is None:
        it = where.current()
    if it is None:
        it = start
    try:
        pickled = wire.dumps(exc)
    except Exception:
        pickled = None
    return {
        "changed": exc.changes if isinstance(exc, checkin.Changed) else None,
        "readonly": isinstance(exc, ValueError) and "read-only" in str(exc),
        "type": type(exc).__name__,
        "module": type(exc).__module__,
        "message": str(exc),
        "traceback": "".join(traceback.format_exception(exc)),
        "iteration": it,
        "item": _item_repr(chunk_obj, it - start),
        "exception": pickled,
        "oom": _oom_note(exc),
    }


def _mark_unsendable(result: Any) -> None:
    """Replace the loop-locals' last values that do not serialise with a marker
    naming their type (everything else in the result travels as it is)."""
    for name, (index, kind, value) in list(result.last_values.items()):
        if kind != "value":
            continue
        try:
            wire.dumps(value)
        except Exception:
            closed = _closed_file(value)
            if closed is not None:  # (`with open(p) as f:` in the body)
                result.last_values[name] = (index, "closed file", closed)
            else:
                result.last_values[name] = (index, "unsendable", type(value).__name__)


def _closed_file(value: Any) -> dict[str, Any] | None:
    """What the kernel needs to stand in for a closed file object (``open``'s
    text or buffered file, or its raw one): nothing can be done with it but
    look at it, so an equal closed object is what the serial loop left."""
    kinds: dict[type, str] = {
        io.TextIOWrapper: "text",
        io.BufferedReader: "reader",
        io.BufferedWriter: "writer",
        io.BufferedRandom: "random",
    }
    kind = kinds.get(type(value))
    if kind is None or not getattr(value, "closed", False):
        return None
    out: dict[str, Any] = {"kind": kind}
    for attr in ("name", "mode", "encoding", "errors", "newlines"):
        try:
            out[attr] = getattr(value, attr)
        except (AttributeError, ValueError):
            pass
    if kind == "text":  # its buffer's kind (the name lives on the raw file)
        out["buffer"] = kinds.get(type(getattr(value, "buffer", None)), "reader")
    return out


def _cuda_target() -> Any:
    if os.environ.get("GPUCELL_DEVICE_KIND") == "gpu":
        return "cuda"
    return None


def _seeder(seed: int):
    """Seed random, numpy and torch from (seed, iteration) before each iteration."""
    try:
        import numpy
    except ImportError:
        numpy = None  # type: ignore[assignment]

    def seed_fn(i: int) -> None:
        digest = hashlib.blake2b(f"{seed}:{i}".encode(), digest_size=8).digest()
        x = int.from_bytes(digest, "little")
        import random

        random.seed(x)
        if numpy is not None:
            numpy.random.seed(x % 2**32)
        torch = sys.modules.get("torch")
        if torch is not None:
            _seed_torch(torch, x % 2**63)

    return seed_fn


def _seed_torch(torch: Any, s: int) -> None:
    """What ``torch.manual_seed`` seeds that an engine can draw from: the CPU
    generator, and CUDA's on a GPU engine (queued by torch until CUDA starts).
    ``torch.manual_seed`` itself also walks every other backend (MPS, XPU,
    custom devices): ~70 us per iteration that a numpy-only loop paid."""
    torch.random.default_generator.manual_seed(s)
    if os.environ.get("GPUCELL_DEVICE_KIND") == "gpu" or torch.cuda.is_initialized():
        torch.cuda.manual_seed_all(s)


class _Tagged(io.TextIOBase):
    """A stream that prefixes each line with the engine and iteration."""

    def __init__(self, target: Any, engine: int, where: Where) -> None:
        self._target = target
        self._engine = engine
        self._where = where  # which iteration runs, as the chunk runs
        self._at_line_start = True
        self.written = False  # flushing costs a round trip to the I/O thread

    def _prefix(self) -> str:
        i = self._where.current()
        if i is None:
            return f"[engine {self._engine}] "
        return f"[engine {self._engine} | iteration {i}] "

    def writable(self) -> bool:
        return True

    def write(self, s: str) -> int:
        self.written = True
        out = []
        for piece in s.splitlines(keepends=True):
            if self._at_line_start:
                out.append(self._prefix())
            out.append(piece)
            self._at_line_start = piece.endswith("\n")
        self._target.write("".join(out))
        return len(s)

    def flush(self) -> None:
        self._target.flush()

    def set_parent(self, parent: Any) -> None:
        """ipykernel tags output with its request through
        ``sys.stdout.set_parent`` (and skips a stream without one)."""
        set_parent = getattr(self._target, "set_parent", None)
        if set_parent is not None:
            set_parent(parent)


def _untagged(stream: Any) -> Any:
    """``stream`` without the :class:`_Tagged` wrappers around it."""
    while isinstance(stream, _Tagged):
        stream = stream._target
    return stream


#: iterations' durations a chunk's median is taken over, at most
MEDIAN_SAMPLE = 4096


def _median_iteration(stamps: dict[int, float], end: float) -> float | None:
    """The chunk's median iteration time (computed here, in parallel, rather
    than in the kernel): the schedule's speed estimate, which the first
    iteration's one-time costs (imports, warm-up) would otherwise skew."""
    if len(stamps) < 3:
        return None
    starts = [*stamps.values(), end]
    # a cheap loop's trial stamps 10^5 iterations or more: sorting all their
    # durations took 22 ms per chunk, the engine idle meanwhile; an evenly
    # spread sample of at most MEDIAN_SAMPLE of them gives the same median
    step = max(1, (len(starts) - 1) // MEDIAN_SAMPLE)
    durations = sorted(
        starts[i + 1] - starts[i] for i in range(0, len(starts) - 1, step)
    )
    return durations[len(durations) // 2]


def _item_repr(chunk_obj: Any, offset: int) -> str:
    try:
        for k, item in enumerate(chunk_items(chunk_obj)):
            if k == offset:
                r = repr(item)
                return r if len(r) <= 200 else r[:197] + "..."
    except Exception:
        pass
    return "?"


def describe_oom(
    message: str, device: str, total: int | None, free: int | None, held: int | None
) -> str:
    """The note added to a CUDA out-of-memory error (pure, so it is unit-tested)."""
    import re

    asked = re.search(r"Tried to allocate ([0-9.]+ [KMGT]?i?B)", message)
    gib = 2**30
    parts = [f"CUDA out of memory on {device}"]
    if total is not None:
        parts.append(f"{total / gib:.1f} GiB total")
    if free is not None:
        parts.append(f"{free / gib:.2f} GiB free")
    if held is not None:
        parts.append(f"{held / gib:.2f} GiB held by this engine")
    if asked:
        parts.append(f"the iteration asked for {asked.group(1)} more")
    return (
        ": ".join([parts[0], ", ".join(parts[1:])]) if len(parts) > 1 else parts[0]
    ) + (
        ". Put fewer engines on each GPU (--per-gpu 1), use smaller batches per "
        "iteration, or free tensors kept between iterations (del them, or "
        "torch.cuda.empty_cache())."
    )


def _release_cuda_cache() -> None:
    """Give the caching allocator's free blocks back to the device."""
    torch = sys.modules.get("torch")
    try:
        if torch is not None and torch.cuda.is_initialized():
            torch.cuda.empty_cache()
    except Exception:
        pass


def _oom_note(exc: BaseException) -> str | None:
    torch = sys.modules.get("torch")
    oom = getattr(getattr(torch, "cuda", None), "OutOfMemoryError", None)
    if torch is None or oom is None or not isinstance(exc, oom):
        return None
    total = free = held = None
    try:
        free, total = torch.cuda.mem_get_info()
        held = torch.cuda.memory_allocated()
    except Exception:
        pass
    device = (
        f"{os.environ.get('GPUCELL_DEVICE_NAME', 'GPU')} "
        f"(GPU {os.environ.get('GPUCELL_DEVICE_INDEX', '?')})"
    )
    return describe_oom(str(exc), device, total, free, held)


class _ShmVerdict:
    """A trial chunk's side of ``shm.pace_path`` and ``shm.verdict_path``: the
    pace it measured at its budget goes to the kernel, the kernel's verdict on
    the trials comes back (see ``chunk._TrialEnd``).  The pace published is
    the median iteration's, as a finished chunk reports it: the first
    iteration's one-time costs, or a moment the engine lost its core, would
    otherwise tell the kernel the loop is uneven when it is not."""

    __slots__ = ("_flag", "_pace", "_stamps")

    def __init__(
        self,
        ch: shm.Channel,
        cell: str,
        engine: int,
        start: int,
        stamps: dict[int, float],
    ):
        self._pace = shm.pace_path(ch, cell, engine, start)
        self._flag = shm.verdict_path(ch, cell)
        self._stamps = stamps

    def publish(self, done: int, seconds: float, stamped: bool) -> None:
        median = _median_iteration(self._stamps, time.time()) if stamped else None
        if median is not None:
            seconds = median * done
        shm.put(self._pace, shm.PACE.pack(done, seconds, stamped))

    def poll(self) -> bool | None:
        said = shm.peek(self._flag)
        return None if said is None else said == b"1"


class _ShmHandBack:
    """A chunk's side of ``shm.hand_back_path`` (see ``chunk._HandBack``): the
    threshold the kernel wrote while an engine idles with nothing to hand
    out, else ``None``."""

    __slots__ = ("_path", "stopped")

    def __init__(self, ch: shm.Channel, cell: str):
        self._path = shm.hand_back_path(ch, cell)
        self.stopped = False

    def threshold(self) -> float | None:
        raw = shm.peek(self._path)
        if raw is None or len(raw) != shm.HAND_BACK.size:
            return None
        return float(shm.HAND_BACK.unpack(raw)[0])


def run(
    cell: str,
    chunk_frames: list[Any],
    start: int,
    engine_id: int,
    seed: int | None = None,
    setup: Setup | None = None,
    input_frames: list[Any] | None = None,
    results_to: shm.Channel | None = None,
    budget: float | None = None,
    kernel: str = "",
    stoppable: bool = False,
) -> list[Any]:
    """Run one chunk; return wire frames of ``(status, payload, timing)``.

    The chunk object (a range slice, or a slice of the user's sequence: numpy and
    torch slices are views) arrives as wire frames, so big items travel zero-copy.
    An engine's first chunk of a cell carries ``setup`` (program, input names,
    fingerprints) and ``input_frames`` (the inputs to send, a top-level argument
    so ipyparallel ships each buffer zero-copy): one message for all of it.
    ``results_to`` is the kernel's shared-memory channel: when this engine can see
    it, the result's big buffers go there instead of through the controller.
    ``budget``: a trial chunk starts no iteration after this many seconds of
    running; ``timing["done"]`` says how many ran.  ``kernel``: whose program and
    inputs (``gpucell.devices.host.kernel_key``; several kernels may share engines).
    ``stoppable``: the chunk may stop early to hand its rest to idle engines
    when the kernel says so (``shm.hand_back_path``: engines on the kernel's
    host); ``timing["handed_back"]`` says it did.
    """
    entered = time.time()
    runtime.busy()  # what waits for an idle engine waits on
    loaded = None
    st = _session(kernel)
    if setup is None and st.cell == cell and st.program is None:
        # this engine tidied the cell away while idle (after_cell): the kernel
        # sends this chunk again with the program and inputs
        return wire.dumps(("unloaded", None, _unloaded_timing(st, start, entered)))
    if setup is not None:
        if st.program is not None:  # the last cell ended a moment ago
            _release(st)
            collect()
        loaded = _set_up(cell, setup, input_frames or [], kernel)
    chunk_obj = wire.loads(chunk_frames, cuda_to=_cuda_target())
    if cell != st.cell:
        raise RuntimeError(
            f"gpucell: engine has cell {st.cell!r} loaded, not {cell!r} "
            "(was the engine restarted?)"
        )
    stamps: dict[int, float] = {}
    where = Where(stamps, start)
    drew: list[str] = []
    device = "cuda" if os.environ.get("GPUCELL_DEVICE_KIND") == "gpu" else "cpu"
    # a wrapper an earlier chunk left (interrupted between its swap and its
    # restore) is dropped: output goes to ipykernel's own streams again
    out, err = _untagged(sys.stdout), _untagged(sys.stderr)
    t0, c0 = time.time(), time.perf_counter()
    caught: Any = None
    home: str | None = None
    behind: Any = None
    try:
        # everything from the swap on is inside the try: an interrupt (a
        # cancelled run signals engines at any moment) must not leave the
        # wrapper installed; ipykernel tags later output with its request
        # through ``sys.stdout.set_parent``, and every later chunk's output
        # was filed under the interrupted request (lost, silently)
        sys.stdout = _Tagged(out, engine_id, where)
        sys.stderr = _Tagged(err, engine_id, where)
        items = None
        if st.watch["items"]:
            checkin.freeze(chunk_obj)
            items = lambda: chunk_items(chunk_obj)  # noqa: E731
        checked_in = checkin.snapshot(st.inputs, st.watch["names"], items)
        own_before = checkout.before(items(), start) if items is not None else None
        caught = _kernel_warning_filters(st)
        home = _enter_cwd(st.cwd)
        tag = f"{engine_id}-{start}-{os.urandom(4).hex()}"
        verdict, hand_back = _feedback(
            results_to, cell, engine_id, start, stamps, budget, stoppable
        )
        to_host = tohost.copier(device)
        behind = writebehind.start(results_to, tag) if to_host is not None else None
        if to_host is not None and behind is not None:
            to_host.sink = behind.add
        payload: ChunkResult | ChunkError
        # without --seed, which process-wide generators the chunk drew from
        rng_before = runtime.generator_states() if seed is None else None
        try:
            with (
                logs.Capture(st.log_levels) as logged,
                runtime.imports_finish_first(),
                _kernel_state(st.state),
            ):
                result = run_chunk(
                    st.program,
                    st.inputs,
                    chunk_obj,
                    start,
                    seed_fn=_seeder(seed) if seed is not None else None,
                    device=device,
                    stamps=stamps,
                    to_host=to_host,
                    deadline=None if budget is None else c0 + budget,
                    where=where,
                    cheap=(
                        st.iteration_mean is not None
                        and st.iteration_mean < CHEAP_ITERATION
                    ),
                    verdict=verdict,
                    hand_back=hand_back,
                )
            result.logs = logged.records
            drew = _drew(rng_before)
            changed = _check_out(st, checked_in, own_before, items, start, result)
            if changed:
                for name, _what in changed:
                    st.cache.pop(name, None)  # the next cell gets a fresh copy
                loaded = {"cached": _cached_keys(st)}
                raise checkin.Changed(changed)
            status, payload = "ok", result
        except KeyboardInterrupt:
            raise
        except BaseException as exc:  # noqa: BLE001 - it goes back to the kernel
            status, payload = "error", _error_payload(exc, where, start, chunk_obj)
            if payload["oom"]:
                _release_cuda_cache()  # the kernel may retry here: start it clean
    except KeyboardInterrupt:
        if behind is not None:
            behind.discard()
        raise
    finally:
        # the chunk is over: an interrupt (a cancelled run signals every engine
        # with unfinished work) must not land inside ipykernel's output flush,
        # where it can leave the stream unable to deliver later output
        with interrupts_held():
            if caught is not None:
                caught.__exit__(None, None, None)
            _leave_cwd(home)
            end, compute = time.time(), time.perf_counter() - c0
            # ipykernel's flush waits for its I/O thread (about a millisecond on
            # a busy host): only a stream that was written to needs it
            for tagged in (sys.stdout, sys.stderr):
                if getattr(tagged, "written", True):
                    tagged.flush()
            sys.stdout, sys.stderr = out, err
    if status == "ok" and where.done():
        st.iteration_mean = compute / where.done()
    timing = _chunk_timing(
        where, stamps, (entered, t0, end, compute), start, hand_back, loaded
    )
    timing["drew"] = drew
    spilled = _reply(
        (status, payload, timing), chunk_obj, start, where, behind, results_to, tag
    )
    runtime.busy()
    # if this was the engine's last chunk of the cell, what the cell left goes
    # once the engine has been idle a moment: no message from the kernel needed
    runtime.when_idle(
        f"after cell {kernel}", AFTER_CELL_IDLE, lambda: after_cell(kernel, cell)
    )
    return spilled


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


def _drew(before: dict[str, int] | None) -> list[str]:
    """The generators whose state a chunk changed (none when seeded)."""
    if before is None:
        return []
    after = runtime.generator_states()
    return sorted(k for k, v in before.items() if after.get(k) != v)


def _feedback(
    results_to: shm.Channel | None,
    cell: str,
    engine_id: int,
    start: int,
    stamps: dict[int, float],
    budget: float | None,
    stoppable: bool,
) -> tuple[_ShmVerdict | None, _ShmHandBack | None]:
    """A chunk's line to the kernel through its /dev/shm (engines on the
    kernel's host): a trial's verdict, and the hand-back flag."""
    shared = (
        results_to if results_to is not None and shm.reachable(results_to) else None
    )
    if shared is None:
        return None, None
    verdict = None
    if budget is not None:
        verdict = _ShmVerdict(shared, cell, engine_id, start, stamps)
    return verdict, _ShmHandBack(shared, cell) if stoppable else None


def _check_out(
    st: _Session,
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
    if [n for n, _ in changed] == [""] and own_before is not None and items is not None:
        # only the items changed: each iteration's own, written back in place
        # by the kernel, unless some change cannot be
        own, cannot = checkout.changes(own_before, items(), start)
        if not cannot:
            result.own_items, changed = own, []
        else:
            changed = [("", "; ".join(cannot[:3]))]
    return changed


def _chunk_timing(
    where: Where,
    stamps: dict[int, float],
    clocks: tuple[float, float, float, float],
    start: int,
    hand_back: _ShmHandBack | None,
    loaded: dict[str, Any] | None,
) -> Timing:
    """``clocks``: entered, started, ended (time.time) and compute seconds."""
    entered, t0, end, compute = clocks
    return {
        "start": t0,
        "entered": entered,
        "end": end,
        "compute": compute,
        # per-iteration stamps travel only for chunks a run's detail can keep,
        # as one buffer of doubles: a cheap loop's trial stamps 10^5 iterations,
        # and as a list of floats they took ~5 ms to pickle here and as long
        # to unpickle in the kernel, on a first run's critical path
        "starts": array("d", stamps.values()) if len(stamps) <= DETAIL_MAX else [],
        "median": (
            compute / max(where.done(), 1)  # unstamped: the mean is what is known
            if where.unstamped
            else _median_iteration(stamps, end)
        ),
        "done": where.done(),
        "handed_back": hand_back is not None and hand_back.stopped,
        "unstamped": where.unstamped,
        "host": socket.gethostname(),
        "pid": os.getpid(),
        "first": start,  # which chunk this is: the kernel checks it is the one it sent
        "cached": loaded["cached"] if loaded is not None else None,
        "drew": [],
    }


def _reply(
    reply: tuple[str, Any, Timing],
    chunk_obj: Any,
    start: int,
    where: Where,
    behind: Any,
    results_to: shm.Channel | None,
    tag: str,
) -> list[Any]:
    """The reply's wire frames, big buffers through /dev/shm where the kernel
    can map them (a result written behind as the loop ran is kept)."""
    status, payload, timing = reply
    prewritten = None
    if behind is not None:
        if status == "ok":
            prewritten = behind.finish()
        else:
            behind.discard()
    # results that hold the loop's own items (`out.append(p)`) name them, and
    # the kernel puts its own there: serially they are the same objects
    refs = item_refs(chunk_obj, start) if status == "ok" else None
    try:
        frames = wire.dumps(reply, items=refs, cell_globals=where.namespace)
    except Exception:
        if prewritten is not None:
            shm.discard(prewritten)
        if status != "ok":
            raise
        # a loop-local whose last value cannot travel (a closed file, a
        # generator, a lock) must not fail a loop whose results are fine: the
        # kernel leaves that name as it was, and says so
        _mark_unsendable(payload)
        frames = wire.dumps(reply, items=refs, cell_globals=where.namespace)
        prewritten = None
    return shm.spill(frames, results_to, tag, prewritten)


#: the functions the kernel sends for every chunk and cell, by name (ByName)
RUN = ByName("run")
RUN_EACH = ByName("run_each")
TIDY = ByName("tidy")
TIDY_EACH = ByName("tidy_each")
