"""The displays: pure formatting, widgets built without a kernel, text, timeline."""

from __future__ import annotations

import io
import json
import os
import subprocess
import sys
import time
import types
import xml.etree.ElementTree as ET
from dataclasses import dataclass, replace
from typing import Any

import pytest

from gpucell.core.provenance import ChunkRecord, LastRun
from gpucell.core.runstate import EngineProgress, RunSnapshot
from gpucell.ui import model

try:
    from gpucell.protocol.telemetry import DeviceSample
except ImportError:  # pragma: no cover - before telemetry lands

    @dataclass(frozen=True)
    class DeviceSample:  # type: ignore[no-redef]
        engine: int
        host: str
        kind: str
        index: int
        name: str
        timestamp: float
        utilization: float | None = None
        memory_used: int | None = None
        memory_total: int | None = None
        power_w: float | None = None
        temperature_c: float | None = None
        host_cpu: float | None = None
        state: str = "ok"
        error: str = ""


GiB = 2**30


def engines(states: tuple[str, ...] = ("busy", "busy")) -> tuple[EngineProgress, ...]:
    return tuple(
        EngineProgress(
            engine=i,
            host="node1",
            device=f"GPU {i}",
            name="NVIDIA A100",
            kind="gpu",
            index=i,
            done=10 * (i + 1),
            busy_seconds=2.0,
            state=s,
        )
        for i, s in enumerate(states)
    )


def snap(done: int = 30, elapsed: float = 6.0, **kw: Any) -> RunSnapshot:
    kw.setdefault("engines", engines())
    return RunSnapshot(total=100, done=done, elapsed=elapsed, **kw)


def sample(eid: int, util: float = 50.0, used: int = 8 * GiB, **kw: Any):
    return DeviceSample(
        engine=eid,
        host="node1",
        kind="gpu",
        index=eid,
        name="NVIDIA A100",
        timestamp=time.time(),
        utilization=util,
        memory_used=used,
        memory_total=80 * GiB,
        power_w=250.0,
        temperature_c=60.0,
        **kw,
    )


# ------------------------------------------------------------------- model


def test_units():
    assert model.fmt_duration(42) == "0:42"
    assert model.fmt_duration(723) == "12:03"
    assert model.fmt_duration(3723) == "1:02:03"
    assert model.fmt_duration(None) == "?"
    # under a second the clock would read 0:00, as if nothing ran
    assert model.fmt_duration(0.034) == "0.03 s"
    assert model.fmt_duration(0) == "0:00"
    assert model.fmt_eta(42.4) == "ETA 0:42"
    assert model.fmt_eta(None) == "ETA ?"
    assert model.fmt_rate(12.34) == "12.3 it/s"
    assert model.fmt_rate(4.567) == "4.57 it/s"
    assert model.fmt_rate(123.4) == "123 it/s"
    # fast loops: three significant figures and a prefix, not "1,345 it/s"
    assert model.fmt_rate(1234.0) == "1.23k it/s"
    assert model.fmt_rate(2973.0) == "2.97k it/s"
    assert model.fmt_rate(45_678.0) == "45.7k it/s"
    assert model.fmt_rate(999.7) == "1k it/s"
    assert model.fmt_rate(2.5e6) == "2.5M it/s"
    assert model.fmt_rate(0.05) == "20.0 s/it"
    assert model.fmt_rate(0.0) == "–"
    assert model.fmt_bytes(3.2 * GiB, 80 * GiB) == "3.2/80.0 GiB"
    assert model.fmt_bytes(300 * 2**20, 512 * 2**20) == "300.0/512.0 MiB"
    assert model.fmt_bytes(None, None) == "–"
    assert model.fmt_count(1234567) == "1,234,567"


def test_rows_rates_eta_and_load():
    view = model.run_view(snap(), [sample(0, 87.0), sample(1, 12.0, 40 * GiB)])
    o = view.overall
    assert o.fraction == pytest.approx(0.3)
    assert "30/100 it (30%)" in o.text and "0:06" in o.text
    assert "ETA 0:14" in o.text  # 6 s for 30 -> 14 s for 70
    assert o.bar_style == "info"
    r0, r1 = view.rows
    assert r0.label == "0 · node1 · GPU 0 (NVIDIA A100)"
    assert (r0.state, r0.done_text, r0.rate_text) == ("busy", "10 it", "5.00 it/s")
    assert r1.rate_text == "10.0 it/s"
    assert (r0.util, r0.util_text) == (pytest.approx(0.87), "87%")
    assert r1.mem == pytest.approx(0.5) and r1.mem_text == "40.0/80.0 GiB"
    assert r0.extra == "250 W · 60 °C"
    assert r0.stats == "10 it · 5.00 it/s"


