"""What the progress displays show, as plain data and strings (no ipywidgets).

Every display (the in-cell widget, the terminal line, the device monitor and the
selector) renders the same rows, so all formatting lives here, where it can be
unit-tested without a kernel or a front end.  Inputs are a
:class:`~gpucell.core.runstate.RunSnapshot` and, optionally, telemetry samples (any
objects shaped like ``gpucell.protocol.telemetry.DeviceSample``; read by attribute name
so
this module does not import the telemetry backends).
"""

from __future__ import annotations

import html
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any

from gpucell.core.runstate import (
    BUSY,
    DEAD,
    IDLE,
    RESTARTING,
    RETRYING,
    EngineProgress,
    RunSnapshot,
)

__all__ = [
    "DeviceRow",
    "OverallRow",
    "RunView",
    "device_label",
    "device_text",
    "fmt_bytes",
    "fmt_count",
    "fmt_duration",
    "fmt_eta",
    "fmt_percent",
    "fmt_rate",
    "host_loads",
    "initial_snapshot",
    "monitor_rows",
    "run_view",
    "samples_by_engine",
    "state_html",
    "summary_lines",
    "text_line",
]

#: extra states: the run ended (``done``), or ended badly (``stopped``)
DONE, STOPPED = "done", "stopped"

#: state -> CSS colour; chosen to stay readable on light and dark themes
STATE_COLORS: dict[str, str] = {
    BUSY: "#2e7d32",
    IDLE: "#757575",
    RETRYING: "#ef6c00",
    RESTARTING: "#ef6c00",
    DEAD: "#c62828",
    DONE: "#1565c0",
    STOPPED: "#6a1b9a",
}

#: run status -> FloatProgress ``bar_style``
STATUS_BAR_STYLE: dict[str, str] = {
    "running": "info",
    "ok": "success",
    "error": "danger",
    "timeout": "danger",
    "interrupted": "warning",
}

NA = "–"


# --------------------------------------------------------------------- units


def fmt_duration(seconds: float | None) -> str:
    """``0:42``, ``12:03``, ``1:02:03``: the clock form people read at a glance.

    Under a second the clock would read ``0:00``, which looks like nothing ran;
    there it is ``0.03 s``.
    """
    if seconds is None or seconds != seconds or seconds < 0:
        return "?"
    if 0 < seconds < 0.995:
        return f"{seconds:.2f} s"
    s = int(round(seconds))
    h, rest = divmod(s, 3600)
    m, s = divmod(rest, 60)
    return f"{h}:{m:02d}:{s:02d}" if h else f"{m}:{s:02d}"


def fmt_eta(eta: float | None) -> str:
    """``ETA 0:42``; ``ETA ?`` before the first iteration gives a pace."""
    return f"ETA {fmt_duration(eta)}"


def fmt_rate(rate: float) -> str:
    """Iterations per second, or seconds per iteration for slow loops.

    Slow loops (a training step per iteration) read better as ``20.0 s/it`` than as
    ``0.05 it/s``; this is the convention tqdm users know.  Fast ones keep three
    significant figures with a ``k``/``M`` prefix (``2.97k it/s``): a cheap loop's
    pace is a rough figure, and four or more digits only look precise.
    """
    if rate <= 0 or rate != rate:
        return NA
    if rate < 1:
        return f"{1 / rate:.1f} s/it"
    if rate < 10:
        return f"{rate:.2f} it/s"
    if rate < 99.95:
        return f"{rate:.1f} it/s"
    if rate < 999.5:
        return f"{rate:.0f} it/s"
    for scale, prefix in ((1e3, "k"), (1e6, "M")):
        v = rate / scale
        if v < 999.5:
            return f"{v:.3g}{prefix} it/s"
    return f"{rate / 1e9:,.3g}G it/s"


def fmt_count(n: int) -> str:
    """Thousands separated, so ``1,234,567`` is not misread."""
    return f"{n:,}"


def fmt_percent(fraction: float | None) -> str:
    return NA if fraction is None else f"{100 * fraction:.0f}%"


def fmt_bytes(used: float | None, total: float | None = None) -> str:
    """``3.2/80.0 GiB``: one unit for both numbers, picked from the total."""
    if used is None and not total:
        return NA
    ref = total or used or 0
    unit, scale = ("GiB", 2**30) if ref >= 2**30 else ("MiB", 2**20)
    if not total:
        return f"{(used or 0) / scale:.1f} {unit}"
    if used is None:
        return f"?/{total / scale:.1f} {unit}"
    return f"{used / scale:.1f}/{total / scale:.1f} {unit}"


