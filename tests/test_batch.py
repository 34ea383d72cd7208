"""Engines through PBS, Torque, LSF and Grid Engine (``--scheduler``): the scripts
ipyparallel's own launchers render with gpucell's template, and what such a
script does when run (one engine per GPU of its node, each pinned by its rank
and given its share of the cores).  No real PBS/LSF/SGE here (README,
Multi-node): the scripts are run by ``sh``, as one node's array element."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
from IPython.core.error import UsageError

import gpucell.cluster.lifecycle as gc_mod
from gpucell.cluster.batch import SCHEDULERS, directive_line, launcher_class
from gpucell.cluster.slurm import SlurmRequest, batch_template, preview
from gpucell.config import settings
from gpucell.errors import ClusterError


@pytest.fixture
def site(monkeypatch):
    s = settings()
    for name in ("slurm_directives", "slurm_prologue", "slurm_skip", "slurm_shebang"):
        monkeypatch.setattr(s, name, getattr(s, name))
    return s


def _show(scheduler: str, tmp_path: Path, **kw) -> tuple[list[str], list[str]]:
    req = SlurmRequest(scheduler=scheduler, **kw)
    p = preview(
        req, ["--IPEngine.log_level=WARN"], "/venv/bin/python", str(tmp_path), "c1"
    )
    return p.script.splitlines(), p.command


def test_each_scheduler_asks_for_a_node_of_gpus_per_array_element(tmp_path):
    got = {
        s: _show(s, tmp_path / s, nodes=2, gpus_per_node=4, partition="q1")
        for s in SCHEDULERS
    }
    pbs, cmd = got["pbs"]
    assert pbs[:5] == [
        "#!/bin/sh",
        "#PBS -V",
        "#PBS -N gpucell-c1",
        "#PBS -J 1-2",
        "#PBS -l select=1:ncpus=4:ngpus=4",
    ]
    assert "#PBS -q q1" in pbs and cmd == [
        "qsub",
        str(tmp_path / "pbs/log/gpucell.pbs"),
    ]
    assert "#PBS -t 1-2" in got["torque"][0]
    assert "#PBS -l nodes=1:ppn=4:gpus=4" in got["torque"][0]
    lsf, cmd = got["lsf"]
    assert lsf[2] == "#BSUB -J gpucell-c1[1-2]" and "gpucell-c1" not in lsf[3]
    assert '#BSUB -gpu "num=4"' in lsf and '#BSUB -R "span[hosts=1]"' in lsf
    assert cmd[0] == "bsub"
    sge = got["sge"][0]
    assert "#$ -t 1-2" in sge and "#$ -pe smp 4" in sge and "#$ -q q1" in sge
    for s, (lines, _) in got.items():
        # ipyparallel's fields filled: the job's name and output file
        assert not any("{" in x or "}" in x for x in lines), (s, lines)
        assert any(f"{tmp_path / s}/log/ipengine-c1-slurm-" in x for x in lines), s
        assert any("gpucell-c1" in x for x in lines), s
        engines = [x for x in lines if "gpucell.cluster.boot" in x]
        assert len(engines) == 4, s  # one a GPU of the node, each its rank
        for r, x in enumerate(engines):
            assert x.startswith(f"GPUCELL_LOCAL_RANK={r} GPUCELL_LOCAL_SIZE=4 ")
            assert x.endswith(" &")
        assert lines[-1] == "wait", s  # the job lasts as long as its engines


def test_one_node_is_no_array_and_cpu_nodes_ask_for_no_gpu(tmp_path):
    pbs, _ = _show("pbs", tmp_path, cpus_per_node=8)
    assert not any(" -J " in x for x in pbs) and "#PBS -l select=1:ncpus=8" in pbs
    assert "export CUDA_VISIBLE_DEVICES=" in pbs
    lsf, _ = _show("lsf", tmp_path / "l", cpus_per_node=2)
    assert not any("-gpu" in x for x in lsf) and "#BSUB -n 2" in lsf
    assert not any("[1-" in x for x in lsf)


def test_site_options_reach_each_schedulers_script(site, tmp_path):
    site.slurm_prologue = ["module load cuda"]
    site.slurm_skip = [
        "-l gpu="
    ]  # a Grid Engine site whose resource is named otherwise
    site.slurm_directives = ["-l gpus=2"]
    sge, _ = _show(
        "sge", tmp_path, gpus_per_node=2, time="1:00:00", account="proj", nodes=2
    )
    assert not any("-l gpu=" in x for x in sge)
    assert "#$ -l h_rt=1:00:00" in sge and "#$ -A proj" in sge
    assert "#$ -l gpus=2" in sge
    assert sge[sge.index("module load cuda") + 1].startswith("GPUCELL_LOCAL_RANK=0")
    site.slurm_skip, site.slurm_directives = [], []
    lsf, _ = _show(
        "lsf", tmp_path / "l", time="90", account="p", directives=("#BSUB -x",)
    )
    assert "#BSUB -W 90" in lsf and "#BSUB -P p" in lsf and "#BSUB -x" in lsf
    assert directive_line("pbs", "-l mem=4gb") == "#PBS -l mem=4gb"
    for bad in ("echo hi", "", "-l a\nrm -rf /"):
        with pytest.raises(ClusterError):
            directive_line("pbs", bad)
    with pytest.raises(ClusterError, match="--scheduler 'htcondor'"):
        SlurmRequest(scheduler="htcondor")
    with pytest.raises(ClusterError, match="plain Slurm value"):
        batch_template(SlurmRequest(scheduler="pbs", partition="q;rm"))


SHOW_ENV = """
import json, os
e = os.environ
d = {"rank": e.get("GPUCELL_LOCAL_RANK"), "cvd": e.get("CUDA_VISIBLE_DEVICES"),
     "label": e.get("GPUCELL_ENGINE_LABEL"), "omp": e.get("OMP_NUM_THREADS"),
     "cores": sorted(os.sched_getaffinity(0))}
