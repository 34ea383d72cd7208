"""Engines through Slurm: one job, one task per engine, by ipyparallel's own Slurm
launcher (``sbatch`` of a batch script whose ``srun`` starts the engines).

Each task starts through gpucell.cluster.boot, which pins it by its rank on its node
(``SLURM_LOCALID``: its GPU first in ``CUDA_VISIBLE_DEVICES``); on a CPU-only
partition (``--cpus-per-node``) each task is bound to a core and no GPU is asked
for, so its thread pools are sized to that core, as a local CPU engine's are.
What a site asks of every job goes into the script too: extra ``#SBATCH`` directives
(``--slurm-directive``, ``GpuCell.slurm_directives``), directives of gpucell's own
to leave out (``GpuCell.slurm_skip``, as dask-jobqueue's ``job_directives_skip``)
and prologue lines run before ``srun`` (``GpuCell.slurm_prologue``: ``module load
cuda``); :func:`preview` shows the script and the ``sbatch`` command without
submitting anything (``--dry-run``).  The job is
cancelled on ``stop`` (the launcher's ``scancel``); if the kernel dies, the engines
end once their controller is silent, and the job with them.  While the engines are
awaited the job is watched: a job that stays pending says so once (with
``squeue``'s reason), and one still pending at the timeout fails the start with
that reason, cancelled.  With ``--jobs N`` the nodes are shared out over N
jobs: the start waits for one job's engines, the others join as they start
(:class:`gpucell.cluster.restart.Restarts` ``joining``), and status names the
jobs still pending.  ``scheduler`` other than slurm: :mod:`gpucell.cluster.batch`
writes the script, for ipyparallel's PBS, LSF or SGE launcher.
"""

from __future__ import annotations

import os
import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from gpucell.cluster.slurm_jobs import (  # noqa: F401 (the API's own names)
    ANY_ENGINE,
    SCHEDULER_OF,
    Job,
    JobWatch,
    Resubmitter,
    job_state,
    job_states,
    kind,
    wait_for_job,
)
from gpucell.errors import ClusterError
from gpucell.protocol.devices import THREAD_ENV_VARS

__all__ = [
    "SlurmRequest",
    "batch_template",
    "directive_line",
    "dry_run",
    "preview",
    "site_request",
    "start_slurm_engines",
    "wait_for_job",
]


