"""``%gpu_cluster start --slurm``: engines as a job of a real Slurm.

slurmctld and two slurmd (the second as ``node2``, in its own UTS namespace), with
two fake GPUs each (tests/slurm_cluster.py).  Skipped with the reason where root or
Slurm's packages are missing; ``.ci/run`` installs them.
"""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile
import time

import pytest
import slurm_cluster
from helpers import QUICK_GIVE_UP
from IPython.core.error import UsageError

import gpucell
import gpucell.cluster.lifecycle as gc_mod
from gpucell.cluster.slurm import SlurmRequest, batch_template
from gpucell.errors import ClusterError

pytestmark = pytest.mark.cluster

slurm = slurm_cluster.slurm  # the module-scoped fixture: a real Slurm


def _engine_env() -> dict:
    import os
    import socket

    return {
        "host": socket.gethostname(),
        "cvd": os.environ.get("CUDA_VISIBLE_DEVICES"),
        "local": os.environ.get("SLURM_LOCALID"),
        "job": os.environ.get("SLURM_JOB_ID"),
    }


def _job_engines(job: str) -> list[int]:
    """Engine processes of Slurm job ``job`` still running on this machine."""
    import psutil

    out = []
    for p in psutil.process_iter(["cmdline"]):
        try:
            if "ipyparallel.engine" not in " ".join(p.info["cmdline"] or []):
                continue
            if p.environ().get("SLURM_JOB_ID") == job:
                out.append(p.pid)
        except (psutil.NoSuchProcess, psutil.AccessDenied):
            pass
    return out


def _wait_no_jobs(slurm, timeout: float) -> list[str]:
    deadline = time.monotonic() + timeout
    while slurm.jobs() and time.monotonic() < deadline:
        time.sleep(0.1)
    return slurm.jobs()


def test_two_nodes_of_two_gpus_give_four_pinned_engines_and_stop_cancels_the_job(
    ip, slurm, no_active_cluster, capsys
):
    ip.run_line_magic(
        "gpu_cluster", "start --slurm --nodes 2 --gpus-per-node 2 --timeout 90"
    )
    assert "4 engines" in capsys.readouterr().out
    gc = gc_mod.current()
    seen = gc.client[:].apply_sync(_engine_env)
    assert {s["host"] for s in seen} == set(slurm.nodes)
    for s in seen:  # each its own GPU first, by its rank on its node
        own = str(int(s["local"]) % 2)
        assert s["cvd"] == ",".join([own, *[g for g in "01" if g != own]]), s
    assert sorted((s["host"], s["cvd"][0]) for s in seen) == sorted(
        (h, g) for h in slurm.nodes for g in "01"
    )
    assert {e.kind for e in gc.engines.values()} == {"gpu"}
    job = seen[0]["job"]
    assert [j.split()[0] for j in slurm.jobs()] == [job]
    ip.user_ns["out"] = []
    ip.run_cell_magic(
        "gpu_parallel", "--quiet", "for i in range(40):\n    out.append(i * 3)\n"
    )
    assert ip.user_ns["out"] == [i * 3 for i in range(40)]
    assert len(_job_engines(job)) >= 4
    ip.run_line_magic("gpu_cluster", "stop")
    assert _wait_no_jobs(slurm, 20) == []
    deadline = time.monotonic() + 10
    while _job_engines(job) and time.monotonic() < deadline:
        time.sleep(0.2)
    assert _job_engines(job) == []


def test_site_directives_and_prologue_reach_the_job(
    ip, slurm, no_active_cluster, monkeypatch, capsys
):
    """A site's extra directive and prologue (GpuCell settings and
    --slurm-directive) are in the job: the engines see both, and the script
    submitted is the one --dry-run shows for the same cluster."""
    from gpucell.cluster.slurm import preview
    from gpucell.config import settings

    s = settings()
    monkeypatch.setattr(s, "slurm_prologue", ["export GPUCELL_PROLOGUE=$SLURM_JOB_ID"])
    monkeypatch.setattr(s, "slurm_directives", ["--cpus-per-task=1"])
    ip.run_line_magic(
        "gpu_cluster",
        "start --slurm --gpus-per-node 2 --slurm-directive=--comment=gpucell-site "
        "--timeout 90",
    )
    capsys.readouterr()
    gc = gc_mod.current()
    try:
        seen = gc.client[:].apply_sync(_site_env)
        job = seen[0]["job"]
        assert [x["prologue"] for x in seen] == [job, job]  # the prologue ran
        assert [x["cpus"] for x in seen] == ["1", "1"]  # the config's directive
        comment = subprocess.run(
            ["squeue", "-h", "-j", job, "-o", "%k"],
            capture_output=True,
            text=True,
            env=slurm.env,
        ).stdout.strip()
        assert comment == "gpucell-site"  # the line's directive
        c = gc.cluster
        with open(os.path.join(c.profile_dir, "log", "gpucell.sbatch")) as f:
            submitted = f.read()
        shown = preview(
            SlurmRequest(gpus_per_node=2, directives=("--comment=gpucell-site",)),
            gc_mod._remote_engine_args(list(gc.engine_args)),
            None,
            c.profile_dir,
            c.cluster_id,
        )
        assert shown.script == submitted
    finally:
        ip.run_line_magic("gpu_cluster", "stop")
    assert _wait_no_jobs(slurm, 20) == []


