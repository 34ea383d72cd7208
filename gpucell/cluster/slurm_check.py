"""``python -m gpucell.cluster.slurm_check PROFILE_DIR CLUSTER_ID``: run by a
batch job's script before its engines start.  A job can wait in the queue far
longer than the kernel that submitted it lives (``--jobs``: the later jobs
pend while cells run); when it starts after that kernel was killed, its
controller is gone, and engines would wait for it in vain on nodes the site
charges for.  So: if the controller's registration port does not answer, the
job cancels itself (``scancel $SLURM_JOB_ID``) and exits without starting an
engine.

Standard library only (it runs on the node before anything else).
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import time

#: seconds the controller has to answer (a node's network may be slow to come up)
PATIENCE = 10.0
#: seconds its connection file has to appear: the controller may still be writing
#: it when a job starts at once (engines wait 60 s for it: --wait_for_url_file)
FILE_PATIENCE = 30.0


def registration_address(profile_dir: str, cluster_id: str) -> tuple[str, int] | None:
    """Where the controller takes registrations: from ``IPP_CONNECTION_INFO``
    (the engines' environment), else its engine file in the profile (None:
    neither; a controller removes that file as it stops, and the engines
    would read it)."""
    text = os.environ.get("IPP_CONNECTION_INFO", "")
    name = f"ipcontroller-{cluster_id}-engine.json" if cluster_id else ""
    path = os.path.join(profile_dir, "security", name or "ipcontroller-engine.json")
    deadline = time.monotonic() + FILE_PATIENCE
    while not text:
        try:
            with open(path) as f:
                text = f.read()
        except OSError:
            if time.monotonic() > deadline:
                return None
            time.sleep(0.5)
    try:
        info = json.loads(text)
        host = str(info["interface"]).split("://", 1)[-1]
        port = int(info["registration"])
    except (ValueError, KeyError, TypeError):
        return None
    if host in ("*", "0.0.0.0", ""):
        # a controller listening on every interface: its location is where the
        # engines reach it (ipyparallel's disambiguate_ip_address does the same)
        host = str(info.get("location") or "127.0.0.1")
    return host, port


def controller_answers(address: tuple[str, int], patience: float | None = None) -> bool:
    """Whether a TCP connection to ``address`` opens within ``patience`` s
    (``PATIENCE`` by default)."""
    deadline = time.monotonic() + (PATIENCE if patience is None else patience)
    while True:
        try:
            with socket.create_connection(address, timeout=2.0):
                return True
        except OSError:
            if time.monotonic() > deadline:
                return False
            time.sleep(0.5)


def main(argv: list[str]) -> int:
    profile_dir, cluster_id = (argv + ["", ""])[:2]
    address = registration_address(profile_dir, cluster_id)
    if address is not None and controller_answers(address):
        return 0
    where = (
        f"at {address[0]}:{address[1]} does not answer"
        if address
        else f"left no connection file in {profile_dir}"
    )
    job = os.environ.get("SLURM_JOB_ID", "")
    print(
        f"gpucell: the cluster's controller {where} (its kernel is gone); no "
        "engine is started" + (f" and job {job} is cancelled" if job else ""),
        file=sys.stderr,
        flush=True,
    )
    if job:
        try:
            subprocess.run(["scancel", job], timeout=30, check=False)
        except (OSError, subprocess.TimeoutExpired):
            pass
    return 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
