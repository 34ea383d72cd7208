"""The live display of a running ``%%gpu_parallel`` cell.

:func:`make_progress` picks the display for where the cell runs: an ipywidgets
widget in a kernel with a front end, a one-line ``\\r`` display in a terminal, or
nothing when quiet.  The dispatcher calls ``update(snapshot)`` on the kernel's
main thread 2-4 times a second, so an update only diffs a few trait values inside
``hold_sync()`` (one comm message per changed widget) and never raises: a display
must not break or slow the loop it shows.

ipywidgets is imported here, on first use, never by ``import gpucell``.
"""

from __future__ import annotations

import html
import shutil
import sys
import time
from collections.abc import Callable, Sequence
from typing import IO, TYPE_CHECKING, Any, Protocol

from gpucell.core.runstate import RunSnapshot
from gpucell.ui import model
from gpucell.ui.widgets import (
    GAP,
    W_MEM,
    W_MEM_FIG,
    W_UTIL,
    W_UTIL_FIG,
    SharedStyles,
    apply_changes,
    fig_header,
    px,
)

if TYPE_CHECKING:
    from gpucell.protocol.telemetry import DeviceSample, TelemetrySource

__all__ = [
    "DeviceTable",
    "NullProgress",
    "ProgressDisplay",
    "TelemetryThrottle",
    "TextProgress",
    "WidgetProgress",
    "has_widget_frontend",
    "make_progress",
]

#: at most this many telemetry samples per second (NVML calls cost ~ms per GPU)
MAX_SAMPLE_HZ = 4.0
#: seconds an update may spend sending widget changes (the rest wait a tick)
UPDATE_BUDGET = 0.003
#: a display that failed this often stops trying (and stops costing time)
MAX_ERRORS = 3


class ProgressDisplay(Protocol):
    """What the dispatcher's ``progress=`` callback talks to."""

    def update(self, snap: RunSnapshot) -> None: ...

    def close(self, snap: RunSnapshot) -> None: ...