print(json.dumps(d) + chr(10), end="", flush=True)  # one write: two print at once
"""


@pytest.mark.parametrize("scheduler", SCHEDULERS)
def test_the_script_starts_one_pinned_engine_per_gpu(scheduler, tmp_path):
    """The script as the scheduler runs it on a node whose two GPUs it gave
    (``CUDA_VISIBLE_DEVICES=0,1``): two processes through gpucell.cluster.boot,
    each its GPU first and its half of the cores."""
    (tmp_path / "gpucell_show_env.py").write_text(SHOW_ENV)
    req = SlurmRequest(scheduler=scheduler, gpus_per_node=2)
    from gpucell.cluster.slurm import _engine_set

    kw = _engine_set(req, [], None, str(tmp_path))
    kw["engine_cmd"] = [sys.executable, "-m", "gpucell.cluster.boot"]
    kw["engine_args"] = ["gpucell_show_env"]
    launcher = launcher_class(scheduler)(
        work_dir=".", profile_dir=str(tmp_path), cluster_id="c1", **kw
    )
    launcher.output_file = str(tmp_path / "out.log")
    script = tmp_path / "job.sh"
    script.write_text(launcher.render_batch_script(2))
    env = {
        **os.environ,
        **launcher.get_env(),
        "CUDA_VISIBLE_DEVICES": "0,1",
        "PYTHONPATH": str(tmp_path),
    }
    out = subprocess.run(
        ["sh", str(script)], env=env, capture_output=True, text=True, timeout=60
    )
    assert out.returncode == 0, out.stderr
    seen = sorted(
        (json.loads(x) for x in out.stdout.splitlines()), key=lambda d: d["rank"]
    )
    assert [(d["rank"], d["cvd"]) for d in seen] == [("0", "0,1"), ("1", "1,0")]
    assert [d["label"].split("/")[1] for d in seen] == ["gpu0", "gpu1"]
    cores = sorted(os.sched_getaffinity(0))
    if len(cores) >= 2:  # each its half, disjoint, threads sized to it
        assert not set(seen[0]["cores"]) & set(seen[1]["cores"])
        assert sorted(seen[0]["cores"] + seen[1]["cores"]) == cores
        assert [d["omp"] for d in seen] == [str(len(d["cores"])) for d in seen]


def test_dry_run_and_bad_options(ip, site, no_active_cluster, capsys):
    ip.run_line_magic(
        "gpu_cluster",
        "start --scheduler lsf --nodes 2 --gpus-per-node 2 --partition gpu "
        "--directive='-R rusage[mem=4G]' --dry-run",
    )
    out = capsys.readouterr().out
    assert "#BSUB -q gpu\n" in out and "#BSUB -R rusage[mem=4G]\n" in out
    assert "# submitted with: bsub < " in out and "nothing was submitted" in out
    assert gc_mod._current is None
    ip.run_line_magic(
        "gpu_cluster", "start --scheduler pbs --jobs 2 --nodes 2 --dry-run"
    )
    out = capsys.readouterr().out
    assert out.count("#PBS -l select=1:ncpus=1:ngpus=1") == 2 and "# job 2 of 2" in out
    with pytest.raises(UsageError, match="choose one"):
        ip.run_line_magic("gpu_cluster", "start --slurm --scheduler pbs --dry-run")
    with pytest.raises(UsageError, match="is for --slurm"):
        ip.run_line_magic("gpu_cluster", "start --directive=-x")
    with pytest.raises(UsageError, match="--directive 'echo hi'"):
        ip.run_line_magic(
            "gpu_cluster", "start --scheduler sge --directive 'echo hi' --dry-run"
        )


#: a stand-in for qsub/bsub that runs the script on this machine as one node
#: would (in its own session, so the stand-in for qdel/bkill ends all of it)
FAKE_SUBMIT = """#!{python}
import subprocess, sys
script = sys.argv[1] if len(sys.argv) > 1 else None
if script is None:  # bsub < script
    script = {root!r} + "/stdin.sh"
    open(script, "w").write(sys.stdin.read())