@dataclass(frozen=True)
class SlurmRequest:
    """What ``--slurm`` asks Slurm for: one engine per GPU on each node, or
    with ``cpus_per_node`` (a CPU-only partition) one engine per core and no
    GPU asked for."""

    nodes: int = 1
    gpus_per_node: int = 1
    #: engines a node, one core each, no GPU (0: one engine per GPU instead)
    cpus_per_node: int = 0
    partition: str | None = None
    time: str | None = None
    account: str | None = None
    #: extra ``#SBATCH`` options, after gpucell's own (``--mem-per-cpu=4G``)
    directives: tuple[str, ...] = ()
    #: shell lines the job runs before ``srun`` starts the engines
    prologue: tuple[str, ...] = ()
    #: gpucell's (or extra) directives containing any of these are left out
    skip: tuple[str, ...] = ()
    #: the script's first line
    shebang: str = "#!/bin/sh"
    #: smaller jobs instead of one (their nodes shared out): a cell starts once
    #: one job's engines are up, the others' join as their jobs start
    jobs: int = 1
    #: the batch system: slurm, or pbs, torque, lsf, sge (gpucell.cluster.batch)
    scheduler: str = "slurm"
    #: times a job Slurm ends is submitted again by itself (--checkpoint;
    #: None: GpuCell.slurm_resubmit)
    checkpoint: int | None = None
    #: the site's settings (a profile's, the kernel's) are already in it
    #: (gpucell.cluster.site): :func:`site_request` adds none again
    settled: bool = False

    def __post_init__(self) -> None:
        for name in ("directives", "prologue", "skip"):  # lists from JSON too
            value = getattr(self, name)
            value = (value,) if isinstance(value, str) else tuple(value)
            object.__setattr__(self, name, value)
        if self.nodes < 1:
            raise ClusterError(f"--nodes {self.nodes}: a job needs at least 1 node.")
        from gpucell.cluster.batch import SCHEDULERS

        if self.scheduler not in ("slurm", *SCHEDULERS):
            raise ClusterError(
                f"--scheduler {self.scheduler!r}: one of slurm, "
                f"{', '.join(SCHEDULERS)}."
            )
        if not 1 <= self.jobs <= self.nodes:
            raise ClusterError(
                f"--jobs {self.jobs} for {self.nodes} node(s): each job needs at "
                "least one node, so 1 to --nodes jobs."
            )
        if self.checkpoint is not None and self.checkpoint < 0:
            raise ClusterError(
                f"--checkpoint {self.checkpoint}: times a job is submitted again, "
                "so 0 or more."
            )
        if self.cpus_per_node < 0:
            raise ClusterError(
                f"--cpus-per-node {self.cpus_per_node}: CPU engines a node, so at "
                "least 1 (or leave it out for GPU engines)."
            )
        if self.cpus_per_node and self.gpus_per_node not in (0, 1):
            raise ClusterError(
                f"--cpus-per-node {self.cpus_per_node} with --gpus-per-node "
                f"{self.gpus_per_node}: engines are per GPU or per core; choose one."
            )
        if self.cpus_per_node:  # no GPU asked for (a profile's JSON keeps 0)
            object.__setattr__(self, "gpus_per_node", 0)
        elif self.gpus_per_node < 1:
            raise ClusterError(
                f"--gpus-per-node {self.gpus_per_node}: gpucell starts one engine "
                "per GPU, so at least 1."
            )

    @property
    def per_node(self) -> int:
        """Engines a node: its GPUs, or its cores on a CPU-only partition."""
        return self.cpus_per_node or self.gpus_per_node

    @property
    def engines(self) -> int:
        return self.nodes * self.per_node

    def parts(self) -> list[SlurmRequest]:
        """The jobs submitted: ``jobs`` requests of one job each, the nodes
        shared out (5 over 2: 3 and 2)."""
        from dataclasses import replace

        q, r = divmod(self.nodes, self.jobs)
        return [replace(self, nodes=q + (k < r), jobs=1) for k in range(self.jobs)]

    @property
    def first(self) -> int:
        """Engines a start waits for: all of them, or with ``jobs`` those of
        its smallest job (whichever job starts first)."""
        return min(p.engines for p in self.parts())


def batch_template(req: SlurmRequest) -> str:
    """The job script (ipyparallel fills ``{program_and_args}`` and the rest).

    gpucell's directives, then the extra ones, less those ``req.skip`` names;
    then the prologue; then ``srun``.  Braces in the site's lines are kept as
    they are (ipyparallel formats the template: they are doubled here).
    """
    if req.scheduler != "slurm":
        from gpucell.cluster import batch

        return batch.batch_template(req)
    lines = [
        "#SBATCH --export=ALL",
        "#SBATCH --job-name=gpucell-{cluster_id}",
        f"#SBATCH --nodes={req.nodes}",
        f"#SBATCH --ntasks={req.engines}",
        f"#SBATCH --ntasks-per-node={req.per_node}",
    ]
    if req.cpus_per_node:  # a core each (task/affinity binds it): its threads
        lines.append("#SBATCH --cpus-per-task=1")
    else:
        lines.append(f"#SBATCH --gpus-per-node={req.gpus_per_node}")
    lines.append("#SBATCH --output={output_file}")
    if req.partition:
        lines.append(f"#SBATCH --partition={_plain(req.partition, '--partition')}")
    if req.time:
        lines.append(f"#SBATCH --time={_plain(req.time, '--time')}")
    if req.account:
        lines.append(f"#SBATCH --account={_plain(req.account, '--account')}")
    shebang, lines, prologue = site_parts(
        req, lines, [directive_line(d) for d in req.directives]
    )
    return "\n".join([shebang, *lines, *prologue, "srun {program_and_args}", ""])


