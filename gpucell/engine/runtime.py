"""What an engine knows about itself: its device, its limits, its identity.

Runs on engines (imported there by name, so only data travels).  Standard library
only, plus torch when the user's code has it.  The launcher passes the engine's
device in ``GPUCELL_*`` environment variables; an engine of a cluster we merely
connected to is assigned one later with :func:`assign_device`.
"""

from __future__ import annotations

import _thread
import contextlib
import importlib
import os
import signal
import socket
import sys
import threading
import time
from collections.abc import Iterator
from typing import Any

from gpucell.protocol.devices import THREAD_ENV_VARS as _THREAD_VARS

__all__ = ["assign_device", "describe", "device", "device_string"]


def device_string() -> str:
    """``"cuda"`` on a GPU engine (its GPU is ``cuda:0``), ``"cpu"`` otherwise."""
    return "cuda" if os.environ.get("GPUCELL_DEVICE_KIND") == "gpu" else "cpu"


def device() -> Any:
    """The engine's torch device: ``torch.device("cuda")`` on a GPU engine, else CPU.

    In the kernel (not an engine) this is the kernel's own best device.
    """
    import torch

    if "GPUCELL_DEVICE_KIND" not in os.environ:
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    return torch.device(device_string())


def _torch_threads() -> int | None:
    torch = sys.modules.get("torch")
    if torch is None:
        return None
    try:
        return int(torch.get_num_threads())
    except Exception:
        return None


