"""An engine killed *between* cells is restarted at once, from the kernel's
event loop (issue 29): on a real ipykernel driven through jupyter_client, with
a jupyter_client playing the Lab panel, the killed engine's row goes
``restarting`` then ``idle`` under a new engine without any cell running; a
cell sent while such a restart is under way runs, with the new engine or
beside it.  In a terminal (no loop between prompts) nothing watches.

One kernel and one 2-engine cluster for the module (tests run in order).
"""

from __future__ import annotations

import ast
import os
import signal
import time
from collections.abc import Iterator
from typing import Any

import pytest
from test_panel import _Panel

import gpucell
import gpucell.cluster.lifecycle as gc_mod
from gpucell.cluster import restart_watch

pytestmark = pytest.mark.cluster

SETUP = """\
%load_ext gpucell
import gpucell, logging, time
class _Keep(logging.Handler):
    def __init__(self):
        super().__init__()
        self.lines = []
    def emit(self, record):
        self.lines.append(record.getMessage())
_keep = _Keep()
logging.getLogger("gpucell.cluster.restart").addHandler(_keep)
logging.getLogger("gpucell.cluster.restart").setLevel("INFO")
gpucell.start_cluster(2, gpus="none")
"""


class _Kernel(_Panel):
    """The panel's comm, and every line the kernel prints (between cells too)."""

    def __init__(self, kc: Any) -> None:
        super().__init__(kc)
        self.said: list[str] = []

    def _take(self, msg: dict[str, Any]) -> None:
        kind, c = msg["msg_type"], msg["content"]
        if kind == "stream":
            self.said.append(c["text"])
        panel = {self.comm_id, *self.opened_by_kernel}
        if kind in ("comm_msg", "comm_close") and c.get("comm_id") not in panel:
            return  # a widget's (the device monitor's)
        super()._take(msg)


@pytest.fixture(scope="module")
def kernel() -> Iterator[_Kernel]:
    from jupyter_client.manager import start_new_kernel

    km, kc = start_new_kernel(kernel_name="python3", startup_timeout=60)
    panel = _Kernel(kc)
    try:
        panel.run(SETUP)
        panel.open()
        yield panel
    finally:
        try:
            kc.execute_interactive("import gpucell; gpucell.stop()", timeout=30)
        except Exception:
            pass
        kc.stop_channels()
        km.shutdown_kernel(now=True)


def _value(kernel: _Panel, expr: str) -> Any:
    return ast.literal_eval(kernel.run(f"print(repr({expr}))").strip().splitlines()[-1])


def _rows(s: dict[str, Any]) -> list[tuple[int, str]]:
    rows = [(d["engine"], d["state"]) for d in (s["cluster"] or {}).get("devices", [])]
    return rows if len(rows) == 2 else [(-1, "none"), (-1, "none")]


def _wait(kernel: _Panel, ok: Any, timeout: float = 30.0, what: str = "a state") -> Any:
    """The first state sent from now on that ``ok`` accepts."""
    seq = kernel.states[-1]["seq"] if kernel.states else 0
    return kernel.wait(lambda s: s["seq"] > seq and ok(s), timeout, what)


def _pids(kernel: _Panel) -> dict[int, int]:
    return _value(kernel, "{e: i.pid for e, i in gpucell.current().engines.items()}")


MONITOR = """\
import re
from gpucell.ui.monitor import DeviceMonitor
_frames = []
def _text(w):
    return re.sub("<[^>]*>", "", w.value)
class _Recording(DeviceMonitor):
    def refresh(self):
        super().refresh()
        _frames.append({str(k): (_text(r.label), _text(r.state))
                        for k, r in self.table.rows.items()})
_mon = _Recording(gpucell.current(), None, period=0.2)
def _drawn(new, timeout=10.0):
    # the frames once the monitor's thread drew engine `new` idle; closed then
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline and not any(
        label.startswith(f"{new} · ") and state == "idle"
        for label, state in _frames[-1].values()
    ):
        time.sleep(0.05)
    _mon.close()
    return _frames
"""


