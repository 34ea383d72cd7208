"""Files a cluster leaves in its profile, swept when the next one starts.

A SIGKILLed kernel takes its controller and engines with it (they die with
their parent) but cannot remove ``security/cluster-<id>.json`` (which lists
pids that no longer exist), the connection files, or its logs; and every start
adds logs.  Before a start, the files of clusters whose controller process is
gone are removed, and the logs of all but the newest :data:`KEEP_LOGS` stopped
clusters.  A cluster whose controller still runs (started elsewhere, by
``ipcluster`` or another kernel) is never touched.

A controller that dies on its own (SIGKILLed, out of memory) cannot remove its
connection files either (``security/ipcontroller-<id>-{client,engine}.json``,
with the key that lets anyone who reads them send the engines code), and the
kernel's stop then removes the cluster file, leaving them with nothing that
names a pid.  So the kernel's stop removes its own cluster's connection files
once no process of that cluster runs (:func:`forget_cluster`), and a start
removes connection files that no cluster file claims, once no process on this
host belongs to that cluster id and they are :data:`ORPHANS_AFTER` seconds old
(a controller started just now writes them before its cluster file exists, and
one on another host sharing this profile over NFS cannot be seen here).
"""

from __future__ import annotations

import json
import os
import re
import time
from pathlib import Path

from gpucell.devices.host import pid_running

__all__ = ["KEEP_LOGS", "ORPHANS_AFTER", "forget_cluster", "sweep_profile"]

#: logs of this many stopped clusters are kept per profile (newest first)
KEEP_LOGS = 5

#: connection files no cluster file claims are swept once this old (seconds)
ORPHANS_AFTER = 600.0

_ID = re.compile(r"(\d{9,}-[a-z0-9]{4})")


def _controller_pid(path: Path) -> int | None:
    try:
        data = json.loads(path.read_text())
        pid = data["controller"]["state"]["pid"]
    except (OSError, ValueError, KeyError, TypeError):
        return None
    return pid if isinstance(pid, int) and pid > 0 else None


def sweep_profile(profile_dir: str | os.PathLike[str]) -> list[str]:
    """Remove the leftovers of dead clusters in ``profile_dir``; the paths removed."""
    root = Path(profile_dir)
    security, log = root / "security", root / "log"
    removed: list[str] = []
    running: set[str] = set()
    for path in sorted(security.glob("cluster-*.json")):
        cid = path.stem[len("cluster-") :]
        pid = _controller_pid(path)
        if pid is not None and not pid_running(pid):
            for p in [path, *_connection_files(security, cid)]:
                removed += _unlink(p)
        else:
            running.add(cid)
    # connection files of a controller that died after its cluster file went
    orphans: dict[str, list[Path]] = {}
    for p in security.glob("ipcontroller-*.json"):
        m = _ID.fullmatch(p.name[len("ipcontroller-") :].rsplit("-", 1)[0])
        if m and m.group(1) not in running:
            orphans.setdefault(m.group(1), []).append(p)
    if orphans:
        now, live = time.time(), _live_cluster_ids()
        for cid, paths in orphans.items():
            if cid in live:
                running.add(cid)
                continue
            for p in paths:
                try:
                    old = now - p.lstat().st_mtime >= ORPHANS_AFTER
                except OSError:
                    continue
                if old:
                    removed += _unlink(p)
    # logs, by cluster id: those of running clusters stay, and the newest few
    by_id: dict[str, list[Path]] = {}
    for p in log.glob("*"):
        m = _ID.search(p.name)
        if m and p.is_file():
            by_id.setdefault(m.group(1), []).append(p)
    stopped = sorted(
        (cid for cid in by_id if cid not in running),
        key=lambda c: max(p.stat().st_mtime for p in by_id[c]),
        reverse=True,
    )
    for cid in stopped[KEEP_LOGS:]:
        for p in by_id[cid]:
            removed += _unlink(p)
    return removed


def forget_cluster(profile_dir: str | os.PathLike[str], cluster_id: str) -> list[str]:
    """After a cluster was stopped: remove its connection files if its
    controller could not (it died first), once none of its processes runs."""
    if not cluster_id or cluster_id in _live_cluster_ids():
        return []
    removed: list[str] = []
    for p in _connection_files(Path(profile_dir) / "security", cluster_id):
        removed += _unlink(p)
    return removed


def _connection_files(security: Path, cid: str) -> list[Path]:
    return [
        p
        for p in security.glob(f"ipcontroller-{cid}-*.json")
        if p.name[len(f"ipcontroller-{cid}-") : -len(".json")] in _KINDS
    ]


#: the connection files a controller writes (``ipcontroller-<id>-<kind>.json``)
_KINDS = ("client", "engine")


def _live_cluster_ids() -> set[str]:
    """Cluster ids of this user's processes on this host (ipyparallel gives
    the controller and engines it starts ``IPP_CLUSTER_ID``)."""
    found: set[str] = set()
    try:
        pids = [d for d in os.listdir("/proc") if d.isdigit()]
    except OSError:
        return found
    uid = os.getuid()
    for pid in pids:
        try:
            if os.stat(f"/proc/{pid}").st_uid != uid:
                continue
            with open(f"/proc/{pid}/environ", "rb") as f:
                env = f.read()
        except OSError:
            continue
        for var in env.split(b"\0"):
            if var.startswith(b"IPP_CLUSTER_ID="):
                cid = var[len(b"IPP_CLUSTER_ID=") :].decode(errors="replace")
                if cid:
                    found.add(cid)
    return found


def _unlink(p: Path) -> list[str]:
    try:
        p.unlink()
    except OSError:
        return []
    return [str(p)]
