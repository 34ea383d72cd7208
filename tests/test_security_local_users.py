"""Another local user cannot read a local cluster's messages (issue 29).

The test makes a second local user (useradd, removed after), which subscribes
to every port of the controller (a user can find them in /proc/net/tcp) while
the engines print a marker: with the default (CurveZMQ, its server key only in
the 0600 connection files) it gets nothing; with encryption off the same probe
reads the marker in clear, which shows the probe would see it."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator

import pytest

import gpucell
import gpucell.cluster.lifecycle as gc_mod
from gpucell.cluster import starting

pytestmark = [
    pytest.mark.cluster,
    pytest.mark.skipif(
        os.geteuid() != 0 or not shutil.which("useradd"),
        reason="needs root and useradd to make a second local user",
    ),
]

#: what the other user runs: the system Python with the venv's pyzmq on its
#: path (the venv's interpreter lives under /root, which it cannot enter)
PROBE = r"""
import json, sys, time, zmq
urls, marker = json.loads(sys.argv[1]), sys.argv[2].encode()
seconds = float(sys.argv[3])
ctx = zmq.Context()
socks = []
for u in urls:
    s = ctx.socket(zmq.SUB)
    s.setsockopt(zmq.SUBSCRIBE, b"")
    s.setsockopt(zmq.LINGER, 0)
    s.connect(u)
    socks.append(s)
poller = zmq.Poller()
for s in socks:
    poller.register(s, zmq.POLLIN)
got, seen = 0, False
end = time.time() + seconds
while time.time() < end:
    for s, _ in poller.poll(100):
        frames = s.recv_multipart()
        got += 1
        seen = seen or any(marker in f for f in frames)
print(json.dumps({"messages": got, "marker": seen}))
"""


@pytest.fixture
def other_user() -> Iterator[str]:
    name = f"gpcprobe{uuid.uuid4().hex[:6]}"
    subprocess.run(
        ["useradd", "-M", "-r", "-s", "/usr/sbin/nologin", name],
        check=True,
        capture_output=True,
    )
    try:
        yield name
    finally:
        subprocess.run(["userdel", name], capture_output=True)


def _ports(gc) -> list[str]:
    """Every port of the controller named in its connection files."""
    security = os.path.join(gc.cluster.profile_dir, "security")
    urls = set()
    for side in ("client", "engine"):
        path = os.path.join(
            security, f"ipcontroller-{gc.cluster.cluster_id}-{side}.json"
        )
        with open(path) as f:
            info = json.load(f)
        for v in info.values():
            for port in v if isinstance(v, list) else [v]:
                if isinstance(port, int) and port > 1024:
                    urls.add(f"{info['interface']}:{port}")
    return sorted(urls)


def _say(marker: str) -> None:
    print(marker, flush=True)


def _probe(user: str, gc, marker: str) -> dict[str, object]:
    site = next(p for p in sys.path if p.endswith("site-packages"))
    proc = subprocess.Popen(
        [
            "runuser",
            "-u",
            user,
            "--",
            "env",
            f"PYTHONPATH={site}",
            f"/usr/bin/python{sys.version_info[0]}.{sys.version_info[1]}",
            "-c",
            PROBE,
            json.dumps(_ports(gc)),
            marker,
            "6",
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    time.sleep(2.0)  # its subscriptions are in place
    end = time.time() + 3.0
    while time.time() < end:
        gc.client[:].apply_sync(_say, marker)
    out, err = proc.communicate(timeout=60)
    assert proc.returncode == 0, err
    return json.loads(out.strip().splitlines()[-1])


@pytest.mark.parametrize("curve", [True, False], ids=["default-curve", "plain"])
def test_another_local_user_reads_nothing_of_a_local_cluster(
    other_user, curve, monkeypatch
):
    if not os.path.exists(
        f"/usr/bin/python{sys.version_info[0]}.{sys.version_info[1]}"
    ):
        pytest.skip("no system Python of this version for the other user")
    monkeypatch.setattr(starting, "LOCAL_CURVE", curve)
    saved = gc_mod._current
    gc_mod._current = None
    try:
        gc = gpucell.start_cluster(2, gpus="none")
        marker = f"secret-{uuid.uuid4().hex}"
        seen = _probe(other_user, gc, marker)
    finally:
        if gc_mod._current is not None:
            gpucell.stop()
        gc_mod._current = saved
    if curve:
        assert seen == {"messages": 0, "marker": False}
    else:  # the probe works: in clear, the output is read
        assert seen["marker"] is True