def test_host_cpu_is_shown_once_per_host():
    rows = model.run_view(snap(), [sample(0, host_cpu=68.0), sample(1, host_cpu=68.0)])
    assert all("host CPU" not in r.extra for r in rows.rows)
    assert [r.host_cpu for r in rows.rows] == [68.0, 68.0]
    assert model.host_loads(rows.rows) == "host CPU: node1 68%"
    assert model.host_loads(model.run_view(snap()).rows) == ""


def test_no_telemetry_and_no_progress_yet():
    view = model.run_view(snap(done=0, elapsed=0.0, engines=engines(("idle",))))
    assert "ETA ?" in view.overall.text
    (r,) = view.rows
    assert (r.util, r.util_text, r.mem_text) == (None, "–", "–")


def test_states_and_dead_engine_shown_dead():
    s = snap(engines=engines(("retrying", "dead")))
    r0, r1 = model.run_view(s, [sample(0), sample(1)]).rows
    assert r0.state == "retrying" and r0.color == model.STATE_COLORS["retrying"]
    # a dead engine shows dead, with no stale load figures
    assert r1.state == "dead" and r1.util is None and r1.mem_text == "–"
    assert "dead" in model.state_html("dead") and "#c62828" in model.state_html("dead")
    # telemetry seeing the process gone blanks its figures; whether the device
    # is dead or restarting is the run's to say (a restart brings it back)
    r0, _ = model.run_view(snap(), [sample(0, state="dead", error="gone")]).rows
    assert r0.state == "busy" and r0.note == "gone" and r0.util is None
    s = snap(engines=engines(("restarting", "dead")), status="error")
    r0, r1 = model.run_view(s).rows
    assert (r0.state, r1.state) == ("restarting", "dead")
    assert r0.util is None and "restarting" in model.state_html("restarting")
    assert "1 engine lost · 1 engine restarting" in model.run_view(s).overall.text


def test_final_state_all_done():
    s = snap(done=100, elapsed=9.0, engines=engines(("idle", "dead")), status="ok")
    view = model.run_view(s)
    assert view.overall.fraction == 1.0 and view.overall.bar_style == "success"
    assert "ETA" not in view.overall.text
    assert "ok" in view.overall.text and "1 engine lost" in view.overall.text
    assert [r.state for r in view.rows] == ["done", "dead"]
    bad = model.run_view(replace(s, status="interrupted", done=40))
    assert bad.overall.bar_style == "warning" and bad.rows[0].state == "stopped"


def test_cpu_engine_over_100_percent():
    s = DeviceSample(
        engine=0,
        host="h",
        kind="cpu",
        index=-1,
        name="CPU",
        timestamp=1.0,
        utilization=350.0,
        memory_used=512 * 2**20,
        memory_total=16 * GiB,
    )
    snap1 = snap(engines=(replace(engines()[0], device="CPU", name="CPU"),))
    (r,) = model.run_view(snap1, [s]).rows
    assert r.label == "0 · node1 · CPU"
    assert (r.util, r.util_text, r.mem_text) == (1.0, "350%", "0.5/16.0 GiB")


def test_text_line_and_summary():
    line = model.text_line(snap(engines=engines(("busy", "dead"))), width=200)
    assert line.startswith("gpucell [######--------------] 30/100 it")
    assert "e0 5.00 it/s" in line and "e1 dead" in line
    assert "\n" not in line
    assert len(model.text_line(snap(), width=50)) == 50
    lines = model.summary_lines(snap(status="ok", done=100), [sample(0)])
    assert lines[0].startswith("gpucell: 100/100 it (100%)")
    assert lines[1].split()[:3] == ["engine", "host", "device"]
    assert "GPU 0 (NVIDIA A100)" in lines[2] and "50%" in lines[2]
    assert lines[2].rstrip().endswith("done") and len(lines) == 4


