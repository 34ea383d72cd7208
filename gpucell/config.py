"""gpucell's settings, the IPython way.

``GpuCell`` is a traitlets ``Configurable``: set it in ``ipython_config.py``
(``c.GpuCell.per_gpu = 2``) or in a notebook (``%config GpuCell.per_gpu = 2``).
Options on a magic's line override these for that call.
"""

from __future__ import annotations

from traitlets import Bool, Enum, Float, Int, List, Unicode
from traitlets.config import Configurable

__all__ = ["GpuCell", "settings"]


class GpuCell(Configurable):
    """Defaults for ``%gpu_cluster`` and ``%%gpu_parallel``."""

    per_gpu = Int(1, config=True, help="Engines started on each GPU (--per-gpu).")
    cpu_engines = Int(
        0,
        config=True,
        help="CPU engines started beside the GPU engines (--cpu-engines).",
    )
    gpus = Unicode(
        "all", config=True, help="GPUs a local cluster uses: 'all', 'none' or '0,2'."
    )
    pin_cpu_engines = Bool(
        True,
        config=True,
        help="Give each CPU engine its own share of cores (CPU affinity).",
    )
    start_timeout = Float(
        60.0,
        config=True,
        help="Seconds to wait for a started cluster's engines before giving up.",
    )
    remote_python = Unicode(
        "python3",
        config=True,
        help="The Python that runs engines on --ssh hosts (--python): one with "
        "gpucell and ipyparallel installed, e.g. a virtualenv's bin/python.",
    )
    ssh_options = List(
        Unicode(),
        [],
        config=True,
        help="Extra ssh arguments for --ssh hosts, e.g. ['-F', 'my_ssh_config'] "
        "(ports and keys per host are best kept in ~/.ssh/config).",
    )
    slurm_directives = List(
        Unicode(),
        [],
        config=True,
        help="Extra #SBATCH options of every --slurm job, after gpucell's own and "
        "before those of --slurm-directive, e.g. ['--mem-per-cpu=4G', "
        "'--constraint=a100'] (what a site requires).",
    )
    slurm_prologue = List(
        Unicode(),
        [],
        config=True,
        help="Shell lines a --slurm job runs before srun starts its engines, e.g. "
        "['module load cuda', 'source ~/venv/bin/activate']; what they export "
        "reaches the engines.",
    )
    slurm_skip = List(
        Unicode(),
        [],
        config=True,
        help="#SBATCH lines containing any of these strings are left out of a "
        "--slurm job's script, e.g. ['--gpus-per-node'] on a site that wants "
        "--gres=gpu:N instead (add that with slurm_directives).",
    )
    slurm_shebang = Unicode(
        "#!/bin/sh",
        config=True,
        help="The first line of a --slurm job's script, e.g. '#!/bin/bash -l' "
        "where the prologue needs a login shell's `module`.",
    )
    slurm_resubmit = Int(
        0,
        config=True,
        help="Times a --slurm job that Slurm ends during a run (time limit, "
        "preemption, scancel) is submitted again by itself, the run going on on "
        "its engines (--checkpoint N).",
    )
    slurm_pending_timeout = Float(
        600.0,
        config=True,
        help="Seconds a --slurm job submitted again by --checkpoint may stay "
        "pending (a busy queue, a hold) before it is cancelled and a cell waiting "
        "for its engines fails, its finished chunks kept for "
        "`%%gpu_parallel --resume` (0: no limit).",
    )
    slurm_partition = Unicode(
        "", config=True, help="A site's --partition for --slurm jobs ('': none)."
    )
    slurm_account = Unicode(
        "", config=True, help="A site's --account for --slurm jobs ('': none)."
    )
    slurm_time = Unicode(
        "", config=True, help="A site's --time limit for --slurm jobs ('': none)."
    )
    slurm_jobs = Int(1, config=True, help="A site's --jobs for --slurm starts.")
    slurm_scheduler = Unicode(
        "",
        config=True,
        help="A site's batch system (--scheduler: slurm, pbs, torque, lsf, sge); "
        "set, `%gpu_cluster start --profile P` alone submits a job ('': none).",
    )
    encrypt = Bool(
        True,
        config=True,
        help="Encrypt a cluster's messages (CurveZMQ) on this host, to --ssh "
        "hosts and to batch jobs' engines (--slurm, --scheduler), so other users "
        "cannot read them (--no-encrypt for one start). "
        "Off, heavy traffic to other hosts costs less (a 16 MiB input: ~30 "
        "instead of ~110-160 ms over loopback ssh) and anyone who reaches the "
        "controller's ports reads what travels: only on hosts and networks of "
        "your own.",
    )
    connect_timeout = Float(
        30.0,
        config=True,
        help="Seconds to wait for an existing cluster to answer on connect.",
    )
    fast_start = Bool(
        True,
        config=True,
        help="Start the controller with its schedulers in threads and engines without "
        "a nanny process where that is safe, which halves start-up on small hosts.",
    )
    cluster_log_level = Enum(
        ["DEBUG", "INFO", "WARN", "ERROR", "CRITICAL"],
        "WARN",
        config=True,
        help="Log level of the controller and engines a local cluster starts. "
        "ipyparallel's own default, INFO, writes a line per task to the controller's "
        "and each engine's log file (CPU on every task, files that grow with the "
        "loop); set INFO or DEBUG to see them when debugging a cluster.",
    )
    schedule = Enum(
        ["guided", "dynamic", "static"],
        "guided",
        config=True,
        help="Default chunk schedule of %%gpu_parallel.",
    )
    serial_fallback = Bool(
        False,
        config=True,
        help="Without a cluster, run %%gpu_parallel cells serially in the kernel (with "
        "a one-line note) instead of raising.",
    )
    quiet_idle = Bool(
        False,
        config=True,
        help="Engines send no 'idle' status after a chunk that printed and displayed "
        "nothing (its reply says so and the kernel marks its output complete): one "
        "message fewer per chunk for the engine, the controller and the kernel. "
        "Off by default until it has run longer: once, under load, a task's output "
        "was left awaited with it on (not reproduced). False: every chunk's 'idle' "
        "is sent, as ipyparallel does.",
    )
    chunk_channel = Bool(
        True,
        config=True,
        help="Engines on the kernel's host take a cell's chunks after their first "
        "through /dev/shm, one ipyparallel task per engine per cell instead of one "
        "per chunk: a cheap chunk's transport costs ~0.05 ms of CPU instead of "
        "~2.5 ms (bench/bench_stream_proto.py). False: every chunk is a task. "
        "Engines on other hosts take every chunk as a task either way.",
    )
    inline_below = Float(
        0.005,
        config=True,
        help="Run a %%gpu_parallel loop in the kernel when its last run on the same "
        "engines measured less than this many seconds of work in all (sending it "
        "would cost more). 0: always send. Cells with CUDA, --seed or explicit "
        "engines, schedule, chunk size or timeout are always sent.",
    )
    shared_memory = Bool(
        True,
        config=True,
        help="Engines on the kernel's host return big arrays and tensors through "
        "/dev/shm (one copy) instead of through the controller (three). Engines that "
        "cannot see the kernel's /dev/shm use the controller either way.",
    )
    engine_cache_bytes = Int(
        8 << 30,
        config=True,
        help="Bytes of inputs each engine keeps cached between cells (arrays and "
        "tensors counted by their buffers). Beyond it the least recently used "
        "inputs that the running cell does not read are dropped; they are sent "
        "again if a later cell reads them. 0: keep nothing between cells.",
    )
    check_inputs = Bool(
        True,
        config=True,
        help="Engines check, before and after each chunk, the inputs a call in the "
        "loop could change in place (receivers and arguments of calls, notebook "
        "functions' globals, the loop's items), and fail the cell if one changed: "
        "serially the change would stay in your objects. False skips the check (a "
        "loop that changes an input then leaves a silently different namespace).",
    )


_settings: GpuCell | None = None


def settings() -> GpuCell:
    """The process-wide settings object (the one ``%config`` sees once loaded)."""
    global _settings
    if _settings is None:
        _settings = GpuCell()
    return _settings


def install(shell: object) -> GpuCell:
    """Bind the settings to an IPython shell's config and make ``%config`` see them."""
    global _settings
    cfg = getattr(shell, "config", None)
    if _settings is None or (cfg is not None and _settings.config is not cfg):
        _settings = GpuCell(parent=shell) if cfg is not None else GpuCell()
    configurables = getattr(shell, "configurables", None)
    if configurables is not None and _settings not in configurables:
        configurables.append(_settings)
    return _settings
