"""Connecting to a cluster started elsewhere (``ipcluster start``, another
notebook's, another host's, through an ssh tunnel): its engines get devices by
their local rank on each host.
"""

from __future__ import annotations

import contextlib
import os
import signal
import threading
import time
from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING, Any

from gpucell import config as _config
from gpucell.cluster import profiles, shm_channel
from gpucell.cluster.engines import EngineInfo, answers, info_from, preimport, summary
from gpucell.cluster.model import GpuCluster
from gpucell.errors import ClusterError

if TYPE_CHECKING:  # imported lazily at run time: ipyparallel costs ~0.3 s
    import ipyparallel as ipp

__all__ = ["assign_by_local_rank", "check_request", "connect_to"]


def check_request(
    profile: str | None,
    cluster_id: str | None,
    file: str | None,
    ssh: str | None,
    ssh_key: str | None,
) -> None:
    """A ClusterError for a request that cannot name a cluster or a tunnel."""
    if not (profile or cluster_id or file):
        raise ClusterError(
            "connect needs --profile P, --cluster-id ID or "
            "--file ipcontroller-client.json."
        )
    if ssh_key and not ssh:
        raise ClusterError("--ssh-key needs --ssh user@host to tunnel through.")
    if ssh_key and not os.path.isfile(os.path.expanduser(ssh_key)):
        raise ClusterError(f"No ssh key file {ssh_key!r}.")


def connect_to(
    *,
    profile: str | None,
    cluster_id: str | None,
    file: str | None,
    ssh: str | None,
    ssh_key: str | None,
    timeout: float | None,
    min_engines: int,
    echo: Callable[[str], None] | None,
) -> GpuCluster:
    """Connect, wait for ``min_engines``, pin each engine by local rank."""
    check_request(profile, cluster_id, file, ssh, ssh_key)
    timeout = timeout if timeout is not None else _config.settings().connect_timeout
    t0 = time.perf_counter()
    client, url_file = _client(profile, cluster_id, file, ssh, ssh_key, timeout)
    try:
        try:
            client.wait_for_engines(min_engines, timeout=timeout, interactive=False)
        except TimeoutError:
            raise ClusterError(
                "The cluster answered but no engine registered within "
                f"{timeout:.0f} s. Start engines (`ipcluster engines`) "
                "or raise --timeout."
            ) from None
        ids = list(client.ids)
        channel = shm_channel.open_for_cluster()
        try:
            engines, pin_warnings = assign_by_local_rank(client, ids, timeout, channel)
        except BaseException:
            shm_channel.release(channel)
            raise
    except BaseException:
        client.close()
        raise
    elapsed = time.perf_counter() - t0
    gc = GpuCluster(
        client=client,
        engines=engines,
        owned=False,
        startup_seconds=elapsed,
        warnings=pin_warnings,
        _channel=channel,
    )
    gc.description = f"{len(engines)} engines ({summary(engines)})"
    gc.watched_pid = _local_controller_pid(client, url_file)
    preimport(client, ids)
    if echo:
        echo(f"gpucell: connected to {gc.description} in {elapsed:.1f} s")
        for w in gc.warnings:
            echo(f"gpucell: warning: {w}")
    return gc


def _local_controller_pid(client: ipp.Client, url_file: str | None) -> int | None:
    """The controller's pid when it runs on this host and its cluster file is
    beside the connection file (a cluster another kernel here started): a dead
    owner's controller is then noticed at once instead of hanging the next
    request (``%gpu_cluster status`` waited for ever)."""
    import json
    import re
    import socket

    cfg = getattr(client, "_config", None) or {}
    if cfg.get("location") != socket.gethostname() or not url_file:
        return None
    m = re.fullmatch(r"ipcontroller-(.+)-client\.json", os.path.basename(url_file))
    if not m:
        return None
    cluster_file = os.path.join(os.path.dirname(url_file), f"cluster-{m[1]}.json")
    try:
        with open(cluster_file) as f:
            pid = json.load(f)["controller"]["state"]["pid"]
    except (OSError, ValueError, KeyError, TypeError):
        return None
    return pid if isinstance(pid, int) and pid > 0 else None


