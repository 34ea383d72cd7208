"""``%gpu_cluster start --ssh``: engines on another host, through a real sshd.

The "other host" is an OpenSSH sshd in its own UTS, pid and mount namespaces
(``unshare``): its engines have their own host name (``node2``), their own pids and
an empty private ``/dev/shm``, so gpucell treats them as remote in every way it can
tell, while loopback stays shared.  Needs root, ``unshare`` and Debian's
openssh-server (``.ci/run`` installs it); skipped with the reason elsewhere.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import psutil
import pytest
import ssh_hosts
from helpers import QUICK_GIVE_UP
from IPython.core.error import UsageError

import gpucell
import gpucell.cluster.lifecycle as gc_mod
from gpucell import config as gconfig

pytestmark = pytest.mark.cluster


@dataclass
class Node:
    """The namespaced sshd (tests/ssh_hosts.py): ``ssh -F config node2`` logs in
    there; ``refused`` and ``deadhost`` in the same config fail."""

    config: Path
    host: ssh_hosts.SshHost

    def engines(self) -> list[int]:
        return self.host.engines()


@pytest.fixture(scope="module")
def node(tmp_path_factory) -> Iterator[Node]:
    why = ssh_hosts.missing()
    if why:
        pytest.skip(why)
    config, hosts = ssh_hosts.start_hosts(tmp_path_factory.mktemp("node2"), ("node2",))
    try:
        yield Node(config, hosts[0])
    finally:
        ssh_hosts.stop_hosts(hosts)


@pytest.fixture
def ssh_config(node: Node) -> Iterator[None]:
    s = gconfig.settings()
    saved = list(s.ssh_options)
    s.ssh_options = ["-F", str(node.config)]
    try:
        yield
    finally:
        s.ssh_options = saved


def _no_cluster_processes(before: set[int]) -> set[int]:
    from helpers import children

    return children() - before


def test_start_over_ssh_runs_a_cell_on_the_other_host_and_stop_leaves_nothing(
    ip, node, ssh_config, no_active_cluster, capsys
):
    from helpers import children, wait_gone

    before = children()
    ip.run_line_magic(
        "gpu_cluster",
        f"start -n 1 --gpus none --ssh node2:2 --python {sys.executable} --timeout 90",
    )
    out = capsys.readouterr().out
    assert "3 engines" in out, out
    gc = gc_mod.current()
    remote = [e for e in gc.engines.values() if e.host == "node2"]
    assert len(remote) == 2 and all(not e.local and not e.shm for e in remote)
    assert sorted(e.label for e in remote) == ["node2/cpu0", "node2/cpu1"]
    assert len(node.engines()) >= 2  # each engine (and its nanny)
    # each remote engine has its share of the node's cores, set before it started
    cores = sorted(os.sched_getaffinity(0))
    if len(cores) >= 2:
        assert sorted(e.cpu_affinity for e in remote) == [(cores[0],), (cores[1],)]
    ip.run_line_magic("gpu_cluster", "status")
    table = capsys.readouterr().out.splitlines()[1:]
    assert [row.split()[1] == "node2" for row in table] == [False, True, True]
    ip.user_ns["out"] = []
    ip.run_cell_magic(
        "gpu_parallel", "--quiet", "for i in range(60):\n    out.append(i * i)\n"
    )
    assert ip.user_ns["out"] == [i * i for i in range(60)]
    hosts = {c.host for c in gpucell.last_run.chunks}
    assert "node2" in hosts, hosts
    _an_input_crosses_once_to_the_other_host(ip, gc, node)
    ip.run_line_magic("gpu_cluster", "stop")
    deadline = time.monotonic() + 20
    while node.engines() and time.monotonic() < deadline:
        time.sleep(0.2)
    assert node.engines() == []
    assert wait_gone(children() - before, 10) == set()


def _node_shm(node: Node) -> list[str]:
    """gpucell's files in node2's own /dev/shm (its mount namespace, seen through
    an engine's /proc root)."""
    for pid in node.engines():
        try:
            return sorted(
                f for f in os.listdir(f"/proc/{pid}/root/dev/shm") if "gpucell" in f
            )
        except OSError:
            continue
    return []


def _an_input_crosses_once_to_the_other_host(ip, gc, node: Node) -> None:
    """A big input reaches node2 once: one of its engines receives it and
    publishes it in node2's /dev/shm, the other maps it from there; the result is
    the serial one and the files are gone after the cell."""
    import numpy as np

    size = 32 << 20
    ip.user_ns["np"] = np
    ip.user_ns["big"] = np.arange(size // 8, dtype=np.float64)
    ip.run_cell("import time")
    cell = (
        "sums = []\nfor i in range(24):\n    time.sleep(0.05)\n"
        "    sums.append(float(big[i::24].sum()))\n"
    )
    ip.run_cell_magic("gpu_parallel", "--quiet", cell)
    big = ip.user_ns["big"]
    assert ip.user_ns["sums"] == [float(big[i::24].sum()) for i in range(24)]
    remote = {e for e, info in gc.engines.items() if info.host == "node2"}
    ran = {c.engine for c in gpucell.last_run.chunks if c.host == "node2"}
    assert ran == remote, (ran, remote)
    # mapped, not sent: by the local engine (the kernel's /dev/shm) and by
    # node2's follower (node2's /dev/shm); only node2's leader received it
    assert gpucell.last_run.shared_bytes >= 2 * size, gpucell.last_run.shared_bytes
    deadline = time.monotonic() + 10
    while _node_shm(node):
        assert time.monotonic() < deadline, f"left on node2: {_node_shm(node)}"
        time.sleep(0.2)
    ip.user_ns.pop("big", None)


@pytest.mark.parametrize(
    ("line", "expect"),
    [
        ("--ssh deadhost", "unreachable over ssh"),
        ("--ssh refused", "refused the login"),
        ("--ssh node2 --python /nonexistent/python3", "no Python at"),
        ("--ssh node2:0", "asks for 0 engines"),
        ("--ssh 'node2:x'", "number of engines"),
    ],
)
def test_a_host_that_cannot_take_engines_fails_before_anything_starts(
    ip, node, ssh_config, no_active_cluster, line, expect
):
    from helpers import children

    before = children()
    with pytest.raises(UsageError, match=expect) as info:
        ip.run_line_magic("gpu_cluster", f"start -n 1 --gpus none {line}")
    msg = str(info.value)
    if "ssh" in expect or "Python" in expect:
        assert "Nothing was started" in msg
    assert gc_mod._current is None
    # the test's own sshd forks a process per login, which may still be closing
    # the refused one: part of the "host", not something gpucell started
    server = psutil.Process(node.host.proc.pid).children(recursive=True)
    assert children() - before - {p.pid for p in server} == set()
    assert node.engines() == []


def test_a_python_without_gpucell_is_named(
    ip, node, ssh_config, no_active_cluster, tmp_path
):
    bare = tmp_path / "bare"  # a Python with nothing installed
    subprocess.run(
        [sys.executable, "-m", "venv", "--without-pip", str(bare)], check=True
    )
    with pytest.raises(UsageError, match="has no gpucell"):
        ip.run_line_magic(
            "gpu_cluster",
            f"start -n 1 --gpus none --ssh node2 --python {bare}/bin/python",
        )
    assert gc_mod._current is None


KERNEL = """
import sys, time
import gpucell
from gpucell import config
config.settings().ssh_options = ["-F", sys.argv[1]]
{quick}
gpucell.start_cluster(1, gpus="none", ssh="node2:2", python=sys.executable, timeout=90)
print("ready", flush=True)
time.sleep(600)
""".replace("{quick}", QUICK_GIVE_UP)


def test_remote_engines_end_soon_after_their_kernel_is_killed(node, tmp_path):
    kernel = subprocess.Popen(
        [sys.executable, "-c", KERNEL, str(node.config)],
        stdout=subprocess.PIPE,
        text=True,
        cwd=tmp_path,
    )
    try:
        assert kernel.stdout.readline().strip() == "ready"
        assert len(node.engines()) >= 2
        kernel.kill()
        kernel.wait(10)
        t0 = time.monotonic()
        while node.engines() and time.monotonic() - t0 < 30:
            time.sleep(0.2)
        assert node.engines() == [], "remote engines outlived their kernel by 30 s"
    finally:
        kernel.kill()


def test_remote_engines_give_a_silent_controller_up_after_30_checks():
    """The product's grace the killed-kernel test shortens (QUICK_GIVE_UP): 30
    checks, each the controller's fast-start heartbeat period plus
    ipyparallel's 500 ms, about 18 s, inside that test's 30 s."""
    from gpucell.cluster.starting import fast_start_settings, remote_engine_args

    _, controller, engine = fast_start_settings(True)
    args = remote_engine_args(engine)
    assert "--IPEngine.max_heartbeat_misses=30" in args, args
    assert not any("enable_nanny" in a for a in args), args  # the nanny is kept
    assert "--HeartMonitor.period=100" in controller, controller
    assert 30 * (100 + 500) / 1000 < 30


OTHER_NOTEBOOK = """
from IPython.testing.globalipapp import start_ipython
import gpucell.cluster.lifecycle as gc_mod
ip = start_ipython()
ip.run_line_magic("load_ext", "gpucell")
ip.run_line_magic("gpu_cluster", "connect --profile lab --timeout 30")
print(sorted(e.label for e in gc_mod.current().engines.values()))
ip.user_ns["out"] = []
cell = "for i in range(20):\\n    out.append(-i)\\n"
ip.run_cell_magic("gpu_parallel", "--quiet", cell)
print("ok" if ip.user_ns["out"] == [-i for i in range(20)] else "WRONG")
ip.run_line_magic("gpu_cluster", "stop")
"""


def test_a_profile_remembers_its_hosts_and_another_notebook_reattaches(
    ip, node, ssh_config, no_active_cluster, tmp_path, monkeypatch, capsys
):
    monkeypatch.setenv("IPYTHONDIR", str(tmp_path / "ipython"))
    line = f"start -n 1 --gpus none --ssh node2:1 --python {sys.executable}"
    ip.run_line_magic("gpu_cluster", f"{line} --profile lab --timeout 90")
    other = subprocess.run(
        [sys.executable, "-c", OTHER_NOTEBOOK],
        capture_output=True,
        text=True,
        timeout=180,
    )
    # the other kernel found the cluster by the profile's name, kept each
    # engine's pinning, and ran a cell on it
    assert "'node2/cpu0'" in other.stdout and "ok" in other.stdout, other
    ip.run_line_magic("gpu_cluster", "stop")
    capsys.readouterr()
    ip.run_line_magic(
        "gpu_cluster", "start -n 1 --gpus none --profile lab --timeout 90"
    )
    assert "starting as saved (--ssh node2:1)" in capsys.readouterr().out
    assert [e.label for e in gc_mod.current().engines.values() if not e.local] == [
        "node2/cpu0"
    ]
    ip.run_line_magic("gpu_cluster", "stop")