def test_an_engine_killed_between_cells_restarts_with_no_cell_run(kernel):
    pids = _pids(kernel)
    assert sorted(pids) == [0, 1]
    label = _value(kernel, "gpucell.current().engines[1].label")
    kernel.run(MONITOR)  # %gpu_cluster monitor's rows, kept from its thread
    kernel.wait(lambda s: _rows(s) == [(0, "idle"), (1, "idle")])
    seen = len(kernel.states)
    kernel.drain(0.3)
    t0 = time.monotonic()
    os.kill(pids[1], signal.SIGKILL)
    _wait(kernel, lambda s: _rows(s)[1:] == [(1, "restarting")], timeout=10)
    noticed = time.monotonic() - t0
    back = _wait(
        kernel,
        lambda s: _rows(s)[1][0] not in (0, 1) and _rows(s)[1][1] == "idle",
        timeout=40,
        what="the new engine idle in the dead one's row",
    )
    took = time.monotonic() - t0
    print(f"restarting shown after {noticed:.1f} s, the new engine after {took:.1f} s")
    assert noticed < 3.0, noticed
    after = [_rows(s) for s in kernel.states[seen:]]
    # never dead; one row per device, engine 0's first all along
    assert all(len(r) == 2 and r[0][0] == 0 for r in after), after
    assert "dead" not in {r[1][1] for r in after}, after
    assert "restarting" not in back["status"] and "dead" not in back["status"]
    assert back["status"].startswith("gpucell: 2 CPU engines · 1 host · ")
    new = _rows(back)[1][0]
    # the device monitor's thread drew the same: restarting, then the new engine
    # (its thread draws every 0.2 s: waited for, a loaded host delays it)
    frames = _value(kernel, f"_drawn({new})")
    (key,) = [k for k, (label, _) in frames[0].items() if label.startswith("1 · ")]
    states = [f[key][1] for f in frames]
    assert "dead" not in states and "restarting" in states, states
    last = frames[-1][key]
    assert last[0].startswith(f"{new} · ") and last[1] == "idle", frames[-3:]
    # the kernel's own record agrees, and the restart logger has it
    assert _value(kernel, "sorted(gpucell.current().engines)") == [0, new]
    lines = _value(kernel, "_keep.lines")
    assert any("engine 1 (cpu" in ln and "restarting it" in ln for ln in lines), lines
    assert any(f"is back as engine {new}" in ln for ln in lines), lines
    # said by the next gpucell cell, first, not into the last cell's output
    first = f"gpucell: since the last cell: engine 1 ({label}) was restarted: it is "
    first += f"engine {new} now"
    assert first not in _said(kernel), _said(kernel)
    said = kernel.run("%gpu_cluster status")
    assert said.splitlines()[0] == first, said
    assert "since the last cell" not in kernel.run("%gpu_cluster status")  # once


def test_a_cell_sent_while_a_restart_runs_is_not_broken(kernel):
    pids = _pids(kernel)
    (victim,) = [e for e in pids if e != 0]
    os.kill(pids[victim], signal.SIGKILL)
    _wait(kernel, lambda s: _rows(s)[1:] == [(victim, "restarting")], timeout=10)
    text = kernel.run(
        "%%gpu_parallel --schedule dynamic --chunksize 2 --quiet\n"
        "out = []\nfor i in range(40):\n    time.sleep(0.05)\n    out.append(i * i)\n"
    )
    assert "Error" not in text, text
    assert _value(kernel, "out == [i * i for i in range(40)]") is True
    assert _value(kernel, "gpucell.last_run.status") == "ok"
    # the restart ended too: two live engines, none dead, none left restarting
    back = _wait(
        kernel,
        lambda s: (
            _rows(s)[1][0] not in (0, victim) and {st for _, st in _rows(s)} == {"idle"}
        ),
        timeout=40,
        what="both devices idle, the second on a new engine",
    )
    ids = _value(kernel, "sorted(gpucell.current().engines)")
    assert ids == [0, _rows(back)[1][0]], ids


def test_status_watches_a_cluster_nothing_watched(kernel):
    """A cluster started before the kernel's loop ran (a startup script) has no
    watch; ``%gpu_cluster status`` arms it: an engine killed after that comes
    back with no cell run."""
    kernel.run("from gpucell.cluster import restart_watch as _rw\n_rw.forget()")
    assert _value(kernel, "_rw._active") is None
    kernel.run("%gpu_cluster status")
    assert _value(kernel, "_rw._active is not None and not _rw._active.stopped")
    pids = _pids(kernel)
    (victim,) = [e for e in pids if e != 0]
    os.kill(pids[victim], signal.SIGKILL)
    back = _wait(
        kernel,
        lambda s: (
            _rows(s)[1][0] not in (0, victim) and {st for _, st in _rows(s)} == {"idle"}
        ),
        timeout=40,
        what="the second device idle on a new engine, no cell run",
    )
    ids = _value(kernel, "sorted(gpucell.current().engines)")
    assert ids == [0, _rows(back)[1][0]], ids