def site_parts(
    req: Any, lines: list[str], directives: list[str]
) -> tuple[str, list[str], list[str]]:
    """What the site adds to a job script (any scheduler's): its directives
    after gpucell's, every line holding one of ``req.skip`` left out, its first
    line and its prologue, each checked to be one line, braces doubled."""
    lines = lines + [_braces(x) for x in directives]
    skip = [_one_line(x, "GpuCell.slurm_skip") for x in req.skip if x.strip()]
    lines = [x for x in lines if not any(k.strip() in x for k in skip)]
    shebang = _one_line(req.shebang, "GpuCell.slurm_shebang")
    if not shebang.startswith("#!"):
        raise ClusterError(
            f"GpuCell.slurm_shebang {req.shebang!r}: the script's first line, "
            "e.g. '#!/bin/bash -l'."
        )
    prologue = [_braces(_one_line(x, "GpuCell.slurm_prologue")) for x in req.prologue]
    return _braces(shebang), lines, prologue


def directive_line(option: str) -> str:
    """``--mem-per-cpu=4G`` (or ``mem-per-cpu=4G``), ``-C a100`` or ``#SBATCH
    --qos=high`` as the ``#SBATCH`` line it is; anything that is not an sbatch
    option is refused."""
    text = _one_line(option, "--slurm-directive").strip()
    if text.startswith("#SBATCH"):
        text = text[len("#SBATCH") :].strip()
    if text[:1].isalpha() and not any(c.isspace() for c in text.split("=")[0]):
        text = "--" + text  # mem-per-cpu=4G: argparse takes no leading "--" here
    if not text.startswith("-") or text.strip("-") == "":
        raise ClusterError(
            f"--slurm-directive {option!r}: expected an sbatch option such as "
            "--mem-per-cpu=4G or --constraint=a100."
        )
    return f"#SBATCH {text}"


def _one_line(text: str, what: str) -> str:
    if "\n" in text or "\r" in text or "\0" in text:
        raise ClusterError(f"{what} {text!r}: one line each (no line breaks).")
    return text


def _braces(text: str) -> str:
    return text.replace("{", "{{").replace("}", "}}")


def site_request(req: SlurmRequest, settings: Any = None) -> SlurmRequest:
    """``req`` with the site's settings (``GpuCell.slurm_directives``,
    ``slurm_prologue``, ``slurm_skip``, ``slurm_shebang``): the config's lines
    first, then the request's own."""
    from dataclasses import replace

    if req.settled:
        return req
    if settings is None:
        from gpucell.config import settings as current

        settings = current()
    shebang = req.shebang
    if shebang == SlurmRequest.shebang:
        shebang = settings.slurm_shebang or shebang
    return replace(
        req,
        directives=(*settings.slurm_directives, *req.directives),
        prologue=(*settings.slurm_prologue, *req.prologue),
        skip=(*settings.slurm_skip, *req.skip),
        shebang=shebang,
        checkpoint=(
            req.checkpoint
            if req.checkpoint is not None
            else getattr(settings, "slurm_resubmit", 0)
        ),
    )


def _plain(value: str, flag: str) -> str:
    if not value or any(c.isspace() or c in "{}'\"\\;$`" for c in value):
        raise ClusterError(f"{flag} {value!r}: expected a plain Slurm value.")
    return value


#: the engines' environment (besides ipyparallel's own): how boot pins them
ENGINE_ENV = {
    "GPUCELL_PIN_BY_RANK": "1",
    "GPUCELL_THREAD_VARS": ",".join(THREAD_ENV_VARS),
    "GPUCELL_PREIMPORT": "numpy",
    # the task's parent is slurmstepd, which lives as long as the job step
}


def set_id(k: int) -> str:
    """The engine set (and script) of the ``k``-th job: ``slurm``, ``slurm-2``..."""
    return "slurm" if k == 0 else f"slurm-{k + 1}"


def _engine_set(
    req: SlurmRequest,
    engine_args: Sequence[str],
    python: str | None,
    log_dir: str,
    k: int = 0,
) -> dict[str, Any]:
    """The ``k``-th job's engine set settings, the same for a submission and a
    preview."""
    ext = "sbatch" if req.scheduler == "slurm" else req.scheduler
    kw: dict[str, Any] = {
        "environment": dict(ENGINE_ENV),  # (``--export=ALL`` carries it)
        "engine_args": list(engine_args),
        "batch_template": batch_template(req),
        # the script goes beside the cluster's logs, not the notebook's folder
        "batch_file_name": os.path.join(log_dir, f"gpucell{set_id(k)[5:]}.{ext}"),
    }
    if req.scheduler == "slurm":
        kw["batch_template"] = _checked(kw["batch_template"], python)
    if req.cpus_per_node and req.scheduler == "slurm":  # (batch's script: its own)
        kw["environment"]["CUDA_VISIBLE_DEVICES"] = ""
    if python:
        kw["engine_cmd"] = [python, "-m", "gpucell.cluster.boot", "ipyparallel.engine"]
    return kw


