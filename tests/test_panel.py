"""The JupyterLab panel's kernel side: the message schema, the state it shows,
and a real ipykernel answering a comm as the panel opens it.

The browser test (tests/test_lab_panel.py) drives the same comm from the real
extension; here a jupyter_client stands in for the panel, so every message the
kernel sends can be read and checked against the schema.
"""

from __future__ import annotations

import json
import time
import uuid
from pathlib import Path
from types import SimpleNamespace

import pytest

from gpucell.core.runstate import EngineProgress, RunSnapshot
from gpucell.kernel.telemetry import LoadHistory
from gpucell.protocol import panel as schema
from gpucell.protocol.telemetry import DeviceSample
from gpucell.ui import panel_state

FIXTURE = Path(__file__).parent / "fixtures" / "panel_v1.json"


def _fixture() -> dict:
    return json.loads(FIXTURE.read_text())


# ------------------------------------------------------------------ schema


def test_the_fixture_is_the_schema_python_checks():
    f = _fixture()
    assert f["target"] == schema.TARGET and f["version"] == schema.VERSION
    for msg in f["valid"]:
        assert schema.validate(msg) == [], msg
    for case in f["invalid"]:
        assert schema.validate(case["message"]), case["why"]


def test_every_request_the_panel_can_send_is_in_the_fixture():
    kinds = {m["type"] for m in _fixture()["valid"]}
    assert {"hello", "state", "reply", *schema.REQUESTS} <= kinds


# ------------------------------------------------------------------ history


def _load(eid, util, used, total=100, kind="gpu"):
    return DeviceSample(
        engine=eid,
        host="h",
        kind=kind,
        index=eid,
        name="A100",
        timestamp=0.0,
        utilization=util,
        memory_used=used,
        memory_total=total,
    )


def test_the_history_keeps_a_point_a_period_within_the_window():
    h = LoadHistory(window=10.0, period=1.0)
    assert h.view() is None
    assert h.record(100.0, [_load(0, 50.0, 25), _load(1, None, None)])
    # the panel looks twice a second: the second look adds nothing
    assert not h.record(100.5, [_load(0, 99.0, 99)])
    assert h.record(100.9, [_load(0, 350.0, 50), _load(1, 10.0, 0, total=0)])
    v = h.view()
    assert schema.validate({**_NO_CLUSTER_STATE, "history": v}) == []
    assert v["window"] == 10.0 and v["period"] == 1.0
    d0, d1 = v["devices"]
    assert d0 == {
        "engine": 0,
        "age": [-0.9, 0.0],
        "util": [50.0, 100.0],  # a CPU engine's 350 % is one full device
        "mem": [25.0, 50.0],
    }
    assert d1 == {
        "engine": 1,
        "age": [-0.9, 0.0],
        "util": [None, 10.0],
        "mem": [None, None],
    }


def test_the_history_is_bounded_and_forgets_engines_gone_for_a_window():
    h = LoadHistory(window=60.0, period=1.0)
    for t in range(10_000):
        h.record(
            float(t), [_load(0, t % 100, 1)] + ([_load(1, 5, 1)] if t < 100 else [])
        )
    v = h.view()
    assert [d["engine"] for d in v["devices"]] == [0]
    (d0,) = v["devices"]
    assert len(d0["age"]) == h.maxlen == 61
    assert d0["age"][0] == -60.0 and d0["age"][-1] == 0.0
    assert len(h) == 61
    assert len(json.dumps(v)) < 2_000  # one device, 5 minutes at 1 Hz: ~6 KB


def test_a_history_needs_a_positive_window_and_period():
    with pytest.raises(ValueError, match="positive window and period"):
        LoadHistory(window=0)
    with pytest.raises(ValueError, match="positive window and period"):
        LoadHistory(period=-1)


_NO_CLUSTER_STATE = {
    "v": 1,
    "type": "state",
    "seq": 1,
    "status": "gpucell: no cluster",
    "cluster": None,
    "run": None,
    "last": None,
}


# ------------------------------------------------------------------ state


def _engine(eid, host, kind="cpu", index=-1, local=True, state="idle"):
    return SimpleNamespace(
        id=eid,
        host=host,
        pid=100 + eid,
        kind=kind,
        index=index,
        name="A100" if kind == "gpu" else "CPU",
        device=f"GPU {index}" if kind == "gpu" else "CPU",
        local=local,
        state=state,
    )


def _sample(eid, host, util, used=None, total=None, kind="gpu"):
    return DeviceSample(
        engine=eid,
        host=host,
        kind=kind,
        index=0,
        name="A100",
        timestamp=time.time(),
        utilization=util,
        memory_used=used,
        memory_total=total,
    )