def describe(channel: Any = None) -> dict[str, Any]:
    """Identity and pinning of this engine, as plain data for the status table;
    ``shm``: whether it sees the kernel's shared-memory ``channel``."""
    from gpucell.devices.host import identity
    from gpucell.protocol.shm import reachable

    env = os.environ
    try:
        affinity = sorted(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        affinity = []
    return {
        "pid": os.getpid(),
        "host": socket.gethostname(),
        "label": env.get("GPUCELL_ENGINE_LABEL", ""),
        "kind": env.get("GPUCELL_DEVICE_KIND", "cpu"),
        "index": int(env.get("GPUCELL_DEVICE_INDEX", "-1")),
        "name": env.get("GPUCELL_DEVICE_NAME", ""),
        "memory_total": int(env.get("GPUCELL_DEVICE_MEMORY", "0")),
        "cuda_visible_devices": env.get("CUDA_VISIBLE_DEVICES"),
        "threads": {v: env.get(v) for v in _THREAD_VARS},
        "torch_threads": _torch_threads(),
        "cpu_affinity": affinity,
        "torch_loaded": "torch" in sys.modules,
        "shm": bool(channel is not None and reachable(channel)),
        "identity": identity(),
    }


def _cuda_initialised() -> bool:
    torch = sys.modules.get("torch")
    try:
        return bool(torch is not None and torch.cuda.is_initialized())
    except Exception:
        return False


def assign_device(
    kind: str,
    index: int,
    visible: str | None,
    name: str,
    memory_total: int,
    threads: int,
    label: str,
    channel: Any = None,
) -> dict[str, Any]:
    """Pin an already-running engine (one we connected to) to a device.

    Works only before CUDA initialises in the engine; afterwards the engine keeps
    what it has and the caller is told, so it can warn instead of lying.  The
    answer is :func:`describe`'s (``channel``: the kernel's shared memory).
    """
    pinned = True
    if visible is not None:
        if _cuda_initialised() and os.environ.get("CUDA_VISIBLE_DEVICES") != visible:
            pinned = False
        else:
            os.environ["CUDA_DEVICE_ORDER"] = "PCI_BUS_ID"  # NVML's indices
            os.environ["CUDA_VISIBLE_DEVICES"] = visible
    os.environ.update(
        {
            "GPUCELL_DEVICE_KIND": kind,
            "GPUCELL_DEVICE_INDEX": str(index),
            "GPUCELL_DEVICE_NAME": name,
            "GPUCELL_DEVICE_MEMORY": str(memory_total),
            "GPUCELL_ENGINE_LABEL": label,
        }
    )
    for var in _THREAD_VARS:
        os.environ[var] = str(threads)
    torch = sys.modules.get("torch")
    if torch is not None:
        try:
            torch.set_num_threads(threads)
        except Exception:
            pass
    info = describe(channel)
    info["pinned"] = pinned
    return info


def local_gpus() -> list[dict[str, Any]]:
    """This engine's host GPUs, through NVML (empty without a driver)."""
    try:
        from gpucell.devices.nvml import PynvmlApi
    except ImportError:
        return []
    try:
        return [
            {
                "index": g.index,
                "name": g.name,
                "uuid": g.uuid,
                "memory_total": g.memory_total,
            }
            for g in PynvmlApi().gpus()
        ]
    except Exception:
        return []


def host_facts() -> dict[str, Any]:
    """This engine's host, usable cores and GPUs: what the kernel needs to pin the
    engines of a cluster it connected to by local rank."""
    try:
        cores = len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        cores = os.cpu_count() or 1
    return {"host": socket.gethostname(), "cores": cores, "gpus": local_gpus()}


@contextlib.contextmanager
def interrupts_held() -> Iterator[None]:
    """SIGINT ignored while the block runs (main thread only; elsewhere a no-op):
    for work an interrupt must not cut in half, such as an import or
    ipykernel's output flush, which a half-done step can leave broken."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    previous = signal.signal(signal.SIGINT, signal.SIG_IGN)
    try:
        yield
    finally:
        signal.signal(signal.SIGINT, previous)


def generator_states() -> dict[str, int]:
    """A checksum of each process-wide random generator's state (``random``,
    numpy's legacy global one, torch's CPU default), for the generators whose
    module is loaded: a chunk that changed one drew from it (a library's own
    draw: ``DataLoader(shuffle=True)``, a layer's initialisation, an estimator
    without ``random_state``)."""
    import zlib

    out: dict[str, int] = {}
    rnd = sys.modules.get("random")
    if rnd is not None:
        out["random"] = hash(rnd.getstate())
    np = sys.modules.get("numpy")
    if np is not None:
        try:
            out["numpy"] = zlib.crc32(np.random.get_state()[1].tobytes())
        except Exception:  # noqa: BLE001 - (an exotic numpy): not checked
            pass
    torch = sys.modules.get("torch")
    if torch is not None:
        try:
            state = torch.random.default_generator.get_state()
            out["torch"] = zlib.crc32(state.numpy().tobytes())
        except Exception:  # noqa: BLE001
            pass
    return out


def importing() -> bool:
    """Is a module being imported in this process right now (its code half
    run)?  importlib marks a module's spec ``_initializing`` while it runs."""
    for module in list(sys.modules.values()):
        spec = getattr(module, "__spec__", None)
        if spec is not None and getattr(spec, "_initializing", False):
            return True
    return False


#: seconds between looks at whether an import an interrupt waits for is done
IMPORT_RECHECK = 0.05


