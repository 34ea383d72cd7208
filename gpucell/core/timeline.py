"""``gpucell.last_run.timeline()``: a picture of the last ``%%gpu_parallel`` cell.

One lane per engine, a bar per chunk from its start to its end, so load
imbalance, retries and idle gaps show at a glance.  The picture is an SVG string
built by hand (no matplotlib: a heavy import for a few rectangles, and an SVG
renders in every front end, in nbconvert's HTML and on GitHub); ``str()`` gives
a text version for terminals.

Chunk times are the engines' wall clocks (``time.time``); engines on other hosts
are only as aligned as those hosts' clocks.
"""

from __future__ import annotations

import html
import math
import uuid
from dataclasses import dataclass, field
from typing import Any

__all__ = ["Bar", "Lane", "Timeline", "timeline"]

#: chunk kind -> (fill, legend text); lost/cancelled use hatch patterns
_FILL = {
    "done": "#4c78a8",
    "retried": "#f58518",
    "failed": "#c62828",
}
_LEGEND = (
    ("done", "chunk"),
    ("retried", "chunk re-run after a loss"),
    ("lost", "lost (engine died)"),
    ("failed", "failed"),
    ("idle", "idle"),
)


@dataclass(frozen=True)
class Bar:
    """One chunk placed on its lane, in seconds from the run's start."""

    start: float
    end: float
    kind: str  # done, retried, lost, failed, cancelled
    first: int  # first iteration
    stop: int  # one past the last
    attempt: int
    timed: bool = True  # False: the engine died first; placed by inference


@dataclass
class Lane:
    engine: int
    label: str
    bars: list[Bar] = field(default_factory=list)
    busy: float = 0.0  # seconds covered by timed chunks (their union)

    @property
    def chunks(self) -> int:
        return len(self.bars)

    @property
    def lost(self) -> int:
        return sum(1 for b in self.bars if b.kind in ("lost", "cancelled"))


def _union(intervals: list[tuple[float, float]]) -> float:
    total, end = 0.0, -math.inf
    for a, b in sorted(intervals):
        if b <= end:
            continue
        total += b - max(a, end)
        end = b
    return total


def _timed(c: Any) -> bool:
    return bool(c.t_end > 0 and c.t_end >= c.t_start > 0)


def _kind(c: Any) -> str:
    if c.state == "done":
        return "retried" if c.attempt > 0 else "done"
    return c.state if c.state in ("lost", "failed", "cancelled") else "failed"


def timeline(last_run: Any) -> Timeline:
    """Lay out ``last_run``'s chunks (a :class:`~gpucell.core.provenance.LastRun`)."""
    chunks = list(last_run.chunks)
    timed = [c for c in chunks if _timed(c)]
    t0 = min((c.t_start for c in timed), default=0.0)
    t1 = max((c.t_end for c in timed), default=0.0)
    span = t1 - t0 if timed else 0.0
    if span <= 0:
        span = float(getattr(last_run, "wall", 0.0) or 0.0) or 1.0
    engines = list(dict.fromkeys([*last_run.engines, *(c.engine for c in chunks)]))
    lanes = {e: Lane(e, "") for e in engines}
    for c in chunks:
        lane = lanes[c.engine]
        if not lane.label:
            lane.label = " · ".join(x for x in (c.host, c.device) if x)
    for c in timed:
        lanes[c.engine].bars.append(
            Bar(c.t_start - t0, c.t_end - t0, _kind(c), c.start, c.stop, c.attempt)
        )
    # A lost chunk has no engine timing: its engine died.  Draw it from the end
    # of that engine's last finished chunk to when its iterations were re-run.
    for c in chunks:
        if _timed(c):
            continue
        lane = lanes[c.engine]
        begin = max((b.end for b in lane.bars if b.timed), default=0.0)
        retry = [
            r.t_start - t0
            for r in timed
            if r.attempt > c.attempt and r.start < c.stop and c.start < r.stop
        ]
        end = min(retry, default=span)
        if end - begin < span * 0.01:
            end = begin + span * 0.01
        lane.bars.append(Bar(begin, end, _kind(c), c.start, c.stop, c.attempt, False))
    for lane in lanes.values():
        lane.bars.sort(key=lambda b: (b.start, b.first))
        lane.busy = _union([(b.start, b.end) for b in lane.bars if b.timed])
        if not lane.label:
            lane.label = "engine"
    return Timeline(
        lanes=[lanes[e] for e in sorted(lanes)],
        span=span,
        iterations=int(getattr(last_run, "iterations", 0) or 0),
        wall=float(getattr(last_run, "wall", 0.0) or 0.0),
        status=str(getattr(last_run, "status", "")),
        schedule=str(getattr(last_run, "schedule", "")),
        resumed=sum(b - a for a, b in getattr(last_run, "resumed", ())),
        events=[
            w
            for w in getattr(last_run, "warnings", [])
            if "restarted" in w
            or "ran out of device memory" in w
            or "died" in w
            or "stopped answering" in w
        ],
    )