def _site_env() -> dict:
    import os

    return {
        "job": os.environ.get("SLURM_JOB_ID"),
        "prologue": os.environ.get("GPUCELL_PROLOGUE"),
        "cpus": os.environ.get("SLURM_CPUS_PER_TASK"),
    }


def test_a_job_slurm_rejects_fails_with_sbatch_reason(ip, slurm, no_active_cluster):
    with pytest.raises(UsageError, match="Slurm refused the job.*") as info:
        ip.run_line_magic("gpu_cluster", "start --slurm --gpus-per-node 3 --timeout 30")
    assert "configuration is not available" in str(info.value)
    assert gc_mod._current is None
    assert slurm.jobs() == []


def test_a_job_that_stays_pending_says_so_and_is_cancelled(
    ip, slurm, no_active_cluster, capsys
):
    hold = subprocess.run(
        [
            "sbatch",
            "--parsable",
            "--nodes=2",
            "--gpus-per-node=2",
            "--exclusive",
            "--output=/dev/null",
            "--wrap",
            "sleep 300",
        ],
        capture_output=True,
        text=True,
        env=slurm.env,
        check=True,
    ).stdout.strip()
    try:
        with pytest.raises(UsageError, match="still pending after 3 s"):
            ip.run_line_magic(
                "gpu_cluster", "start --slurm --gpus-per-node 2 --timeout 3"
            )
        assert "is pending" in capsys.readouterr().out
        assert [j.split()[0] for j in slurm.jobs()] == [hold]
    finally:
        subprocess.run(["scancel", hold], env=slurm.env)
    assert _wait_no_jobs(slurm, 20) == []


KERNEL = """
import time
import gpucell
from gpucell.cluster.slurm import SlurmRequest
{quick}
gpucell.start_cluster(slurm=SlurmRequest(nodes=2, gpus_per_node=2), timeout=90)
print("ready", flush=True)
time.sleep(600)
""".replace("{quick}", QUICK_GIVE_UP)


def test_a_killed_kernel_leaves_no_job_and_no_engine(slurm, tmp_path):
    kernel = subprocess.Popen(
        [sys.executable, "-c", KERNEL],
        stdout=subprocess.PIPE,
        text=True,
        cwd=tmp_path,
        env=slurm.env,
    )
    try:
        assert kernel.stdout.readline().strip() == "ready"
        assert len(slurm.jobs()) == 1
        kernel.kill()
        kernel.wait(10)
        assert _wait_no_jobs(slurm, 30) == [], "the job outlived its kernel by 30 s"
    finally:
        kernel.kill()


def test_requests_are_checked_before_anything_is_submitted(ip, no_active_cluster):
    with pytest.raises(ClusterError, match="at least 1 node"):
        SlurmRequest(nodes=0)
    with pytest.raises(ClusterError, match="plain Slurm value"):
        batch_template(SlurmRequest(partition="gpu; rm -rf /"))
    with pytest.raises(UsageError, match="--nodes is for --slurm"):
        ip.run_line_magic("gpu_cluster", "start --nodes 2")
    with pytest.raises(UsageError, match="choose one"):
        ip.run_line_magic("gpu_cluster", "start --slurm --ssh node2")
    t = batch_template(SlurmRequest(nodes=2, gpus_per_node=4, time="1:00:00"))
    assert "#SBATCH --gpus-per-node=4" in t and "#SBATCH --ntasks=8" in t
    assert "#SBATCH --time=1:00:00" in t and t.rstrip().endswith(
        "srun {program_and_args}"
    )
    assert gpucell  # the package is importable without a Slurm