def _clamp(x: float | None) -> float | None:
    if x is None or x != x:
        return None
    return min(1.0, max(0.0, float(x)))


# ------------------------------------------------------------------ samples


def _attr(obj: Any, *names: str) -> Any:
    for n in names:
        v = getattr(obj, n, None)
        if v is not None:
            return v
    return None


def samples_by_engine(samples: Iterable[Any] | None) -> dict[int, Any]:
    """Index telemetry samples by engine id (the newest wins).

    Samples without an engine id (a GPU the cluster does not use) are left out
    here; :func:`monitor_rows` shows them separately.
    """
    out: dict[int, Any] = {}
    for s in samples or ():
        eid = _attr(s, "engine", "engine_id")
        if eid is None:
            continue
        old = out.get(eid)
        if old is None or (_attr(s, "timestamp") or 0) >= (
            _attr(old, "timestamp") or 0
        ):
            out[int(eid)] = s
    return out


@dataclass(frozen=True)
class _Load:
    util: float | None
    util_text: str
    mem: float | None
    mem_text: str
    extra: str
    note: str = ""
    dead: bool = False
    host_cpu: float | None = None


def _load(sample: Any | None) -> _Load:
    if sample is None:
        return _Load(None, NA, None, NA, "")
    util = _attr(sample, "utilization", "utilization_pct", "util")
    used = _attr(sample, "memory_used")
    total = _attr(sample, "memory_total")
    u = _clamp(util / 100.0) if util is not None else None
    # a CPU engine's process may use several cores (e.g. 350 %): the bar is
    # full, the text says how full
    util_text = NA if util is None else f"{util:.0f}%"
    m = _clamp(used / total) if used is not None and total else None
    extra = []
    power = _attr(sample, "power_w")
    temp = _attr(sample, "temperature_c")
    # the host's CPU load is the same for every device of a host: it is kept
    # apart (see host_loads) rather than repeated on every row
    cpu = _attr(sample, "host_cpu")
    if power is not None:
        extra.append(f"{power:.0f} W")
    if temp is not None:
        extra.append(f"{temp:.0f} °C")
    state = getattr(sample, "state", "ok") or "ok"
    note = getattr(sample, "error", "") or ("" if state == "ok" else state)
    return _Load(
        u,
        util_text,
        m,
        fmt_bytes(used, total),
        " · ".join(extra),
        note=str(note),
        dead=state == DEAD,
        host_cpu=cpu,
    )


# --------------------------------------------------------------------- rows


def device_text(device: str, name: str) -> str:
    """``GPU 0 (A100)`` or ``CPU``: the model name only where it adds something."""
    dev = device or name or "?"
    if name and name != dev and name.upper() != "CPU":
        dev = f"{dev} ({name})"
    return dev


def device_label(engine: int | None, host: str, device: str, name: str) -> str:
    """``0 · node1 · GPU 0 (A100)``: who the row is, in one short string."""
    who = NA if engine is None else str(engine)
    return " · ".join(x for x in (who, host, device_text(device, name)) if x)


@dataclass(frozen=True)
class DeviceRow:
    """One device as every display shows it (strings ready to render)."""

    engine: int | None
    label: str
    state: str
    done: int = 0
    done_text: str = ""
    rate: float = 0.0
    rate_text: str = NA
    util: float | None = None
    util_text: str = NA
    mem: float | None = None
    mem_text: str = NA
    extra: str = ""  # power, temperature
    note: str = ""  # why telemetry is missing, when it is
    host: str = ""
    host_cpu: float | None = None  # the whole host's CPU load (see host_loads)
    # what the displays key the row's widgets by: its device, so an engine
    # restarted after dying (a new id) redraws its device's row, not a new one
    key: Any = None

    @property
    def color(self) -> str:
        return STATE_COLORS.get(self.state, "#000000")

    @property
    def stats(self) -> str:
        """Iterations and pace; the live load for rows without a run."""
        if self.done_text:
            return f"{self.done_text} · {self.rate_text}"
        return self.extra


@dataclass(frozen=True)
class OverallRow:
    """The run's own bar."""

    fraction: float
    text: str
    status: str

    @property
    def bar_style(self) -> str:
        return STATUS_BAR_STYLE.get(self.status, "")


@dataclass(frozen=True)
class RunView:
    overall: OverallRow
    rows: tuple[DeviceRow, ...]


