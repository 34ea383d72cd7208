"""``%gpu_cluster select``: choose the devices later cells run on.

One checkbox per engine with its live load, so a user can leave out a GPU that
another job is using.  Toggling writes ``gc.selected`` (a tuple of engine ids;
``None`` means every live engine), which :func:`gpucell.kernel.execute.select_targets`
uses for cells without ``--devices``/``--targets``.  The load bars refresh from
a background thread that ends with the widget or the cluster.
"""

from __future__ import annotations

import html
import threading
from collections.abc import Callable, Iterable
from typing import TYPE_CHECKING, Any

from gpucell.ui import model
from gpucell.ui.monitor import Refresher, close_source, cluster_alive

if TYPE_CHECKING:
    from gpucell.protocol.telemetry import TelemetrySource

__all__ = ["DeviceSelector", "selection_from"]

#: px from a checkbox's left edge to its description: the 13 px box and the
#: 8 px margin ipywidgets gives it
CHECK_W = 21


def selection_from(
    checked: Iterable[int], live: Iterable[int]
) -> tuple[int, ...] | None:
    """``gc.selected`` for a set of ticked engines (pure).

    Every live engine ticked, or none, is stored as ``None`` ("all"), so engines
    that join later are not left out by accident, and an empty selection never
    leaves a cell with nowhere to run.
    """
    chosen = tuple(sorted(set(checked)))
    live_set = set(live)
    if not chosen or live_set <= set(chosen):
        return None
    return chosen


