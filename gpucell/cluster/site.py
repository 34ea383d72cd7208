"""A site's batch defaults, kept in an IPython profile: ``c.GpuCell.slurm_*``
in the profile's ``ipython_config.py`` (partition, account, time, directives,
skipped directives, prologue, first line, ``--jobs``, ``--checkpoint``, the
scheduler), so that ``%gpu_cluster start --profile hpc`` submits the job the
site wants.  Each value comes from, in order: the command line, the profile,
this kernel's own ``GpuCell`` settings (``%config``), gpucell's default;
``--slurm-directive`` lines are added after the profile's directives.
``--dry-run`` shows the merged values and where each came from.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field, replace
from typing import Any

from gpucell.errors import ClusterError

__all__ = ["SITE_SETTINGS", "Merged", "merge", "profile_settings"]

#: GpuCell setting -> (SlurmRequest field, its command-line option or "")
SITE_SETTINGS: dict[str, tuple[str, str]] = {
    "slurm_scheduler": ("scheduler", "--scheduler"),
    "slurm_partition": ("partition", "--partition"),
    "slurm_account": ("account", "--account"),
    "slurm_time": ("time", "--time"),
    "slurm_jobs": ("jobs", "--jobs"),
    "slurm_resubmit": ("checkpoint", "--checkpoint"),
    "slurm_directives": ("directives", "--slurm-directive"),
    "slurm_skip": ("skip", ""),
    "slurm_prologue": ("prologue", ""),
    "slurm_shebang": ("shebang", ""),
}


def profile_settings(profile: str) -> tuple[dict[str, Any], str]:
    """The ``GpuCell`` batch settings a profile's ``ipython_config.py`` (or
    ``.json``) sets, checked by GpuCell's own traits; and that file's path."""
    from traitlets.config import Config
    from traitlets.config.loader import (
        ConfigFileNotFound,
        JSONFileConfigLoader,
        PyFileConfigLoader,
    )

    from gpucell.config import GpuCell

    folder = _existing_profile(profile)
    if folder is None:  # (a start makes it: nothing is set in it yet)
        return {}, ""
    cfg, used = Config(), ""
    for name, loader in (
        ("ipython_config.py", PyFileConfigLoader),
        ("ipython_config.json", JSONFileConfigLoader),
    ):
        try:
            cfg.merge(loader(name, path=folder).load_config())
            used = used or os.path.join(folder, name)
        except ConfigFileNotFound:
            continue
        except Exception as e:  # a syntax error in the site's file
            raise ClusterError(
                f"--profile {profile}: {os.path.join(folder, name)} could not be "
                f"read: {e}"
            ) from None
    section = cfg.GpuCell if "GpuCell" in cfg else Config()
    try:
        checked = GpuCell(config=Config(GpuCell=section))
    except Exception as e:  # a wrong type (traitlets' own message)
        raise ClusterError(f"--profile {profile}: GpuCell setting: {e}") from None
    out = {k: getattr(checked, k) for k in SITE_SETTINGS if k in section}
    return out, used or os.path.join(folder, "ipython_config.py")


def _existing_profile(profile: str) -> str | None:
    from IPython.core.profiledir import ProfileDir, ProfileDirError
    from IPython.paths import get_ipython_dir

    try:
        found = ProfileDir.find_profile_dir_by_name(get_ipython_dir(), profile)
    except ProfileDirError:
        return None
    return str(found.location)


@dataclass
class Merged:
    """The request a start submits, and where each value came from."""

    request: Any  # gpucell.cluster.slurm.SlurmRequest, or None: no batch job
    origin: dict[str, str] = field(default_factory=dict)

    def describe(self) -> str:
        """``--dry-run``'s lines on the merged values (as script comments)."""
        if self.request is None:
            return ""
        rows = []
        for attr, _flag in SITE_SETTINGS.values():
            value = getattr(self.request, attr)
            if value in (None, (), "") and self.origin.get(attr) == "default":
                continue
            shown = ", ".join(value) if isinstance(value, tuple) else value
            rows.append(f"#   {attr:<10} = {shown}  ({self.origin.get(attr)})")
        return "# the job's settings, merged:\n" + "\n".join(rows)


def merge(line: dict[str, Any], profile: str | None) -> Merged:
    """The batch request of a start: ``line`` (the command line's values, None
    where not given, ``slurm`` True for ``--slurm``) over the profile's
    settings over this kernel's.  No batch job (``request`` None) unless the
    line or the profile names a scheduler."""
    from gpucell.cluster.slurm import SlurmRequest
    from gpucell.config import GpuCell, settings

    own = settings()
    site, path = profile_settings(profile) if profile else ({}, "")
    scheduler = line.get("scheduler") or ("slurm" if line.get("slurm") else None)
    if scheduler is None and not site.get("slurm_scheduler"):
        return Merged(None)
    values: dict[str, Any] = {}
    origin: dict[str, str] = {}
    for name, (attr, flag) in SITE_SETTINGS.items():
        given = line.get(attr)
        if name == "slurm_scheduler":
            given = scheduler
        if attr == "directives":  # the line's are added after the site's
            given = None
        if given is not None:
            if name == "slurm_scheduler" and line.get("slurm"):
                flag = "--slurm"
            values[attr], origin[attr] = given, f"command line {flag}"
        elif name in site:
            values[attr] = site[name]
            origin[attr] = f"profile {profile}: c.GpuCell.{name} in {path}"
        elif getattr(own, name) != GpuCell.class_traits()[name].default():
            values[attr], origin[attr] = getattr(own, name), f"%config GpuCell.{name}"
        else:
            values[attr], origin[attr] = None, "default"
    return Merged(_request(SlurmRequest, values, line, origin), origin)


def _request(
    cls: Any, values: dict[str, Any], line: dict[str, Any], origin: Any
) -> Any:
    """The SlurmRequest of merged ``values`` and the line's node options."""
    extra = tuple(line.get("directives") or ())
    site_lines = tuple(values.pop("directives") or ())
    if extra:
        origin["directives"] = (
            f"{origin['directives']}, then command line --slurm-directive"
            if site_lines
            else "command line --slurm-directive"
        )
    kw = {k: v for k, v in values.items() if v not in (None, "")}
    for list_field in ("skip", "prologue"):
        kw[list_field] = tuple(kw.get(list_field) or ())
    req = cls(
        nodes=line.get("nodes") or 1,
        gpus_per_node=line.get("gpus_per_node") or 1,
        cpus_per_node=line.get("cpus_per_node") or 0,
        **kw,
    )
    # the site's settings are in it now: slurm.site_request adds none again
    return replace(req, directives=(*site_lines, *extra), settled=True)
