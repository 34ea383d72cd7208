"""A kernel connected to a cluster another kernel started (issue 29): when that
kernel restarts an engine that died, the connected kernel takes the new engine
in the dead one's place (its device's label) instead of showing the device dead
for good; it launches nothing itself, and shuts no engine of the other kernel's
down.  The owning kernel is a real process; this one connects by profile.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

import pytest

import gpucell
import gpucell.cluster.lifecycle as gc_mod

pytestmark = pytest.mark.cluster

#: the kernel that owns the cluster: a terminal's, so its `status` calls start
#: the restarts; it stops the cluster when its stdin closes
OWNER = """
import select, sys, time
import gpucell
gc = gpucell.start_cluster(2, gpus="none", profile="adopt")
print(" ".join(f"{e}:{i.pid}" for e, i in sorted(gc.engines.items())), flush=True)
while not select.select([sys.stdin], [], [], 0.1)[0]:
    gpucell.status()
gpucell.stop()
"""


def test_a_connected_kernel_takes_the_engine_its_owner_restarted(
    ip, no_active_cluster, tmp_path, monkeypatch
):
    monkeypatch.setenv("IPYTHONDIR", str(tmp_path / "ipython"))
    owner = subprocess.Popen(
        [sys.executable, "-c", OWNER],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
        cwd=tmp_path,
    )
    try:
        line = owner.stdout.readline().split()
        assert line, "the owning kernel did not start its cluster"
        pids = {int(e): int(p) for e, p in (x.split(":") for x in line)}
        ip.run_line_magic("gpu_cluster", "connect --profile adopt --timeout 30")
        gc = gc_mod.current()
        assert sorted(gc.engines) == [0, 1] and not gc.owned
        label = gc.engines[1].label
        os.kill(pids[1], signal.SIGKILL)
        deadline = time.monotonic() + 40
        rows = gc_mod.status()
        while 1 in gc.engines or len(gc.engines) < 2:
            assert time.monotonic() < deadline, f"never took the new engine: {rows}"
            time.sleep(0.1)
            rows = gc_mod.status()
        (new,) = set(gc.engines) - {0}
        assert gc.engines[new].label == label
        # live (busy a moment: it imports what the kernel has), none dead
        assert {r.state for r in rows} <= {"idle", "busy"}, rows
        ip.user_ns["out"] = []
        ip.run_cell_magic(
            "gpu_parallel", "--quiet", "for i in range(12):\n    out.append(i * i)\n"
        )
        assert ip.user_ns["out"] == [i * i for i in range(12)]
        assert {c.engine for c in gpucell.last_run.chunks} == {0, new}
    finally:
        if gc_mod._current is not None:
            ip.run_line_magic("gpu_cluster", "stop")  # (disconnects)
        owner.stdin.close()
        try:
            owner.wait(30)
        except subprocess.TimeoutExpired:
            owner.kill()
            owner.wait(10)
