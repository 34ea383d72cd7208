"""The JupyterLab panel's state while a device's engine is restarted (issue 29):
the row says ``restarting`` while a new engine is started on the device, then
goes on, in the same place, under the new engine's id; the status bar counts it
apart (neither a GPU at work nor lost).  On real clusters whose engines are
killed with SIGKILL; the panel's state is built by the kernel's own endpoint,
its messages checked against the schema."""

from __future__ import annotations

import os
import signal
import threading
import time
from collections.abc import Iterator
from typing import Any

import pytest

import gpucell.cluster.lifecycle as gc_mod
from gpucell.devices.host import pid_running
from gpucell.kernel.panel import PanelEndpoint
from gpucell.kernel.session import current
from gpucell.protocol import panel as schema

pytestmark = pytest.mark.cluster


class Recording(PanelEndpoint):
    """The kernel's endpoint without a comm: the state it would send, kept
    after every snapshot the run gives it."""

    def __init__(self, shell: Any) -> None:
        super().__init__(shell)
        self.frames: list[dict[str, Any]] = []

    def look(self) -> dict[str, Any]:
        msg = self.state()
        assert schema.validate(msg) == [], schema.validate(msg)
        self.frames.append(msg)
        return msg

    def run_progress(self, snap: Any) -> None:
        super().run_progress(snap)
        self.look()

    def run_ended(self, snap: Any) -> None:
        super().run_ended(snap)
        self.look()


@pytest.fixture
def endpoint(ip) -> Iterator[Recording]:
    session = current()
    saved, ep = session.panel, Recording(ip)
    session.panel = ep
    try:
        yield ep
    finally:
        session.panel = saved
        ep.close()


def _rows(msg: dict[str, Any]) -> list[tuple[int, str]]:
    return [(d["engine"], d["state"]) for d in msg["cluster"]["devices"]]


def test_a_killed_engine_is_restarting_in_the_panel_then_the_new_one(
    ip, own_cluster, endpoint
):
    victim = own_cluster.engines[1]
    ip.user_ns["out"] = []
    threading.Timer(0.8, os.kill, (victim.pid, signal.SIGKILL)).start()
    ip.run_cell_magic(
        "gpu_parallel",
        "--schedule dynamic --chunksize 2",
        "import time\nfor i in range(120):\n    time.sleep(0.08)\n    out.append(i)\n",
    )
    assert ip.user_ns["out"] == list(range(120))
    (new,) = [e for e in own_cluster.engines if e not in (0, 1)]
    frames = endpoint.frames
    # one row per device all along, engine 0's first
    assert all(len(_rows(f)) == 2 and _rows(f)[0][0] == 0 for f in frames), frames
    second = [_rows(f)[1] for f in frames]
    states = [s for _, s in second]
    assert "dead" not in states, second
    assert "restarting" in states, second
    at = states.index("restarting")
    assert second[at][0] == 1  # the dead engine's row says it
    assert {s for _, s in second[at:]} <= {
        "restarting",
        "busy",
        "retrying",
        "idle",
        "done",
    }, second
    assert {e for e, _ in second[at:]} == {1, new}, second
    # once the new engine is there, the row is its for good
    took = [e for e, _ in second].index(new)
    assert {e for e, _ in second[took:]} == {new}, second
    assert any(s in ("busy", "retrying") for s in states[took:]), second
    # the status bar: neither a present engine nor lost while restarting
    restarting = [f for f in frames if _rows(f)[1][1] == "restarting"]
    for f in restarting:
        assert f["status"].startswith("gpucell: 1 CPU engine · 1 host · "), f
        assert f["status"].endswith(" · 1 restarting"), f["status"]
    assert frames[-1]["status"].startswith("gpucell: 2 CPU engines · 1 host · ")
    assert "restarting" not in frames[-1]["status"]
    assert frames[-1]["run"]["status"] == "ok"


def test_between_cells_the_new_engine_takes_its_devices_place(own_cluster, endpoint):
    """Engine 0 dies: the new engine (id 2) goes on in the first row, not after
    engine 1."""
    before = endpoint.look()
    assert _rows(before) == [(0, "idle"), (1, "idle")]
    os.kill(own_cluster.engines[0].pid, signal.SIGKILL)
    deadline = time.monotonic() + 10
    while pid_running(own_cluster.engines[0].pid):
        assert time.monotonic() < deadline, "the killed engine's process ends"
        time.sleep(0.02)
    # its process gone, its death not yet judged (no cell, no status, and a
    # terminal has no watch): the panel's own telemetry sees it gone, and the
    # device it will restart is restarting, never dead (the panel's thread
    # samples between two looks of a kernel's watch)
    unjudged = endpoint.look()
    assert _rows(unjudged)[0] == (0, "restarting"), unjudged
    gc_mod.status()  # notices the death; the restart begins
    msg = endpoint.look()
    # the other engine is live: idle, or busy a moment (an earlier test's
    # restarted engine may still be importing what the kernel has)
    (first, second) = _rows(msg)
    assert first == (0, "restarting") and second[0] == 1
    assert second[1] in ("idle", "busy"), msg
    assert msg["status"].startswith("gpucell: 1 CPU engine · 1 host · ")
    assert msg["status"].endswith(" · 1 restarting"), msg["status"]
    deadline = time.monotonic() + 40
    while own_cluster.restarts.pending:
        assert time.monotonic() < deadline, "the restart ends"
        gc_mod.status()
        time.sleep(0.1)
    (new,) = [e for e in own_cluster.engines if e not in (0, 1)]
    msg = endpoint.look()
    # in the first row (busy a moment: it imports what the kernel has)
    assert [e for e, _ in _rows(msg)] == [new, 1]
    assert {s for _, s in _rows(msg)} <= {"idle", "busy"}
    assert msg["status"].startswith("gpucell: 2 CPU engines · 1 host · ")
    assert "restarting" not in msg["status"] and "dead" not in msg["status"]