def _cluster_state(engines, samples=(), selected=None, snap=None, kind="local"):
    conn = panel_state.connection_view(kind, engines, None, "")
    cluster = panel_state.cluster_view(engines, conn, selected, samples, snap)
    msg = panel_state.state_message(1, cluster, None, None)
    assert schema.validate(msg) == [], schema.validate(msg)
    return msg


def test_gpus_of_two_hosts_this_host_first_and_the_busy_average():
    engines = [
        _engine(0, "node2", "gpu", 0, local=False),
        _engine(1, "node1", "gpu", 0),
        _engine(2, "node1", "gpu", 1),
        _engine(3, "node2", "gpu", 1, local=False),
    ]
    samples = [
        _sample(i, e.host, u, 2 << 30, 8 << 30)
        for i, (e, u) in enumerate(zip(engines, (90.0, 60.0, 30.0, 72.0), strict=True))
    ]
    msg = _cluster_state(engines, samples, selected=[1, 3], kind="ssh")
    c = msg["cluster"]
    assert c["connection"]["hosts"] == ["node1", "node2"]
    assert [d["engine"] for d in c["devices"]] == [1, 2, 0, 3]
    assert [d["selected"] for d in c["devices"]] == [True, False, False, True]
    assert c["devices"][0]["util"] == pytest.approx(0.6)
    assert c["devices"][0]["mem"] == pytest.approx(0.25)
    assert msg["status"] == "gpucell: 4 GPUs · 2 hosts · 63% busy"


def test_cpu_engines_without_telemetry_say_unknown_not_zero():
    msg = _cluster_state([_engine(0, "box"), _engine(1, "box")])
    assert msg["status"] == "gpucell: 2 CPU engines · 1 host · – busy"
    assert {d["util"] for d in msg["cluster"]["devices"]} == {None}
    assert {d["selected"] for d in msg["cluster"]["devices"]} == {True}


def test_a_dead_engine_is_counted_apart():
    engines = [_engine(0, "box"), _engine(1, "box", state="dead")]
    msg = _cluster_state(engines)
    assert msg["status"] == "gpucell: 1 CPU engine · 1 host · – busy · 1 dead"
    assert msg["cluster"]["devices"][1]["state"] == "dead"


def test_a_device_being_restarted_is_counted_apart_and_keeps_its_row():
    """Its engine died and a new one is being started: ``restarting`` (not
    dead, not a present engine), in a colour that is not dead's."""
    engines = [_engine(0, "box"), _engine(1, "box", state="dead"), _engine(2, "box")]
    engines[1].restarting = True
    msg = _cluster_state(engines)
    rows = msg["cluster"]["devices"]
    assert [d["state"] for d in rows] == ["idle", "restarting", "idle"]
    assert msg["status"] == "gpucell: 2 CPU engines · 1 host · – busy · 1 restarting"
    dead = _cluster_state([_engine(1, "box", state="dead")])["cluster"]["devices"]
    assert rows[1]["color"] != dead[0]["color"]
    # the new engine (4) takes the dead one's place, not the end of the rows
    engines[1] = _engine(4, "box")
    conn = panel_state.connection_view("local", engines, None, "")
    c = panel_state.cluster_view(engines, conn, None, slots={4: 1})
    assert [d["engine"] for d in c["devices"]] == [0, 4, 2]
    assert panel_state.status_text(c) == "gpucell: 3 CPU engines · 1 host · – busy"


def test_restarting_and_dead_are_both_said():
    engines = [
        _engine(0, "box", state="dead"),
        _engine(1, "box", state="dead"),
        _engine(2, "box"),
    ]
    engines[0].restarting = True
    msg = _cluster_state(engines)
    assert msg["status"] == (
        "gpucell: 1 CPU engine · 1 host · – busy · 1 restarting · 1 dead"
    )


def test_the_fixtures_restarting_state_is_what_python_says():
    (msg,) = [
        m
        for m in _fixture()["valid"]
        if m["type"] == "state"
        and any(
            d["state"] == "restarting" for d in (m["cluster"] or {}).get("devices", [])
        )
    ]
    assert panel_state.status_text(msg["cluster"]) == msg["status"]


def test_every_state_a_row_can_have_is_in_the_schema():
    from typing import get_args

    from gpucell.core.states import EngineState
    from gpucell.ui import model

    assert set(get_args(EngineState)) | {model.DONE, model.STOPPED} == set(
        schema.DEVICE_STATES
    )