def _checked(template: str, python: str | None) -> str:
    """The script with, before ``srun``, the check that its cluster's controller
    still answers (:mod:`gpucell.cluster.slurm_check`): a job that starts after
    its kernel was killed cancels itself, starting no engine."""
    import shlex
    import sys

    py = _braces(shlex.quote(python or sys.executable))
    check = (
        f"{py} -m gpucell.cluster.slurm_check '{{profile_dir}}' '{{cluster_id}}' "
        "|| exit 0"
    )
    head, sep, tail = template.rpartition("srun {program_and_args}")
    return f"{head}{check}\n{sep}{tail}" if sep else template


def start_slurm_engines(
    cluster: Any, req: SlurmRequest, engine_args: Sequence[str], python: str | None
) -> str:
    """Submit the engines' job (the site's settings added), or with ``jobs``
    each of the smaller jobs; their ids, comma-separated (as ``squeue -j``
    takes them)."""
    req = site_request(req)
    log = os.path.join(cluster.profile_dir, "log")
    saved = cluster.engine_launcher_class
    cluster.engine_launcher_class = launcher_class(req)
    jobs = []
    try:
        for k, part in enumerate(req.parts()):
            kw = _engine_set(part, engine_args, python, log, k)
            got = cluster.start_engines_sync(
                part.engines, engine_set_id=set_id(k), **kw
            )
            job_id = str(cluster.engines[got].job_id)
            jobs.append(Job(set_id(k), job_id, part.engines, kw))
    finally:
        cluster.engine_launcher_class = saved
    for j in jobs if req.scheduler != "slurm" else ():  # asked with qstat/bjobs
        SCHEDULER_OF[j.job_id] = req.scheduler
    if req.scheduler == "slurm":  # (resubmission: Slurm's only)
        # what the cluster's Restarts watches (starting.launch hands it over);
        # a resubmission goes through the Slurm launcher too
        cluster.gpucell_jobs = JobWatch(
            Resubmitter(cluster, launcher_class(req)), jobs, req.checkpoint or 0
        )
    return ",".join(j.job_id for j in jobs)


def launcher_class(req: SlurmRequest) -> type:
    """The engine-set launcher that submits ``req``'s jobs."""
    if req.scheduler == "slurm":
        from gpucell.cluster.launcher import SlurmGpuEngineSetLauncher

        return SlurmGpuEngineSetLauncher
    from gpucell.cluster import batch

    return batch.launcher_class(req.scheduler)


def batch_jobs(cluster: Any) -> list[str]:
    """The ids of the Slurm jobs a cluster's engine sets submitted."""
    sets = getattr(cluster, "engines", None) or {}
    return [
        str(es.job_id)
        for name, es in sorted(sets.items())
        if name.startswith("slurm") and getattr(es, "job_id", None)
    ]


def pending_note(gc: Any) -> str | None:
    """``%gpu_cluster status``'s line on the jobs still pending (``--jobs``),
    with squeue's reason, or None when none is."""
    jobs = batch_jobs(getattr(gc, "cluster", None))
    if not jobs:
        return None
    waiting = [
        f"{j} ({st[1] or 'no reason given'})"
        for j, st in job_states(jobs).items()
        if st[0] == "PENDING"
    ]
    if not waiting:
        return None
    restarts = getattr(gc, "restarts", None)
    coming = getattr(restarts, "joining", 0) + sum(  # (and --checkpoint's waits)
        1
        for r in getattr(restarts, "pending", ())
        if r.label == ANY_ENGINE and r.new_id is None
    )
    return (
        f"{kind(jobs[0])}{'s' if len(waiting) > 1 else ''} {', '.join(waiting)} "
        "pending; "
        f"{coming} more engine{'s' if coming != 1 else ''} join as they start"
    )


