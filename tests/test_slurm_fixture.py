"""The real-Slurm fixture (tests/slurm_cluster.py) leaves nothing behind: a test
that fails while its job step runs still gets its job cancelled, its
``slurmstepd`` and tasks ended and the daemons stopped; a process that outlives
all that fails the module loudly, named.  Proven on a pytest run of its own
(a subprocess), whose tests fail on purpose."""

from __future__ import annotations

import os
import subprocess
import sys
import time

import pytest
import slurm_cluster

pytestmark = pytest.mark.cluster

INNER = """
import os, subprocess, time
import slurm_cluster

slurm = slurm_cluster.slurm


def test_fails_while_a_step_runs(slurm):
    with open(os.environ["WHERE"], "w") as f:
        f.write(str(slurm.conf))
    job = slurm.run(
        "sbatch", "--parsable", "--output=/dev/null", "--wrap", "srun sleep 300"
    ).strip()
    for _ in range(100):
        if f"{job}.0 " in slurm.run("squeue", "-h", "-s", "-o", "%i %j"):
            break
        time.sleep(0.1)
    assert any("sleep 300" in c for _, c in slurm.processes())
    assert False, "on purpose, inside the step"


def test_leaves_a_process_of_its_slurm(slurm):
    subprocess.Popen(["sleep", "301"], env=slurm.env, start_new_session=True)
"""


def _of(conf: str) -> list[str]:
    """Commands of live processes whose environment names ``conf``."""
    needle = f"SLURM_CONF={conf}".encode()
    found = []
    for entry in os.listdir("/proc"):
        try:
            with open(f"/proc/{entry}/environ", "rb") as f:
                if needle in f.read().split(b"\0"):
                    with open(f"/proc/{entry}/cmdline", "rb") as c:
                        found.append(c.read().replace(b"\0", b" ").decode())
        except OSError:
            continue
    return found


def test_a_test_failing_mid_step_leaves_no_slurm_process(tmp_path):
    why = slurm_cluster.missing()
    if why:
        pytest.skip(why)
    (tmp_path / "test_inner.py").write_text(INNER)
    where = tmp_path / "conf"
    t0 = time.monotonic()
    run = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider"]
        + ["test_inner.py"],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=120,
        env={**os.environ, "WHERE": str(where)},
    )
    took = time.monotonic() - t0
    out = run.stdout + run.stderr
    assert run.returncode == 1, out
    assert "1 failed, 1 passed, 1 error" in out, out
    assert "on purpose, inside the step" in out
    # the step's processes were ended by the cleanup; only the stray is named
    assert "1 process(es) of the test Slurm outlived" in out, out
    named = out.split("outlived")[1].split("=====")[0]
    assert "sleep 301" in named and "sleep 300" not in named, out
    assert "slurmstepd" not in named, out
    assert _of(where.read_text()) == []
    print(f"\nthe inner run (Slurm up, a step, the cleanup): {took:.1f} s")