def _state(e: EngineProgress, status: str) -> str:
    if e.state in (DEAD, RESTARTING) or status == "running":
        return e.state
    return DONE if status == "ok" else STOPPED


def overall_row(snap: RunSnapshot) -> OverallRow:
    """``37/100 it (37%) · 0:12 · ETA 0:20``, or the outcome once finished."""
    parts = [
        f"{fmt_count(snap.done)}/{fmt_count(snap.total)} it "
        f"({fmt_percent(_clamp(snap.fraction))})",
        fmt_duration(snap.elapsed),
    ]
    if snap.status == "running":
        parts.append(fmt_eta(snap.eta))
        if snap.elapsed > 0 and snap.done:
            parts.append(fmt_rate(snap.done / snap.elapsed))
    else:
        parts.append(snap.status)
        dead = sum(1 for e in snap.engines if e.state == DEAD)
        if dead:
            parts.append(f"{dead} engine{'s' if dead > 1 else ''} lost")
        back = sum(1 for e in snap.engines if e.state == RESTARTING)
        if back:
            parts.append(f"{back} engine{'s' if back > 1 else ''} restarting")
    return OverallRow(_clamp(snap.fraction) or 0.0, " · ".join(parts), snap.status)


def engine_order(engines: dict[int, Any]) -> list[int]:
    """Engine ids as displays list them: this host's first, then each other
    host's together (``EngineInfo``-like values: ``local``, ``host``)."""
    return sorted(
        engines,
        key=lambda e: (not getattr(engines[e], "local", True), engines[e].host, e),
    )


def _by_host(engines: Sequence[EngineProgress]) -> list[EngineProgress]:
    """Each host's engines together, hosts in the order they first appear."""
    first: dict[str, int] = {}
    for i, e in enumerate(engines):
        first.setdefault(e.host, i)
    return sorted(engines, key=lambda e: first[e.host])


def run_view(snap: RunSnapshot, samples: Iterable[Any] | None = None) -> RunView:
    """The whole display of a running (or finished) cell (each host's engines
    together)."""
    by = samples_by_engine(samples)
    rows = []
    for e in _by_host(snap.engines):
        load = _load(by.get(e.engine))
        state = _state(e, snap.status)
        # telemetry may see a vanished process before the dispatcher's next
        # poll: its figures go, but whether the device is dead or restarting
        # is the run's to say
        if load.dead or state in (DEAD, RESTARTING):
            load = _Load(None, NA, None, NA, "", note=load.note, dead=True)
        rows.append(
            DeviceRow(
                engine=e.engine,
                label=device_label(e.engine, e.host, e.device, e.name),
                state=state,
                done=e.done,
                done_text=f"{fmt_count(e.done)} it",
                rate=e.rate,
                rate_text=fmt_rate(e.rate),
                util=load.util,
                util_text=load.util_text,
                mem=load.mem,
                mem_text=load.mem_text,
                extra=load.extra,
                note=load.note,
                host=e.host,
                host_cpu=load.host_cpu,
                key=e.slot if e.slot >= 0 else e.engine,
            )
        )
    return RunView(overall_row(snap), tuple(rows))


def monitor_rows(
    engines: Iterable[Any], samples: Iterable[Any] | None = None
) -> tuple[DeviceRow, ...]:
    """Rows outside a run: one per engine (``EngineInfo``-like), then one per
    sampled device no engine uses (a GPU shared with other jobs).
    """
    samples = list(samples or ())
    by = samples_by_engine(samples)
    rows = []
    seen: set[tuple[str, str, int]] = set()
    for info in engines:
        eid = int(info.id)
        state = getattr(info, "state", IDLE) or IDLE
        device = getattr(info, "device", "") or ""
        seen.add((info.host, info.kind, info.index))
        load = _load(by.get(eid))
        if load.dead or state == DEAD:
            # a dead engine being restarted is its device's next engine coming
            state = RESTARTING if getattr(info, "restarting", False) else DEAD
            load = _Load(None, NA, None, NA, "", note=load.note, dead=True)
        rows.append(
            DeviceRow(
                engine=eid,
                label=device_label(eid, info.host, device, info.name),
                state=state,
                util=load.util,
                util_text=load.util_text,
                mem=load.mem,
                mem_text=load.mem_text,
                extra=load.extra,
                note=load.note,
                host=info.host,
                host_cpu=load.host_cpu,
                key=(info.host, info.label) if getattr(info, "label", "") else eid,
            )
        )
    for s in samples:
        if _attr(s, "engine", "engine_id") is not None:
            continue
        key = (s.host, s.kind, s.index)
        if key in seen:
            continue
        seen.add(key)
        load = _load(s)
        device = f"GPU {s.index}" if s.kind == "gpu" else "CPU"
        rows.append(
            DeviceRow(
                engine=None,
                label=device_label(None, s.host, device, s.name),
                state="unused",
                util=load.util,
                util_text=load.util_text,
                mem=load.mem,
                mem_text=load.mem_text,
                extra=load.extra,
                host=s.host,
                host_cpu=load.host_cpu,
            )
        )
    return tuple(rows)


