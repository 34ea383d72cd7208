"""A real Slurm on this machine for the tests: slurmctld, and two slurmd.

The second slurmd runs in its own UTS namespace as ``node2`` (its tasks see that
host name); both have two fake GPUs (character devices with NVIDIA's major number:
Slurm only stats them) so ``--gpus-per-node`` and ``CUDA_VISIBLE_DEVICES`` work as
on a GPU cluster.  Everything lives in one temporary directory (``SLURM_CONF``);
nothing is written under /etc.  Needs root and Debian's slurmctld, slurmd,
slurm-client and munge (``.ci/run`` installs them); skipped with the reason
elsewhere.  Follows ../shared/MULTINODE-NOTES.md.

Three partitions share the nodes: ``debug`` (the default), ``urgent``, of a
higher priority tier, whose jobs preempt the others' (``PreemptMode=CANCEL``),
and ``requeue``, whose preempted jobs go back to pending (``REQUEUE``).

The test modules take the module-scoped fixture :func:`slurm` (``from
slurm_cluster import slurm``).  Its teardown leaves nothing behind, also when a
test failed while a job step ran: it cancels every job, waits for their steps'
processes (``slurmstepd``, engines) to end, stops the daemons, and then fails
the test loudly, naming them, if any process of this Slurm is still alive
(every one carries its ``SLURM_CONF`` in its environment).
"""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import pytest
from process_leftovers import processes_with

NGPU = 2


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def missing() -> str | None:
    """Why a real Slurm cannot run here, or None."""
    if os.geteuid() != 0:
        return "needs root (Slurm's daemons, mknod, unshare)"
    for tool in (
        "slurmctld",
        "slurmd",
        "munged",
        "mungekey",
        "sbatch",
        "squeue",
        "unshare",
    ):
        if shutil.which(tool) is None:
            return f"needs {tool} (Debian: slurmctld slurmd slurm-client munge)"
    return None


_DAEMONS = (b"slurmd", b"slurmscriptd")


@dataclass
class Slurm:
    root: Path
    conf: Path
    nodes: list[str]
    procs: list[subprocess.Popen] = field(default_factory=list)

    @property
    def env(self) -> dict[str, str]:
        return {**os.environ, "SLURM_CONF": str(self.conf)}

    def run(self, *cmd: str, timeout: float = 10) -> str:
        return subprocess.run(
            list(cmd), env=self.env, capture_output=True, text=True, timeout=timeout
        ).stdout

    def jobs(self) -> list[str]:
        """Jobs Slurm still knows as pending, running or completing."""
        out = self.run("squeue", "-h", "-o", "%i %T")
        return [line for line in out.splitlines() if line.strip()]

    def processes(self, jobs_only: bool = False) -> list[tuple[int, str]]:
        """(pid, command) of every live process of this Slurm but its daemons:
        job steps and their tasks (``jobs_only``), and whatever else a test
        started with its environment."""
        needle = f"SLURM_CONF={self.conf}".encode()
        return [
            (pid, cmd[:160])
            for pid, cmd, env in processes_with(needle, self._daemons())
            if not jobs_only
            or cmd.startswith("slurmstepd")
            or any(v.startswith(b"SLURM_JOB_ID=") for v in env)
        ]

    def _daemons(self, names: tuple[bytes, ...] = _DAEMONS) -> set[int]:
        """The daemons' pids (node2's slurmd is the child of its unshare;
        slurmctld's slurmscriptd, its child): theirs and their children's of
        ``names``."""
        own = {p.pid for p in self.procs if p.poll() is None}
        kids = set()
        for entry in os.listdir("/proc"):
            try:
                with open(f"/proc/{entry}/stat", "rb") as f:
                    name, _, rest = f.read().partition(b" (")[2].rpartition(b")")
                if name in names and int(rest.split()[1]) in own:
                    kids.add(int(entry))
            except (OSError, ValueError, IndexError):
                continue
        return own | kids

    def stop(self) -> list[tuple[int, str]]:
        """Cancel every job, wait for its processes, stop the daemons; what
        was still alive after that (killed now), which should be nothing."""
        if self.procs and self.procs[1:2] and self.procs[1].poll() is None:
            with _quiet():
                self.run("scancel", "--full", "-u", "root")
            deadline = time.monotonic() + 30  # KillWait (5 s), then SIGKILL
            while time.monotonic() < deadline:
                with _quiet():
                    if not self.jobs() and not self.processes(jobs_only=True):
                        break
                time.sleep(0.2)
        # node2's slurmd first: its unshare (--kill-child) ignores SIGTERM
        for pid in self._daemons((b"slurmd",)) - {p.pid for p in self.procs}:
            with _quiet():
                os.kill(pid, signal.SIGTERM)
        for p in reversed(self.procs):  # slurmds, slurmctld, munged
            if p.poll() is None:
                p.send_signal(signal.SIGTERM)
            try:
                p.wait(3)
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait(5)
        time.sleep(0.1)
        left = self.processes()
        for pid, _ in left:
            with _quiet():
                os.kill(pid, signal.SIGKILL)
        return left