def test_a_restarted_engine_takes_its_devices_place_in_the_panel():
    from gpucell.kernel.panel import Slots

    def eng(eid, label, host="box"):
        return SimpleNamespace(id=eid, host=host, label=label)

    slots, gc = Slots(), object()
    assert slots(gc, [eng(0, "gpu0"), eng(1, "gpu1"), eng(2, "gpu2")]) == {}
    assert slots(gc, [eng(0, "gpu0"), eng(3, "gpu1"), eng(2, "gpu2")]) == {3: 1}
    # restarted again: still the device's first place
    assert slots(gc, [eng(0, "gpu0"), eng(5, "gpu1"), eng(2, "gpu2")]) == {5: 1}
    # the same label on another host is another device; no label, no place
    assert slots(gc, [eng(6, "gpu1", "node2"), eng(7, "")]) == {}
    # another cluster starts afresh
    assert slots(object(), [eng(3, "gpu1")]) == {}


def test_no_cluster():
    msg = panel_state.state_message(3, None, None, None)
    assert schema.validate(msg) == []
    assert msg["status"] == "gpucell: no cluster"


def test_a_running_cell_shows_its_progress_on_the_rows_and_the_run():
    engines = [_engine(0, "box"), _engine(1, "box")]
    snap = RunSnapshot(
        total=40,
        done=10,
        elapsed=2.0,
        engines=(
            EngineProgress(
                0, "box", "CPU", "CPU", done=6, busy_seconds=1.0, state="busy"
            ),
            EngineProgress(
                1, "box", "CPU", "CPU", done=4, busy_seconds=1.0, state="busy"
            ),
        ),
    )
    msg = _cluster_state(engines, snap=snap)
    assert [d["done_text"] for d in msg["cluster"]["devices"]] == ["6 it", "4 it"]
    assert [d["state"] for d in msg["cluster"]["devices"]] == ["busy", "busy"]
    run = panel_state.run_view(snap)
    assert run["eta"] == pytest.approx(6.0)
    assert run["text"].startswith("10/40 it (25%)")
    full = panel_state.state_message(2, msg["cluster"], run, None)
    assert schema.validate(full) == []


# ------------------------------------------------------------------ a real kernel


class _Panel:
    """A jupyter_client playing the Lab panel: opens the comm, reads what the
    kernel sends on it (every message checked against the schema)."""

    def __init__(self, kc):
        self.kc = kc
        self.comm_id = None
        self.states: list[dict] = []
        self.replies: list[dict] = []
        self.opened_by_kernel: list[str] = []
        self.closed: set[str] = set()

    def _take(self, msg):
        t, c = msg["msg_type"], msg["content"]
        if t == "comm_open" and c.get("target_name") == schema.TARGET:
            self.opened_by_kernel.append(c["comm_id"])
            self._data(c["data"])
        elif t == "comm_msg":
            self._data(c["data"])
        elif t == "comm_close":
            self.closed.add(c["comm_id"])

    def _data(self, data):
        assert schema.validate(data) == [], (schema.validate(data), data)
        (self.states if data["type"] == "state" else self.replies).append(data)

    def drain(self, timeout=0.1):
        while True:
            try:
                msg = self.kc.get_iopub_msg(timeout=timeout)
            except Exception:
                return
            self._take(msg)

    def wait(self, ok, timeout=30.0, what="a state"):
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            for s in reversed(self.states):
                if ok(s):
                    return s
            try:
                self._take(self.kc.get_iopub_msg(timeout=0.2))
            except Exception:
                pass
        raise AssertionError(f"no {what} in {timeout} s; last: {self.states[-1:]}")

    def run(self, code, timeout=120):
        out: list[str] = []

        def hook(msg):
            self._take(msg)
            c = msg["content"]
            if msg["msg_type"] == "stream":
                out.append(c["text"])
            elif msg["msg_type"] == "error":
                out.append("\n".join(c["traceback"]))

        reply = self.kc.execute_interactive(code, timeout=timeout, output_hook=hook)
        assert reply["content"]["status"] == "ok", "".join(out)
        return "".join(out)

    def open(self):
        self.comm_id = uuid.uuid4().hex
        self.kc.session.send(
            self.kc.shell_channel.socket,
            self.kc.session.msg(
                "comm_open",
                {
                    "comm_id": self.comm_id,
                    "target_name": schema.TARGET,
                    "data": schema.hello(),
                },
            ),
        )

    def send(self, data):
        self.kc.session.send(
            self.kc.shell_channel.socket,
            self.kc.session.msg("comm_msg", {"comm_id": self.comm_id, "data": data}),
        )


