"""``python -m gpucell.cluster.slurm_check PROFILE_DIR CLUSTER_ID``: run by a
batch job's script before its engines start.  A job can wait in the queue far
longer than the kernel that submitted it lives (``--jobs``: the later jobs
pend while cells run); when it starts after that kernel was killed, its
controller is gone, and engines would wait for it in vain on nodes the site
charges for.  So: if the controller's registration port does not answer, the
job cancels itself (``scancel $SLURM_JOB_ID``) and exits without starting an
engine.

How long it waits for the controller's connection file is counted from the
job's submission (``squeue``'s submit time), not its start: the controller
writes the file within seconds of the submission, so a job that pended longer
than that and finds none cancels itself at once instead of holding its nodes
for the whole wait.  ``GPUCELL_SLURM_FILE_PATIENCE`` (seconds, in the kernel's
environment: ``--export=ALL`` carries it into the job) sets that wait.

Standard library only (it runs on the node before anything else).
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import time
from datetime import datetime

#: seconds the controller has to answer (a node's network may be slow to come up)
PATIENCE = 10.0
#: seconds its connection file has to appear: the controller may still be writing
#: it when a job starts at once (engines wait 60 s for it: --wait_for_url_file)
FILE_PATIENCE = 30.0
#: the environment variable that overrides ``FILE_PATIENCE``
FILE_PATIENCE_ENV = "GPUCELL_SLURM_FILE_PATIENCE"


def file_patience() -> float:
    """``FILE_PATIENCE``, or the job environment's ``GPUCELL_SLURM_FILE_PATIENCE``
    (a value that is not a number of seconds >= 0: the default, so a typo
    never cancels a live cluster's job)."""
    try:
        value = float(os.environ.get(FILE_PATIENCE_ENV, ""))
    except ValueError:
        return FILE_PATIENCE
    return value if value >= 0 else FILE_PATIENCE


def submitted_at(job: str) -> float | None:
    """The job's submission time (epoch seconds) as Slurm tells it, or None
    (not in a job, no ``squeue``, an answer not understood)."""
    if not job:
        return None
    env = {**os.environ, "SLURM_TIME_FORMAT": "standard"}
    try:
        out = subprocess.run(
            ["squeue", "-h", "-j", job, "-o", "%V"],
            capture_output=True,
            text=True,
            timeout=10,
            env=env,
            check=False,
        ).stdout.strip()
        return datetime.strptime(out, "%Y-%m-%dT%H:%M:%S").timestamp()
    except (OSError, subprocess.TimeoutExpired, ValueError):
        return None


def file_deadline(job: str) -> float:
    """The ``time.monotonic()`` after which a missing connection file means no
    controller: the patience counted from the submission when known (never
    later than counted from now)."""
    patience = file_patience()
    since = submitted_at(job)
    if since is not None:
        patience = min(patience, max(0.0, since + patience - time.time()))
    return time.monotonic() + patience


def registration_address(
    profile_dir: str, cluster_id: str, deadline: float | None = None
) -> tuple[str, int] | None:
    """Where the controller takes registrations: from ``IPP_CONNECTION_INFO``
    (the engines' environment), else its engine file in the profile, waited
    for until ``deadline`` (``time.monotonic()``; ``file_patience()`` from now
    by default) (None: neither; a controller removes that file as it stops,
    and the engines would read it)."""
    text = os.environ.get("IPP_CONNECTION_INFO", "")
    name = f"ipcontroller-{cluster_id}-engine.json" if cluster_id else ""
    path = os.path.join(profile_dir, "security", name or "ipcontroller-engine.json")
    if deadline is None:
        deadline = time.monotonic() + file_patience()
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
    job = os.environ.get("SLURM_JOB_ID", "")
    address = registration_address(profile_dir, cluster_id, file_deadline(job))
    if address is not None and controller_answers(address):
        return 0
    where = (
        f"at {address[0]}:{address[1]} does not answer"
        if address
        else f"left no connection file in {profile_dir}"
    )
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
