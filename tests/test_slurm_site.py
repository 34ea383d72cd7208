"""What a site asks of a --slurm job's script: extra directives, directives left
out, a prologue, the first line, and --dry-run's preview.  Pure: no Slurm needed
(tests/test_slurm.py submits one such job to a real Slurm where there is one)."""

from __future__ import annotations

import json
import os
import shlex
from dataclasses import asdict

import pytest
from helpers import children, wait_gone
from IPython.core.error import UsageError

import gpucell.cluster.lifecycle as gc_mod
import gpucell.cluster.slurm as slurm_mod
from gpucell.cluster.slurm import (
    SlurmRequest,
    batch_template,
    directive_line,
    preview,
    site_request,
)
from gpucell.config import settings
from gpucell.errors import ClusterError


@pytest.fixture
def site(monkeypatch):
    """The process's GpuCell settings, restored after the test."""
    s = settings()
    for name in ("slurm_directives", "slurm_prologue", "slurm_skip", "slurm_shebang"):
        monkeypatch.setattr(s, name, getattr(s, name))
    return s


def _sbatch_lines(script: str) -> list[str]:
    return [x for x in script.splitlines() if x.startswith("#SBATCH")]


def test_extra_directives_follow_gpucells_own_config_first(site):
    site.slurm_directives = ["--mem-per-cpu=4G", "#SBATCH --constraint=a100"]
    req = SlurmRequest(gpus_per_node=2, directives=("qos=high", "-C 'a100|h100'"))
    lines = _sbatch_lines(batch_template(site_request(req)))
    assert lines[-4:] == [
        "#SBATCH --mem-per-cpu=4G",
        "#SBATCH --constraint=a100",
        "#SBATCH --qos=high",
        "#SBATCH -C 'a100|h100'",
    ]
    assert lines[0] == "#SBATCH --export=ALL"
    assert "#SBATCH --gpus-per-node=2" in lines
    # without the site's settings: the request's own only
    assert _sbatch_lines(batch_template(req))[-2:] == [
        "#SBATCH --qos=high",
        "#SBATCH -C 'a100|h100'",
    ]


@pytest.mark.parametrize(
    "bad", ["", "   ", "--", "rm -rf /", "--mem=4G\nrm -rf /", "echo hi", "#SBATCH"]
)
def test_a_directive_that_is_no_sbatch_option_is_refused(bad):
    with pytest.raises(ClusterError, match="--slurm-directive|one line each"):
        directive_line(bad)
    with pytest.raises(ClusterError):
        batch_template(SlurmRequest(directives=(bad,)))


def test_skipped_directives_are_left_out(site):
    """dask-jobqueue's job_directives_skip: a site that wants --gres=gpu:N."""
    site.slurm_skip = ["--gpus-per-node"]
    site.slurm_directives = ["--gres=gpu:2"]
    req = SlurmRequest(nodes=2, gpus_per_node=2, time="10", skip=("--time",))
    lines = _sbatch_lines(batch_template(site_request(req)))
    assert not any("--gpus-per-node" in x or "--time" in x for x in lines)
    assert lines[-1] == "#SBATCH --gres=gpu:2"
    assert "#SBATCH --ntasks=4" in lines and "#SBATCH --nodes=2" in lines


def test_the_prologue_runs_before_srun_in_the_chosen_shell(site):
    site.slurm_prologue = ["module load cuda/12.4", 'export SITE="${HOME}/x"']
    site.slurm_shebang = "#!/bin/bash -l"
    req = SlurmRequest(prologue=("source /opt/venv/bin/activate",))
    t = batch_template(site_request(req)).splitlines()
    assert t[0] == "#!/bin/bash -l"
    # braces doubled in the template: ipyparallel's formatting gives them back
    # as written (the preview test renders one)
    assert t[-4:] == [
        "module load cuda/12.4",
        'export SITE="${{HOME}}/x"',
        "source /opt/venv/bin/activate",
        "srun {program_and_args}",
    ]
    with pytest.raises(ClusterError, match="one line each"):
        batch_template(SlurmRequest(prologue=("a\nb",)))
    with pytest.raises(ClusterError, match="first line"):
        batch_template(SlurmRequest(shebang="/bin/sh"))