@pytest.fixture
def kernel():
    from jupyter_client.manager import start_new_kernel

    km, kc = start_new_kernel(kernel_name="python3", startup_timeout=60)
    try:
        yield _Panel(kc)
    finally:
        try:
            kc.execute_interactive("import gpucell; gpucell.stop()", timeout=30)
        except Exception:
            pass
        kc.stop_channels()
        km.shutdown_kernel(now=True)


@pytest.mark.cluster
def test_a_kernel_without_gpucell_closes_the_panels_comm(kernel):
    kernel.open()
    deadline = time.monotonic() + 20
    while kernel.comm_id not in kernel.closed and time.monotonic() < deadline:
        kernel.drain(0.2)
    assert kernel.comm_id in kernel.closed
    assert kernel.states == []


@pytest.mark.cluster
def test_the_panel_follows_the_kernel_and_acts_through_the_magics(kernel):
    kernel.run("%load_ext gpucell")
    # loading gpucell told a panel that may already be there
    assert kernel.opened_by_kernel
    assert kernel.states[-1]["cluster"] is None
    kernel.open()
    first = kernel.wait(lambda s: s["status"] == "gpucell: no cluster")
    seq = first["seq"]

    kernel.run("%gpu_cluster start -n 2 --gpus none")
    s = kernel.wait(lambda s: s["cluster"] is not None and s["seq"] > seq)
    assert [d["engine"] for d in s["cluster"]["devices"]] == [0, 1]
    assert s["cluster"]["connection"]["kind"] == "local"
    assert s["status"].startswith("gpucell: 2 CPU engines · 1 host · ")
    # the charts' history: a point a second per engine, kept across cells
    h = kernel.wait(
        lambda s: (
            s.get("history") is not None
            and all(len(d["age"]) >= 2 for d in s["history"]["devices"])
        ),
        what="two history points per engine",
    )["history"]
    assert [d["engine"] for d in h["devices"]] == [0, 1]
    assert h["window"] == 300.0 and h["period"] == 1.0

    # a tick in the panel is the magic's selection; the magic's shows in the panel
    kernel.send({"v": 1, "type": "select", "engines": [1]})
    kernel.wait(lambda s: (s["cluster"] or {}).get("selected") == [1])
    assert kernel.replies[-1]["ok"] is True
    assert "engines [1]" in kernel.replies[-1]["text"]
    out = kernel.run("import gpucell\nprint(gpucell.current().selected)")
    assert out.strip() == "(1,)"
    kernel.run("%gpu_cluster select all")
    kernel.wait(lambda s: s["cluster"] is not None and s["cluster"]["selected"] is None)

    # a running cell: pushed updates while it runs, then its summary and timeline
    before = kernel.states[-1]["seq"]
    kernel.run(
        "%%gpu_parallel --quiet\nimport time\nout = []\nfor i in range(12):\n"
        "    time.sleep(0.25)\n    out.append(i)\n"
    )
    s = kernel.wait(lambda s: s["last"] is not None and s["seq"] > before)
    running = [
        x
        for x in kernel.states
        if x["seq"] > before and x["run"] and x["run"]["status"] == "running"
    ]
    assert len({x["run"]["done"] for x in running}) >= 2, running
    assert s["last"]["status"] == "ok"
    later = kernel.states[-1]["history"]["devices"]
    assert len(later[0]["age"]) > len(h["devices"][0]["age"]), "history lost"
    assert s["last"]["timeline_svg"].lstrip().startswith("<svg")
    assert any("12 iterations on 2 engines" in ln for ln in s["last"]["lines"])

    # a bad start is answered, not raised; stop goes through the magic
    kernel.send({"v": 1, "type": "start", "args": "--no-such-option"})
    deadline = time.monotonic() + 20
    while not any(r["request"] == "start" for r in kernel.replies):
        assert time.monotonic() < deadline
        kernel.drain(0.2)
    bad = [r for r in kernel.replies if r["request"] == "start"][-1]
    assert bad["ok"] is False and "no-such-option" in bad["text"]
    kernel.send({"v": 1, "type": "stop"})
    kernel.wait(
        lambda s: s["cluster"] is None and s["seq"] > before,
        what="no cluster after stop",
    )
    deadline = time.monotonic() + 20
    while not any(r["request"] == "stop" for r in kernel.replies):
        assert time.monotonic() < deadline
        kernel.drain(0.2)
    assert [r["ok"] for r in kernel.replies if r["request"] == "stop"] == [True]


@pytest.mark.cluster
def test_an_idle_kernel_sends_nothing(kernel):
    kernel.run("%load_ext gpucell")
    kernel.open()
    kernel.wait(lambda s: s["cluster"] is None)
    kernel.drain(1.5)
    n = len(kernel.states)
    kernel.drain(2.0)
    assert len(kernel.states) == n