def test_initial_snapshot_from_engine_infos():
    from gpucell.cluster.lifecycle import EngineInfo

    infos = [
        EngineInfo(
            id=3, host="h", pid=9, kind="cpu", index=-1, name="CPU", memory_total=0
        )
    ]
    s = model.initial_snapshot(infos, 50)
    assert (s.total, s.done, s.engines[0].engine, s.engines[0].device) == (
        50,
        0,
        3,
        "CPU",
    )


def test_pure_modules_do_not_import_ipywidgets():
    probe = (
        "import sys, json, gpucell.ui.model, gpucell.core.timeline, gpucell.ui;"
        "print(json.dumps('ipywidgets' in sys.modules))"
    )
    out = subprocess.run(
        [sys.executable, "-c", probe], capture_output=True, text=True, check=True
    )
    assert json.loads(out.stdout) is False


# ------------------------------------------------------------------ widget


class FakeTelemetry:
    def __init__(self, util: float = 10.0) -> None:
        self.util = util
        self.calls = 0
        self.fail = False

    def sample(self) -> list[Any]:
        self.calls += 1
        if self.fail:
            raise RuntimeError("nvml went away")
        return [sample(0, self.util), sample(1, self.util / 2)]

    closed = 0

    def close(self) -> None:
        self.closed += 1


class FakeHandle:
    def __init__(self) -> None:
        self.updates: list[dict[str, Any]] = []

    def update(self, obj: dict[str, Any], raw: bool = False) -> None:
        self.updates.append(obj)


@pytest.fixture
def hold_calls(monkeypatch):
    import ipywidgets

    calls: list[Any] = []
    orig = ipywidgets.Widget.hold_sync

    def counting(self):
        calls.append(self)
        return orig(self)

    monkeypatch.setattr(ipywidgets.Widget, "hold_sync", counting)
    return calls


def make_widget(telemetry=None):
    from gpucell.ui.progress import WidgetProgress

    shown: list[dict[str, Any]] = []
    handle = FakeHandle()
    echoed: list[str] = []

    def show(obj, raw=False, display_id=None):
        shown.append(obj)
        return handle

    w = WidgetProgress(
        snap(done=0, elapsed=0.0), telemetry, show=show, echo=echoed.append
    )
    return w, shown, handle, echoed


def test_widget_builds_updates_and_closes_without_kernel(hold_calls):
    import ipywidgets

    tele = FakeTelemetry(20.0)
    w, shown, handle, echoed = make_widget(tele)
    assert isinstance(w.widget, ipywidgets.VBox)
    (bundle,) = shown
    assert "application/vnd.jupyter.widget-view+json" in bundle
    assert bundle["text/plain"].startswith("gpucell: running")
    rows = w.table.rows
    assert len(rows) == 2 and w.bar.value == 0.0
    assert rows[0].util.description == "20%"

    hold_calls.clear()
    w.update(snap(done=30, elapsed=6.0))
    assert w.bar.value == pytest.approx(0.3)
    assert "30/100 it" in w.label.value and "ETA 0:14" in w.label.value
    assert hold_calls, "updates must be batched in hold_sync()"
    assert w.bar in hold_calls and w.label in hold_calls

    tele.util = 90.0
    w._sampler._last = -1e9  # let the throttle sample again
    w.update(snap(done=60, elapsed=8.0, engines=engines(("busy", "dead"))))
    assert w.bar.value == pytest.approx(0.6)
    assert rows[0].util.value == pytest.approx(0.9)
    assert rows[0].util.description == "90%"
    assert "dead" in rows[1].state.value and rows[1].util.bar_style == "danger"
    assert rows[1].util.description == "–"

    final = snap(done=100, elapsed=9.0, status="ok", engines=engines(("idle", "dead")))
    w.close(final)
    assert w.bar.value == 1.0 and w.bar.bar_style == "success"
    assert "done" in rows[0].state.value
    # the output's text form becomes the whole summary, in place; nothing is
    # printed under the widget to say it again
    text = handle.updates[-1]["text/plain"]
    assert text.startswith("gpucell: 100/100 it") and len(text.splitlines()) == 4
    assert "application/vnd.jupyter.widget-view+json" in handle.updates[-1]
    assert echoed == []


