"""Engines on other hosts over ssh, through ipyparallel's own SSH launcher.

Before anything starts, each host is asked what it has (``python -m
gpucell.devices.probe`` over ssh, all hosts at once): an unreachable host, a
refused login, a Python without gpucell or with another version fail here with one
line that says how to fix it, and nothing is left running.  Then each engine is its
own ipyparallel engine set (as local ones are), so each gets its own environment:
its GPU first in ``CUDA_VISIBLE_DEVICES``, its cores, its thread pools, all set
before the engine process starts.
"""

from __future__ import annotations

import json
import subprocess
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

from gpucell.core.hosts import HostFacts, SshHost, check_facts, plan_host
from gpucell.core.topology import EngineSpec
from gpucell.errors import ClusterError

__all__ = ["RemotePlan", "probe_hosts", "ssh_args", "start_remote_engines"]

#: seconds for one host's probe (a login and a Python start)
PROBE_TIMEOUT = 60.0


@dataclass(frozen=True)
class RemotePlan:
    """The engines to start on one host."""

    dest: str
    facts: HostFacts
    specs: tuple[EngineSpec, ...]


def ssh_args(key: str | None, options: Sequence[str] = ()) -> list[str]:
    """ssh's arguments (before the destination): never a password prompt."""
    args = ["-o", "BatchMode=yes", "-o", "ConnectTimeout=15"]
    if key:
        args += ["-i", key, "-o", "IdentitiesOnly=yes"]
    return args + list(options)


def probe_hosts(
    hosts: Sequence[SshHost],
    python: str,
    args: Sequence[str],
    version: str,
    *,
    per_gpu: int = 1,
    pin_cpu_engines: bool = True,
) -> list[RemotePlan]:
    """Ask every host at once; plan its engines; the first problem as an error."""
    with ThreadPoolExecutor(max_workers=min(16, len(hosts))) as pool:
        found = list(pool.map(lambda h: _probe(h.dest, python, args), hosts))
    plans = []
    for h, facts in zip(hosts, found, strict=True):
        check_facts(h.dest, facts, version)
        specs = plan_host(facts, h.n, per_gpu=per_gpu, pin_cpu_engines=pin_cpu_engines)
        plans.append(RemotePlan(h.dest, facts, tuple(specs)))
    return plans


def _probe(dest: str, python: str, args: Sequence[str]) -> HostFacts:
    cmd = ["ssh", *args, dest, python, "-m", "gpucell.devices.probe"]
    try:
        p = subprocess.run(
            cmd,
            capture_output=True,
            text=True,
            timeout=PROBE_TIMEOUT,
            stdin=subprocess.DEVNULL,
        )
    except FileNotFoundError:
        raise ClusterError(
            "--ssh needs the `ssh` command (OpenSSH's client), which is not on PATH."
        ) from None
    except subprocess.TimeoutExpired:
        raise ClusterError(
            f"{dest} did not answer over ssh within {PROBE_TIMEOUT:.0f} s "
            f"(`ssh {dest} true` shows why). Nothing was started."
        ) from None
    if p.returncode == 0:
        try:
            return HostFacts.from_json(json.loads(p.stdout.strip().splitlines()[-1]))
        except (ValueError, IndexError, KeyError, TypeError):
            raise ClusterError(
                f"{dest}: `{python} -m gpucell.devices.probe` printed something "
                f"unexpected ({_last(p.stdout)!r}); is the login shell printing "
                "text? Nothing was started."
            ) from None
    raise ClusterError(describe_failure(dest, python, p.returncode, p.stderr))


def describe_failure(dest: str, python: str, code: int, stderr: str) -> str:
    """One line for a failed ssh probe: what went wrong and how to fix it."""
    err = stderr.strip()
    line = _last(err)
    tail = " Nothing was started."
    if code == 255:  # ssh's own failure
        if "Permission denied" in err:
            return (
                f"ssh refused the login to {dest} ({line}). Give the key with "
                "--ssh-key KEY (or an IdentityFile in ~/.ssh/config); "
                f"`ssh {dest} true` must work without a password." + tail
            )
        if "Host key verification failed" in err:
            return (
                f"{dest}'s host key is not in ~/.ssh/known_hosts: log in once with "
                f"`ssh {dest} true` and accept it." + tail
            )
        return f"{dest} is unreachable over ssh ({line})." + tail
    if "No module named" in err and "gpucell" in err:
        return (
            f"{python} on {dest} has no gpucell: install it there (`pip install "
            "gpucell`, the same version as here), or pass --python with the "
            "Python that has it." + tail
        )
    if code == 127 or "No such file or directory" in err:
        return (
            f"no Python at {python!r} on {dest} ({line}): pass --python PATH, the "
            "Python that has gpucell there." + tail
        )
    return f"{dest}: `{python} -m gpucell.devices.probe` failed ({line})." + tail


def _last(text: str) -> str:
    lines = [x for x in text.strip().splitlines() if x.strip()]
    return lines[-1].strip() if lines else "no output"


def remote_env(base: dict[str, str]) -> dict[str, str]:
    """A remote engine's environment: not tied to a parent there (the ssh
    receiver that starts it exits at once), its affinity applied by boot."""
    env = dict(base)
    env["GPUCELL_PARENT_PID"] = "0"
    return env


def start_remote_engines(
    cluster: Any,
    plans: Sequence[RemotePlan],
    python: str,
    args: Sequence[str],
    engine_args: Sequence[str],
    env_for: Any,
) -> int:
    """One ipyparallel SSH engine set per engine; the number started."""
    from gpucell.cluster.launcher import RemoteEngineSetLauncher

    saved = cluster.engine_launcher_class, cluster.send_engines_connection_env
    # the engines read the controller's address from their environment (no
    # connection file copied over), and start through gpucell's boot there
    cluster.engine_launcher_class = RemoteEngineSetLauncher
    cluster.send_engines_connection_env = True
    started = 0
    try:
        for plan in plans:
            for spec in plan.specs:
                cluster.start_engines_sync(
                    1,
                    engine_set_id=spec.label.replace("/", "-"),
                    engines={plan.dest: {"n": 1, "to_send": []}},
                    environment=remote_env(env_for(spec)),
                    engine_args=list(engine_args),
                    ssh_args=list(args),
                    scp_args=list(args),
                    remote_python=python,
                )
                started += 1
    finally:
        cluster.engine_launcher_class, cluster.send_engines_connection_env = saved
    return started