class DeviceSelector:
    """A checkbox row per device with its live load; the ticks are ``gc.selected``.

    Parameters
    ----------
    gc
        The cluster (``engines``: id -> ``EngineInfo``-like, ``selected``, and
        ``dead`` or ``live_ids()`` when available).
    telemetry
        Live load; ``sample()`` must be safe to call from a thread.
    period
        Seconds between load refreshes (1 s).
    start, alive
        As for :class:`gpucell.ui.monitor.DeviceMonitor`.
    """

    def __init__(
        self,
        gc: Any,
        telemetry: TelemetrySource | None = None,
        *,
        period: float = 1.0,
        start: bool = True,
        alive: Callable[[], bool] | None = None,
    ) -> None:
        import ipywidgets as w

        from gpucell.ui.widgets import (
            GAP,
            W_LABEL,
            W_MEM_FIG,
            W_UTIL_FIG,
            SharedStyles,
            apply_changes,
            fig_header,
            px,
        )

        self.gc = gc
        self.telemetry = telemetry
        self._apply = apply_changes
        self._lock = threading.RLock()
        self._syncing = False
        self.checkboxes: dict[int, Any] = {}
        self.bars: dict[int, Any] = {}
        self.mems: dict[int, Any] = {}
        self.loads: dict[int, Any] = {}
        # the same columns as the run's table (progress.DeviceTable); the
        # checkbox column is wider by the box in front of the label
        sh = SharedStyles(w)
        check = w.Layout(width=px(W_LABEL + CHECK_W), margin=f"0 {GAP}px 0 0")
        rows = []
        sel = gc.selected
        for eid in model.engine_order(gc.engines):
            cb = w.Checkbox(
                value=sel is None or eid in sel, indent=False, layout=check, tooltip=""
            )
            cb.observe(self._on_toggle, names="value")
            bar = sh.util_bar(w)
            mem = sh.mem_bar(w)
            load = w.HTML(layout=sh.stats, style=sh.html, tooltip="")
            self.checkboxes[eid], self.bars[eid] = cb, bar
            self.mems[eid], self.loads[eid] = mem, load
            rows.append(w.HBox([cb, bar, mem, load], tooltip=""))
        self.load_header = w.HTML(layout=sh.stats, style=sh.html, tooltip="")
        self.header = w.HBox(
            [
                w.HTML(
                    f'<div style="padding-left:{CHECK_W}px">'
                    "<b>engine · host · device</b></div>",
                    layout=check,
                    style=sh.html,
                    tooltip="",
                ),
                w.HTML(fig_header("util", W_UTIL_FIG), layout=sh.util, tooltip=""),
                w.HTML(fig_header("memory", W_MEM_FIG), layout=sh.mem, tooltip=""),
                self.load_header,
            ],
            tooltip="",
        )
        self.title = w.HTML(tooltip="")
        self.note = w.HTML(tooltip="")
        self.widget = w.VBox([self.title, self.header, *rows, self.note], tooltip="")
        try:
            self.refresh()
        except BaseException:
            close_source(telemetry)  # no display, so nothing else would
            raise
        self._refresher = Refresher(
            self.refresh,
            period,
            alive or cluster_alive(gc),
            on_end=lambda: self._set_note("cluster stopped; selection closed"),
            name="gpucell-select",
            release=lambda: close_source(telemetry),
        )
        self._refresher.stop_when_closed(self.widget)
        if start:
            self._refresher.start()

    # ---------------------------------------------------------------- state

    def _live(self) -> list[int]:
        dead = set(getattr(self.gc, "dead", ()) or ())
        return [
            e
            for e in model.engine_order(self.gc.engines)
            if e not in dead and getattr(self.gc.engines[e], "state", "") != "dead"
        ]

    @property
    def selected(self) -> tuple[int, ...] | None:
        return self.gc.selected

    def select(self, ids: Iterable[int] | None) -> None:
        """Tick exactly ``ids`` (``None``: all), as if the user clicked."""
        want = set(self.checkboxes) if ids is None else set(ids)
        with self._lock:
            self._syncing = True
            try:
                for eid, cb in self.checkboxes.items():
                    cb.value = eid in want
            finally:
                self._syncing = False
            self._write()

    def _on_toggle(self, change: dict[str, Any]) -> None:
        if self._syncing:
            return
        with self._lock:
            self._write()

    def _write(self) -> None:
        checked = [e for e, cb in self.checkboxes.items() if cb.value]
        self.gc.selected = selection_from(checked, self._live())
        self._set_note(self._describe())

    def _describe(self) -> str:
        sel = self.gc.selected
        if sel is None:
            return "later cells run on every live engine"
        return "later cells run on engine" + (
            f"s {', '.join(map(str, sel))}" if len(sel) > 1 else f" {sel[0]}"
        )

    def _set_note(self, text: str) -> None:
        self._apply([(self.note, {"value": f"<i>{html.escape(text)}</i>"})])

    # -------------------------------------------------------------- refresh

    def refresh(self) -> None:
        """Redraw labels and loads; follow selection changes made elsewhere."""
        samples = list(self.telemetry.sample()) if self.telemetry else []
        engines = [self.gc.engines[e] for e in model.engine_order(self.gc.engines)]
        rows = {r.engine: r for r in model.monitor_rows(engines, samples)}
        with self._lock:
            sel = self.gc.selected
            ticked = {e for e, cb in self.checkboxes.items() if cb.value}
            # ``None`` shows as all ticked or all unticked; a mix means the
            # selection was reset elsewhere (the magic, another selector)
            reset = sel is None and ticked and ticked != set(self.checkboxes)
            changes: list[tuple[Any, dict[str, Any]]] = []
            for eid, cb in self.checkboxes.items():
                r = rows.get(eid)
                if r is None:
                    continue
                dead = r.state == "dead"
                label = r.label + (" (dead)" if dead else "")
                attrs: dict[str, Any] = {"description": label, "disabled": dead}
                if sel is not None:
                    attrs["value"] = eid in sel
                elif reset:
                    attrs["value"] = True
                changes.append((cb, attrs))
                changes.append(
                    (
                        self.bars[eid],
                        {
                            "value": round(r.util or 0.0, 2),
                            "description": r.util_text,
                            "bar_style": "danger" if dead else "info",
                        },
                    )
                )
                changes.append(
                    (
                        self.mems[eid],
                        {
                            "value": round(r.mem or 0.0, 2),
                            "description": r.mem_text,
                            "bar_style": "danger" if dead else "",
                        },
                    )
                )
                changes.append((self.loads[eid], {"value": html.escape(r.extra)}))
            # power and temperature exist for GPUs only; the host's CPU load is
            # one figure per host, so it goes in the title, once
            extra = any(r.extra for r in rows.values())
            head = "<b>power · temperature</b>" if extra else ""
            changes.append((self.load_header, {"value": head}))
            title = "<b>gpucell: devices for later cells</b>"
            hosts = model.host_loads(rows.values())
            if hosts:
                title += f" · {html.escape(hosts)}"
            changes.append((self.title, {"value": title}))
            self._syncing = True
            try:
                self._apply(changes)
            finally:
                self._syncing = False
            self._set_note(self._describe())

    @property
    def running(self) -> bool:
        return self._refresher.running

    def close(self) -> None:
        """Stop refreshing and remove the widget (the selection stays)."""
        self._refresher.stop()
        self.widget.close()

    def _repr_mimebundle_(self, **kwargs: Any) -> dict[str, Any]:
        data = dict(self.widget._repr_mimebundle_(**kwargs))
        data["text/plain"] = "gpucell: " + self._describe()
        return data
