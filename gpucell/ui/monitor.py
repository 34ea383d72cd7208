"""``%gpu_cluster monitor``: the per-device rows outside any cell run.

For watching GPUs between cells, or GPUs shared with other jobs.  A background
thread samples telemetry and refreshes the rows (ipywidgets state may be set
from a thread in ipykernel); it never touches the ipyparallel client, which is
not thread-safe and belongs to the main thread.  The thread ends when the
monitor is closed or the cluster it watches stops.
"""

from __future__ import annotations

import dataclasses
import html
import sys
import threading
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from gpucell.ui import model

if TYPE_CHECKING:
    from gpucell.protocol.telemetry import TelemetrySource

__all__ = ["DeviceMonitor", "Refresher", "close_source", "cluster_alive"]


def cluster_alive(gc: Any) -> Callable[[], bool]:
    """A check that ``gc`` is still the active cluster (not stopped, not replaced).

    Looked up in ``sys.modules`` so a display never imports the cluster machinery
    (a display of a cluster exists only once that module is loaded).
    """

    def alive() -> bool:
        mod = sys.modules.get("gpucell.cluster.lifecycle")
        return mod is not None and mod.current_or_none() is gc

    return alive


def close_source(telemetry: Any) -> None:
    """Release a telemetry source's handles (NVML) when a display stops."""
    close = getattr(telemetry, "close", None)
    if close is not None:
        close()


class Refresher:
    """Calls ``tick()`` every ``period`` seconds on a daemon thread.

    Stops when :meth:`stop` is called, ``alive()`` turns false (then ``on_end()``
    runs once) or a widget given to :meth:`stop_when_closed` is closed; however it
    stops, ``release()`` runs once (the telemetry's NVML session), also when the
    thread was never started.  Exceptions from ``tick`` are counted, not raised: a
    monitor that cannot sample shows stale figures rather than a traceback on a
    thread nobody reads.
    """

    def __init__(
        self,
        tick: Callable[[], None],
        period: float,
        alive: Callable[[], bool],
        on_end: Callable[[], None] | None = None,
        name: str = "gpucell-ui",
        release: Callable[[], None] | None = None,
    ) -> None:
        self.tick = tick
        self.release = release  # runs once when the thread ends, however it ends
        self.period = period
        self.alive = alive
        self.on_end = on_end
        self.errors = 0
        self._stop = threading.Event()
        self._released = False
        self._release_lock = threading.Lock()
        self._thread = threading.Thread(target=self._run, name=name, daemon=True)

    def start(self) -> Refresher:
        self._thread.start()
        return self

    @property
    def running(self) -> bool:
        return self._thread.is_alive()

    def _run(self) -> None:
        try:
            self._loop()
        finally:
            self._release()

    def _release(self) -> None:
        with self._release_lock:
            if self._released:
                return
            self._released = True
        if self.release is not None:
            try:
                self.release()
            except Exception:
                self.errors += 1

    def _loop(self) -> None:
        while not self._stop.wait(self.period):
            if not self.alive():
                if self.on_end is not None:
                    try:
                        self.on_end()
                    except Exception:
                        self.errors += 1
                return
            try:
                self.tick()
            except Exception:
                self.errors += 1

    def stop(self, timeout: float = 2.0) -> None:
        self._stop.set()
        if self._thread.ident is None:  # never started: no thread will release
            self._release()
        elif self._thread.is_alive() and threading.current_thread() is not self._thread:
            self._thread.join(timeout)

    def stop_when_closed(self, widget: Any) -> None:
        """Stop when ``widget`` is closed (``widget.close()``), not only through
        :meth:`stop`: a closed display must not keep sampling, or keep NVML open."""

        def closed(change: dict[str, Any]) -> None:
            if change["new"] is None:  # ipywidgets drops the comm on close()
                self.stop()

        widget.observe(closed, names="comm")


