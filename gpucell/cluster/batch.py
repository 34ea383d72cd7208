"""Engines through PBS (OpenPBS/PBS Pro), Torque, LSF or Grid Engine, by
ipyparallel's own launchers (``PBSEngineSetLauncher``, ``LSFEngineSetLauncher``,
``SGEEngineSetLauncher``): ``%gpu_cluster start --scheduler pbs ...``.

These schedulers have no ``srun`` that starts one task per GPU with its rank on
its node, so the script does it itself: an array job of one element per node
(none for one node), each asking for the node's GPUs (or cores) and starting
one engine per GPU, ``GPUCELL_LOCAL_RANK=r`` and ``GPUCELL_LOCAL_SIZE=G`` set,
by which :mod:`gpucell.cluster.boot` pins it as it pins a Slurm task by
``SLURM_LOCALID`` (its GPU first in ``CUDA_VISIBLE_DEVICES``, which the
scheduler sets for the GPUs it gave, and its share of the node's cores).
The options a Slurm job has are here where the scheduler has them: queue
(``--partition``), wall time, account (project), extra directives, directives
to skip, prologue and first line (the site's ``GpuCell.slurm_*`` settings,
which name Slurm only for history); ``--dry-run`` shows the script.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from gpucell.errors import ClusterError

__all__ = ["SCHEDULERS", "batch_template", "launcher_class"]


@dataclass(frozen=True)
class _Dialect:
    """How one scheduler spells a job's directives."""

    prefix: str  # "#PBS"
    name: str  # the job's name (an array where it takes one there)
    array: str  # one element per node: "{prefix} -J 1-{nodes}"
    gpus: str  # the node's GPUs (and a core for each)
    cpus: str  # the node's cores, no GPU
    output: tuple[str, ...]
    queue: str
    time: str
    account: str
    head: tuple[str, ...]  # what every job has (export the environment...)


_PBS_OUT = ("#PBS -j oe", "#PBS -o {{output_file}}")
_DIALECTS = {
    # OpenPBS / PBS Pro: select statements and -J arrays
    "pbs": _Dialect(
        "#PBS",
        "#PBS -N gpucell-{{cluster_id}}",
        "#PBS -J 1-{nodes}",
        "#PBS -l select=1:ncpus={g}:ngpus={g}",
        "#PBS -l select=1:ncpus={c}",
        _PBS_OUT,
        "#PBS -q {v}",
        "#PBS -l walltime={v}",
        "#PBS -A {v}",
        ("#PBS -V",),
    ),
    # Torque: nodes=1:ppn and -t arrays
    "torque": _Dialect(
        "#PBS",
        "#PBS -N gpucell-{{cluster_id}}",
        "#PBS -t 1-{nodes}",
        "#PBS -l nodes=1:ppn={g}:gpus={g}",
        "#PBS -l nodes=1:ppn={c}",
        _PBS_OUT,
        "#PBS -q {v}",
        "#PBS -l walltime={v}",
        "#PBS -A {v}",
        ("#PBS -V",),
    ),
    "lsf": _Dialect(
        "#BSUB",
        "#BSUB -J gpucell-{{cluster_id}}",
        "#BSUB -J gpucell-{{cluster_id}}[1-{nodes}]",
        '#BSUB -n {g}\n#BSUB -R "span[hosts=1]"\n#BSUB -gpu "num={g}"',
        '#BSUB -n {c}\n#BSUB -R "span[hosts=1]"',
        ("#BSUB -o {{output_file}}", "#BSUB -e {{output_file}}"),
        "#BSUB -q {v}",
        "#BSUB -W {v}",
        "#BSUB -P {v}",
        ("#BSUB -env all",),
    ),
    # Grid Engine (SGE, Son of Grid Engine, UGE): a site's GPU resource is
    # often named otherwise ("gpu" here): GpuCell.slurm_skip and a directive
    "sge": _Dialect(
        "#$",
        "#$ -N gpucell-{{cluster_id}}",
        "#$ -t 1-{nodes}",
        "#$ -pe smp {g}\n#$ -l gpu={g}",
        "#$ -pe smp {c}",
        ("#$ -j y", "#$ -o {{output_file}}"),
        "#$ -q {v}",
        "#$ -l h_rt={v}",
        "#$ -A {v}",
        ("#$ -V", "#$ -S /bin/sh"),
    ),
}

