"""``%gpu_cluster connect --ssh``: a cluster reached through a real sshd.

The sshd is OpenSSH's own (Debian's openssh-server, which ``.ci/run`` installs),
started on a free local port with keys made for the test; ipyparallel opens its
tunnels with the ``ssh`` command, as it would to a remote head node.
"""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import psutil
import pytest
from helpers import wait_for_ipcluster
from IPython.core.error import UsageError

import gpucell.cluster.lifecycle as gc_mod
from gpucell.errors import ClusterError

# the tests here start a real sshd and a real ipcluster's engine processes (the
# last only checks arguments, but is marked with the module it belongs to)
pytestmark = pytest.mark.cluster

SSHD = "/usr/sbin/sshd"


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class Sshd:
    def __init__(self, root: Path, port: int, key: Path, log: Path) -> None:
        self.root, self.port, self.key, self.log = root, port, key, log
        self.server = f"root@127.0.0.1:{port}"

    def logins(self) -> int:
        return self.log.read_text().count("Accepted publickey")


@pytest.fixture
def sshd(tmp_path: Path) -> Iterator[Sshd]:
    """A real sshd on 127.0.0.1 that accepts a test key for root."""
    if not os.path.exists(SSHD) or shutil.which("ssh") is None:
        pytest.skip("needs OpenSSH's sshd and ssh (Debian: openssh-server)")
    if os.geteuid() != 0:
        pytest.skip("sshd logs in as root here: needs root, as CI runs")
    d = tmp_path / "ssh"
    d.mkdir()
    for name in ("hostkey", "userkey"):
        subprocess.run(
            ["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(d / name)],
            check=True,
        )
    (d / "authorized_keys").write_text((d / "userkey.pub").read_text())
    port = _free_port()
    (d / "sshd_config").write_text(
        f"Port {port}\nListenAddress 127.0.0.1\nHostKey {d}/hostkey\n"
        f"AuthorizedKeysFile {d}/authorized_keys\nPasswordAuthentication no\n"
        "KbdInteractiveAuthentication no\nPermitRootLogin prohibit-password\n"
        f"StrictModes no\nUsePAM no\nAllowTcpForwarding yes\nPidFile {d}/sshd.pid\n"
    )
    Path("/run/sshd").mkdir(exist_ok=True)  # its privilege-separation directory
    log = d / "log"
    proc = subprocess.Popen(
        [SSHD, "-D", "-f", str(d / "sshd_config"), "-E", str(log)],
        start_new_session=True,
    )
    try:
        deadline = time.monotonic() + 10
        while True:
            try:
                socket.create_connection(("127.0.0.1", port), timeout=1).close()
                break
            except OSError:
                if time.monotonic() > deadline or proc.poll() is not None:
                    raise RuntimeError("sshd did not start") from None
                time.sleep(0.1)
        yield Sshd(d, port, d / "userkey", log)
    finally:
        # pyzmq's tunnels are `ssh -f ... sleep 60` processes that outlive the
        # client by design; end this test's, then the server
        for p in psutil.process_iter(["cmdline"]):
            if str(d / "userkey") in " ".join(p.info["cmdline"] or []):
                p.kill()
        proc.terminate()
        proc.wait(10)


@pytest.fixture
def known_host(sshd: Sshd) -> Iterator[None]:
    """The test sshd's host key in root's known_hosts (as after a first login);
    the file is put back as it was afterwards."""
    ssh_dir = Path.home() / ".ssh"
    known = ssh_dir / "known_hosts"
    had_dir, before = ssh_dir.exists(), known.read_bytes() if known.exists() else None
    ssh_dir.mkdir(mode=0o700, exist_ok=True)
    key = (sshd.root / "hostkey.pub").read_text().split()
    with known.open("a") as f:
        f.write(f"[127.0.0.1]:{sshd.port} {key[0]} {key[1]}\n")
    try:
        yield
    finally:
        if before is not None:
            known.write_bytes(before)
        else:
            known.unlink(missing_ok=True)
            if not had_dir:
                shutil.rmtree(ssh_dir, ignore_errors=True)


def _connect(ip, line: str) -> None:
    # asked directly first, not through ssh: a tunnel loses a request sent
    # before the controller listens
    wait_for_ipcluster()
    ip.run_line_magic("gpu_cluster", line)


def test_connect_through_ssh_runs_a_cell(
    ip, ipcluster, sshd, known_host, no_active_cluster, capsys
):
    _connect(
        ip,
        f"connect --profile X --ssh {sshd.server} --ssh-key {sshd.key} --timeout 30",
    )
    assert "connected to" in capsys.readouterr().out
    c = gc_mod.current()
    assert sshd.logins() >= 1  # the connections went through the tunnel
    assert not c.owned and len(c.engines) >= 1
    ip.user_ns["out"] = []
    ip.run_cell_magic(
        "gpu_parallel", "--quiet", "for i in range(30):\n    out.append(i * i)\n"
    )
    assert ip.user_ns["out"] == [i * i for i in range(30)]
    ip.run_line_magic("gpu_cluster", "stop")
    assert "disconnected" in capsys.readouterr().out
    assert ipcluster.poll() is None  # a cluster we only joined keeps running


def test_an_unknown_host_key_says_how_to_fix_it(ip, ipcluster, sshd, no_active_cluster):
    with pytest.raises(UsageError) as info:
        _connect(
            ip,
            f"connect --profile X --ssh {sshd.server} --ssh-key {sshd.key} "
            "--timeout 30",
        )
    msg = str(info.value)
    assert "ssh tunnel through" in msg and "known_hosts" in msg
    assert f"-p {sshd.port} root@127.0.0.1 true" in msg  # the command to try
    assert gc_mod._current is None  # nothing half-connected is left active


def test_ssh_key_needs_ssh_and_must_exist(tmp_path, no_active_cluster):
    with pytest.raises(ClusterError, match="needs --ssh"):
        gc_mod.connect(profile="X", ssh_key=str(tmp_path / "k"))
    with pytest.raises(ClusterError, match="No ssh key file"):
        gc_mod.connect(profile="X", ssh="me@host", ssh_key=str(tmp_path / "k"))