log = open({root!r} + "/job.log", "ab")
p = subprocess.Popen(["sh", script], stdout=log, stderr=log, start_new_session=True)
open({root!r} + "/jobs", "a").write(f"{{p.pid}}\\n")
print({said!r}.format(p.pid))
"""
FAKE_DELETE = """#!/bin/sh
echo "$@" >> "$(dirname "$0")/../deleted"
kill -TERM -"$1"  # the job's process group
"""


@pytest.mark.cluster
@pytest.mark.parametrize(
    ("scheduler", "submit", "delete", "said"),
    [
        ("pbs", "qsub", "qdel", "{}.pbs-server"),
        ("lsf", "bsub", "bkill", "Job <{}> is submitted to default queue <normal>."),
        ("sge", "qsub", "qdel", 'Your job {} ("gpucell") has been submitted'),
    ],
)
def test_a_start_submits_the_script_and_stop_deletes_the_job(
    ip,
    no_active_cluster,
    tmp_path,
    monkeypatch,
    capsys,
    scheduler,
    submit,
    delete,
    said,
):
    """The whole start through ipyparallel's launcher with stand-ins for the
    submit and delete commands that run the script here: the engines register
    with the environment the script was given, a cell equals serial, and stop
    ends the job."""
    import psutil

    submitted = FAKE_SUBMIT.format(python=sys.executable, root=str(tmp_path), said=said)
    _stand_ins(tmp_path, monkeypatch, {submit: submitted, delete: FAKE_DELETE})
    ip.run_line_magic(
        "gpu_cluster", f"start --scheduler {scheduler} --cpus-per-node 2 --timeout 60"
    )
    assert "2 engines" in capsys.readouterr().out
    gc = gc_mod.current()
    try:
        (job,) = (tmp_path / "jobs").read_text().split()
        assert {e.kind for e in gc.engines.values()} == {"cpu"}
        ranks = gc.client[:].apply_sync(_rank)
        assert sorted(ranks) == [("0", job), ("1", job)]
        ip.user_ns["out"] = []
        ip.run_cell_magic(
            "gpu_parallel", "--quiet", "for i in range(9):\n    out.append(-i)\n"
        )
        assert ip.user_ns["out"] == [-i for i in range(9)]
    finally:
        ip.run_line_magic("gpu_cluster", "stop")
    deadline = time.monotonic() + 15
    while psutil.pid_exists(int(job)) and time.monotonic() < deadline:
        time.sleep(0.2)
    assert (tmp_path / "deleted").read_text().split() == [job]
    assert (
        not psutil.pid_exists(int(job)) or psutil.Process(int(job)).status() == "zombie"
    )


def _stand_ins(tmp_path, monkeypatch, commands: dict[str, str]) -> None:
    """The scheduler's commands as stand-in scripts in ``tmp_path/bin``, first
    on PATH (they write their files beside that folder)."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    for name, text in commands.items():
        (bin_dir / name).write_text(text)
        (bin_dir / name).chmod(0o755)
    monkeypatch.setenv("PATH", f"{bin_dir}:{os.environ['PATH']}")


