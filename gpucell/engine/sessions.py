"""What an engine keeps for each kernel between chunks: the running cell's
program and inputs, the inputs cached across cells by fingerprint (an
unchanged model or dataset travels once), and the kernel's settings its
chunks run under.  :func:`load` installs a cell (an engine's first chunk of
it carries the setup).
"""

from __future__ import annotations

import os
import sys
from dataclasses import dataclass, field
from typing import Any

from gpucell.engine import hostcopy
from gpucell.protocol import shm, wire
from gpucell.protocol.fold import is_torch
from gpucell.protocol.program import LogLevels, Setup, Watch

__all__ = ["cached", "cached_names", "clear", "load", "session", "set_up"]


@dataclass
class Session:
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
    return {"names": [], "items": False, "modes": []}


#: kernel key (``gpucell.devices.host.kernel_key``) -> its state here, the most
#: recently used last
by_kernel: dict[str, Session] = {}


#: kernels whose state an engine keeps: a kernel that died without saying so
#: (killed) leaves its cached inputs here until this many others came after it
MAX_SESSIONS = 16


def session(kernel: str) -> Session:
    s = by_kernel.pop(kernel, None)
    if s is None:
        s = Session()
        while len(by_kernel) >= MAX_SESSIONS:
            by_kernel.pop(next(iter(by_kernel)))  # the least recently used
    by_kernel[kernel] = s
    return s


def cached(name: str) -> Any:
    """The cached input ``name`` of any kernel (for tests and the GPU proof)."""
    for s in by_kernel.values():
        if name in s.cache:
            return s.cache[name][1]
    raise KeyError(name)


def cached_names() -> list[str]:
    """Names cached for every kernel, sorted (for tests)."""
    return sorted({n for s in by_kernel.values() for n in s.cache})


def clear(kernel: str = "") -> None:
    """Forget a kernel's cached inputs and program (frees engine memory)."""
    by_kernel.pop(kernel, None)
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


def release(s: Session) -> None:
    s.inputs.clear()
    s.program = None


def cached_keys(s: Session) -> dict[str, Any]:
    """Name -> fingerprint of what this engine caches for the kernel (what the
    kernel's ``input_cache`` mirrors)."""
    return {n: k for n, (k, _) in s.cache.items()}


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
    st = session(kernel)
    cache = st.cache
    if frames:
        frames = hostcopy.receive(frames, cell, kernel)  # one copy per host
    if frames and shm.spilled(frames):
        frames = shm.unspill(frames, shared=True)  # mapped, copy-on-write
    sent = wire.loads(frames, cuda_to=cuda_target()) if frames else {}
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
    st.watch = watch or {"names": [], "items": False, "modes": []}
    return {"missing": missing, "cached": cached_keys(st)}


def _set_warning_filters(st: Session, frames: list[Any]) -> None:
    try:
        st.warning_filters = wire.loads(frames) if frames else None
    except Exception:  # a filter's category class that cannot load here
        st.warning_filters = None


def set_up(
    cell: str, setup: Setup, input_frames: list[Any], kernel: str = ""
) -> dict[str, Any]:
    """An engine's first chunk of a cell: program, inputs, checks, filters."""
    _import_path(setup.get("state") or {})
    loaded = load(
        cell,
        setup["program"],
        setup["names"],
        setup["keys"],
        input_frames,
        setup["watch"],
        kernel,
    )
    st = session(kernel)
    st.cwd = setup.get("cwd")
    _set_warning_filters(st, setup.get("warnings") or [])
    st.log_levels = setup.get("logging")
    st.state = dict(setup.get("state") or {})
    _evict(st.cache, setup.get("cache_bytes"), keep=set(setup["names"]))
    loaded["cached"] = cached_keys(st)
    if loaded["missing"]:
        clear(kernel)
        raise RuntimeError(
            "gpucell: inputs expected in this engine's cache are missing: "
            f"{', '.join(loaded['missing'])}. The cache was reset; run the cell "
            "again."
        )
    return loaded


def _import_path(state: dict[str, Any]) -> None:
    """The folders the notebook put on its ``sys.path`` (``sys.path.append(
    "src")`` for its own modules), added to this engine's where it has them:
    an input or a call from such a module imports here as there."""
    for folder in state.get("sys_path", ()):
        if os.path.isabs(folder) and folder not in sys.path and os.path.isdir(folder):
            sys.path.append(folder)


def cuda_target() -> Any:
    if os.environ.get("GPUCELL_DEVICE_KIND") == "gpu":
        return "cuda"
    return None