class _quiet:
    """Ignores what a cleanup step raises (the next step still runs)."""

    def __enter__(self) -> None:
        return None

    def __exit__(self, *exc: object) -> bool:
        return exc[0] is not None and issubclass(
            exc[0], (OSError, subprocess.SubprocessError)
        )


@pytest.fixture(scope="module")
def slurm() -> Iterator[Slurm]:
    """A real Slurm for a test module, ``SLURM_CONF`` set as a user's login
    has it; its teardown fails if any of its processes outlived it."""
    why = missing()
    if why:
        pytest.skip(why)
    # not under pytest's 0700 tmp folders: munged wants every directory above
    # its socket searchable by all
    root = Path(tempfile.mkdtemp(prefix="gpucell-slurm-"))
    s = start(root)
    saved = os.environ.get("SLURM_CONF")
    os.environ["SLURM_CONF"] = str(s.conf)
    left: list[tuple[int, str]] = []
    try:
        yield s
    finally:
        try:
            left = s.stop()
        finally:
            shutil.rmtree(root, ignore_errors=True)
            if saved is None:
                os.environ.pop("SLURM_CONF", None)
            else:
                os.environ["SLURM_CONF"] = saved
    if left:
        pytest.fail(
            f"{len(left)} process(es) of the test Slurm outlived its jobs and "
            "daemons (killed now):\n"
            + "\n".join(f"  pid {pid}: {cmd}" for pid, cmd in left),
            pytrace=False,
        )


