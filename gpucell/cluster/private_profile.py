"""A cluster's files in its IPython profile are its user's alone.

Other local users of a shared GPU server must not read the controller's
connection files (their key lets anyone send the engines code), its state, or
the logs (what the loops print).  IPython makes ``security/`` and ``pid/`` 0700
but ``log/`` 0755, and ipyparallel writes ``security/cluster-<id>.json`` and
the logs with the umask's mode (0644).  Before a start the profile's
``security/``, ``log/`` and ``pid/`` folders are made 0700 (when they are this
user's), the cluster file is written 0600 through
:func:`gpucell.protocol.private.write` (random temporary name, ``O_EXCL|
O_NOFOLLOW``, renamed into place), and :mod:`gpucell.cluster.launcher` makes
the logs 0600 and runs the controller with umask 077.
"""

from __future__ import annotations

import json
import os
from typing import Any

from gpucell.protocol import private

__all__ = ["FOLDERS", "cluster_class", "tighten"]

#: the profile's folders a cluster writes into
FOLDERS = ("security", "log", "pid")


def tighten(profile_dir: str | os.PathLike[str]) -> None:
    """Make the profile's folders 0700 (made if missing; those of another user,
    or links, are left alone)."""
    for name in FOLDERS:
        path = os.path.join(profile_dir, name)
        try:
            private.make_folder(path)
        except OSError:
            pass


_CLASS: Any = None


def cluster_class() -> Any:
    """``ipyparallel.Cluster``, writing its cluster file 0600."""
    global _CLASS
    if _CLASS is None:
        import ipyparallel as ipp

        class PrivateCluster(ipp.Cluster):  # type: ignore[misc, name-defined]
            """An ipyparallel cluster whose cluster file is 0600."""

            def write_cluster_file(self) -> None:
                os.makedirs(os.path.dirname(self.cluster_file), exist_ok=True)
                data = json.dumps(self.to_dict()).encode()
                private.write(self.cluster_file, data)

        _CLASS = PrivateCluster
    return _CLASS