class TelemetryThrottle:
    """Calls ``source.sample()`` at most :data:`MAX_SAMPLE_HZ` times a second.

    A slow source (many GPUs, a remote host) widens its own interval to keep
    sampling under ~5 % of the caller's time, since the caller is the kernel's main
    thread while a cell runs.  Errors keep the last good samples.
    """

    def __init__(
        self,
        source: TelemetrySource | None,
        min_interval: float = 1.0 / MAX_SAMPLE_HZ,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.source = source
        self.interval = min_interval
        self._min = min_interval
        self._clock = clock
        self._last = -float("inf")
        self.samples: list[DeviceSample] = []
        self.errors = 0

    def get(self, force: bool = False) -> list[DeviceSample]:
        if self.source is None or self.errors >= MAX_ERRORS:
            return self.samples
        now = self._clock()
        if not force and now - self._last < self.interval:
            return self.samples
        self._last = now
        try:
            self.samples = list(self.source.sample())
        except Exception:
            self.errors += 1
            return self.samples
        cost = self._clock() - now
        self.interval = max(self._min, 20.0 * cost)
        return self.samples


# --------------------------------------------------------------------- null


class NullProgress:
    """``--quiet``: shows nothing."""

    def update(self, snap: RunSnapshot) -> None:
        pass

    def close(self, snap: RunSnapshot) -> None:
        pass


# --------------------------------------------------------------------- text


class TextProgress:
    """One line redrawn in place with ``\\r``: terminal IPython and plain Python.

    When the stream is not a terminal (a log file, a pipe) a redrawn line would
    only pile up, so only the final summary is written there.
    """

    def __init__(
        self,
        telemetry: TelemetrySource | None = None,
        stream: IO[str] | None = None,
        width: int | None = None,
    ) -> None:
        self._stream = stream
        self._sampler = TelemetryThrottle(telemetry)
        self._width = width
        self._shown = 0
        self._line = ""
        self.errors = 0

    @property
    def stream(self) -> IO[str]:
        # looked up late: IPython swaps sys.stdout while capturing
        return self._stream if self._stream is not None else sys.stdout

    def _live(self) -> bool:
        try:
            return bool(self.stream.isatty())
        except Exception:
            return False

    def _cols(self) -> int:
        if self._width is not None:
            return self._width
        return max(40, shutil.get_terminal_size((100, 24)).columns - 1)

    def update(self, snap: RunSnapshot) -> None:
        if self.errors >= MAX_ERRORS or not self._live():
            return
        try:
            line = model.text_line(snap, self._sampler.get(), width=self._cols())
            pad = " " * max(0, self._shown - len(line))
            self.stream.write("\r" + line + pad)
            self.stream.flush()
            self._shown, self._line = len(line), line
        except Exception:
            self.errors += 1

    def write_above(self, text: str) -> None:
        """Engine output while the line is shown: the line is cleared, the output
        printed, and the line drawn again below it (never mixed into it)."""
        s = self.stream
        if not self._shown:
            s.write(text)
            s.flush()
            return
        s.write("\r" + " " * self._shown + "\r" + text)
        if not text.endswith("\n"):
            s.write("\n")  # the next redraw's \r must not overwrite the output
        s.write(self._line)
        s.flush()

    def close(self, snap: RunSnapshot) -> None:
        try:
            samples = self._sampler.get(force=True)
            if self._shown:
                self.stream.write("\r" + " " * self._shown + "\r")
            self.stream.write("\n".join(model.summary_lines(snap, samples)) + "\n")
            self.stream.flush()
        except Exception:
            self.errors += 1


class _RowWidgets:
    """The widgets of one device row (an ``HBox``)."""

    def __init__(self, w: Any, sh: SharedStyles) -> None:
        # tooltip="": ipywidgets writes a None tooltip into the label's title as
        # the word "null", which a hover then shows
        self.label = w.HTML(layout=sh.label, style=sh.html, tooltip="")
        self.util = sh.util_bar(w)
        self.mem = sh.mem_bar(w)
        self.stats = w.HTML(layout=sh.stats, style=sh.html, tooltip="")
        self.state = w.HTML(layout=sh.state, style=sh.html, tooltip="")
        self.box = w.HBox(
            [self.label, self.util, self.mem, self.stats, self.state], tooltip=""
        )

    def changes(self, r: model.DeviceRow) -> list[tuple[Any, dict[str, Any]]]:
        dead = r.state in ("dead", "restarting")
        mem_style = "warning" if (r.mem or 0.0) > 0.9 else ""
        host = "" if r.host_cpu is None else f"host CPU {r.host_cpu:.0f}%"
        return [
            (self.label, {"value": _esc(r.label)}),
            (
                self.util,
                {
                    "value": round(r.util or 0.0, 2),
                    "description": r.util_text,
                    "tooltip": " · ".join(x for x in (r.extra, host, r.note) if x),
                    "bar_style": "danger" if dead else "info",
                },
            ),
            (
                self.mem,
                {
                    "value": round(r.mem or 0.0, 2),
                    "description": r.mem_text,
                    "bar_style": "danger" if dead else mem_style,
                },
            ),
            (self.stats, {"value": _esc(r.stats)}),
            (self.state, {"value": model.state_html(r.state)}),
        ]


def _esc(s: str) -> str:
    return html.escape(s)


class DeviceTable:
    """A header and one row per device; shared by the cell widget and the monitor.

    Rows are keyed by their device (``DeviceRow.key``: an engine restarted
    after dying redraws its device's row; else the engine id, or the label for
    devices no engine uses), added when a new one appears and dropped when one
    goes, so a refresh rebuilds the widget tree only then (that re-renders
    every view in the front end).
    """

    def __init__(self, stats_title: str = "iterations · pace") -> None:
        import ipywidgets as w

        self._w = w
        self._shared = sh = SharedStyles(w)
        # each header cell has its column's Layout, so the widths and gaps are
        # the rows' own; the figure columns' titles sit right-aligned over the
        # figures (see fig_header)
        head = (
            ("<b>engine · host · device</b>", sh.label),
            (fig_header("util", W_UTIL_FIG), sh.util),
            (fig_header("memory", W_MEM_FIG), sh.mem),
            (f"<b>{_esc(stats_title)}</b>", sh.stats),
            ("<b>state</b>", sh.state),
        )
        self.header = w.HBox(
            [w.HTML(v, layout=lay, style=sh.html, tooltip="") for v, lay in head],
            tooltip="",
        )
        self.rows: dict[Any, _RowWidgets] = {}
        self.box = w.VBox([self.header], tooltip="")

    def changes(
        self, rows: Sequence[model.DeviceRow]
    ) -> list[tuple[Any, dict[str, Any]]]:
        out: list[tuple[Any, dict[str, Any]]] = []
        keys = [_key(r) for r in rows]
        changed = set(keys) != set(self.rows)
        for key in set(self.rows) - set(keys):
            self.rows.pop(key).box.close()
        for key, r in zip(keys, rows, strict=True):
            rw = self.rows.get(key)
            if rw is None:
                rw = self.rows[key] = _RowWidgets(self._w, self._shared)
            out += rw.changes(r)
        if changed:
            children = (self.header, *(rw.box for rw in self.rows.values()))
            out.append((self.box, {"children": children}))
        return out


def _key(r: model.DeviceRow) -> Any:
    if r.key is not None:
        return r.key
    return r.engine if r.engine is not None else r.label


class WidgetProgress:
    """The in-cell widget: an overall bar, then one row per engine.

    It stays in the output after the cell with its final figures (front ends save
    widget state with the notebook); where widgets cannot be drawn, the output's
    ``text/plain`` says the same thing (see :meth:`close`).
    """

    def __init__(
        self,
        snap: RunSnapshot,
        telemetry: TelemetrySource | None = None,
        show: Callable[..., Any] | None = None,
        echo: Callable[[str], None] | None = None,
    ) -> None:
        import ipywidgets as w

        self._sampler = TelemetryThrottle(telemetry)
        self._echo = echo or print
        self.errors = 0
        self.table = DeviceTable()
        sh = self.table._shared
        # the overall row on the table's grid: the title in the label column, the
        # bar across the utilisation and memory columns, the text from the
        # iterations column on
        self.title = w.HTML(
            "<b>gpucell run</b>", layout=sh.label, style=sh.html, tooltip=""
        )
        self.bar = w.FloatProgress(
            min=0.0,
            max=1.0,
            bar_style="info",
            layout=w.Layout(width=px(W_UTIL + GAP + W_MEM), margin=f"0 {GAP}px 0 0"),
            tooltip="",
        )
        # margin 0 as every cell of the table has (the default 2 px would set
        # the text off the iterations column and below the title's baseline)
        self.label = w.HTML(layout=w.Layout(margin="0"), style=sh.html, tooltip="")
        self.overall = w.HBox([self.title, self.bar, self.label], tooltip="")
        self.widget = w.VBox([self.overall, self.table.box], tooltip="")
        self.budget = UPDATE_BUDGET
        self._turn = 0
        apply_changes(sum(self._changes(snap, self._sampler.get(force=True)), []))
        if show is None:
            from IPython.display import display as show
        self._handle = show(
            self._bundle("gpucell: running… (live per-device widget)"),
            raw=True,
            display_id=True,
        )

    def _bundle(self, text: str) -> dict[str, Any]:
        data = dict(self.widget._repr_mimebundle_())
        data["text/plain"] = text
        return data

    def _changes(
        self, snap: RunSnapshot, samples: list[Any]
    ) -> tuple[list[tuple[Any, dict[str, Any]]], list[tuple[Any, dict[str, Any]]]]:
        """(the overall row's changes, the device rows' changes)."""
        view = model.run_view(snap, samples)
        o = view.overall
        head: list[tuple[Any, dict[str, Any]]] = [
            (self.bar, {"value": round(o.fraction, 3), "bar_style": o.bar_style}),
            (self.label, {"value": _esc(o.text)}),
        ]
        return head, self.table.changes(view.rows)

    def update(self, snap: RunSnapshot) -> None:
        """Show ``snap``; spends at most about :attr:`budget` seconds sending.

        Every changed widget is a comm message, so with many devices changing at
        once a refresh could outgrow the budget; then the overall row goes first
        and the device rows take turns (a row waits at most a tick or two).
        """
        if self.errors >= MAX_ERRORS:
            return
        try:
            t0 = time.perf_counter()
            head, rows = self._changes(snap, self._sampler.get())
            k = self._turn % len(rows) if rows else 0
            order = head + rows[k:] + rows[:k]
            done = apply_changes(order, t0 + self.budget, at_least=len(head) + 1)
            self._turn = k + max(0, done - len(head))
        except Exception:
            self.errors += 1

    def close(self, snap: RunSnapshot) -> None:
        """Final figures in the widget and in its text form.

        The output's ``text/plain`` (which every front end without the widget
        manager shows: nbconvert, GitHub, a terminal) becomes the whole summary,
        updated in place through the display handle; so a widget front end shows
        the widget alone, not the widget and the same figures again as text.  Only
        where there is no handle to update is the summary printed.
        """
        try:
            samples = self._sampler.get(force=True)
            apply_changes(sum(self._changes(snap, samples), []))
            text = "\n".join(model.summary_lines(snap, samples))
            if self._handle is not None and hasattr(self._handle, "update"):
                self._handle.update(self._bundle(text), raw=True)
            else:
                self._echo(text)
        except Exception:
            self.errors += 1


# ------------------------------------------------------------------- choice


def has_widget_frontend(shell: Any) -> bool:
    """True in a Jupyter kernel (ipykernel's ``ZMQInteractiveShell``).

    Looked up in ``sys.modules`` rather than imported: outside a kernel ipykernel
    is not loaded and need not be.
    """
    zmqshell = sys.modules.get("ipykernel.zmqshell")
    if zmqshell is None or shell is None:
        return False
    return isinstance(shell, zmqshell.ZMQInteractiveShell)


def make_progress(
    shell: Any,
    snapshot: RunSnapshot,
    telemetry: TelemetrySource | None = None,
    quiet: bool = False,
) -> ProgressDisplay:
    """The display for this run: widget in a kernel, a text line elsewhere.

    Parameters
    ----------
    shell
        The IPython shell running the cell (``None`` in plain Python).
    snapshot
        The first frame (:func:`gpucell.ui.model.initial_snapshot`), so the rows
        exist before the first chunk ends.
    telemetry
        Live utilisation and memory; sampled by the display itself, at most
        :data:`MAX_SAMPLE_HZ` times a second.
    quiet
        ``--quiet``: nothing at all.
    """
    if quiet:
        return NullProgress()
    if has_widget_frontend(shell):
        try:
            return WidgetProgress(snapshot, telemetry)
        except Exception:  # no ipywidgets, or no display machinery: use text
            pass
    return TextProgress(telemetry)