def test_the_preview_is_the_script_that_is_submitted(site, tmp_path):
    """--dry-run's script is rendered by the launcher that submits, and equals
    the file it writes for the same cluster; nothing is created meanwhile."""
    from gpucell.cluster.launcher import SlurmGpuEngineSetLauncher

    site.slurm_prologue = ['export GPUCELL_SITE="{braces} $HOME"']
    site.slurm_directives = ["--mem-per-cpu=4G"]
    profile = tmp_path / "profile_x"
    req = SlurmRequest(nodes=2, gpus_per_node=2, partition="gpu")
    args = ["--IPEngine.log_level=WARN"]
    p = preview(req, args, "/opt/venv/bin/python", str(profile), "1700000000-abcd")
    assert not profile.exists()  # nothing written or made
    batch = str(profile / "log" / "gpucell.sbatch")
    assert p.command == ["sbatch", batch]
    lines = p.script.splitlines()
    assert lines[0] == "#!/bin/sh"
    assert "#SBATCH --job-name=gpucell-1700000000-abcd" in lines
    assert "#SBATCH --partition=gpu" in lines and "#SBATCH --mem-per-cpu=4G" in lines
    out = [x for x in lines if x.startswith("#SBATCH --output=")]
    assert out == [
        f"#SBATCH --output={profile}/log/ipengine-1700000000-abcd-slurm-"
        f"{os.getpid()}.log"
    ]
    assert lines[-3] == 'export GPUCELL_SITE="{braces} $HOME"'
    # then the check that the kernel's controller still answers (slurm_check)
    assert shlex.split(lines[-2]) == [
        "/opt/venv/bin/python",
        "-m",
        "gpucell.cluster.slurm_check",
        str(profile),
        "1700000000-abcd",
        "||",
        "exit",
        "0",
    ]
    assert shlex.split(lines[-1]) == [
        "srun",
        "/opt/venv/bin/python",
        "-m",
        "gpucell.cluster.boot",
        "ipyparallel.engine",
        "--IPEngine.log_level=WARN",
    ]
    assert p.environment["GPUCELL_PIN_BY_RANK"] == "1"
    assert p.environment["IPP_CLUSTER_ID"] == "1700000000-abcd"
    text = str(p)
    assert text.startswith(p.script.rstrip())
    assert f"sbatch {batch}" in text and "nothing was submitted" in text

    # the launcher as a start builds it (ipyparallel's Cluster.start_engines)
    (profile / "log").mkdir(parents=True)
    kw = {
        "environment": dict(p.environment),
        "engine_args": args,
        # the script as start_slurm_engines gives it (the controller check added)
        "batch_template": slurm_mod._engine_set(
            site_request(req), args, "/opt/venv/bin/python", str(profile / "log")
        )["batch_template"],
        "batch_file_name": batch,
        "engine_cmd": ["/opt/venv/bin/python", "-m", "gpucell.cluster.boot"]
        + ["ipyparallel.engine"],
    }
    launcher = SlurmGpuEngineSetLauncher(
        work_dir=".",
        profile_dir=str(profile),
        cluster_id="1700000000-abcd",
        engine_set_id="slurm",
        **kw,
    )
    launcher.write_batch_script(req.engines)
    with open(batch) as f:
        assert f.read() == p.script
    assert oct(os.stat(batch).st_mode & 0o777) == "0o700"


def test_a_profile_keeps_the_jobs_own_directives():
    """--profile saves the request as JSON and reads it back (lifecycle's
    _placement / _unpack_placement): the line's directives survive it."""
    req = SlurmRequest(directives=("--mem-per-cpu=4G",), prologue=("module load x",))
    back = SlurmRequest(**json.loads(json.dumps(asdict(req))))
    assert back == req and back.directives == ("--mem-per-cpu=4G",)
    assert SlurmRequest(directives="--qos=high").directives == ("--qos=high",)


def test_dry_run_prints_the_script_and_submits_nothing(
    ip, site, no_active_cluster, capsys
):
    site.slurm_prologue = ["export GPUCELL_SITE=1"]
    before = children()
    ip.run_line_magic(
        "gpu_cluster",
        "start --slurm --nodes 2 --gpus-per-node 4 --time 1:00:00 "
        "--slurm-directive=--mem-per-cpu=4G --slurm-directive 'constraint=a100' "
        "--dry-run",
    )
    out = capsys.readouterr().out
    assert "#SBATCH --ntasks=8" in out and "#SBATCH --time=1:00:00" in out
    assert "#SBATCH --mem-per-cpu=4G\n#SBATCH --constraint=a100\n" in out
    assert "export GPUCELL_SITE=1\n" in out and "slurm_check" in out
    assert "# submitted with: sbatch " in out and "nothing was submitted" in out
    assert gc_mod._current is None
    assert not wait_gone(children() - before, timeout=2)
    for line in ("start --dry-run", "start --slurm-directive=--qos=x"):
        with pytest.raises(UsageError, match="is for --slurm"):
            ip.run_line_magic("gpu_cluster", line)
    with pytest.raises(UsageError, match="--slurm-directive 'echo hi'"):
        ip.run_line_magic(
            "gpu_cluster", "start --slurm --slurm-directive 'echo hi' --dry-run"
        )


