"""Files a cluster leaves in its profile, swept when the next one starts.

A SIGKILLed kernel takes its controller and engines with it (they die with
their parent) but cannot remove ``security/cluster-<id>.json`` (which lists
pids that no longer exist), the connection files, or its logs; and every start
adds logs.  Before a start, the files of clusters whose controller process is
gone are removed, and the logs of all but the newest :data:`KEEP_LOGS` stopped
clusters.  A cluster whose controller still runs (started elsewhere, by
``ipcluster`` or another kernel) is never touched.
"""

from __future__ import annotations

import json
import os
import re
from pathlib import Path

from gpucell.devices.host import pid_running

__all__ = ["KEEP_LOGS", "sweep_profile"]

#: logs of this many stopped clusters are kept per profile (newest first)
KEEP_LOGS = 5

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
            for p in [path, *security.glob(f"ipcontroller-{cid}-*.json")]:
                removed += _unlink(p)
        else:
            running.add(cid)
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


def _unlink(p: Path) -> list[str]:
    try:
        p.unlink()
    except OSError:
        return []
    return [str(p)]
