"""A cluster with engines on another host over ssh is encrypted (CurveZMQ), as a
local one is (issue 29): the engines there take the controller's server key
from the connection info ipyparallel sends them through ssh, and a party on
the network that subscribes to every port the controller opened reads nothing
of a cell's output.  Without Curve (the control) the same probe reads it.

The "other host" is tests/ssh_hosts.py's namespaced sshd (root, unshare and
openssh-server; skipped with the reason elsewhere)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
import ssh_hosts

import gpucell
import gpucell.cluster.lifecycle as gc_mod
from gpucell import config as gconfig
from gpucell.cluster import starting

pytestmark = pytest.mark.cluster

#: someone on the network: subscribes to every port, with no key; says "ready"
#: once each connection is up (or after 5 s), reads until its stdin closes, then
#: 0.5 s more for what was still on the way
PROBE = r"""
import json, sys, time, zmq
urls, marker = json.loads(sys.argv[1]), sys.argv[2].encode()
ctx = zmq.Context()
poller, waiting = zmq.Poller(), zmq.Poller()
for u in urls:
    s = ctx.socket(zmq.SUB)
    s.setsockopt(zmq.SUBSCRIBE, b"")
    s.setsockopt(zmq.LINGER, 0)
    waiting.register(s.get_monitor_socket(zmq.EVENT_CONNECTED), zmq.POLLIN)
    s.connect(u)
    poller.register(s, zmq.POLLIN)
end = time.time() + 5.0
while waiting.sockets and time.time() < end:
    for m, _ in waiting.poll(100):
        m.recv_multipart()
        waiting.unregister(m)
print("ready", flush=True)
poller.register(sys.stdin, zmq.POLLIN)
got, seen, end = 0, False, float("inf")
while time.time() < end:
    for s, _ in poller.poll(100):
        if s == sys.stdin.fileno():  # (a file is polled as its number)
            sys.stdin.read()
            poller.unregister(sys.stdin)
            end = time.time() + 0.5
            continue
        frames = s.recv_multipart()
        got += 1
        seen = seen or any(marker in f for f in frames)
print(json.dumps({"messages": got, "marker": seen}))
"""


@pytest.fixture(scope="module")
def node2(tmp_path_factory) -> Iterator[Path]:
    why = ssh_hosts.missing()
    if why:
        pytest.skip(why)
    config, hosts = ssh_hosts.start_hosts(tmp_path_factory.mktemp("node2"), ("node2",))
    s = gconfig.settings()
    saved = list(s.ssh_options)
    s.ssh_options = ["-F", str(config)]
    try:
        yield config
    finally:
        s.ssh_options = saved
        ssh_hosts.stop_hosts(hosts)


def _info(gc, side: str) -> dict:
    security = os.path.join(gc.cluster.profile_dir, "security")
    path = os.path.join(security, f"ipcontroller-{gc.cluster.cluster_id}-{side}.json")
    with open(path) as f:
        return json.load(f)  # type: ignore[no-any-return]


def _ports(gc) -> list[str]:
    urls = set()
    for side in ("client", "engine"):
        info = _info(gc, side)
        for v in info.values():
            for port in v if isinstance(v, list) else [v]:
                if isinstance(port, int) and port > 1024:
                    urls.add(f"{info['interface']}:{port}")
    return sorted(urls)


@pytest.mark.parametrize("curve", [True, False], ids=["default-curve", "plain"])
def test_ssh_engines_are_encrypted(ip, node2, no_active_cluster, curve, monkeypatch):
    monkeypatch.setattr(starting, "LOCAL_CURVE", curve)
    ip.run_line_magic(
        "gpu_cluster",
        f"start -n 1 --gpus none --ssh node2:1 --python {sys.executable} --timeout 90",
    )
    gc = gc_mod.current()
    try:
        # node2's engine registered: with Curve, only through the handshake
        assert [e.host for e in gc.engines.values()].count("node2") == 1
        assert bool(_info(gc, "engine").get("curve_serverkey")) is curve
        marker = f"secret-{uuid.uuid4().hex}"
        probe = subprocess.Popen(
            [sys.executable, "-c", PROBE, json.dumps(_ports(gc)), marker],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        assert probe.stdout.readline().strip() == "ready"  # connected to each port
        ip.user_ns["marker"] = marker
        hosts: set[str] = set()
        end = time.monotonic() + 1.5  # (cells, one after another, all along)
        while time.monotonic() < end:
            ip.run_cell_magic(
                "gpu_parallel",
                "--quiet --schedule static",
                "for i in range(4):\n    print(marker, i)\n",
            )
            hosts |= {c.host for c in gpucell.last_run.chunks}
        out, err = probe.communicate(timeout=60)  # (closes its stdin: done)
        assert probe.returncode == 0, err
        seen = json.loads(out.strip().splitlines()[-1])
        assert "node2" in hosts, hosts
    finally:
        ip.run_line_magic("gpu_cluster", "stop")
    if curve:
        assert seen == {"messages": 0, "marker": False}
    else:  # the probe works: in clear, the output is read
        assert seen["marker"] is True
