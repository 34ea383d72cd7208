"""A site's batch defaults in an IPython profile (``c.GpuCell.slurm_*`` in its
``ipython_config.py``): ``%gpu_cluster start --profile hpc`` submits the job
they describe, the command line overrides them, ``--dry-run`` shows the merged
values and where each came from.  Real profile folders (IPYTHONDIR in tmp);
the last test submits to the real Slurm of tests/slurm_cluster.py.
"""

from __future__ import annotations

import subprocess

import pytest
import slurm_cluster
import test_slurm_checkpoint as real_slurm
from IPython.core.error import UsageError

import gpucell.cluster.lifecycle as gc_mod
from gpucell.cluster.site import merge
from gpucell.errors import ClusterError

slurm = slurm_cluster.slurm  # the module-scoped fixture: a real Slurm
_wait_no_jobs = real_slurm._wait_no_jobs

SITE = """\
c = get_config()  # noqa
c.GpuCell.slurm_scheduler = "slurm"
c.GpuCell.slurm_partition = "gpu"
c.GpuCell.slurm_account = "proj42"
c.GpuCell.slurm_time = "2:00:00"
c.GpuCell.slurm_directives = ["--mem-per-cpu=4G"]
c.GpuCell.slurm_prologue = ["module load cuda/12.4"]
c.GpuCell.slurm_jobs = 2
c.GpuCell.slurm_resubmit = 1
"""


@pytest.fixture
def ipython_dir(tmp_path, monkeypatch):
    monkeypatch.setenv("IPYTHONDIR", str(tmp_path / "ipython"))
    return tmp_path / "ipython"


def _profile(ipython_dir, name: str, text: str):
    folder = ipython_dir / f"profile_{name}"
    folder.mkdir(parents=True)
    (folder / "ipython_config.py").write_text(text)
    return folder


def _line(**kw):
    base = dict.fromkeys(
        ("nodes", "gpus_per_node", "cpus_per_node", "partition", "time")
        + ("account", "jobs", "checkpoint", "scheduler", "directives")
    )
    return {**base, "slurm": False, **kw}


def test_the_profile_gives_the_job_and_the_command_line_overrides_it(ipython_dir):
    _profile(ipython_dir, "hpc", SITE)
    m = merge(_line(nodes=4, time="30", directives=["--qos=high"]), "hpc")
    r = m.request
    assert (r.scheduler, r.partition, r.account, r.time) == (
        "slurm",
        "gpu",
        "proj42",
        "30",
    )
    assert (r.jobs, r.checkpoint, r.nodes) == (2, 1, 4)
    assert r.directives == ("--mem-per-cpu=4G", "--qos=high")  # site's first
    assert r.prologue == ("module load cuda/12.4",)
    assert m.origin["time"] == "command line --time"
    assert m.origin["partition"].startswith("profile hpc: c.GpuCell.slurm_partition")
    # a profile without a scheduler: no batch job unless the line asks for one
    _profile(ipython_dir, "plain", 'c = get_config()\nc.GpuCell.slurm_time = "5"\n')
    assert merge(_line(), "plain").request is None
    assert merge(_line(slurm=True), "plain").request.time == "5"


def test_dry_run_shows_the_merged_values_and_where_each_came_from(
    ip, ipython_dir, no_active_cluster, capsys
):
    _profile(ipython_dir, "hpc", SITE)
    ip.run_line_magic(
        "gpu_cluster",
        "start --profile hpc --nodes 2 --partition debug "
        "--slurm-directive=--qos=high --dry-run",
    )
    out = capsys.readouterr().out
    assert "# the job's settings, merged:" in out
    assert "partition  = debug  (command line --partition)" in out
    assert "account    = proj42  (profile hpc: c.GpuCell.slurm_account in " in out
    assert "#SBATCH --partition=debug" in out and "#SBATCH --account=proj42" in out
    assert out.index("#SBATCH --mem-per-cpu=4G") < out.index("#SBATCH --qos=high")
    assert "module load cuda/12.4" in out
    assert "# job 2 of 2" in out  # the profile's --jobs 2
    assert "nothing was submitted (--dry-run)" in out
    assert gc_mod._current is None


def test_a_wrong_setting_in_the_profile_is_named(ip, ipython_dir, no_active_cluster):
    _profile(ipython_dir, "bad", 'c = get_config()\nc.GpuCell.slurm_jobs = "two"\n')
    with pytest.raises(ClusterError, match="--profile bad: GpuCell setting"):
        merge(_line(), "bad")
    with pytest.raises(UsageError, match="--nodes is for --slurm"):
        _profile(ipython_dir, "local", "c = get_config()\n")
        ip.run_line_magic("gpu_cluster", "start --profile local --nodes 2")


def _prologue_env() -> dict:
    import os

    return {
        "site": os.environ.get("GPUCELL_SITE"),
        "partition": os.environ.get("SLURM_JOB_PARTITION"),
    }


def test_start_with_the_profile_alone_submits_the_sites_job(
    ip, slurm, ipython_dir, no_active_cluster, capsys
):
    _profile(
        ipython_dir,
        "hpc",
        'c = get_config()\nc.GpuCell.slurm_scheduler = "slurm"\n'
        'c.GpuCell.slurm_partition = "debug"\n'
        "c.GpuCell.slurm_prologue = ['export GPUCELL_SITE=hpc-$SLURM_JOB_ID']\n"
        "c.GpuCell.slurm_directives = ['--comment=from-the-profile']\n"
        "c.GpuCell.slurm_resubmit = 2\n",
    )
    ip.run_line_magic("gpu_cluster", "start --profile hpc --gpus-per-node 2")
    assert "2 engines" in capsys.readouterr().out
    gc = gc_mod.current()
    try:
        job = str(gc.cluster.engines["slurm"].job_id)
        seen = gc.client[:].apply_sync(_prologue_env)
        assert [s["site"] for s in seen] == [f"hpc-{job}"] * 2
        assert {s["partition"] for s in seen} == {"debug"}
        comment = subprocess.run(
            ["squeue", "-h", "-j", job, "-o", "%k"],
            capture_output=True,
            text=True,
            env=slurm.env,
        ).stdout.strip()
        assert comment == "from-the-profile"
        assert gc.restarts.batch.resubmit == 2  # the profile's --checkpoint
    finally:
        ip.run_line_magic("gpu_cluster", "stop")
    assert _wait_no_jobs(slurm, 20) == []