def test_widget_without_a_display_handle_prints_the_summary():
    from gpucell.ui.progress import WidgetProgress

    echoed: list[str] = []
    w = WidgetProgress(snap(), None, show=lambda *a, **k: None, echo=echoed.append)
    w.close(snap(done=100, status="ok"))
    assert len(echoed) == 1 and echoed[0].startswith("gpucell: 100/100 it")


def _all_widgets(root):
    import ipywidgets

    seen, todo = [], [root]
    while todo:
        x = todo.pop()
        if isinstance(x, ipywidgets.DOMWidget) and x not in seen:
            seen.append(x)
            todo += list(getattr(x, "children", ()))
    return seen


def test_no_widget_tooltip_is_none():
    """A None tooltip reaches the browser as the title "null" (shown on hover)."""
    from gpucell.ui.monitor import DeviceMonitor
    from gpucell.ui.select import DeviceSelector

    w, *_ = make_widget(FakeTelemetry())
    w.update(snap(engines=engines(("busy", "dead"))))
    w.close(snap(done=100, status="ok"))
    sel = DeviceSelector(StandIn(2), FakeTelemetry(), start=False)
    mon = DeviceMonitor(StandIn(2), FakeTelemetry(), start=False)
    for root in (w.widget, sel.widget, mon.widget):
        found = _all_widgets(root)
        assert len(found) > 10
        assert [x for x in found if x.tooltip is None] == []


def test_widget_columns_line_up():
    """Header cells share their column's Layout; figure titles sit right-aligned
    in a block as wide as the figures' description."""
    from gpucell.ui import progress

    w, *_ = make_widget(FakeTelemetry())
    t = w.table
    row = t.rows[0]
    head = t.header.children
    cells = (row.label, row.util, row.mem, row.stats, row.state)
    assert [h.layout for h in head] == [c.layout for c in cells]
    assert row.util.style.description_width == f"{progress.W_UTIL_FIG}px"
    assert f"width:{progress.W_UTIL_FIG}px;text-align:right" in head[1].value
    assert f"width:{progress.W_MEM_FIG}px;text-align:right" in head[2].value
    assert all(c.layout.margin == f"0 {progress.GAP}px 0 0" for c in cells)
    # the overall row on the same grid: title over the labels, bar over the
    # utilisation and memory columns
    assert w.title.layout is row.label.layout
    gap = progress.GAP
    assert w.bar.layout.width == f"{progress.W_UTIL + gap + progress.W_MEM}px"


def test_widget_unchanged_update_sends_nothing(hold_calls):
    w, *_ = make_widget()
    w.update(snap())
    hold_calls.clear()
    w.update(snap())
    assert hold_calls == []