def host_loads(rows: Iterable[DeviceRow]) -> str:
    """``host CPU: node1 68% · node2 12%``, once per host (``""`` when unknown).

    The host's load is the same figure on every device of that host, so the
    displays show it once instead of on each row.
    """
    seen: dict[str, float] = {}
    for r in rows:
        if r.host_cpu is not None and r.state not in (DEAD, RESTARTING):
            seen.setdefault(r.host or "?", r.host_cpu)
    if not seen:
        return ""
    return "host CPU: " + " · ".join(f"{h} {c:.0f}%" for h, c in seen.items())


def initial_snapshot(engines: Iterable[Any], total: int) -> RunSnapshot:
    """The display's first frame, before the dispatcher's first snapshot.

    ``engines`` are ``EngineInfo``-like (``id``, ``host``, ``device``, ``name``...).
    """
    return RunSnapshot(
        total=total,
        done=0,
        elapsed=0.0,
        engines=tuple(
            EngineProgress(
                engine=int(e.id),
                host=e.host,
                device=getattr(e, "device", ""),
                name=e.name,
                pid=getattr(e, "pid", 0),
                kind=getattr(e, "kind", "cpu"),
                index=getattr(e, "index", -1),
            )
            for e in engines
        ),
    )


def state_html(state: str) -> str:
    """The coloured state label (inline style only: no JavaScript, any front end)."""
    color = STATE_COLORS.get(state, "#000000")
    return f'<span style="color:{color};font-weight:bold">{html.escape(state)}</span>'


# --------------------------------------------------------------------- text


def _bar(fraction: float, width: int) -> str:
    n = int(round((_clamp(fraction) or 0.0) * width))
    return "[" + "#" * n + "-" * (width - n) + "]"


def text_line(
    snap: RunSnapshot, samples: Iterable[Any] | None = None, width: int = 100
) -> str:
    """The one-line terminal form: overall bar, then a short note per engine.

    Cut to ``width`` so a ``\\r`` redraw never wraps (a wrapped line cannot be
    redrawn in place).
    """
    view = run_view(snap, samples)
    head = f"gpucell {_bar(view.overall.fraction, 20)} {view.overall.text}"
    parts = [head]
    for r in view.rows:
        if r.state in (BUSY, IDLE, DONE):
            note = r.rate_text if r.rate > 0 else r.state
        else:
            note = r.state
        if r.util is not None and r.state not in (DEAD, RESTARTING):
            note += f" {r.util_text}"
        parts.append(f"e{r.engine} {note}")
    line = " | ".join(parts)
    if len(line) > width:
        line = line[: max(0, width - 1)] + "…"
    return line


def _table(head: Sequence[str], body: Sequence[Sequence[str]]) -> list[str]:
    widths = [max([len(h)] + [len(b[i]) for b in body]) for i, h in enumerate(head)]
    lines = ["  ".join(h.ljust(w) for h, w in zip(head, widths, strict=True))]
    lines += [
        "  ".join(c.ljust(w) for c, w in zip(b, widths, strict=True)) for b in body
    ]
    return [line.rstrip() for line in lines]


def summary_lines(snap: RunSnapshot, samples: Iterable[Any] | None = None) -> list[str]:
    """The plain-text record printed when a cell ends.

    It is what nbconvert, GitHub and a terminal show where the widget cannot be
    drawn, so it carries the same figures: the run, then one line per device.
    """
    view = run_view(snap, samples)
    lines = [f"gpucell: {view.overall.text}"]
    body = [
        (
            str(e.engine),
            e.host or NA,
            device_text(e.device, e.name),
            fmt_count(e.done),
            r.rate_text,
            r.util_text,
            r.mem_text,
            r.state,
        )
        for e, r in zip(_by_host(snap.engines), view.rows, strict=True)
    ]
    if body:
        head = ("engine", "host", "device", "iterations", "pace", "util", "memory")
        lines += ["  " + line for line in _table((*head, "state"), body)]
    return lines