@contextlib.contextmanager
def imports_finish_first() -> Iterator[None]:
    """An interrupt (a cancelled or timed-out cell) that arrives while the
    chunk imports a module waits until the import is done.  Cut in half, an
    import leaves the engine with a package whose submodules are loaded but not
    attached (``module 'sympy' has no attribute 'printing'``) or a C library
    registered twice (``Only a single TORCH_LIBRARY``) in every later cell.
    Main thread only; elsewhere a no-op."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    previous = signal.getsignal(signal.SIGINT)
    active = [True]

    def again() -> None:
        if active[0]:
            _thread.interrupt_main()

    def on_sigint(signum: int, frame: Any) -> None:
        if importing():
            timer = threading.Timer(IMPORT_RECHECK, again)
            timer.daemon = True
            timer.start()
            return
        if previous is signal.SIG_IGN:
            return
        if callable(previous):
            previous(signum, frame)
        else:
            raise KeyboardInterrupt

    signal.signal(signal.SIGINT, on_sigint)
    try:
        yield
    finally:
        active[0] = False
        signal.signal(signal.SIGINT, previous)


def preimport(names: list[str]) -> None:
    """Import ``names`` (the heavy libraries the kernel uses) now, as a task of
    its own queued ahead of a cell's chunks, so a first cell that comes a little
    later does not wait for them.

    In this (the main) thread, not a background one: torch imported from two
    threads at once can leave one of them a partially initialised module.  An
    interrupt meanwhile is held off until the import is done, so a cancelled
    first cell cannot leave a library half-imported on this engine for good.
    """
    with interrupts_held():
        for name in names:
            if name not in sys.modules:
                try:
                    importlib.import_module(name)
                except Exception:  # the cell that needs it will say what is missing
                    pass
        collect()  # the libraries' objects are frozen now, not at a cell's end


#: every this many collections, :func:`collect` scans the frozen survivors too,
#: once the engine has been idle for ``IDLE_FULL`` seconds
FULL_EVERY = 16
IDLE_FULL = 1.0
_collections = 0
_last_busy = 0.0  # time.monotonic() when a chunk last started or ended here

#: key -> what runs once the engine has been idle long enough (:func:`when_idle`)
_idle_waiting: dict[str, tuple[float, Any]] = {}


def busy() -> None:
    """A chunk starts or ends (worker.run calls it at both): what waits for an
    idle engine waits on."""
    global _last_busy
    _last_busy = time.monotonic()


def when_idle(key: str, seconds: float, action: Any) -> bool:
    """Run ``action()`` on the engine's event loop once no chunk has started or
    ended for ``seconds``.  One wait per ``key``: a later call replaces the
    action and the seconds, and the wait already under way goes on.  False
    where the engine has no running event loop (nothing is scheduled).

    Idle time counts from the last chunk's *end*: a timer that fell due while a
    long chunk ran finds the engine busy a moment ago and waits again, rather
    than acting between that chunk and the next one already queued.
    """
    import asyncio

    try:
        loop = asyncio.get_running_loop()
    except RuntimeError:
        return False
    waiting = key in _idle_waiting
    _idle_waiting[key] = (seconds, action)
    if waiting:
        return True

    def check() -> None:
        wait, act = _idle_waiting[key]
        left = wait - (time.monotonic() - _last_busy)
        if left > 0:
            loop.call_later(left, check)
            return
        del _idle_waiting[key]
        act()

    loop.call_later(seconds, check)
    return True


def collect(full: bool = False) -> None:
    """Free the reference cycles a cell left, at the cost of scanning only what
    was made since the last collection.

    A full collection scans every object the engine holds: about 35 ms for the
    66,000 objects of an idle engine (more once torch is imported), and on a host
    whose engines share cores that delayed the next cell's first chunks by up to
    100 ms.  So the survivors of each collection are frozen (``gc.freeze``: what
    an engine keeps, modules and cached inputs, is not scanned again) and the
    next collection scans only new objects (0.04 ms after a cell).  A frozen
    object that later dies in a cycle waits for a full collection: at once when
    cached inputs are dropped (``full``: the likeliest owners of such cycles),
    and every ``FULL_EVERY`` collections once the engine has been idle for
    ``IDLE_FULL`` seconds.  (Run at the tidy itself, every engine of a cluster
    made its full collection after the same cell: 8 engines x 35-140 ms of CPU
    on 2 cores, and the next cell's chunks queued behind them; a profile of
    back-to-back cells on 8 engines found each engine spending 8.8 ms per cell
    in it, more than in its chunks.)
    """
    import gc

    global _collections
    _collections += 1
    if full:
        _collect_all()
        return
    gc.collect()
    gc.freeze()
    if _collections % FULL_EVERY == 0:
        _collect_all_when_idle()


def _collect_all() -> None:
    import gc

    gc.unfreeze()
    gc.collect()
    gc.freeze()


def _collect_all_when_idle() -> None:
    """A full collection once the engine has been idle for 1-2 x ``IDLE_FULL``
    seconds (at once where it has no event loop)."""
    import random

    # each engine waits its own 1-2 idle seconds, so the engines of a host do
    # not all rescan at the same moment (8 x 35 ms of CPU on 2 cores)
    wait = IDLE_FULL * (1.0 + random.random())
    if not when_idle("full collection", wait, _collect_all):
        _collect_all()
