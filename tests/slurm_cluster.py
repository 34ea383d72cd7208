"""A real Slurm on this machine for the tests: slurmctld, and two slurmd.

The second slurmd runs in its own UTS namespace as ``node2`` (its tasks see that
host name); both have two fake GPUs (character devices with NVIDIA's major number:
Slurm only stats them) so ``--gpus-per-node`` and ``CUDA_VISIBLE_DEVICES`` work as
on a GPU cluster.  Everything lives in one temporary directory (``SLURM_CONF``);
nothing is written under /etc.  Needs root and Debian's slurmctld, slurmd,
slurm-client and munge (``.ci/run`` installs them); skipped with the reason
elsewhere.  Follows ../shared/MULTINODE-NOTES.md.
"""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import time
from dataclasses import dataclass, field
from pathlib import Path

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

    def stop(self) -> None:
        if self.procs and self.procs[-1].poll() is None:
            try:
                subprocess.run(
                    ["scancel", "--full", "-u", "root"],
                    env=self.env,
                    capture_output=True,
                    timeout=10,
                )
            except (OSError, subprocess.TimeoutExpired):
                pass
        for p in reversed(self.procs):
            if p.poll() is None:
                p.send_signal(signal.SIGTERM)
        for p in reversed(self.procs):
            try:
                p.wait(3)  # unshare --kill-child ignores SIGTERM
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait(5)


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
    ]
    cpus = os.cpu_count() or 1
    for n, port in zip(nodes, ports, strict=True):
        lines.append(
            f"NodeName={n} NodeAddr=127.0.0.1 Port={port} CPUs={cpus} "
            f"Gres=gpu:{NGPU} State=UNKNOWN"
        )
    lines.append(
        f"PartitionName=debug Nodes={','.join(nodes)} Default=YES MaxTime=INFINITE "
        "State=UP OverSubscribe=FORCE:4"
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
            lambda: s.run("sinfo", "-h", "-o", "%t %D").strip() == "idle 2",
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