CELL = "%%gpu_parallel --quiet\nsq = []\nfor i in range(8):\n    sq.append(i * i)\n"


def _fresh(kernel: _Panel) -> dict[int, int]:
    """A new cluster in the same kernel (its devices' restart budgets new)."""
    kernel.run("gpucell.stop()\ngpucell.start_cluster(2, gpus='none')")
    _wait(kernel, lambda s: _rows(s) == [(0, "idle"), (1, "idle")])
    return _pids(kernel)


def _listen(kernel: _Panel, seconds: float) -> None:
    """Read what the kernel sends for ``seconds`` (the panel's state changes
    every second while it records history: ``drain`` would never end)."""
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        try:
            kernel._take(kernel.kc.get_iopub_msg(timeout=0.1))
        except Exception:
            pass


def _said(kernel: _Panel) -> str:
    return "".join(kernel.said)


def _engines_of(kernel_pid: int) -> set[int]:
    import psutil

    out = set()
    for p in psutil.Process(kernel_pid).children(recursive=True):
        try:
            if "ipyparallel.engine" in p.cmdline():
                out.add(p.pid)
        except psutil.Error:
            pass
    return out


def test_two_engines_killed_between_cells_come_back_as_two(kernel):
    pids = _fresh(kernel)
    for pid in pids.values():
        os.kill(pid, signal.SIGKILL)
    _wait(kernel, lambda s: [st for _, st in _rows(s)] == ["restarting"] * 2, 10)
    back = _wait(
        kernel,
        lambda s: (
            {st for _, st in _rows(s)} == {"idle"}
            and not {e for e, _ in _rows(s)} & {0, 1}
        ),
        timeout=40,
        what="both devices idle on new engines",
    )
    new = sorted(e for e, _ in _rows(back))
    time.sleep(1.0)  # nothing registers late, nothing else restarts
    assert _value(kernel, "sorted(gpucell.current().engines)") == new
    labels = "sorted(e.label for e in gpucell.current().engines.values())"
    assert _value(kernel, labels) == ["cpu0", "cpu1"]
    ids = "sorted(set(gpucell.current().client.ids) - {0, 1})"
    assert _value(kernel, ids) == new  # no third engine running unused
    # a cell sent while every engine restarts waits for them
    for pid in _pids(kernel).values():
        os.kill(pid, signal.SIGKILL)
    _wait(kernel, lambda s: [st for _, st in _rows(s)] == ["restarting"] * 2, 10)
    kernel.run(
        "%%gpu_parallel --quiet\nsq = []\nfor i in range(20):\n    sq.append(i * i)\n"
    )
    assert _value(kernel, "sq == [i * i for i in range(20)]") is True


def test_an_engine_dying_after_every_start_between_cells_is_retired(kernel):
    pids = _fresh(kernel)
    kpid = _value(kernel, "__import__('os').getpid()")
    budget = 1  # restarts of a device within the window (3 by default: slower)
    kernel.run(f"import gpucell.cluster.restart as _R\n_R.BUDGET = {budget}")
    try:
        killed = {pids[1]}
        label = _value(kernel, "gpucell.current().engines[1].label")
        os.kill(pids[1], signal.SIGKILL)
        for _ in range(budget):  # killed a moment after every start
            back = _wait(
                kernel,
                lambda s: _rows(s)[1][1] == "idle" and _rows(s)[1][0] not in (0, 1),
                timeout=40,
                what="the device's new engine",
            )
            (pid,) = _engines_of(kpid) - killed - {pids[0]}
            os.kill(pid, signal.SIGKILL)
            killed.add(pid)
            prev = _rows(back)[1][0]
            _wait(kernel, lambda s, prev=prev: _rows(s)[1] != (prev, "idle"), 10)
        dead = _wait(kernel, lambda s: _rows(s)[1][1] == "dead", 10, "the device dead")
        assert "1 dead" in dead["status"], dead["status"]
        _listen(kernel, 1.0)  # nothing printed between cells (the last cell's)
        assert "times within" not in _said(kernel), _said(kernel)
        said = kernel.run("%gpu_cluster status")  # the next gpucell cell says it
        told = f"since the last cell: engine {prev} ({label}) died {budget + 1} times"
        assert told in said, said
        assert "stops restarting it" in said, said
        assert _engines_of(kpid) == {pids[0]}  # nothing else runs for it
        kernel.run(CELL)  # the cluster goes on with the engine left
        assert _value(kernel, "sq == [i * i for i in range(8)]") is True
    finally:
        kernel.run("_R.BUDGET = 3")