class DeviceMonitor:
    """Live per-device rows (utilisation, memory, power, state) for a cluster.

    Parameters
    ----------
    gc
        The cluster (``engines``: id -> ``EngineInfo``-like).  Engine states are
        the cluster's last known ones; the monitor does not query engines.
    telemetry
        The source of samples; its ``sample()`` must be safe to call from a
        thread.  Devices it reports that no engine uses get rows too.
    period
        Seconds between refreshes (0.5 s: 2 Hz).
    start
        Start the refresh thread now (tests refresh by hand with :meth:`refresh`).
    alive
        When the refresh should end; default: while ``gc`` is the active cluster.
    """

    def __init__(
        self,
        gc: Any,
        telemetry: TelemetrySource | None = None,
        *,
        period: float = 0.5,
        start: bool = True,
        alive: Callable[[], bool] | None = None,
    ) -> None:
        import ipywidgets as w

        from gpucell.ui.progress import DeviceTable
        from gpucell.ui.widgets import apply_changes

        self.gc = gc
        self.telemetry = telemetry
        self._apply = apply_changes
        self.title = w.HTML(tooltip="")
        self.table = DeviceTable(stats_title="power · temperature")
        self.widget = w.VBox([self.title, self.table.box], tooltip="")
        self._hosts = ""
        try:
            self.refresh()
        except BaseException:
            close_source(telemetry)  # no display, so nothing else would
            raise
        self._refresher = Refresher(
            self.refresh,
            period,
            alive or cluster_alive(gc),
            on_end=lambda: self._set_title("cluster stopped; monitor ended"),
            name="gpucell-monitor",
            release=lambda: close_source(telemetry),
        )
        self._refresher.stop_when_closed(self.widget)
        if start:
            self._refresher.start()

    def _set_title(self, note: str) -> None:
        n = len(self.table.rows)
        text = f"<b>gpucell monitor</b> · {n} device{'s' if n != 1 else ''} · "
        # the host's CPU load, once per host rather than on every row
        hosts = f"{self._hosts} · " if self._hosts else ""
        value = text + html.escape(hosts + note)
        self._apply([(self.title, {"value": value})])

    def refresh(self) -> None:
        """Sample once and redraw the rows (what the thread does each period)."""
        samples = list(self.telemetry.sample()) if self.telemetry else []
        # one copy: the main thread replaces a restarted engine's entry meanwhile
        now = dict(self.gc.engines)
        engines = [now[e] for e in model.engine_order(now)]
        rows = model.monitor_rows(_restarting(self.gc, engines), samples)
        self._hosts = model.host_loads(rows)
        self._apply(self.table.changes(rows))
        self._set_title(f"updated {time.strftime('%H:%M:%S')}")

    @property
    def running(self) -> bool:
        return self._refresher.running

    def close(self) -> None:
        """Stop refreshing and remove the widget from the output."""
        self._refresher.stop()
        self.widget.close()

    def _repr_mimebundle_(self, **kwargs: Any) -> dict[str, Any]:
        data = dict(self.widget._repr_mimebundle_(**kwargs))
        order = model.engine_order(self.gc.engines)
        rows = model.monitor_rows([self.gc.engines[e] for e in order])
        data["text/plain"] = "gpucell monitor: " + ", ".join(r.label for r in rows)
        return data


def _restarting(gc: Any, engines: list[Any]) -> list[Any]:
    """``engines`` with ``restarting`` as it is now: a dead engine whose device
    is being restarted reads ``restarting``, not ``dead`` (read only; the
    restarts are stepped in the main thread: by cells, ``%gpu_cluster status``
    and between cells the kernel's event loop, ``cluster/restart_watch``)."""
    restarts = getattr(gc, "restarts", None)
    if restarts is None:
        return engines
    out = []
    for e in engines:
        now = restarts.shown_restarting(gc, e.id)
        if dataclasses.is_dataclass(e) and bool(getattr(e, "restarting", now)) != now:
            e = dataclasses.replace(e, restarting=now)
        out.append(e)
    return out
