"""What the user is shown while a device's engine is restarted (issue 29): the
progress widget and the device monitor say ``restarting`` while it is, then the
device's row goes on under the new engine; ``dead`` is for a device nothing
restarts any more.  On real clusters whose engines are killed with SIGKILL."""

from __future__ import annotations

import os
import re
import signal
import threading
import time
from typing import Any

import pytest

import gpucell
import gpucell.cluster.lifecycle as gc_mod
from gpucell.ui import model, progress
from gpucell.ui.monitor import DeviceMonitor

pytestmark = pytest.mark.cluster


def _shown(table: progress.DeviceTable) -> dict[Any, tuple[str, str]]:
    """Each row's (label, state) as the widgets' models hold them."""
    out = {}
    for key, rw in table.rows.items():
        state = re.sub(r"<[^>]*>", "", rw.state.value)
        out[key] = (re.sub(r"<[^>]*>", "", rw.label.value), state)
    return out


def test_the_widget_shows_a_killed_engine_restarting_then_at_work(
    ip, own_cluster, monkeypatch
):
    frames: list[dict[Any, tuple[str, str]]] = []

    class Recording(progress.WidgetProgress):
        def __init__(self, snap: Any, telemetry: Any = None) -> None:
            super().__init__(snap, telemetry, show=lambda *a, **k: None)
            frames.append(_shown(self.table))

        def update(self, snap: Any) -> None:
            self.budget = 10.0  # every row's change sent, each frame
            super().update(snap)
            frames.append(_shown(self.table))

        def close(self, snap: Any) -> None:
            super().close(snap)
            frames.append(_shown(self.table))

    monkeypatch.setattr(progress, "has_widget_frontend", lambda shell: True)
    monkeypatch.setattr(progress, "WidgetProgress", Recording)
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
    assert new in {c.engine for c in gpucell.last_run.chunks if c.state == "done"}
    # one row per device all along: the restarted engine redraws engine 1's
    assert all(set(f) == {0, 1} for f in frames), frames
    states = [f[1][1] for f in frames]
    assert "dead" not in states, states
    assert "restarting" in states, states
    after = states[states.index("restarting") :]
    assert set(after) <= {"restarting", "busy", "retrying", "idle", "done"}, states
    label, state = frames[-1][1]
    assert label.startswith(f"{new} · ") and state == "done", frames[-1]
    assert frames[-1][0][1] == "done"


def test_the_monitor_shows_restarting_then_the_new_engine_in_its_row(own_cluster):
    mon = DeviceMonitor(own_cluster, None, start=False)
    try:
        before = _shown(mon.table)
        (key,) = [k for k, (label, _) in before.items() if label.startswith("1 · ")]
        os.kill(own_cluster.engines[1].pid, signal.SIGKILL)
        time.sleep(0.3)
        gc_mod.status()  # notices the death; the restart begins
        mon.refresh()
        assert _shown(mon.table)[key][1] == "restarting"
        deadline = time.monotonic() + 40
        while own_cluster.restarts.pending:
            assert time.monotonic() < deadline, "the restart ends"
            gc_mod.status()
            time.sleep(0.1)
        mon.refresh()
        rows = _shown(mon.table)
        assert set(rows) == set(before)  # the device's row, not a second one
        (new,) = [e for e in own_cluster.engines if e not in (0, 1)]
        # live: idle, or busy a moment importing what the kernel has
        assert rows[key][0].startswith(f"{new} · ") and rows[key][1] in ("idle", "busy")
    finally:
        mon.close()


def test_a_device_nothing_restarts_is_dead(own_cluster, monkeypatch):
    """The budget gave up (here: nothing may restart it): dead, not restarting."""
    monkeypatch.setattr(own_cluster.restarts, "begin", lambda gc, eid: None)
    os.kill(own_cluster.engines[1].pid, signal.SIGKILL)
    time.sleep(0.3)
    gc_mod.status()
    rows = model.monitor_rows(
        [own_cluster.engines[e] for e in sorted(own_cluster.engines)]
    )
    # the other engine is live (idle, or busy a moment importing what the
    # kernel has after an earlier test's restart)
    assert [r.state for r in rows][1] == "dead"
    assert rows[0].state in ("idle", "busy"), rows