def start(root: Path) -> Slurm:
    host = socket.gethostname().split(".")[0]
    nodes = [host, "node2"]
    for d in ("state", "log", "munge", "dev"):
        (root / d).mkdir(parents=True, exist_ok=True)
    # munged refuses a socket whose directories are not all a+x
    for d in (root, root / "munge"):
        os.chmod(d, 0o755)
    key = root / "munge" / "munge.key"
    subprocess.run(["mungekey", "-c", "-k", str(key)], check=True, capture_output=True)
    for g in range(NGPU):
        dev = root / "dev" / f"nvidia{g}"
        if not dev.exists():
            os.mknod(dev, 0o666 | 0o020000, os.makedev(195, g))
    ctl_port = free_port()
    ports = [free_port() for _ in nodes]
    sock = root / "munge" / "munge.socket"
    lines = [
        "ClusterName=ci",
        f"SlurmctldHost={host}(127.0.0.1)",
        f"SlurmctldPort={ctl_port}",
        "AuthType=auth/munge",
        "CredType=cred/munge",
        f"AuthInfo=socket={sock}",
        "SlurmUser=root",
        "SlurmdUser=root",
        f"StateSaveLocation={root}/state",
        f"SlurmdSpoolDir={root}/spool-%n",
        f"SlurmctldPidFile={root}/slurmctld.pid",
        f"SlurmdPidFile={root}/slurmd-%n.pid",
        f"SlurmctldLogFile={root}/log/slurmctld.log",
        f"SlurmdLogFile={root}/log/slurmd-%n.log",
        "ProctrackType=proctrack/linuxproc",
        "TaskPlugin=task/affinity",
        "SelectType=select/cons_tres",
        "SelectTypeParameters=CR_Core",
        "GresTypes=gpu",
        "MpiDefault=none",
        "ReturnToService=2",
        "JobAcctGatherType=jobacct_gather/none",
        "AccountingStorageType=accounting_storage/none",
        "SlurmdTimeout=30",
        "KillWait=5",
        # partitions of a higher tier preempt the jobs of lower ones
        "PreemptType=preempt/partition_prio",
        "PreemptMode=CANCEL",
    ]
    cpus = os.cpu_count() or 1
    for n, port in zip(nodes, ports, strict=True):
        lines.append(
            f"NodeName={n} NodeAddr=127.0.0.1 Port={port} CPUs={cpus} "
            f"Gres=gpu:{NGPU} State=UNKNOWN"
        )
    # requeue: a preempted job of its goes back to pending (PreemptMode=REQUEUE)
    for name, tier, extra in (
        ("debug", 1, "Default=YES"),
        ("urgent", 2, "Default=NO"),
        ("requeue", 1, "Default=NO PreemptMode=REQUEUE"),
    ):
        lines.append(
            f"PartitionName={name} Nodes={','.join(nodes)} {extra} MaxTime=INFINITE "
            f"State=UP OverSubscribe=FORCE:4 PriorityTier={tier}"
        )
    conf = root / "slurm.conf"
    conf.write_text("\n".join(lines) + "\n")
    (root / "gres.conf").write_text(f"Name=gpu File={root}/dev/nvidia[0-{NGPU - 1}]\n")
    s = Slurm(root, conf, nodes)
    log = root / "log"

    def daemon(cmd: list[str], name: str) -> None:
        out = open(log / f"{name}.out", "wb")
        s.procs.append(
            subprocess.Popen(
                cmd,
                stdout=out,
                stderr=subprocess.STDOUT,
                env=s.env,
                start_new_session=True,
            )
        )

    try:
        daemon(
            [
                "munged",
                "-F",
                f"--key-file={key}",
                f"--socket={sock}",
                f"--pid-file={root}/munge/munged.pid",
                f"--log-file={log}/munged.log",
                f"--seed-file={root}/munge/seed",
            ],
            "munged",
        )
        _wait(lambda: sock.exists(), 5, "munged did not start", log / "munged.out")
        daemon(["slurmctld", "-D", "-i", "-f", str(conf)], "slurmctld")
        daemon(["slurmd", "-D", "-f", str(conf)], f"slurmd-{host}")
        daemon(
            [
                "unshare",
                "--uts",
                "--kill-child",
                "sh",
                "-c",
                'hostname node2 && exec slurmd -D -f "$0"',
                str(conf),
            ],
            "slurmd-node2",
        )
        _wait(
            lambda: (
                s.run("sinfo", "-h", "-p", "debug", "-o", "%t %D").strip() == "idle 2"
            ),
            30,
            "the two slurmd did not come up idle",
            log / "slurmctld.log",
        )
    except BaseException:
        s.stop()
        raise
    return s


def _wait(ok, timeout: float, what: str, log: Path) -> None:
    deadline = time.monotonic() + timeout
    while True:
        try:
            if ok():
                return
        except (subprocess.SubprocessError, OSError):
            pass
        if time.monotonic() > deadline:
            tail = log.read_text(errors="replace")[-2000:] if log.exists() else ""
            raise RuntimeError(f"{what}:\n{tail}")
        time.sleep(0.2)