def test_widget_update_never_raises_and_is_cheap():
    tele = FakeTelemetry()
    w, *_ = make_widget(tele)
    tele.fail = True
    w._sampler._last = -1e9
    w.update(snap(done=40))  # telemetry error: last samples kept
    assert w.bar.value == pytest.approx(0.4)
    w.update("not a snapshot")  # type: ignore[arg-type]
    assert w.errors == 1
    # the dispatcher calls update on the kernel's main thread: < 5 ms
    big = tuple(replace(engines()[0], engine=i, index=i) for i in range(8))
    w2, *_ = make_widget()
    times = []
    for k in range(50):
        t = time.perf_counter()
        w2.update(snap(done=k, elapsed=1 + k, engines=big))
        times.append(time.perf_counter() - t)
    times.sort()
    assert times[len(times) // 2] < 0.005


def test_widget_over_budget_rows_take_turns():
    tele = FakeTelemetry(10.0)
    w, *_ = make_widget(tele)
    w.budget = 0.0  # every update over budget: overall row + one more widget
    tele.util = 70.0
    s = snap(done=50, engines=engines(("busy", "retrying")))
    w._sampler._last = -1e9
    w.update(s)
    assert w.bar.value == pytest.approx(0.5)
    rows = w.table.rows
    assert rows[1].util.description != "35%"  # not reached yet
    for _ in range(12):
        w.update(s)
    assert rows[0].util.description == "70%" and rows[1].util.description == "35%"
    assert "retrying" in rows[1].state.value


def test_telemetry_is_throttled():
    from gpucell.ui.progress import TelemetryThrottle

    now = [0.0]
    tele = FakeTelemetry()
    t = TelemetryThrottle(tele, clock=lambda: now[0])
    for _ in range(10):
        t.get()
    assert tele.calls == 1
    now[0] += 0.26
    t.get()
    assert tele.calls == 2
    t.get(force=True)
    assert tele.calls == 3


# -------------------------------------------------------------------- text


class Tty(io.StringIO):
    def isatty(self) -> bool:
        return True


def test_text_display_redraws_one_line_then_summary():
    from gpucell.ui.progress import TextProgress

    out = Tty()
    t = TextProgress(stream=out, width=120)
    t.update(snap(done=10))
    t.update(snap(done=20))
    text = out.getvalue()
    assert text.count("\r") == 2 and "\n" not in text
    assert "20/100 it" in text.split("\r")[-1]
    t.close(snap(done=100, status="ok", engines=engines(("idle", "idle"))))
    final = out.getvalue().split("\r")[-1]
    assert final.startswith("gpucell: 100/100 it") and final.endswith("\n")
    assert "done" in final.splitlines()[-1]


def test_engine_output_goes_above_the_line_not_into_it():
    from gpucell.ui.progress import TextProgress

    out = Tty()
    t = TextProgress(stream=out, width=120)
    t.write_above("[engine 0 | iteration 0] before\n")  # no line yet: as is
    t.update(snap(done=10))
    line = out.getvalue().split("\r")[-1]
    t.write_above("[engine 1 | iteration 7] hello\n")
    t.write_above("partial")
    t.update(snap(done=20))
    text = out.getvalue()
    screen = terminal(text)
    assert screen[:3] == [
        "[engine 0 | iteration 0] before",
        "[engine 1 | iteration 7] hello",
        "partial",
    ]
    assert "20/100 it" in screen[3] and len(screen) == 4
    assert line in text


def terminal(text: str) -> list[str]:
    """What a terminal shows after ``text`` (\r returns to the line's start)."""
    lines = [""]
    col = 0
    for ch in text:
        if ch == "\n":
            lines.append("")
            col = 0
        elif ch == "\r":
            col = 0
        else:
            cur = lines[-1]
            lines[-1] = cur[:col] + ch + cur[col + 1 :]
            col += 1
    return [ln.rstrip() for ln in lines if ln.strip()]


def test_text_display_not_a_terminal_writes_only_the_summary():
    from gpucell.ui.progress import TextProgress

    out = io.StringIO()
    t = TextProgress(stream=out)
    t.update(snap())
    assert out.getvalue() == ""
    t.close(snap(status="ok", done=100))
    assert "\r" not in out.getvalue()
    assert out.getvalue().startswith("gpucell: 100/100 it")


def test_make_progress_picks_the_display(monkeypatch):
    from gpucell.ui import progress

    assert isinstance(
        progress.make_progress(None, snap(), None, True), progress.NullProgress
    )
    assert isinstance(
        progress.make_progress(None, snap(), None, False), progress.TextProgress
    )

    class ZMQInteractiveShell:  # stands in for ipykernel's
        pass

    fake = types.ModuleType("ipykernel.zmqshell")
    fake.ZMQInteractiveShell = ZMQInteractiveShell  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, "ipykernel.zmqshell", fake)
    assert progress.has_widget_frontend(ZMQInteractiveShell())
    assert not progress.has_widget_frontend(object())
    d = progress.make_progress(ZMQInteractiveShell(), snap(), None, False)
    assert isinstance(d, progress.WidgetProgress)


# ---------------------------------------------------------------- selector


@dataclass
class Info:
    id: int
    host: str = "node1"
    kind: str = "gpu"
    index: int = 0
    name: str = "NVIDIA A100"
    state: str = "idle"
    pid: int = 0

    @property
    def device(self) -> str:
        return f"GPU {self.index}"


class StandIn:
    def __init__(self, n: int = 3) -> None:
        self.engines = {i: Info(i, index=i) for i in range(n)}
        self.selected: tuple[int, ...] | None = None
        self.dead: set[int] = set()


