"""What a host offers gpucell, printed as one JSON line: run there over ssh.

``%gpu_cluster start --ssh`` runs ``python -m gpucell.devices.probe`` on each host
before it starts anything, so a host that cannot take engines (no gpucell, another
gpucell version, no ipyparallel) is refused with a clear error while nothing runs
yet, and the host's engines can be planned by the same rules as local ones (its
GPUs, their near cores, the cores this login may use).

``ssh_client`` is the address this host sees the kernel's machine connect from
(``SSH_CONNECTION``): the address its engines can reach the controller on.
"""

from __future__ import annotations

import json
import os
import socket
import sys
from dataclasses import asdict
from typing import Any


def facts() -> dict[str, Any]:
    """This host as the kernel needs it to plan engines here."""
    from importlib.metadata import PackageNotFoundError, version

    import gpucell
    from gpucell.devices.discovery import cpu_device, discover

    try:
        ipp = version("ipyparallel")
    except PackageNotFoundError:
        ipp = None
    try:
        cores = sorted(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        cores = list(range(os.cpu_count() or 1))
    found = discover()
    ssh = os.environ.get("SSH_CONNECTION", "").split()
    return {
        "host": socket.gethostname(),
        "python": sys.executable,
        "gpucell": gpucell.__version__,
        "ipyparallel": ipp,
        "cores": cores,
        "cpu": asdict(cpu_device()),
        "gpus": [asdict(g) for g in found.gpus],
        "notes": list(found.notes),
        "ssh_client": ssh[0] if ssh else None,
    }


if __name__ == "__main__":
    print(json.dumps(facts()))