#: the schedulers ``--scheduler`` takes besides slurm
SCHEDULERS = tuple(_DIALECTS)


def batch_template(req: Any) -> str:
    """The job script of ``req`` (a :class:`gpucell.cluster.slurm.SlurmRequest`
    whose ``scheduler`` is one of :data:`SCHEDULERS`): gpucell's directives, the
    extra ones, less those ``req.skip`` names; the prologue; then one engine per
    GPU (or core) of the node, each with its rank, and ``wait`` (the job lasts
    as long as its engines).  ipyparallel fills the ``{...}`` fields."""
    from gpucell.cluster.slurm import _plain, site_parts

    d = _DIALECTS[req.scheduler]
    per = req.per_node
    res = d.cpus.format(c=per) if req.cpus_per_node else d.gpus.format(g=per)
    lines = list(d.head)
    if req.nodes == 1 or d.prefix != "#BSUB":  # LSF names the array itself
        lines.append(d.name.format())
    if req.nodes > 1:
        lines.append(d.array.format(nodes=req.nodes))
    lines += [*res.split("\n"), *(x.format() for x in d.output)]
    for template, value, flag in (
        (d.queue, req.partition, "--partition"),
        (d.time, req.time, "--time"),
        (d.account, req.account, "--account"),
    ):
        if value:
            lines.append(template.format(v=_plain(value, flag)))
    shebang, lines, prologue = site_parts(
        req, lines, [directive_line(req.scheduler, x) for x in req.directives]
    )
    if req.cpus_per_node:  # the kernel's GPUs are none of a CPU engine's
        prologue.append("export CUDA_VISIBLE_DEVICES=")
    engines = [
        f"GPUCELL_LOCAL_RANK={r} GPUCELL_LOCAL_SIZE={per} {{program_and_args}} &"
        for r in range(per)
    ]
    return "\n".join([shebang, *lines, *prologue, *engines, "wait", ""])


def directive_line(scheduler: str, option: str) -> str:
    """An extra directive as its script line: ``-l mem=4gb`` or ``#PBS -l
    mem=4gb`` -> ``#PBS -l mem=4gb``; anything that is no option is refused."""
    from gpucell.cluster.slurm import _one_line

    prefix = _DIALECTS[scheduler].prefix
    text = _one_line(option, "--directive").strip()
    if text.startswith(prefix):
        text = text[len(prefix) :].strip()
    if not text.startswith("-") or text.strip("-") == "":
        raise ClusterError(
            f"--directive {option!r}: expected a {prefix} option such as "
            f"{'-R rusage[mem=4G]' if prefix == '#BSUB' else '-l mem=4gb'}."
        )
    return f"{prefix} {text}"


class _Submits:
    """What gpucell's batch launchers add to ipyparallel's: engines through
    gpucell.cluster.boot, the script rendered without writing it (the
    preview), 0700, and the submit command's own complaint as the error."""

    def render_batch_script(self: Any, n: int = 1) -> str:
        import json

        self.n = n
        self.context["environment_json"] = json.dumps(self.get_env())
        ns: dict[str, Any] = {**self.context, **self.namespace}
        return str(self.formatter.format(self.batch_template, **ns))

    def write_batch_script(self: Any, n: int = 1) -> None:
        import os
        import stat

        script = self.render_batch_script(n)
        with open(self.batch_file, "w") as f:
            f.write(script)
        os.chmod(self.batch_file, stat.S_IRUSR | stat.S_IWUSR | stat.S_IXUSR)

    def start(self: Any, n: int = 1) -> str:
        """Write and submit the script with the engines' environment (LSF's
        own ``start`` pipes it to ``bsub`` without that environment)."""
        import os

        self.write_batch_script(n)
        env = {**os.environ, **self.get_env()}
        if self.submit_command == ["bsub"]:  # bsub reads #BSUB lines from stdin
            with open(self.batch_file) as f:
                output = self._run_command(list(self.submit_command), env=env, stdin=f)
        else:
            output = self._run_command(self.args, env=env)
        job_id = str(self.parse_job_id(output))
        self.notify_start(job_id)
        return job_id

    def _run_command(self: Any, command: list[str], **kwargs: Any) -> str:
        import subprocess

        submit = list(command[: len(self.submit_command)]) == list(self.submit_command)
        if not submit and not getattr(self, "job_id", None):
            return ""  # nothing was submitted: nothing to cancel or signal
        kwargs.setdefault("stdin", subprocess.DEVNULL)
        p = subprocess.run(command, capture_output=True, text=True, **kwargs)
        if p.returncode != 0:
            what = (p.stderr or p.stdout).strip().splitlines()
            last = what[-1] if what else f"exit status {p.returncode}"
            if submit:
                raise ClusterError(
                    f"The scheduler refused the job (`{' '.join(command)}`): {last}"
                )
        return str(p.stdout)