def test_selector_toggles_gc_selected():
    from gpucell.ui.select import DeviceSelector

    gc = StandIn()
    sel = DeviceSelector(gc, FakeTelemetry(40.0), start=False)
    cbs = sel.checkboxes
    assert all(cb.value for cb in cbs.values()) and gc.selected is None
    assert cbs[0].description == "0 · node1 · GPU 0 (NVIDIA A100)"
    assert sel.bars[0].value == pytest.approx(0.4) and sel.bars[0].description == "40%"
    assert sel.bars[2].description == "–"  # no sample for engine 2
    cbs[1].value = False
    assert gc.selected == (0, 2)
    assert "engines 0, 2" in sel.note.value
    cbs[2].value = False
    assert gc.selected == (0,)
    cbs[1].value = cbs[2].value = True
    assert gc.selected is None  # all ticked: every live engine
    sel.select([2])
    assert gc.selected == (2,) and [cb.value for cb in cbs.values()] == [
        False,
        False,
        True,
    ]
    gc.selected = (0, 1)  # changed elsewhere (the magic)
    sel.refresh()
    assert [cb.value for cb in cbs.values()] == [True, True, False]
    gc.engines[1] = replace(gc.engines[1], state="dead")
    sel.refresh()
    assert cbs[1].disabled and "dead" in cbs[1].description
    assert sel._repr_mimebundle_()["text/plain"].startswith("gpucell: later cells")
    # a header row; the host's CPU load once, in the title, not on every row
    assert [h.value for h in sel.header.children][1:3] == [
        progress_fig_header("util"),
        progress_fig_header("memory"),
    ]
    assert "power · temperature" in sel.load_header.value
    assert sel.loads[0].value == "250 W · 60 °C"


def progress_fig_header(title: str) -> str:
    from gpucell.ui import progress

    width = progress.W_UTIL_FIG if title == "util" else progress.W_MEM_FIG
    return progress.fig_header(title, width)


def test_selector_shows_host_cpu_once():
    from gpucell.ui.select import DeviceSelector

    class HostTelemetry(FakeTelemetry):
        def sample(self):
            return [sample(0, host_cpu=68.0), sample(1, host_cpu=68.0)]

    sel = DeviceSelector(StandIn(2), HostTelemetry(), start=False)
    assert sel.title.value.count("host CPU") == 1 and "node1 68%" in sel.title.value
    assert all("host CPU" not in x.value for x in sel.loads.values())
    assert sel.mems[0].description == "8.0/80.0 GiB"


def test_selection_from():
    from gpucell.ui.select import selection_from

    assert selection_from([1, 0], [0, 1, 2]) == (0, 1)
    assert selection_from([0, 1, 2], [0, 1, 2]) is None
    assert selection_from([], [0, 1]) is None
    assert selection_from([0, 1], [0, 1, 5]) == (0, 1)


def test_selector_thread_refreshes_and_stops():
    from gpucell.ui.select import DeviceSelector

    tele = FakeTelemetry()
    alive = [True]
    sel = DeviceSelector(StandIn(2), tele, period=0.02, alive=lambda: alive[0])
    deadline = time.time() + 5
    while tele.calls < 3 and time.time() < deadline:
        time.sleep(0.01)
    assert tele.calls >= 3 and sel.running
    alive[0] = False  # the cluster stopped
    deadline = time.time() + 5
    while sel.running and time.time() < deadline:
        time.sleep(0.01)
    assert not sel.running and "cluster stopped" in sel.note.value
    sel2 = DeviceSelector(StandIn(2), tele, period=0.02, alive=lambda: True)
    sel2.close()
    assert not sel2.running


@pytest.mark.cluster
def test_selector_on_real_cluster_sets_default_targets(cluster):
    from gpucell.kernel.execute import CellRequest, select_targets
    from gpucell.ui.select import DeviceSelector

    for_cluster = pytest.importorskip("gpucell.kernel.telemetry").for_cluster

    saved = cluster.selected
    sel = DeviceSelector(cluster, for_cluster(cluster), start=False)
    try:
        first, second = sorted(cluster.engines)[:2]
        sel.checkboxes[first].value = False
        assert cluster.selected == (second,)
        assert select_targets(cluster, CellRequest()) == [second]
        sel.refresh()
        # memory figure of a live CPU engine
        assert sel.mems[second].description != model.NA
    finally:
        sel.close()
        cluster.selected = saved


# ----------------------------------------------------------------- monitor


