"""Engine-side telemetry for engines the kernel cannot see (other hosts).

:func:`start` runs on an engine (the kernel applies it once per cell, see
:meth:`gpucell.kernel.telemetry.ClusterTelemetry.start_remote`); it starts, at most once
per engine process, a daemon thread that measures this engine with the same code
the kernel uses for local engines (:class:`gpucell.devices.sampling.LocalTelemetry` on
its own pid and GPU) and publishes with ipyparallel's ``publish_data`` **only while
a task runs**, so the samples land in that task's ``AsyncResult.data``.

Why this is safe and cheap (checked in ipyparallel 9.2 / ipykernel 7.4 source, and
on real engines in ``tests/test_telemetry.py``):

* Tasks run on the engine's main thread (``apply_request`` → ``do_apply``); the
  sampler thread never touches user state.
* ``publish_data`` goes through ``Session.send`` to the engine's IOPub socket, an
  ipykernel ``IOPubThread`` whose ``send_multipart`` only queues the message and
  wakes the IO thread through a per-thread inproc pipe: sending from another
  thread is supported by design.  The message's parent header is the task being
  handled (``shell.set_parent`` on each request), which is what routes it to the
  right ``AsyncResult``.
* "A task runs" is read from the main thread's stack (an ``apply_request`` or
  ``execute_request`` frame): no hook in the kernel, a few µs per check.  Between
  tasks nothing is measured or sent.
* A measurement costs ~0.1 ms and a publication ~0.2 ms of one core, 4 times a
  second: well under 1% of the loop (``bench/bench_telemetry.py``).

Standard library, psutil and (on GPU engines) pynvml only; ipyparallel is already
loaded in an engine.
"""

from __future__ import annotations

import os
import socket
import sys
import threading
import time
from collections import deque
from typing import Any

from gpucell.devices.sampling import LocalTelemetry
from gpucell.protocol.telemetry import DATA_KEY, Target

__all__ = ["start", "status", "stop"]

#: frames of the engine's main thread that mean "handling a task"
_TASK_FRAMES = frozenset({"apply_request", "execute_request"})

_lock = threading.Lock()
_sampler: _Sampler | None = None


def _task_running(main_ident: int | None) -> bool:
    """Whether the main thread is inside a task handler now."""
    if main_ident is None:
        return False
    f = sys._current_frames().get(main_ident)
    depth = 0
    while f is not None and depth < 5000:
        if f.f_code.co_name in _TASK_FRAMES:
            return True
        f = f.f_back
        depth += 1
    return False


def _default_publisher() -> Any:
    """The engine's data publisher (``shell.data_pub``), bound once."""
    from ipykernel.zmqshell import ZMQInteractiveShell

    if not ZMQInteractiveShell.initialized():
        raise RuntimeError("not running in an IPython engine")
    return ZMQInteractiveShell.instance().data_pub.publish_data


class _Sampler(threading.Thread):
    def __init__(
        self,
        target: Target,
        period: float,
        window: int,
        publish: Any,
        main_ident: int | None,
    ) -> None:
        super().__init__(name="gpucell-telemetry", daemon=True)
        self.target = target
        self.period = period
        self.window = window
        self._publish = publish
        self._main = main_ident
        self._halt = threading.Event()
        self._source = LocalTelemetry([target], source="engine")
        self._recent: deque[dict[str, Any]] = deque(maxlen=max(1, window))
        self.seq = 0
        self.published = 0
        self.errors = 0
        self.last_error = ""
        self.cpu_seconds = 0.0  # this thread's own CPU time (the cost)

    def configure(self, target: Target, period: float, window: int) -> None:
        if target != self.target:
            self._source = LocalTelemetry([target], source="engine")
            self.target = target
        self.period = period
        if window != self.window:
            self._recent = deque(self._recent, maxlen=max(1, window))
            self.window = window

    def stop(self) -> None:
        self._halt.set()

    def run(self) -> None:
        busy = False
        while not self._halt.wait(self.period):
            t0 = time.thread_time()
            try:
                now_busy = _task_running(self._main)
                if now_busy and not busy:
                    # measure the task only, not the idle time before it
                    self._source.prime()
                elif now_busy:
                    self._send()
                busy = now_busy
            except Exception as e:  # never let the thread die on one bad sample
                self.errors += 1
                self.last_error = repr(e)
            self.cpu_seconds += time.thread_time() - t0

    def _send(self) -> None:
        (s,) = self._source.sample()
        self.seq += 1
        self._recent.append({**s.to_dict(), "seq": self.seq, "source": "engine"})
        self._publish({DATA_KEY: {"samples": list(self._recent)}})
        self.published += 1


def start(
    engine: int,
    kind: str = "cpu",
    index: int = -1,
    name: str = "CPU",
    period: float = 0.25,
    window: int = 4,
    *,
    publish: Any = None,
) -> dict[str, Any]:
    """Start (or reconfigure) this engine's sampler; return :func:`status`.

    Runs on the engine as a task; idempotent, so the kernel sends it once per cell.
    Never raises: a failure is reported in the returned dict.

    Parameters
    ----------
    engine, kind, index, name
        Who this engine is, as the kernel's ``EngineInfo`` says (``index`` is the
        GPU's index on this host, which NVML uses).
    period
        Seconds between samples while a task runs (0.25: 4 Hz).
    window
        Samples per publication: ``AsyncResult.data`` keeps only the last one, so a
        kernel polling late still sees ``window`` periods back.
    publish
        Where samples go (``shell.data_pub.publish_data`` by default; tests pass
        a list's ``append``).
    """
    global _sampler
    try:
        target = Target(
            engine=int(engine),
            pid=os.getpid(),
            host=socket.gethostname(),
            kind=kind,
            index=int(index),
            name=name,
        )
        with _lock:
            if _sampler is not None and _sampler.is_alive():
                _sampler.configure(target, float(period), int(window))
                return status()
            pub = publish if publish is not None else _default_publisher()
            _sampler = _Sampler(
                target,
                float(period),
                int(window),
                pub,
                threading.main_thread().ident,
            )
            _sampler.start()
        return status()
    except Exception as e:
        return {"running": False, "error": f"{type(e).__name__}: {e}"}


def stop(timeout: float = 2.0) -> bool:
    """Stop this engine's sampler; True if one was running."""
    global _sampler
    with _lock:
        s, _sampler = _sampler, None
    if s is None:
        return False
    s.stop()
    s.join(timeout)
    return True


def status() -> dict[str, Any]:
    """The sampler's counters (for tests and the bench)."""
    s = _sampler
    if s is None or not s.is_alive():
        return {"running": False, "error": ""}
    return {
        "running": True,
        "engine": s.target.engine,
        "pid": s.target.pid,
        "period": s.period,
        "window": s.window,
        "published": s.published,
        "errors": s.errors,
        "error": s.last_error,
        "cpu_seconds": s.cpu_seconds,
    }