@dataclass(frozen=True)
class Preview:
    """What ``--dry-run`` shows: the job script and how it would be submitted
    (with ``--jobs``, each job's in ``others``)."""

    script: str
    command: list[str]
    environment: dict[str, str]
    #: the controller's connection info goes in the environment too (else the
    #: engines read its file in the profile, on a file system the nodes share)
    connection_env: bool = False
    #: the further jobs of ``--jobs N``, each submitted the same way
    others: tuple[Preview, ...] = ()

    def __str__(self) -> str:
        import shlex

        env = " ".join(f"{k}={shlex.quote(v)}" for k, v in self.environment.items())
        if self.connection_env:
            env += " IPP_CONNECTION_INFO=<the controller's, once it runs>"
        jobs = [self, *self.others]
        parts = [
            (f"# job {k + 1} of {len(jobs)}\n" if len(jobs) > 1 else "")
            + f"{p.script.rstrip()}\n\n# submitted with: {_submit_text(p.command)}\n"
            for k, p in enumerate(jobs)
        ]
        return (
            "\n".join(parts)
            + f"# in the kernel's environment plus (--export=ALL gives it to the "
            f"engines): {env}\n# nothing was submitted (--dry-run)"
        )


def _submit_text(command: list[str]) -> str:
    import shlex

    if command[:1] == ["bsub"]:  # LSF reads the script's #BSUB lines from stdin
        return f"bsub < {shlex.quote(command[-1])}"
    return shlex.join(command)


def preview(
    req: SlurmRequest,
    engine_args: Sequence[str],
    python: str | None,
    profile_dir: str,
    cluster_id: str,
    connection_env: bool = False,
) -> Preview:
    """The script and ``sbatch`` command :func:`start_slurm_engines` would use
    for a cluster ``cluster_id`` in ``profile_dir``, rendered by the same
    launcher, without writing or submitting anything (each job's, with
    ``jobs``)."""
    req = site_request(req)
    shown = []
    for k, part in enumerate(req.parts()):
        kw = _engine_set(part, engine_args, python, os.path.join(profile_dir, "log"), k)
        launcher = launcher_class(req)(
            work_dir=".",
            profile_dir=profile_dir,
            cluster_id=cluster_id,
            engine_set_id=set_id(k),
            output_file="-",  # ipyparallel's default creates the log folder
            **kw,
        )
        # then the default's name, as the submission has it
        launcher.output_file = os.path.join(
            profile_dir, "log", f"{launcher.identifier}.log"
        )
        shown.append(
            Preview(
                script=launcher.render_batch_script(part.engines),
                command=list(launcher.args),
                environment={k: str(v) for k, v in launcher.get_env().items()},
                connection_env=connection_env,
            )
        )
    from dataclasses import replace

    return replace(shown[0], others=tuple(shown[1:]))


def dry_run(
    req: SlurmRequest, python: str | None = None, profile: str | None = None
) -> Preview:
    """``%gpu_cluster start --slurm ... --dry-run``: the script and ``sbatch``
    command a start with these options would submit (its engines' arguments
    as :func:`gpucell.cluster.starting.launch` builds them), for a new
    cluster id; nothing is created, written or submitted."""
    import random
    import string

    from gpucell.cluster import starting
    from gpucell.config import settings

    s = settings()
    cluster_kw, _, engine_args = starting.fast_start_settings(s.fast_start)
    engine_args += [f"--IPEngine.log_level={s.cluster_log_level}"]
    ids = "".join(random.choice(string.ascii_lowercase + string.digits) for _ in "1234")
    return preview(
        req,
        starting.remote_engine_args(engine_args),
        python,
        _profile_location(profile),
        f"{int(time.time())}-{ids}",  # as ipyparallel names a cluster
        connection_env=cluster_kw.get("send_engines_connection_env", True),
    )


def _profile_location(profile: str | None) -> str:
    """Where a start's profile is (the kernel's own without ``--profile``),
    without creating it."""
    from IPython.core.profiledir import ProfileDir, ProfileDirError
    from IPython.paths import get_ipython_dir

    if not profile:
        from IPython import get_ipython

        ip = get_ipython()
        if ip is not None:
            return str(ip.profile_dir.location)
    name = profile or "default"
    try:
        return str(
            ProfileDir.find_profile_dir_by_name(get_ipython_dir(), name).location
        )
    except ProfileDirError:
        return os.path.join(get_ipython_dir(), f"profile_{name}")
