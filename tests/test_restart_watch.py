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


@pytest.fixture(scope="module")
def kernel() -> Iterator[_Panel]:
    from jupyter_client.manager import start_new_kernel

    km, kc = start_new_kernel(kernel_name="python3", startup_timeout=60)
    panel = _Panel(kc)
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


def test_an_engine_killed_between_cells_restarts_with_no_cell_run(kernel):
    pids = _pids(kernel)
    assert sorted(pids) == [0, 1]
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
    # the kernel's own record agrees, and the restart logger has it
    assert _value(kernel, "sorted(gpucell.current().engines)") == [0, new]
    lines = _value(kernel, "_keep.lines")
    assert any("engine 1 (cpu1: CPU" in ln and "restarting it" in ln for ln in lines), (
        lines
    )
    assert any(f"is back as engine {new}" in ln for ln in lines), lines


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


def test_a_terminal_shell_has_no_watch(cluster):
    """No event loop runs in this thread (IPython in a terminal, a script):
    the next cell or status restarts, as before."""
    assert restart_watch.watch(cluster) is None
    assert gc_mod.current() is cluster