def _cpu_engine_env() -> dict:
    import os
    import socket

    return {
        "host": socket.gethostname(),
        "cvd": os.environ.get("CUDA_VISIBLE_DEVICES"),
        "gpus": os.environ.get("SLURM_JOB_GPUS"),
        "omp": os.environ.get("OMP_NUM_THREADS"),
        "cores": sorted(os.sched_getaffinity(0)),
    }


def test_a_cpu_partition_gives_one_engine_per_core_without_gpus(
    ip, slurm, no_active_cluster, capsys
):
    """--cpus-per-node on nodes that have GPUs: none is asked for or seen, each
    engine is bound to its core and its thread pools sized to it."""
    ip.run_line_magic(
        "gpu_cluster",
        "start --slurm --partition debug --nodes 2 --cpus-per-node 2 --timeout 90",
    )
    assert "4 engines" in capsys.readouterr().out
    gc = gc_mod.current()
    try:
        seen = gc.client[:].apply_sync(_cpu_engine_env)
        assert sorted(s["host"] for s in seen) == sorted(slurm.nodes * 2)
        for s in seen:
            assert not s["cvd"] and not s["gpus"], s
            assert s["omp"] == str(len(s["cores"])) == "1", s
        assert {e.kind for e in gc.engines.values()} == {"cpu"}
        ip.user_ns["out"] = []
        ip.run_cell_magic(
            "gpu_parallel", "--quiet", "for i in range(20):\n    out.append(i + 1)\n"
        )
        assert ip.user_ns["out"] == [i + 1 for i in range(20)]
    finally:
        ip.run_line_magic("gpu_cluster", "stop")
    assert _wait_no_jobs(slurm, 20) == []


def _host_of(i) -> str:
    import socket

    return socket.gethostname()


def _slow_until_joined(folder: str):
    """``f(i)``: the host that ran iteration ``i``; 0.25 s an iteration until
    two engines on node2 have each run one (their marks in ``folder``)."""

    def f(i: int) -> str:
        import os
        import socket
        import time

        host = socket.gethostname()
        if host == "node2":  # (a file of the iteration's own)
            open(os.path.join(folder, f"{os.getpid()}-{i}"), "w").close()
        else:
            # (listed from another thread: the harness's polling is not the
            # loop's own listing, which the engines' file watch notes)
            import threading

            names: list = []
            t = threading.Thread(target=lambda: names.extend(os.listdir(folder)))
            t.start()
            t.join()
            if len({name.split("-")[0] for name in names}) < 2:
                time.sleep(0.25)
        return host

    return f


def _block_node2(slurm) -> str:
    """A job holding node2's GPUs, so a job that needs them stays pending."""
    return subprocess.run(
        [
            "sbatch",
            "--parsable",
            "--nodelist=node2",
            "--gpus-per-node=2",
            "--exclusive",
            "--output=/dev/null",
            "--wrap",
            "sleep 300",
        ],
        capture_output=True,
        text=True,
        env=slurm.env,
        check=True,
    ).stdout.strip()


