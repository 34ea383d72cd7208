"""The ``gpucell`` logger hears the dispatcher's and the restarts' decisions
(issue 32): a lost engine, its chunks sent again, each restart attempt, the
engine back, a restart given up, a chunk that failed, device memory retried,
the stop.  On real clusters with a handler put on ``gpucell``; the notebook's
own root handlers hear none of it (the logger does not propagate)."""

from __future__ import annotations

import logging
import os
import signal
import threading
import time
from collections.abc import Iterator

import pytest

import gpucell.cluster.lifecycle as gc_mod
from gpucell.cluster import engines as engines_mod

pytestmark = pytest.mark.cluster


class Keep(logging.Handler):
    def __init__(self) -> None:
        super().__init__()
        self.lines: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.lines.append(f"{record.levelname} {record.name}: {record.getMessage()}")

    def having(self, name: str, text: str) -> list[str]:
        return [x for x in self.lines if f" {name}: " in x and text in x]


@pytest.fixture
def heard() -> Iterator[Keep]:
    """A handler on ``gpucell`` at INFO, and one on the root logger that must
    hear nothing of gpucell's."""
    gl, root = logging.getLogger("gpucell"), logging.getLogger()
    keep, notebook = Keep(), Keep()
    gl.addHandler(keep)
    gl.setLevel(logging.INFO)
    root.addHandler(notebook)
    try:
        yield keep
    finally:
        gl.removeHandler(keep)
        gl.setLevel(logging.NOTSET)
        root.removeHandler(notebook)
    assert not [x for x in notebook.lines if " gpucell" in x], notebook.lines


def test_a_killed_engine_is_logged_from_loss_to_its_return(ip, own_cluster, heard):
    victim = own_cluster.engines[1]
    ip.user_ns["out"] = []
    threading.Timer(0.6, os.kill, (victim.pid, signal.SIGKILL)).start()
    cell = "import time\nfor i in range(80):\n    time.sleep(0.08)\n    out.append(i)\n"
    ip.run_cell_magic("gpu_parallel", "--quiet --schedule dynamic --chunksize 2", cell)
    assert ip.user_ns["out"] == list(range(80))
    (new,) = [e for e in own_cluster.engines if e not in (0, 1)]
    ex, rs = "gpucell.kernel.executor", "gpucell.cluster.restart"
    assert heard.having(ex, "engine 1 died; re-running"), heard.lines
    assert heard.having(ex, "were lost with engine 1; they are sent again")
    lost = heard.having(rs, f"engine 1 ({victim.label}: CPU on ")
    assert lost and "restarting it (its device's restart 1 of 3" in lost[0]
    assert lost[0].startswith("WARNING")
    assert heard.having(rs, f"restart attempt 1/3 of engine 1 ({victim.label})")
    back = heard.having(rs, f"engine 1 ({victim.label}) is back as engine {new}")
    assert back and back[0].startswith("INFO"), heard.lines
    assert heard.having(ex, f"engine 1 was restarted as engine {new}")
    # in the order they happened
    order = [
        heard.lines.index(x)
        for x in (lost[0], heard.having(rs, "restart attempt 1/3")[0], back[0])
    ]
    assert order == sorted(order)


def test_a_restart_that_fails_logs_each_attempt_and_the_end(
    ip, own_cluster, heard, monkeypatch
):
    real = engines_mod.engine_env

    def broken(spec):  # every new engine's Python exits at once
        return {**real(spec), "PYTHONHOME": "/nonexistent"}

    monkeypatch.setattr(engines_mod, "engine_env", broken)
    os.kill(own_cluster.engines[1].pid, signal.SIGKILL)
    time.sleep(0.3)
    ip.user_ns["out"] = []
    cell = "for i in range(4):\n    out.append(i)\n"
    ip.run_cell_magic("gpu_parallel", "--quiet", cell)
    assert ip.user_ns["out"] == list(range(4))
    deadline = time.monotonic() + 40
    while own_cluster.restarts.pending:
        assert time.monotonic() < deadline
        gc_mod.status()  # steps the restarts
        time.sleep(0.1)
    said = "engine 1 died since the last cell; running on 1 of 2 selected engines"
    assert heard.having("gpucell.kernel.executor", said)
    rs = "gpucell.cluster.restart"
    for n in (1, 2, 3):
        failed = heard.having(rs, f"restart attempt {n}/3 of engine 1 (")
        assert any("failed: its process exited" in x for x in failed), heard.lines
    end = heard.having(rs, "could not be restarted after 3 attempts")
    assert end and end[0].startswith("WARNING")


def test_a_failed_chunk_and_the_stop_are_logged(ip, own_cluster, heard):
    with pytest.raises(ZeroDivisionError):
        ip.run_cell_magic(
            "gpu_parallel",
            "--quiet --chunksize 2",
            "out = []\nfor i in range(8):\n    out.append(1 / (i - 5))\n",
        )
    failed = heard.having("gpucell.kernel.executor", "failed on engine")
    assert failed and "iteration 5" in failed[0]
    assert "raised ZeroDivisionError: division by zero" in failed[0]
    assert "the run stops and nothing is merged" in failed[0]
    with pytest.raises(Exception, match="timeout|timed out|--timeout"):
        ip.run_cell_magic(
            "gpu_parallel",
            "--quiet --timeout 1 --schedule dynamic --chunksize 1",
            "import time\nfor i in range(20):\n    time.sleep(0.5)\n",
        )
    stop = heard.having("gpucell.kernel.executor", "the run is stopped (its --timeout")
    assert stop and stop[0].startswith("WARNING"), heard.lines
    assert heard.having("gpucell.kernel.executor", "cancelling")


def test_device_memory_retries_are_logged(ip, own_cluster, heard, tmp_path):
    flag = str(tmp_path / "once")
    ip.user_ns["flag"] = flag
    ip.user_ns["out"] = []
    ip.run_cell_magic(
        "gpu_parallel",
        "--quiet --chunksize 2",
        "import os, torch\nfor i in range(6):\n"
        "    if i == 3 and not os.path.exists(flag):\n"
        "        open(flag, 'w').close()\n"
        "        raise torch.cuda.OutOfMemoryError('CUDA out of memory.')\n"
        "    out.append(i)\n",
    )
    assert ip.user_ns["out"] == list(range(6))
    oom = heard.having("gpucell.kernel.executor", "ran out of device memory")
    assert oom and "retrying iterations 2-3 on the same engine" in oom[0], heard.lines