def _rank() -> tuple:
    import os

    return os.environ.get("GPUCELL_LOCAL_RANK"), str(os.getsid(0))


#: a stand-in submit command whose job never starts (held), and the scheduler's
#: own status command saying so
HELD_SUBMIT = """#!/bin/sh
echo 4242 >> "$(dirname "$0")/../jobs"
echo {said!r}
""".replace("{said!r}", "'{said}'")
HELD_STATUS = {
    "pbs": (
        "qstat",
        "Job Id: 4242.pbs\n    job_state = H\n    comment = held by admin",
    ),
    "lsf": ("bjobs", "PEND Job was suspended by the user while pending;"),
    "sge": ("qstat", "job-ID prior name user state\n----\n 4242 0.5 gpucell root hqw"),
}


@pytest.mark.parametrize(
    ("scheduler", "submit", "said", "reason"),
    [
        ("pbs", "qsub", "4242.pbs-server", "held by admin"),
        ("lsf", "bsub", "Job <4242> is submitted to default queue <normal>.", "user"),
        ("sge", "qsub", 'Your job 4242 ("gpucell") has been submitted', "held"),
    ],
)
def test_a_held_job_is_said_pending_with_the_schedulers_reason(
    ip,
    no_active_cluster,
    tmp_path,
    monkeypatch,
    capsys,
    scheduler,
    submit,
    said,
    reason,
):
    """As with squeue for Slurm: the scheduler's own qstat/bjobs says the job
    is pending, the start says so once, and fails at --timeout naming it."""
    status, text = HELD_STATUS[scheduler]
    deleted = '#!/bin/sh\necho "$@" >> "$(dirname "$0")/../deleted"\n'
    commands = {
        submit: HELD_SUBMIT.format(said=said),
        status: f"#!/bin/sh\ncat <<'X'\n{text}\nX\n",
        "qdel": deleted,
        "bkill": deleted,
    }
    _stand_ins(tmp_path, monkeypatch, commands)
    with pytest.raises(UsageError, match="still pending after 2 s") as info:
        ip.run_line_magic(
            "gpu_cluster",
            f"start --scheduler {scheduler} --cpus-per-node 1 --timeout 2",
        )
    assert reason in str(info.value)
    assert f"{scheduler.upper()} job 4242" in str(info.value)
    assert f"{scheduler.upper()} job 4242 is pending" in capsys.readouterr().out
    assert (tmp_path / "deleted").read_text().split() == ["4242"]
    assert gc_mod._current is None