def test_monitor_rows_refresh_and_close():
    from gpucell.ui.monitor import DeviceMonitor

    tele = FakeTelemetry(30.0)
    mon = DeviceMonitor(StandIn(2), tele, start=False)
    rows = mon.table.rows
    assert set(rows) == {0, 1}
    assert rows[0].util.description == "30%"
    assert rows[0].stats.value == "250 W · 60 °C"
    tele.util = 80.0
    mon.refresh()
    assert rows[0].util.value == pytest.approx(0.8)
    assert "gpucell monitor" in mon.title.value
    mon.close()
    assert not mon.running


def test_monitor_rows_include_devices_no_engine_uses():
    unused = types.SimpleNamespace(
        engine=None,
        host="node1",
        kind="gpu",
        index=7,
        name="H100",
        utilization=99.0,
        memory_used=70 * GiB,
        memory_total=80 * GiB,
        timestamp=1.0,
    )
    rows = model.monitor_rows([Info(0)], [sample(0), unused])
    assert [r.engine for r in rows] == [0, None]
    assert rows[1].state == "unused" and rows[1].util_text == "99%"


# ---------------------------------------------------------------- timeline


def chunk(start, stop, engine, t0, t1, state="done", attempt=0):
    return ChunkRecord(
        start=start,
        stop=stop,
        engine=engine,
        host="node1",
        device="CPU",
        t_start=t0,
        t_end=t1,
        compute=max(0.0, t1 - t0),
        attempt=attempt,
        state=state,
    )


T = 1_700_000_000.0


def last_run() -> LastRun:
    return LastRun(
        iterations=40,
        engines=(0, 1),
        schedule="guided",
        wall=4.2,
        status="ok",
        chunks=[
            chunk(0, 10, 0, T + 0.0, T + 1.0),
            chunk(10, 20, 1, T + 0.1, T + 1.5),
            chunk(20, 30, 1, 0.0, 0.0, state="lost"),  # engine 1 died mid-chunk
            chunk(30, 35, 0, T + 1.0, T + 2.0),
            chunk(20, 30, 0, T + 2.5, T + 4.0, attempt=1),
            chunk(35, 40, 0, T + 2.0, T + 2.4),
        ],
    )


def test_timeline_svg():
    tl = last_run().timeline()
    svg = tl._repr_svg_()
    root = ET.fromstring(svg)
    ns = "{http://www.w3.org/2000/svg}"
    assert root.tag == f"{ns}svg"
    lanes = [g for g in root.iter(f"{ns}g") if g.get("class") == "lane"]
    assert [g.get("data-engine") for g in lanes] == ["0", "1"]
    rects = [r for r in root.iter(f"{ns}rect") if "chunk" in (r.get("class") or "")]
    assert len(rects) == 6  # a rect per chunk
    by_class = {r.get("class"): r for r in rects}
    lost = by_class["chunk chunk-lost"]
    assert lost.get("fill", "").startswith("url(#")  # hatched, not solid
    assert lost.get("fill") != by_class["chunk chunk-done"].get("fill")
    assert by_class["chunk chunk-retried"].get("fill") != by_class[
        "chunk chunk-done"
    ].get("fill")
    # the lost chunk spans from its engine's last finish to its retry's start
    assert float(lost.get("x")) == pytest.approx(190 + 560 * 1.5 / 4.0, abs=0.1)
    assert float(lost.get("width")) == pytest.approx(560 * 1.0 / 4.0, abs=0.1)
    # chunk bars are placed on a seconds axis from the run's start
    first = next(r for r in rects if "iterations 0-9" in r.find(f"{ns}title").text)
    assert float(first.get("x")) == pytest.approx(190)
    assert float(first.get("width")) == pytest.approx(140)
    texts = [t.text for t in root.iter(f"{ns}text")]
    assert "0 s" in texts and "4 s" in texts
    assert any("lost" in (t or "") for t in texts)  # legend
    assert any((t or "").startswith("busy") for t in texts)


def test_timeline_text():
    text = str(last_run().timeline())
    lines = text.splitlines()
    assert lines[0].startswith("gpucell timeline: 40 iterations, 6 chunks on 2 engines")
    e0 = next(x for x in lines if x.lstrip().startswith("engine 0"))
    e1 = next(x for x in lines if x.lstrip().startswith("engine 1"))
    assert "busy  98%" in e0 and "idle 0.10 s" in e0  # 3.9 of 4 s busy
    assert "4 chunks" in e0 and "1 re-run" in e0
    assert "busy  35%" in e1 and "1 lost" in e1 and "idle 2.60 s" in e1
    assert "x" in e1.split("|")[1]  # the lost stretch is drawn

    from IPython.lib.pretty import pretty

    assert pretty(last_run().timeline()) == text


