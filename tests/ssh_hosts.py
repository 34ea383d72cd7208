"""Other "hosts" on this machine for the ssh tests and bench: an OpenSSH sshd per
name, each in its own UTS, pid and mount namespaces (``unshare``), so its engines
have their own host name, pids, /proc and an empty private /dev/shm (gpucell treats
them as remote in every way it can tell) while loopback stays shared.

``start_hosts`` writes one ssh_config naming them all (``ssh -F config node2``).
Needs root, util-linux's unshare and Debian's openssh-server.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import socket
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path

import psutil

SSHD = "/usr/sbin/sshd"

__all__ = ["SshHost", "free_port", "missing", "start_hosts", "stop_hosts"]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@dataclass
class SshHost:
    """One namespaced sshd."""

    name: str
    port: int
    proc: subprocess.Popen
    ns: str = ""  # its pid namespace, /proc/PID/ns/pid

    def engines(self) -> list[int]:
        """Host pids of engine processes (engines and their nannies) inside it."""
        out = []
        for p in psutil.process_iter(["cmdline"]):
            try:
                if os.readlink(f"/proc/{p.pid}/ns/pid") != self.ns:
                    continue
            except OSError:
                continue
            if "ipyparallel.engine" in " ".join(p.info["cmdline"] or []):
                out.append(p.pid)
        return out


def missing() -> str | None:
    """Why namespaced sshd hosts cannot run here, or None."""
    if not os.path.exists(SSHD) or shutil.which("ssh") is None:
        return "needs OpenSSH's sshd and ssh (Debian: openssh-server)"
    if os.geteuid() != 0:
        return "needs root (sshd, and unshare for the hosts' namespaces)"
    if shutil.which("unshare") is None:
        return "needs util-linux's unshare"
    return None


def _host_entry(d: Path, name: str, port: int, key: str) -> str:
    return (
        f"Host {name}\n  HostName 127.0.0.1\n  Port {port}\n  User root\n"
        f"  UserKnownHostsFile {d}/known_hosts\n"
        "  StrictHostKeyChecking accept-new\n  IdentitiesOnly yes\n"
        f"  IdentityFile {d}/{key}\n"
    )


def start_hosts(d: Path, names: tuple[str, ...]) -> tuple[Path, list[SshHost]]:
    """An sshd per name, and ``d/ssh_config`` naming each.  It also names two
    hosts that fail: ``refused`` (a key the hosts do not accept) and
    ``deadhost`` (a port nothing listens on)."""
    for key in ("hostkey", "userkey", "otherkey"):
        subprocess.run(
            ["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(d / key)],
            check=True,
        )
    (d / "authorized_keys").write_text((d / "userkey.pub").read_text())
    Path("/run/sshd").mkdir(exist_ok=True)  # sshd's privilege-separation folder
    hosts: list[SshHost] = []
    cfg = ""
    try:
        for name in names:
            hosts.append(_start_sshd(d, name, free_port()))
            cfg += _host_entry(d, name, hosts[-1].port, "userkey")
    except BaseException:
        stop_hosts(hosts)
        raise
    cfg += _host_entry(d, "refused", hosts[0].port, "otherkey")
    cfg += _host_entry(d, "deadhost", free_port(), "userkey")
    (d / "ssh_config").write_text(cfg)
    return d / "ssh_config", hosts


def _start_sshd(d: Path, name: str, port: int) -> SshHost:
    conf = d / f"sshd_config-{name}"
    log = d / f"sshd-{name}.log"
    conf.write_text(
        f"Port {port}\nListenAddress 127.0.0.1\nHostKey {d}/hostkey\n"
        f"AuthorizedKeysFile {d}/authorized_keys\nPasswordAuthentication no\n"
        "KbdInteractiveAuthentication no\nPermitRootLogin prohibit-password\n"
        "StrictModes no\nUsePAM no\nSubsystem sftp /usr/lib/openssh/sftp-server\n"
        f"PidFile {d}/sshd-{name}.pid\n"
    )
    script = (
        f"mount -t tmpfs -o size=2g tmpfs /dev/shm && hostname {name} && "
        f"exec {SSHD} -D -f {conf} -E {log}"
    )
    cmd = ["unshare", "--uts", "--pid", "--mount", "--fork", "--kill-child"]
    cmd += ["--mount-proc", "sh", "-c", script]
    host = SshHost(name, port, subprocess.Popen(cmd, start_new_session=True))
    deadline = time.monotonic() + 15
    while True:
        try:
            socket.create_connection(("127.0.0.1", port), timeout=1).close()
            break
        except OSError:
            if time.monotonic() > deadline or host.proc.poll() is not None:
                stop_hosts([host])
                tail = log.read_text(errors="replace")[-1000:] if log.exists() else ""
                raise RuntimeError(f"sshd {name} did not start: {tail}") from None
            time.sleep(0.1)
    child = psutil.Process(host.proc.pid).children()[0]
    host.ns = os.readlink(f"/proc/{child.pid}/ns/pid")
    return host


def stop_hosts(hosts: list[SshHost]) -> None:
    """SIGKILL each ``unshare --kill-child`` (it ignores SIGTERM): its pid
    namespace, sshd and every engine in it, goes with it."""
    for h in hosts:
        if h.proc.poll() is None:
            h.proc.send_signal(signal.SIGKILL)
        with contextlib.suppress(subprocess.TimeoutExpired):
            h.proc.wait(10)