_CLASSES: dict[str, type] = {}


def launcher_class(scheduler: str) -> type:
    """gpucell's engine-set launcher for ``scheduler``: ipyparallel's own with
    :class:`_Submits` (made once each)."""
    if scheduler not in _CLASSES:
        import sys

        from ipyparallel.cluster import launcher as ipp_launcher
        from traitlets import default

        base = {
            "pbs": ipp_launcher.PBSEngineSetLauncher,
            "torque": ipp_launcher.PBSEngineSetLauncher,
            "lsf": ipp_launcher.LSFEngineSetLauncher,
            "sge": ipp_launcher.SGEEngineSetLauncher,
        }[scheduler]

        def _engine_cmd(self: Any) -> list[str]:
            return [sys.executable, "-m", "gpucell.cluster.boot", "ipyparallel.engine"]

        _CLASSES[scheduler] = type(
            f"Gpucell{base.__name__}",
            (_Submits, base),
            {"_engine_cmd": default("engine_cmd")(_engine_cmd)},
        )
    return _CLASSES[scheduler]


#: a scheduler's job states as Slurm's (what wait_for_job and status read)
_PBS_STATES = {"Q": "PENDING", "H": "PENDING", "W": "PENDING", "T": "PENDING"}
_PBS_STATES.update({"R": "RUNNING", "E": "RUNNING", "B": "RUNNING"})
_PBS_STATES.update({"C": "COMPLETED", "F": "COMPLETED", "X": "COMPLETED"})
_LSF_STATES = {"PEND": "PENDING", "PSUSP": "PENDING", "RUN": "RUNNING"}
_LSF_STATES.update({"DONE": "COMPLETED", "EXIT": "FAILED", "USUSP": "RUNNING"})


def job_state(scheduler: str, job_id: str) -> tuple[str, str] | None:
    """(state, reason) of a PBS/Torque, LSF or SGE job, in Slurm's words
    (PENDING with the scheduler's reason, RUNNING, COMPLETED, FAILED), or
    None where the scheduler does not list it (or cannot be asked)."""
    if scheduler in ("pbs", "torque"):
        out = _ask(["qstat", "-f", job_id])
        fields = {}
        for line in out.splitlines():
            key, sep, value = line.partition("=")
            if sep:
                fields[key.strip()] = value.strip()
        state = _PBS_STATES.get(fields.get("job_state", ""))
        held = "held" if fields.get("job_state") == "H" else ""
        return (state, fields.get("comment", held)) if state else None
    if scheduler == "lsf":
        words = _ask(["bjobs", "-noheader", "-o", "stat pend_reason", job_id]).split(
            None, 1
        )
        state = _LSF_STATES.get(words[0]) if words else None
        reason = words[1].strip() if len(words) > 1 else ""
        return (state, "" if reason == "-" else reason) if state else None
    for row in _ask(["qstat"]).splitlines():  # sge: its table, one row a job
        cells = row.split()
        if len(cells) > 4 and cells[0] == job_id:
            st = cells[4]
            if "E" in st:
                return "FAILED", f"state {st}"
            if "r" in st or "t" in st:
                return "RUNNING", ""
            return "PENDING", "held" if "h" in st else f"state {st}"
    return None


def _ask(command: list[str]) -> str:
    import subprocess

    try:
        p = subprocess.run(
            command,
            capture_output=True,
            text=True,
            timeout=15,
            stdin=subprocess.DEVNULL,
        )
    except (OSError, subprocess.TimeoutExpired):
        return ""
    return p.stdout if p.returncode == 0 else ""