def test_jobs_start_cells_on_the_first_job_and_the_held_one_joins_later(
    ip, slurm, no_active_cluster, capsys
):
    """--jobs 2 with node2 taken: the start returns with the first job's two
    engines, a cell runs on them; the second job, held, is in the status with
    squeue's reason; released (and node2 freed) its engines join, and the next
    cell runs on all four, still equal to serial."""
    blocker = _block_node2(slurm)
    try:
        ip.run_line_magic(
            "gpu_cluster", "start --slurm --nodes 2 --gpus-per-node 2 --jobs 2"
        )
        out = capsys.readouterr().out
        assert "2 engines" in out
        gc = gc_mod.current()
        first, second = gc.cluster.engines["slurm"], gc.cluster.engines["slurm-2"]
        subprocess.run(["scontrol", "hold", str(second.job_id)], env=slurm.env)
        assert gc.restarts.joining == 2
        code = "for i in range(30):\n    out.append((i * 2, host_of(i)))\n"
        ip.user_ns.update(out=[], host_of=_host_of)
        ip.run_cell_magic("gpu_parallel", "--quiet", code)
        assert [x[0] for x in ip.user_ns["out"]] == [i * 2 for i in range(30)]
        ip.run_line_magic("gpu_cluster", "status")
        status = capsys.readouterr().out
        # (JobHeldAdmin: the tests run as root)
        assert f"Slurm job {second.job_id} (JobHeld" in status, status
        assert "pending; 2 more engines join as they start" in status
        subprocess.run(["scancel", blocker], env=slurm.env)
        subprocess.run(["scontrol", "release", str(second.job_id)], env=slurm.env)
        # a cell running meanwhile takes them as they come (as restarted ones);
        # its iterations take 0.25 s each until both have run one (then none)
        slow = "for i in range(160):\n    out.append(host_until_joined(i))\n"
        marks = tempfile.mkdtemp(prefix="joined-", dir=slurm.root)
        os.chmod(marks, 0o777)
        ip.user_ns.update(out=[], host_until_joined=_slow_until_joined(marks))
        ip.run_cell_magic("gpu_parallel", "", slow)
        assert len(ip.user_ns["out"]) == 160
        joined_mid_cell = len(gc.engines) == 4
        said = capsys.readouterr().out
        assert joined_mid_cell and "node2" in ip.user_ns["out"], said
        assert "engine 2 (GPU" in said and ") joined; it takes work now" in said
        deadline = time.monotonic() + 60
        while len(gc.engines) < 4 and time.monotonic() < deadline:
            gc.refresh()  # what status does
            time.sleep(0.5)
        assert len(gc.engines) == 4 and gc.restarts.joining == 0
        assert {e.host for e in gc.engines.values()} == set(slurm.nodes)
        ip.run_line_magic("gpu_cluster", "status")
        assert "pending" not in capsys.readouterr().out
        ip.user_ns["out"] = []
        ip.run_cell_magic("gpu_parallel", "--quiet", code)
        assert [x[0] for x in ip.user_ns["out"]] == [i * 2 for i in range(30)]
        assert {x[1] for x in ip.user_ns["out"]} == set(slurm.nodes)
        assert first.job_id != second.job_id
    finally:
        subprocess.run(["scancel", blocker], env=slurm.env)
        if gc_mod._current is not None:
            ip.run_line_magic("gpu_cluster", "stop")
    assert _wait_no_jobs(slurm, 20) == []


def _connection_env() -> dict:
    import os

    return {k: v for k, v in os.environ.items() if k.startswith("IPP_")}


def test_slurm_engines_are_encrypted_and_the_key_lies_in_no_shared_place(
    ip, slurm, no_active_cluster, capsys
):
    """A --slurm cluster is encrypted (CurveZMQ) as local and --ssh ones are:
    the job's engines register through the handshake with the server key of
    the 0600 connection file in the profile's 0700 security folder (not in
    their environment, the job script or its log), and a party that
    subscribes, with no key, to every port the controller opened reads
    nothing of a cell's output (test_ssh_curve.py's probe; its control run
    shows the probe reads such output in clear)."""
    import json
    import stat
    import uuid

    from test_ssh_curve import PROBE, _info, _ports

    ip.run_line_magic("gpu_cluster", "start --slurm --gpus-per-node 2 --timeout 90")
    capsys.readouterr()
    gc = gc_mod.current()
    try:
        key = _info(gc, "engine").get("curve_serverkey")
        assert key and gc.client.curve_serverkey
        security = os.path.join(gc.cluster.profile_dir, "security")
        path = os.path.join(
            security, f"ipcontroller-{gc.cluster.cluster_id}-engine.json"
        )
        assert stat.S_IMODE(os.stat(path).st_mode) == 0o600
        assert stat.S_IMODE(os.stat(security).st_mode) == 0o700
        envs = gc.client[:].apply_sync(_connection_env)
        assert all(key not in json.dumps(e) for e in envs), envs
        log = os.path.join(gc.cluster.profile_dir, "log")
        for name in os.listdir(log):  # the job script, the engines' output
            with open(os.path.join(log, name), errors="replace") as f:
                assert key not in f.read(), name
        marker = f"secret-{uuid.uuid4().hex}"
        probe = subprocess.Popen(
            [sys.executable, "-c", PROBE, json.dumps(_ports(gc)), marker],
            stdin=subprocess.PIPE,  # it reads until this closes
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        assert probe.stdout.readline().strip() == "ready"  # connected to each port
        ip.user_ns["marker"] = marker
        end = time.monotonic() + 2.5
        while time.monotonic() < end:
            ip.run_cell_magic(
                "gpu_parallel", "--quiet", "for i in range(4):\n    print(marker, i)\n"
            )
        out, err = probe.communicate(timeout=60)  # (closes its stdin: done)
        assert probe.returncode == 0, err
        assert json.loads(out.strip().splitlines()[-1]) == {
            "messages": 0,
            "marker": False,
        }
        ip.run_line_magic("gpu_cluster", "status")
        assert "encrypted: no" not in capsys.readouterr().out
    finally:
        ip.run_line_magic("gpu_cluster", "stop")
    assert _wait_no_jobs(slurm, 20) == []