def _nice_step(span: float, ticks: int = 6) -> float:
    """1, 2 or 5 times a power of ten, giving about ``ticks`` ticks."""
    raw = span / max(1, ticks)
    mag = 10 ** math.floor(math.log10(raw)) if raw > 0 else 1.0
    for m in (1, 2, 5, 10):
        if raw <= m * mag:
            return m * mag
    return 10 * mag


def _fmt_s(x: float, step: float) -> str:
    digits = max(0, -math.floor(math.log10(step))) if step < 1 else 0
    return f"{x:.{digits}f} s"


@dataclass
class Timeline:
    """The laid-out picture; ``_repr_svg_`` for Jupyter, ``str`` for terminals."""

    lanes: list[Lane]
    span: float
    iterations: int = 0
    wall: float = 0.0
    status: str = ""
    schedule: str = ""
    resumed: int = 0  # iterations kept from an unfinished run (--resume)
    events: list[str] = field(default_factory=list)  # deaths, restarts, retries

    # ------------------------------------------------------------------ text

    def title(self) -> str:
        n = sum(lane.chunks for lane in self.lanes)
        e = len(self.lanes)
        s = (
            f"gpucell timeline: {self.iterations} iterations, {n} chunk"
            f"{'s' if n != 1 else ''} on {e} "
            f"engine{'s' if e != 1 else ''}, {self.span:.2f} s"
        )
        kept = f"{self.resumed} kept from an unfinished run" if self.resumed else ""
        extra = ", ".join(x for x in (self.schedule, self.status, kept) if x)
        return s + (f" ({extra})" if extra else "")

    def _strip(self, lane: Lane, width: int = 40) -> str:
        cells = ["."] * width
        rank = {"done": 1, "retried": 1, "failed": 2, "lost": 3, "cancelled": 3}
        mark = {
            "done": "#",
            "retried": "r",
            "failed": "!",
            "lost": "x",
            "cancelled": "x",
        }
        best = [0] * width
        for b in lane.bars:
            lo = int(b.start / self.span * width)
            hi = max(lo + 1, int(math.ceil(b.end / self.span * width)))
            for i in range(max(0, lo), min(width, hi)):
                if rank[b.kind] >= best[i]:
                    best[i], cells[i] = rank[b.kind], mark[b.kind]
        return "".join(cells)

    def __str__(self) -> str:
        lines = [self.title()]
        if not self.lanes:
            return lines[0] + "\n  (no chunks ran)"
        labels = [f"engine {lane.engine} · {lane.label}" for lane in self.lanes]
        w = max(len(x) for x in labels)
        for lane, label in zip(self.lanes, labels, strict=True):
            busy = lane.busy / self.span if self.span > 0 else 0.0
            idle = max(0.0, self.span - lane.busy)
            notes = f"{lane.chunks} chunk{'s' if lane.chunks != 1 else ''}"
            if lane.lost:
                notes += f", {lane.lost} lost"
            retried = sum(1 for b in lane.bars if b.kind == "retried")
            if retried:
                notes += f", {retried} re-run"
            lines.append(
                f"  {label.ljust(w)}  |{self._strip(lane)}|  busy {busy:4.0%}  "
                f"idle {idle:.2f} s  {notes}"
            )
        lines.append("  (# chunk, r re-run, x lost, ! failed, . idle)")
        lines.extend(f"  - {e}" for e in self.events)
        return "\n".join(lines)

    def _repr_pretty_(self, p: Any, cycle: bool) -> None:
        p.text(str(self))

    # ------------------------------------------------------------------- svg

    def _repr_svg_(self) -> str:
        return self.svg()

    def svg(self) -> str:
        """The picture as a standalone SVG document (a string)."""
        uid = uuid.uuid4().hex[:8]
        left, right, top, lane_h, bar_h = 190, 110, 34, 26, 18
        plot_w = 560
        width = left + plot_w + right
        n = len(self.lanes)
        axis_y = top + n * lane_h + 4
        legend_y = axis_y + 34
        height = legend_y + 22

        def x_of(t: float) -> float:
            return left + plot_w * (t / self.span)

        hatch_lost, hatch_cancel = f"gc-lost-{uid}", f"gc-cancel-{uid}"
        fills = {
            **_FILL,
            "lost": f"url(#{hatch_lost})",
            "cancelled": f"url(#{hatch_cancel})",
        }
        out = [
            f'<svg xmlns="http://www.w3.org/2000/svg" width="{width}" '
            f'height="{height}" viewBox="0 0 {width} {height}" '
            'font-family="sans-serif" font-size="11">',
            "<defs>",
            _hatch(hatch_lost, "#c62828"),
            _hatch(hatch_cancel, "#9e9e9e"),
            "</defs>",
            f'<rect width="{width}" height="{height}" fill="white"/>',
            f'<text x="8" y="18" font-size="13" font-weight="bold">'
            f"{_e(self.title())}</text>",
        ]
        for i, lane in enumerate(self.lanes):
            y = top + i * lane_h
            by = y + (lane_h - bar_h) / 2
            busy = lane.busy / self.span if self.span > 0 else 0.0
            out.append(f'<g class="lane" data-engine="{lane.engine}">')
            out.append(
                f'<text x="{left - 8}" y="{by + bar_h - 5}" text-anchor="end">'
                f"{_e(f'engine {lane.engine} · {lane.label}')}</text>"
            )
            out.append(
                f'<rect class="idle" x="{left}" y="{by}" width="{plot_w}" '
                f'height="{bar_h}" fill="#eeeeee"/>'
            )
            for k, b in enumerate(lane.bars):
                x0, x1 = x_of(b.start), x_of(b.end)
                tip = (
                    f"iterations {b.first}-{b.stop - 1} · engine {lane.engine} · "
                    f"{b.start:.3f}-{b.end:.3f} s · attempt {b.attempt} · {b.kind}"
                    + ("" if b.timed else " (no engine timing: it died)")
                )
                # adjacent chunks alternate opacity so their boundaries show
                opacity = "1" if k % 2 == 0 or b.kind != "done" else "0.8"
                stroke = "#c62828" if b.kind in ("lost", "failed") else "white"
                dash = ' stroke-dasharray="3,2"' if not b.timed else ""
                out.append(
                    f'<rect class="chunk chunk-{b.kind}" x="{x0:.2f}" y="{by}" '
                    f'width="{max(1.0, x1 - x0):.2f}" height="{bar_h}" '
                    f'fill="{fills.get(b.kind, "#c62828")}" fill-opacity="{opacity}" '
                    f'stroke="{stroke}" stroke-width="0.8"{dash}>'
                    f"<title>{_e(tip)}</title></rect>"
                )
            out.append(
                f'<text x="{left + plot_w + 8}" y="{by + bar_h - 5}">'
                f"busy {busy:.0%}</text>"
            )
            out.append("</g>")
        # axis: seconds from the run's start
        out.append(
            f'<line x1="{left}" y1="{axis_y}" x2="{left + plot_w}" y2="{axis_y}" '
            'stroke="#333"/>'
        )
        step = _nice_step(self.span)
        t = 0.0
        while t <= self.span * 1.0001:
            x = x_of(t)
            out.append(
                f'<line x1="{x:.2f}" y1="{axis_y}" x2="{x:.2f}" y2="{axis_y + 4}" '
                'stroke="#333"/>'
            )
            out.append(
                f'<text x="{x:.2f}" y="{axis_y + 16}" text-anchor="middle">'
                f"{_fmt_s(t, step)}</text>"
            )
            t += step
        # legend
        x = left
        for kind, text in _LEGEND:
            fill = "#eeeeee" if kind == "idle" else fills[kind]
            out.append(
                f'<rect class="legend legend-{kind}" x="{x}" y="{legend_y}" '
                f'width="14" height="10" fill="{fill}" stroke="#999" '
                'stroke-width="0.5"/>'
            )
            out.append(f'<text x="{x + 18}" y="{legend_y + 9}">{_e(text)}</text>')
            x += 26 + 6 * len(text)
        if not self.lanes:
            out.append(f'<text x="{left}" y="{top + 12}">no chunks ran</text>')
        out.append("</svg>")
        return "\n".join(out)


def _hatch(pid: str, color: str) -> str:
    return (
        f'<pattern id="{pid}" width="6" height="6" patternUnits="userSpaceOnUse" '
        f'patternTransform="rotate(45)"><rect width="6" height="6" fill="white"/>'
        f'<line x1="0" y1="0" x2="0" y2="6" stroke="{color}" stroke-width="3"/>'
        "</pattern>"
    )


def _e(s: str) -> str:
    return html.escape(s, quote=True)
