"""Other hosts' engines: the ``--ssh`` host list and each host's plan (pure).

A host is planned by the same rules as this one (:func:`plan_engines`): one engine
per GPU there (each its own GPU first in ``CUDA_VISIBLE_DEVICES``, its near cores),
one per core on a host without GPUs, ``:n`` to take fewer.  What the host has comes
from ``python -m gpucell.devices.probe`` run there; the kernel decides.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any

from gpucell.core.topology import EngineSpec, plan_engines
from gpucell.errors import ClusterError, DeviceSelectionError
from gpucell.protocol.devices import Device

__all__ = [
    "HostFacts",
    "SshHost",
    "check_facts",
    "controller_address",
    "parse_ssh_hosts",
    "plan_host",
]

_HOST = re.compile(r"^(?:[A-Za-z0-9._-]+@)?[A-Za-z0-9._-]+$")


@dataclass(frozen=True)
class SshHost:
    """One ``--ssh`` entry: what ``ssh`` is given, and engines asked for there."""

    dest: str  # [user@]host, or a Host alias of ~/.ssh/config
    n: int | None = None  # None: one per GPU there (one per core without GPUs)


def parse_ssh_hosts(spec: str) -> list[SshHost]:
    """``host1[:n],user@host2[:n]`` to hosts (a port goes in ~/.ssh/config)."""
    hosts: list[SshHost] = []
    for raw in spec.split(","):
        entry = raw.strip()
        if not entry:
            continue
        dest, _, count = entry.partition(":")
        if not _HOST.match(dest):
            raise ClusterError(
                f"--ssh {spec!r}: {dest!r} is not a host name. Write "
                "host[:n] or user@host[:n], comma-separated (a port or key per host "
                "goes in ~/.ssh/config)."
            )
        n = None
        if count:
            try:
                n = int(count)
            except ValueError:
                raise ClusterError(
                    f"--ssh {spec!r}: {entry!r}: after ':' comes the number of "
                    "engines (a port goes in ~/.ssh/config)."
                ) from None
            if n < 1:
                raise ClusterError(f"--ssh {spec!r}: {entry!r} asks for {n} engines.")
        if any(h.dest == dest for h in hosts):
            raise ClusterError(f"--ssh {spec!r}: {dest!r} is named twice.")
        hosts.append(SshHost(dest, n))
    if not hosts:
        raise ClusterError("--ssh needs at least one host: --ssh host1[:n],host2[:n]")
    return hosts


@dataclass(frozen=True)
class HostFacts:
    """What a host's probe said (:mod:`gpucell.devices.probe`)."""

    host: str
    python: str
    gpucell: str
    ipyparallel: str | None
    cores: tuple[int, ...]
    cpu: Device
    gpus: tuple[Device, ...]
    ssh_client: str | None = None

    @classmethod
    def from_json(cls, d: Mapping[str, Any]) -> HostFacts:
        def device(x: Mapping[str, Any]) -> Device:
            return Device(**{**x, "cpu_affinity": tuple(x.get("cpu_affinity", ()))})

        return cls(
            host=str(d["host"]),
            python=str(d["python"]),
            gpucell=str(d["gpucell"]),
            ipyparallel=d.get("ipyparallel"),
            cores=tuple(int(c) for c in d["cores"]),
            cpu=device(d["cpu"]),
            gpus=tuple(device(g) for g in d["gpus"]),
            ssh_client=d.get("ssh_client"),
        )


def check_facts(dest: str, facts: HostFacts, version: str) -> None:
    """Refuse a host whose engines could not work with this kernel."""
    if facts.gpucell != version:
        raise ClusterError(
            f"{dest} has gpucell {facts.gpucell} ({facts.python}), this kernel "
            f"{version}: install gpucell {version} there, or pass --python with the "
            "Python that has it."
        )
    if facts.ipyparallel is None:
        raise ClusterError(
            f"{dest}: {facts.python} has no ipyparallel: `pip install ipyparallel` "
            "there (gpucell's engines are ipyparallel engines)."
        )


def plan_host(
    facts: HostFacts,
    n: int | None,
    *,
    per_gpu: int = 1,
    pin_cpu_engines: bool = True,
) -> list[EngineSpec]:
    """The engines to start on a host, labelled ``host/gpu0``, ``host/cpu1``..."""
    try:
        specs = plan_engines(
            facts.gpus,
            cpu=facts.cpu,
            cores=facts.cores,
            n=n,
            per_gpu=per_gpu,
            pin_cpu_engines=pin_cpu_engines,
        )
    except DeviceSelectionError as e:
        raise ClusterError(f"--ssh host {facts.host}: {e}") from None
    return [replace(s, label=f"{facts.host}/{s.label}") for s in specs]


def controller_address(facts: Sequence[HostFacts]) -> str | None:
    """The one address every host saw the kernel's machine connect from (where
    their engines can reach the controller), or ``None`` when they differ."""
    seen = {f.ssh_client for f in facts}
    if len(seen) != 1 or None in seen:
        return None
    (address,) = seen
    return address