def test_every_engine_gone_between_cells_with_restarts_failing_is_said(kernel):
    pids = _fresh(kernel)
    kernel.run(  # every new engine's Python exits at once; attempts 0.1 s apart
        "import gpucell.cluster.engines as _E, gpucell.cluster.restart as _R\n"
        "_real_env, _R.BACKOFF = _E.engine_env, 0.1\n"
        "_E.engine_env = lambda spec: {**_real_env(spec), 'PYTHONHOME': '/nonexistent'}"
    )
    try:
        for pid in pids.values():
            os.kill(pid, signal.SIGKILL)
        t0 = time.monotonic()
        _wait(
            kernel,
            lambda s: [st for _, st in _rows(s)] == ["dead"] * 2,
            60,
            "both devices dead",
        )
        took = time.monotonic() - t0
        _listen(kernel, 2.0)  # nothing printed between cells (the last cell's)
        assert "could not be restarted" not in _said(kernel), _said(kernel)
        said = kernel.run("%gpu_cluster status")  # the next gpucell cell says it
        told = [ln for ln in said.splitlines() if "could not be restarted" in ln]
        assert len(told) == 2, said
        for eid, ln in zip((0, 1), sorted(told), strict=True):
            assert ln.startswith(f"gpucell: since the last cell: engine {eid} ("), ln
            assert "could not be restarted after 3 attempts" in ln, ln
        assert took < 30, took
        t0 = time.monotonic()
        reply = kernel.kc.execute_interactive(
            "%%gpu_parallel --quiet\nsq = []\nfor i in range(8):\n    sq.append(i)\n",
            timeout=60,
            output_hook=kernel._take,
        )
        assert reply["content"]["status"] == "error"
        assert time.monotonic() - t0 < 10
        assert "No live engine" in reply["content"]["evalue"], reply["content"]
    finally:
        kernel.run("_E.engine_env, _R.BACKOFF = _real_env, 0.5")


def test_a_terminal_shell_has_no_watch(cluster):
    """No event loop runs in this thread (IPython in a terminal, a script):
    the next cell or status restarts, as before."""
    assert restart_watch.watch(cluster) is None
    assert gc_mod.current() is cluster


def test_a_cell_naming_an_engine_being_restarted_waits_for_it(ip, own_cluster):
    """``--targets 1`` while engine 1 restarts (now noticed between cells): the
    cell runs on its device's new engine, not ``no live engine [1]``."""
    os.kill(own_cluster.engines[1].pid, signal.SIGKILL)
    time.sleep(0.3)
    gc_mod.status()  # the restart begins (no event loop here: status does it)
    assert own_cluster.restarts.restarting(1)
    ip.user_ns["sq"] = []
    result = ip.run_cell(
        "%%gpu_parallel --quiet --targets 1\nfor i in range(6):\n    sq.append(i * i)\n"
    )
    assert result.error_in_exec is None, result.error_in_exec
    assert ip.user_ns["sq"] == [i * i for i in range(6)]
    (new,) = [e for e in own_cluster.engines if e not in (0, 1)]
    assert gpucell.last_run.engines == (new,)


def test_a_distributed_cell_sent_during_a_restart_waits_for_the_device(
    ip, own_cluster, capsys
):
    """A process group's size is every selected device: ``%%gpu_distributed``
    waits for the engine being restarted (was a raw ``IndexError: No such
    engine`` after 30 s)."""
    os.kill(own_cluster.engines[1].pid, signal.SIGKILL)
    time.sleep(0.3)
    gc_mod.status()  # the restart begins (no event loop here: status does it)
    assert own_cluster.restarts.restarting(1)
    result = ip.run_cell(
        "%%gpu_distributed --quiet --out ws\nimport os\nws = os.environ['WORLD_SIZE']\n"
    )
    assert result.error_in_exec is None, result.error_in_exec
    assert ip.user_ns["ws"] == "2"
    assert "waiting for the restart of engine(s) [1]" in capsys.readouterr().out