def test_a_cpu_partition_asks_for_cores_not_gpus(ip, site, no_active_cluster, capsys):
    """--cpus-per-node: one engine per core, bound to it, no GPU in the request
    and none of the kernel's in the engines' environment."""
    req = SlurmRequest(nodes=2, cpus_per_node=8, partition="cpu")
    assert req.engines == 16 and req.gpus_per_node == 0
    lines = _sbatch_lines(batch_template(req))
    assert "#SBATCH --ntasks=16" in lines and "#SBATCH --ntasks-per-node=8" in lines
    assert "#SBATCH --cpus-per-task=1" in lines and "#SBATCH --partition=cpu" in lines
    assert not any("--gpu" in x or "--gres" in x for x in lines)
    assert SlurmRequest(**asdict(req)) == req  # a profile keeps it
    with pytest.raises(ClusterError, match="choose one"):
        SlurmRequest(gpus_per_node=4, cpus_per_node=8)
    with pytest.raises(ClusterError, match="--cpus-per-node -1"):
        SlurmRequest(cpus_per_node=-1)
    ip.run_line_magic(
        "gpu_cluster", "start --slurm --partition cpu --cpus-per-node 4 --dry-run"
    )
    out = capsys.readouterr().out
    assert "#SBATCH --ntasks-per-node=4\n#SBATCH --cpus-per-task=1\n" in out
    assert "--gpus-per-node" not in out and "CUDA_VISIBLE_DEVICES=''" in out
    with pytest.raises(UsageError, match="choose one"):
        ip.run_line_magic(
            "gpu_cluster", "start --slurm --cpus-per-node 4 --gpus-per-node 2"
        )
    with pytest.raises(UsageError, match="--cpus-per-node is for --slurm"):
        ip.run_line_magic("gpu_cluster", "start --cpus-per-node 4")
    with pytest.raises(UsageError, match="--cpus-per-node"):
        ip.run_line_magic("gpu_cluster", "start --slurm --cpus-per-node 0")


def test_jobs_share_out_the_nodes_and_each_is_previewed(
    ip, site, no_active_cluster, capsys
):
    """--jobs N: N scripts, nodes shared out (5 over 2: 3 and 2), each its own
    engine set and script file; a start waits for the smallest job's engines."""
    req = SlurmRequest(nodes=5, gpus_per_node=2, jobs=2)
    assert [p.nodes for p in req.parts()] == [3, 2]
    assert {p.jobs for p in req.parts()} == {1} and req.first == 4
    assert SlurmRequest(nodes=2).first == 2
    with pytest.raises(ClusterError, match="--jobs 3 for 2 node"):
        SlurmRequest(nodes=2, jobs=3)
    with pytest.raises(ClusterError, match="--jobs 0"):
        SlurmRequest(jobs=0)
    p = preview(req, [], None, "/tmp/profile_x", "1700000000-abcd")
    scripts = [p.script, *(o.script for o in p.others)]
    assert [_sbatch_lines(x)[2:4] for x in scripts] == [
        ["#SBATCH --nodes=3", "#SBATCH --ntasks=6"],
        ["#SBATCH --nodes=2", "#SBATCH --ntasks=4"],
    ]
    assert [p.command, p.others[0].command] == [
        ["sbatch", "/tmp/profile_x/log/gpucell.sbatch"],
        ["sbatch", "/tmp/profile_x/log/gpucell-2.sbatch"],
    ]
    assert "-slurm-2-" in p.others[0].script  # its own engine set's log
    text = str(p)
    assert "# job 1 of 2\n" in text and "# job 2 of 2\n" in text
    assert text.count("# submitted with: sbatch") == 2
    ip.run_line_magic("gpu_cluster", "start --slurm --nodes 4 --jobs 4 --dry-run")
    out = capsys.readouterr().out
    assert out.count("#SBATCH --nodes=1\n") == 4 and "# job 4 of 4" in out
    with pytest.raises(UsageError, match="--jobs is for --slurm"):
        ip.run_line_magic("gpu_cluster", "start --jobs 2")
    with pytest.raises(UsageError, match="--jobs 3 for 2 node"):
        ip.run_line_magic("gpu_cluster", "start --slurm --nodes 2 --jobs 3")
