"""IPython profiles for clusters: finding or making one, what a profile keeps of
where its cluster's engines run (so ``start --profile P`` alone starts it the
same way again), and which of its clusters is running.
"""

from __future__ import annotations

import os
from typing import Any

from gpucell.devices.host import pid_running
from gpucell.errors import ClusterError

__all__ = [
    "PLACEMENT_FILE",
    "Placement",
    "placed",
    "profile_dir",
    "running_cluster_id",
    "save_placement",
    "saved_placement",
]


def profile_dir(profile: str, create: bool = False) -> str:
    """The directory of an IPython profile (made if ``create``), or a
    ClusterError saying there is none."""
    from IPython.core.profiledir import ProfileDir, ProfileDirError
    from IPython.paths import get_ipython_dir

    if create:
        try:
            return str(
                ProfileDir.find_profile_dir_by_name(get_ipython_dir(), profile).location
            )
        except ProfileDirError:
            try:
                made = ProfileDir.create_profile_dir_by_name(get_ipython_dir(), profile)
            except ProfileDirError as e:
                raise ClusterError(f"--profile {profile!r}: {e}") from None
            return str(made.location)
    try:
        return str(
            ProfileDir.find_profile_dir_by_name(get_ipython_dir(), profile).location
        )
    except ProfileDirError:
        raise ClusterError(
            f"No IPython profile {profile!r} (looked in {get_ipython_dir()}). "
            f"Create it with `ipython profile create {profile}` or leave out --profile."
        ) from None


PLACEMENT_FILE = "gpucell_cluster.json"


def _placement(
    ssh: str | None,
    ssh_key: str | None,
    python: str | None,
    controller_ip: str | None,
    slurm: Any,
) -> dict[str, Any]:
    """The start's options that say where engines run (empty: this host only)."""
    from dataclasses import asdict

    if ssh is None and slurm is None:
        return {}
    out: dict[str, Any] = {"ssh": ssh, "ssh_key": ssh_key, "python": python}
    out["controller_ip"] = controller_ip
    out["slurm"] = asdict(slurm) if slurm is not None else None
    return out


def _unpack_placement(d: dict[str, Any]) -> tuple[Any, ...]:
    slurm = None
    if d.get("slurm"):
        from gpucell.cluster.slurm import SlurmRequest

        slurm = SlurmRequest(**d["slurm"])
    ip = d.get("controller_ip")
    return d.get("ssh"), d.get("ssh_key"), d.get("python"), ip, slurm


def _describe_placement(d: dict[str, Any]) -> str:
    if d.get("slurm"):
        j = d["slurm"]
        return (
            f"starting as saved (--slurm --nodes {j['nodes']} --gpus-per-node "
            f"{j['gpus_per_node']})"
        )
    return f"starting as saved (--ssh {d.get('ssh')})"


def save_placement(folder: str, where: dict[str, Any]) -> None:
    import json

    from gpucell.protocol import private

    # 0600, under a random temporary name (never through a planted link)
    path = os.path.join(folder, PLACEMENT_FILE)
    private.write(path, json.dumps(where, indent=1).encode())


def saved_placement(folder: str) -> dict[str, Any] | None:
    import json

    from gpucell.protocol import private

    try:
        d = json.loads(private.read(os.path.join(folder, PLACEMENT_FILE)))
    except (OSError, ValueError):
        return None
    return d if isinstance(d, dict) else None


#: where the engines of a start run: --ssh, --ssh-key, --python,
#: --controller-ip, --slurm
Placement = tuple[str | None, str | None, str | None, str | None, Any]


def placed(
    profile: str | None, where: Placement, echo: Any = None
) -> tuple[dict[str, Any], Placement]:
    """The cluster's profile keywords (``profile_dir``) and where its engines run:
    a start that says where is saved in the profile, one that does not starts
    as the profile's saved start did (and says so)."""
    if not profile:
        return {}, where
    kw: dict[str, Any] = {"profile_dir": profile_dir(profile, create=True)}
    wanted = _placement(*where)
    if wanted:
        save_placement(kw["profile_dir"], wanted)
        return kw, where
    saved = saved_placement(kw["profile_dir"])
    if not saved:
        return kw, where
    if echo:
        echo(f"gpucell: profile {profile}: {_describe_placement(saved)}")
    ssh, ssh_key, python, ip, slurm = _unpack_placement(saved)
    return kw, (ssh, ssh_key, python, ip, slurm)


def running_cluster_id(folder: str, profile: str) -> str | None:
    """The id of the one cluster running in a profile that has no plain
    connection file (None: let ipyparallel look for the plain file)."""
    import glob
    import json

    security = os.path.join(folder, "security")
    if os.path.exists(os.path.join(security, "ipcontroller-client.json")):
        return None
    found = []
    for path in sorted(glob.glob(os.path.join(security, "cluster-*.json"))):
        try:
            with open(path) as f:
                d = json.load(f)
            cid = d["cluster"]["cluster_id"]
        except (OSError, ValueError, KeyError, TypeError):
            continue
        if not cid or not os.path.exists(
            os.path.join(security, f"ipcontroller-{cid}-client.json")
        ):
            continue
        pid = ((d.get("controller") or {}).get("state") or {}).get("pid")
        if isinstance(pid, int) and not pid_running(pid):
            continue  # a killed kernel's (the next start sweeps it)
        found.append(cid)
    if len(found) > 1:
        raise ClusterError(
            f"Profile {profile!r} has {len(found)} clusters running "
            f"({', '.join(found)}): pass --cluster-id with one of them."
        )
    return found[0] if found else None