def test_timeline_of_an_empty_run():
    tl = LastRun(iterations=0, status="ok").timeline()
    ET.fromstring(tl.svg())
    assert "no chunks" in str(tl)


def test_monitor_and_selector_release_their_telemetry_when_they_stop() -> None:
    """The NVML session a display's telemetry opened is closed with it, whether
    the display is closed or its cluster goes away."""
    import time

    from gpucell.ui.monitor import DeviceMonitor
    from gpucell.ui.select import DeviceSelector

    for make in (DeviceMonitor, DeviceSelector):
        tele = FakeTelemetry()
        display = make(StandIn(2), tele, period=0.05, alive=lambda: True)
        time.sleep(0.2)
        assert tele.closed == 0 and display.running
        display.close()
        assert tele.closed == 1 and not display.running
        alive = [True]
        tele = FakeTelemetry()
        display = make(
            StandIn(2), tele, period=0.05, alive=lambda alive=alive: alive[0]
        )
        alive[0] = False  # the cluster stopped
        deadline = time.monotonic() + 5
        while display.running and time.monotonic() < deadline:
            time.sleep(0.05)
        assert tele.closed == 1


def test_local_telemetry_closes_only_the_nvml_it_opened() -> None:
    from gpucell.devices.sampling import LocalTelemetry
    from gpucell.protocol.telemetry import Target

    class Session:
        closed = 0

        def usage(self, index):  # pragma: no cover - not sampled here
            raise AssertionError

        def gpus(self):  # pragma: no cover
            return []

        def close(self) -> None:
            self.closed += 1

    given = Session()
    gpu = Target(engine=0, pid=os.getpid(), kind="gpu", index=0, name="GPU")
    LocalTelemetry([gpu], nvml=given).close()
    assert given.closed == 0  # the caller's session stays open
    own = LocalTelemetry([gpu])
    opened = own._nvml
    calls = []
    opened.close = lambda: calls.append(1)
    own.close()
    assert calls == [1]


@dataclass
class LocalInfo(Info):
    """An engine of this host (its telemetry is measured by the kernel)."""

    pid: int = os.getpid()
    local: bool = True


def test_monitor_and_selector_shut_nvml_down_however_they_stop(monkeypatch) -> None:
    """Through the real chain (for_cluster -> LocalTelemetry -> PynvmlApi) over a
    fake ``pynvml``: NVML stays initialised while a display refreshes and is shut
    down when it stops: closed, its widget closed, never started, cluster gone."""
    from fake_nvml import FakeNvml, FakePynvml, a100s

    from gpucell.kernel.telemetry import for_cluster
    from gpucell.ui.monitor import DeviceMonitor
    from gpucell.ui.select import DeviceSelector

    nv = FakePynvml(FakeNvml(a100s(2)))
    monkeypatch.setitem(sys.modules, "pynvml", nv)
    gc = StandIn(2)
    gc.engines = {i: LocalInfo(i, index=i) for i in range(2)}

    def wait_until_stopped(display: Any) -> None:
        deadline = time.monotonic() + 5
        while display.running and time.monotonic() < deadline:
            time.sleep(0.02)
        assert not display.running

    for make in (DeviceMonitor, DeviceSelector):
        display = make(gc, for_cluster(gc), period=0.02, alive=lambda: True)
        time.sleep(0.1)
        assert display.running and nv.initialised == 1
        display.close()
        assert nv.initialised == 0, make

        display = make(gc, for_cluster(gc), period=0.02, alive=lambda: True)
        assert nv.initialised == 1
        display.widget.close()  # closed directly, not through the display
        wait_until_stopped(display)
        assert nv.initialised == 0, make

        display = make(gc, for_cluster(gc), start=False)
        assert nv.initialised == 1  # the first refresh sampled
        display.close()
        assert nv.initialised == 0, make

        up = [True]
        display = make(gc, for_cluster(gc), period=0.02, alive=lambda up=up: up[0])
        up[0] = False  # the cluster stopped
        wait_until_stopped(display)
        assert nv.initialised == 0, make
        display.close()
        assert nv.shutdowns == nv.inits