def _client(
    profile: str | None,
    cluster_id: str | None,
    file: str | None,
    ssh: str | None,
    ssh_key: str | None,
    timeout: float,
) -> tuple[ipp.Client, str | None]:
    """ipyparallel's client of the cluster named, and its connection file (when
    known), or a ClusterError saying why not."""
    kw: dict[str, Any] = {"timeout": timeout}
    args: list[Any] = []
    if file:
        if not os.path.exists(file):
            raise ClusterError(f"No connection file {file!r}.")
        # positional: ipyparallel 9 accepts ``url_file=`` but ignores it, and
        # would fall back to the default profile's file (another cluster)
        args.append(os.path.abspath(os.path.expanduser(file)))
    if profile:
        kw["profile_dir"] = profiles.profile_dir(profile)
        if not cluster_id and not file:
            # a cluster started with an id (gpucell's, `start --profile P`)
            # has no plain ipcontroller-client.json: find the one running
            cluster_id = profiles.running_cluster_id(kw["profile_dir"], profile)
    if cluster_id:
        kw["cluster_id"] = cluster_id
    url_file = args[0] if args else None
    if url_file is None and "profile_dir" in kw:
        name = f"ipcontroller-{cluster_id}-client.json" if cluster_id else ""
        url_file = os.path.join(kw["profile_dir"], "security", name) if name else None
    if ssh:
        kw["sshserver"] = ssh
        if ssh_key:
            kw["sshkey"] = os.path.expanduser(ssh_key)
    import ipyparallel as ipp

    try:
        with _tunnels_survive_hangup(bool(ssh)):
            return ipp.Client(*args, **kw), url_file
    except Exception as e:
        if ssh and _is_ssh_failure(e):
            raise ClusterError(_ssh_advice(ssh, ssh_key, e)) from e
        where = file or f"profile {profile or 'default'}" + (
            f", cluster id {cluster_id}" if cluster_id else ""
        )
        hint = "Is it running (`ipcluster start`)?"
        if ssh and isinstance(e, TimeoutError):
            # the tunnel accepts at once, so a request sent before the
            # controller listens is lost rather than queued
            hint = (
                "Through ssh, a controller that was still starting does not "
                "answer: once `ipcluster start` says it is up, connect again."
            )
        raise ClusterError(
            f"Could not connect to the cluster of {where}: {e}. {hint}"
        ) from e


@contextlib.contextmanager
def _tunnels_survive_hangup(ssh: bool) -> Iterator[None]:
    """Ignore SIGHUP while pyzmq opens its ssh tunnels.

    pyzmq runs ``ssh -f -L ...`` under a pseudo-terminal (pexpect); when the
    foreground ssh exits, the terminal hangs up, and the backgrounded ssh dies if
    that happens before it has detached: most tunnels were gone within a second
    (measured here: 0 of 1 alive; 5 of 5 with SIGHUP ignored).  ssh keeps an
    ignored SIGHUP ignored, so the tunnels now live as long as they are used.
    """
    if not ssh or threading.current_thread() is not threading.main_thread():
        yield
        return
    old = signal.signal(signal.SIGHUP, signal.SIG_IGN)
    try:
        yield
    finally:
        signal.signal(signal.SIGHUP, old)


def _is_ssh_failure(e: BaseException) -> bool:
    """pyzmq's tunnel raised it (its SSHException), or ssh itself is missing."""
    return type(e).__name__ == "SSHException" or (
        isinstance(e, FileNotFoundError) and "ssh" in str(e)
    )


def _ssh_advice(ssh: str, key: str | None, e: BaseException) -> str:
    """What went wrong with the tunnel, and the command that shows why."""
    host, _, port = ssh.partition(":")
    cmd = "ssh" + (f" -i {key}" if key else "") + (f" -p {port}" if port else "")
    return (
        f"Could not open an ssh tunnel through {ssh}: {e} Check that `{cmd} {host} "
        "true` works without a prompt: the host's key must already be in your "
        "known_hosts (log in once to accept it) and login must use a key "
        "(--ssh-key, or your ssh config or agent), not a password."
    )


_open_channels: set[Any] = set()  # closed at exit if their cluster never stops


def assign_by_local_rank(
    client: ipp.Client, ids: list[int], timeout: float, channel: Any = None
) -> tuple[dict[int, EngineInfo], list[str]]:
    from gpucell.engine.runtime import assign_device, describe, host_facts

    view = client.direct_view(ids)
    got = answers(view.apply_async(host_facts), timeout, "describe")
    described = answers(view.apply_async(describe, channel), timeout, "describe")
    facts = dict(zip(ids, got, strict=True))
    # engines gpucell pinned already (a cluster another notebook started, or
    # connected to first) keep their device
    pinned = {e: d for e, d in zip(ids, described, strict=True) if d.get("label")}
    by_host: dict[str, list[int]] = {}
    for eid in ids:
        if eid not in pinned:
            by_host.setdefault(facts[eid]["host"], []).append(eid)
    results = {}
    for _host, eids in by_host.items():
        for rank, eid in enumerate(sorted(eids)):
            f = facts[eid]
            gpus = f["gpus"]
            threads = max(1, f["cores"] // len(eids))
            if gpus:
                g = gpus[rank % len(gpus)]
                order = [g["index"]] + [x["index"] for x in gpus if x is not g]
                args: tuple[Any, ...] = (
                    "gpu",
                    g["index"],
                    ",".join(map(str, order)),
                    g["name"],
                    g["memory_total"],
                )
            else:
                args = ("cpu", -1, None, "CPU", 0)
            ar = client[eid].apply_async(
                assign_device, *args, threads, f"r{rank}", channel
            )
            results[eid] = ar
    engines = {eid: info_from(eid, d) for eid, d in pinned.items()}
    warnings = []
    for eid, ar in results.items():
        d = answers(ar, timeout, "pin")
        if not d.get("pinned", True):
            warnings.append(
                f"engine {eid} had initialised CUDA before gpucell connected; it "
                "keeps its current device (restart it to pin it by local rank)"
            )
        engines[eid] = info_from(eid, d)
    return engines, warnings
