"""Starting a cluster this kernel owns: which engines (one per GPU, or per
core), the controller's and engines' settings, the start itself (here, over ssh
or as a Slurm job), waiting for every engine, and stopping what was started when
anything fails.
"""

from __future__ import annotations

import contextlib
import logging
import os
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, TypeVar

from gpucell import config as _config
from gpucell.cluster import profiles, shm_channel
from gpucell.cluster.engines import (
    describe_engines,
    engine_env,
    info_from,
    preimport,
    summary,
)
from gpucell.cluster.model import GpuCluster
from gpucell.core.topology import EngineSpec, parse_gpu_selection, plan_engines
from gpucell.devices.discovery import Discovery, cpu_device, discover
from gpucell.errors import ClusterError

if TYPE_CHECKING:  # imported lazily at run time: ipyparallel costs ~0.3 s
    import ipyparallel as ipp

    from gpucell.devices.nvml import NvmlApi

__all__ = [
    "CONTROLLER_TRIES",
    "LOCAL_CURVE",
    "REGISTER_AGAIN_AFTER",
    "Plan",
    "controller_said",
    "exited_engines",
    "fast_start_settings",
    "launch",
    "plan",
    "remote_engine_args",
]


@dataclass(frozen=True)
class Plan:
    """The engines a start asks for on this host, and what was found."""

    discovery: Discovery
    select: Any  # core.topology's selection ("all", "none" or indices)
    specs: tuple[EngineSpec, ...]


def plan(
    n: int | None,
    gpus: str | Sequence[int] | None,
    per_gpu: int | None,
    cpu_engines: int | None,
    nvml: NvmlApi | None,
    slurm: Any,
    ssh: str | None,
) -> Plan:
    """This host's engines for a start (none with --slurm: the job's only)."""
    s = _config.settings()
    discovery = discover(nvml)
    select = parse_gpu_selection(gpus if gpus is not None else s.gpus)
    specs = plan_engines(
        discovery.gpus,
        cpu=cpu_device(),
        cores=_cores(),
        select=select,
        n=n,
        per_gpu=per_gpu if per_gpu is not None else s.per_gpu,
        cpu_engines=cpu_engines if cpu_engines is not None else s.cpu_engines,
        pin_cpu_engines=s.pin_cpu_engines,
    )
    if slurm is not None:
        if ssh:
            raise ClusterError("--slurm and --ssh: choose one way to start engines.")
        specs = []  # the job's engines only (this is usually a login node)
    return Plan(discovery, select, tuple(specs))


def launch(
    p: Plan,
    *,
    profile: str | None,
    timeout: float | None,
    where: profiles.Placement,
    per_gpu: int | None,
    echo: Callable[[str], None] | None,
    t0: float,
    encrypt: bool | None = None,
) -> GpuCluster:
    """Start the planned cluster and wait for every engine; on any failure
    stop what was started and say whether anything is left."""
    s = _config.settings()
    profile_kw, where = profiles.placed(profile, where, echo)
    ssh, ssh_key, python, controller_ip, slurm = where
    timeout = timeout if timeout is not None else s.start_timeout
    if python and ssh is None and slurm is None:
        raise ClusterError("--python is for --ssh hosts or --slurm nodes.")
    remote = _plan_remote(s, ssh, ssh_key, python, per_gpu)  # before anything starts
    ip = _listen_on(remote, slurm, controller_ip)
    if ip:
        profile_kw["controller_ip"] = ip
    # encrypted on this host, to --ssh hosts (their engines take the server key
    # from the connection info ipyparallel sends through ssh's stdin) and to a
    # batch job's engines (from the 0600 connection file in the profile's 0700
    # security folder, as ipyparallel's batch launchers have them read it);
    # GpuCell.encrypt / --no-encrypt turn it off
    curve = s.encrypt if encrypt is None else encrypt
    cluster, engine_args = _new_cluster(s, p.specs, profile_kw, curve)
    channel = shm_channel.open_for_cluster()
    try:
        client = _again_if_a_port_was_taken(
            cluster,
            lambda: _start_and_connect(
                cluster, p.specs, engine_args, timeout, remote, slurm, python, echo
            ),
        )
        infos = describe_engines(client, client.ids, timeout, channel)
    except BaseException as e:
        shm_channel.release(channel)
        err = _failed_start(cluster, e)
        if err is e:
            raise
        raise err from e
    engines = {eid: info_from(eid, d) for eid, d in infos.items()}
    preimport(client, list(engines))
    elapsed = time.perf_counter() - t0
    gc = GpuCluster(
        client=client,
        engines=engines,
        cluster=cluster,
        owned=True,
        startup_seconds=elapsed,
        specs=p.specs,
        engine_args=tuple(engine_args),
        _channel=channel,
    )
    for eid in engines:  # the first cell's views, made now (~0.3 ms each)
        gc.view(eid)
    gc.description = f"{len(engines)} engines ({summary(engines)})"
    if slurm is not None:  # --jobs: the later jobs' engines join as they start
        gc.restarts.joining = max(0, slurm.engines - len(engines))
        gc.restarts.batch = getattr(cluster, "gpucell_jobs", None)  # slurm_jobs
    if p.discovery.gpus == () and p.discovery.notes and p.select != "none":
        # the user asked for GPUs (the default): say why there are none
        gc.warnings.append("no GPU found (" + "; ".join(p.discovery.notes) + ")")
    if echo:
        echo(f"gpucell: {gc.description} ready in {elapsed:.1f} s")
        for w in gc.warnings:
            echo(f"gpucell: note: {w}")
    return gc


def _listen_on(remote: _Remote | None, slurm: Any, controller_ip: str | None) -> str:
    """The controller's address ("": ipyparallel's default, loopback only)."""
    if remote is not None:
        return controller_ip or _controller_ip(remote.plans)
    if slurm is not None:
        import socket

        try:
            here = socket.gethostbyname(socket.gethostname())
        except OSError:
            here = "*"
        return controller_ip or here
    return controller_ip or ""


#: A cluster's messages are encrypted (CurveZMQ, ipyparallel's
#: ``IPController.enable_curve``): without it any local user could subscribe to
#: the controller's loopback ports (anyone on the network to the ports it opens
#: for --ssh hosts) and read every cell's output and inputs in clear.  The server
#: key is only in the 0600 connection files and the engines' environment, so no
#: one else can complete the handshake.  Cost measured by bench/bench_curve.py.
LOCAL_CURVE = True


def _new_cluster(
    s: Any, specs: Sequence[EngineSpec], profile_kw: dict[str, Any], curve: bool
) -> tuple[ipp.Cluster, list[str]]:
    """ipyparallel's Cluster (nothing started yet) and the engines' arguments."""
    cluster_kw, controller_args, engine_args = fast_start_settings(s.fast_start)
    if curve and LOCAL_CURVE:
        controller_args.append("--IPController.enable_curve=True")
        _quiet_unsigned_warning()
    controller_args += [f"--IPController.log_level={s.cluster_log_level}"]
    engine_args += [f"--IPEngine.log_level={s.cluster_log_level}"]
    from gpucell.cluster import private_profile
    from gpucell.cluster.launcher import (
        PinnedControllerLauncher,
        PinnedEngineSetLauncher,
    )

    # its cluster file 0600, its logs 0600 (the launchers), folders 0700.  The
    # launcher classes themselves, not their entry-point name "gpucell": a gpucell
    # on PYTHONPATH but not installed has no entry points, and ipyparallel then
    # takes the name for the module gpucell and fails with a TraitError
    cluster = private_profile.cluster_class()(
        n=len(specs),
        engine_launcher_class=PinnedEngineSetLauncher,
        controller_launcher_class=PinnedControllerLauncher,
        controller_args=controller_args,
        log_level=40,
        **profile_kw,
        **cluster_kw,
    )
    try:  # what killed kernels left in this profile (never fails a start)
        from gpucell.cluster.leftovers import sweep_profile

        sweep_profile(cluster.profile_dir)
    except Exception:
        pass
    private_profile.tighten(cluster.profile_dir)
    return cluster, engine_args


class _CurveSigns(logging.Filter):
    """Drops jupyter_client's "Message signing is disabled" warning: with
    CurveZMQ ipyparallel leaves the HMAC key empty on purpose (every connection
    is authenticated and encrypted), and the warning would tell the user the
    opposite of the truth."""

    def filter(self, record: logging.LogRecord) -> bool:
        return "Message signing is disabled" not in record.getMessage()


def _quiet_unsigned_warning() -> None:
    from traitlets.log import get_logger

    # the kernel application's logger in a kernel, else "traitlets"
    for log in {get_logger(), logging.getLogger("traitlets")}:
        if isinstance(log, logging.Logger) and not any(
            isinstance(f, _CurveSigns) for f in log.filters
        ):
            log.addFilter(_CurveSigns())


#: starts of a controller that lost one of its ports.  ipyparallel picks the
#: controller's ports by binding port 0 and closing the socket, and the
#: controller binds them a moment later: another process choosing its ports
#: the same way meanwhile (a kernel started beside it, by jupyter_client) can
#: take one, and the controller exits "Address already in use"
CONTROLLER_TRIES = 3

_T = TypeVar("_T")


def _again_if_a_port_was_taken(cluster: ipp.Cluster, start: Callable[[], _T]) -> _T:
    """``start()``, begun again from nothing (at most :data:`CONTROLLER_TRIES`
    times in all) while it fails because the controller lost a port."""
    for attempt in range(1, CONTROLLER_TRIES + 1):
        try:
            return start()
        except Exception:
            if attempt == CONTROLLER_TRIES or _PORT_TAKEN not in controller_said(
                cluster
            ):
                raise
            if _stop_quietly(cluster) is not None:
                raise
    raise AssertionError("unreachable")


_PORT_TAKEN = "Address already in use"


def controller_said(cluster: Any) -> str:
    """The last line a controller that already exited wrote (why it gave up);
    "" while it runs, or when it wrote nothing."""
    launcher = getattr(cluster, "controller", None)
    if launcher is None or getattr(launcher, "state", None) != "after":
        return ""
    try:
        lines = [x.strip() for x in launcher.get_output().splitlines() if x.strip()]
    except Exception:
        return ""
    return lines[-1][:300] if lines else ""


def _failed_start(cluster: ipp.Cluster, e: BaseException) -> BaseException:
    """What to raise for a start that failed with ``e``, once what it started
    is stopped: ``e`` itself when nothing is left and it says why."""
    said = controller_said(cluster)  # (read before the stop forgets it)
    stop_error = _stop_quietly(cluster)
    left = (
        "Nothing is left running."
        if stop_error is None
        else f"Stopping it failed too ({stop_error!r}): processes of profile "
        f"{cluster.profile_dir} may still run; `ipcluster stop "
        f"--profile-dir={cluster.profile_dir}` stops them."
    )
    if isinstance(e, ClusterError):
        return e if stop_error is None else ClusterError(f"{e} {left}")
    if isinstance(e, KeyboardInterrupt):
        return e
    why = f" The controller exited: {said}." if said else ""
    return ClusterError(f"Cluster failed to start: {e!r}.{why} {left}")


def _cores() -> list[int]:
    try:
        return sorted(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        return list(range(os.cpu_count() or 1))


#: Always on: the controller's schedulers run as threads of one process, so
#: ``PR_SET_PDEATHSIG`` (which forked children do not inherit) covers all of it.
#: ``NoDB``: the controller keeps no record of tasks; its default (an in-memory
#: dict) keeps every task's request and result buffers, so it held a copy of
#: every input sent through it (gpucell reads results from the tasks, never
#: from the controller's history)
_CONTROLLER_ARGS = [
    "--IPController.use_threads=True",
    "--IPController.db_class=NoDB",
]


def fast_start_settings(fast: bool) -> tuple[dict[str, Any], list[str], list[str]]:
    """Cluster kwargs, controller args and engine args for a quick start.

    Measured on a 2-core host (bench/bench_startup.py): registration waits for a
    heartbeat round, so the default 3 s heartbeat period dominates start-up; the
    per-engine nanny process costs another ~0.5 s.  Without the nanny, interrupts of
    local engines are delivered by signalling their pids directly.
    """
    if not fast:
        return {}, list(_CONTROLLER_ARGS), []
    cluster_kw = {"delay": 0.0, "send_engines_connection_env": False}
    # A 100 ms heartbeat: registration waits for a round of it.  gpucell notices
    # dead local engines by pid.
    controller = [
        *_CONTROLLER_ARGS,
        "--HeartMonitor.period=100",
        "--HeartMonitor.max_heartmonitor_misses=300",
    ]
    engine = [
        "--IPEngine.enable_nanny=False",
        # A local engine ends with its parent (boot's PR_SET_PDEATHSIG) and on
        # stop, so it need not watch the controller's heartbeat: watching woke
        # its main thread at every 100 ms ping, 3.8 ms of CPU a second per idle
        # engine (1.1 without; 16 engines on 2 cores feel it).  Its heart still
        # answers the controller's pings (a C thread).  Remote engines watch
        # (remote_engine_args).
        "--IPEngine.max_heartbeat_misses=0",
        "--IPEngine.wait_for_url_file=60",
        # ipyparallel's engine gives up when the controller has not answered
        # its registration in 5 s, and exits: on a loaded 2-core host a
        # controller still starting up (its schedulers are processes) can take
        # longer, and one engine of a start went missing about once in 30
        "--IPEngine.timeout=30",
    ]
    return cluster_kw, controller, engine


def _start_and_connect(
    cluster: ipp.Cluster,
    specs: Sequence[EngineSpec],
    engine_args: list[str],
    timeout: float,
    remote: _Remote | None = None,
    slurm: Any = None,
    python: str | None = None,
    echo: Callable[[str], None] | None = None,
) -> ipp.Client:
    """Controller, then one engine set per spec, then wait for all to register.

    Each engine is its own engine set so it gets its own environment (device,
    threads, affinity); ipyparallel starts them without waiting for one another.
    """
    cluster.start_controller_sync()
    for spec in specs:
        cluster.start_engines_sync(
            1,
            engine_set_id=spec.label,
            environment=engine_env(spec),
            engine_args=list(engine_args),
        )
    total = len(specs)
    if remote is not None:
        from gpucell.cluster.remote import start_remote_engines

        total += start_remote_engines(
            cluster,
            remote.plans,
            remote.python,
            remote.args,
            remote_engine_args(engine_args),
            engine_env,
        )
    if slurm is not None:
        from gpucell.cluster.slurm import start_slurm_engines, wait_for_job

        job = start_slurm_engines(
            cluster, slurm, remote_engine_args(engine_args), python
        )
        client = cluster.connect_client_sync()
        try:
            wait_for_job(client, job, slurm.first, timeout, echo)  # --jobs: one
        except BaseException:
            client.close()
            raise
        return client
    client = cluster.connect_client_sync()
    try:
        if remote is None:
            _wait_for_local_engines(cluster, client, specs, engine_args, timeout)
        else:
            client.wait_for_engines(total, timeout=timeout, interactive=False)
    except TimeoutError:
        got = len(client.ids)
        client.close()
        exited = exited_engines(cluster)
        where = f"Engine logs are in {cluster.profile_dir}/log"
        if exited:
            where = f"{exited}. {where}"
        if remote is not None:
            where += (
                " (on the --ssh hosts: in the same profile's log directory under the "
                "remote home)"
            )
        raise ClusterError(
            f"Only {got} of {total} engines registered within {timeout:.0f} s; "
            f"the cluster was stopped. {where}. Raise GpuCell.start_timeout if a "
            "host is slow."
        ) from None
    return client


#: seconds after which a local engine that has not registered is started again,
#: once.  The hub forgets a registration whose engine's heart it has not heard
#: within 10 s, and that engine then waits for ever: "Only 1 of 2 engines
#: registered within 60 s", with the missing engine alive, about one start in
#: 30 on a loaded 2-core CI host (its cause not found; its logs were gone).
REGISTER_AGAIN_AFTER = 20.0


def _wait_for_local_engines(
    cluster: ipp.Cluster,
    client: ipp.Client,
    specs: Sequence[EngineSpec],
    engine_args: list[str],
    timeout: float,
) -> None:
    """Wait for every local engine to register; one not registered after
    ``REGISTER_AGAIN_AFTER`` s is stopped and started again, once, on its own
    device (TimeoutError when the whole ``timeout`` passes)."""
    total = len(specs)
    first = min(timeout, REGISTER_AGAIN_AFTER)
    try:
        client.wait_for_engines(total, timeout=first, interactive=False)
        return
    except TimeoutError:
        if first >= timeout:
            raise
    labels = _registered_labels(client)
    for spec in specs:
        if spec.label in labels:
            continue
        with contextlib.suppress(Exception):
            cluster.stop_engines_sync(engine_set_id=spec.label)
        cluster.start_engines_sync(
            1,
            engine_set_id=f"{spec.label}-again",
            environment=engine_env(spec),
            engine_args=list(engine_args),
        )
    client.wait_for_engines(total, timeout=timeout - first, interactive=False)


def _registered_labels(client: ipp.Client) -> set[str]:
    """The labels of the engines registered so far, as each describes itself."""
    from gpucell.engine.runtime import describe

    if not client.ids:
        return set()
    try:
        infos = client[client.ids].apply_async(describe).get(timeout=10)
    except Exception:
        return set()
    return {d["label"] for d in infos}


def exited_engines(cluster: Any) -> str:
    """Which local engine processes already exited, and the last lines each
    wrote (why it gave up), for the error of a start that timed out; "" when
    every one is still running (a slow start) or none can be told."""
    said = []
    for label, engine_set in getattr(cluster, "engines", {}).items():
        for launcher in getattr(engine_set, "launchers", {}).values():
            if getattr(launcher, "state", None) != "after":
                continue
            try:
                lines = [x for x in launcher.get_output().splitlines() if x.strip()]
            except Exception:
                lines = []
            tail = " | ".join(x.strip()[:200] for x in lines[-3:]) or "no output"
            said.append(f"engine {label} exited ({tail})")
    return "; ".join(said)


@dataclass(frozen=True)
class _Remote:
    """The --ssh part of a start: each host's plan, and how to log in."""

    plans: tuple[Any, ...]  # gpucell.cluster.remote.RemotePlan
    python: str
    args: tuple[str, ...]


def _plan_remote(
    s: Any,
    ssh: str | None,
    ssh_key: str | None,
    python: str | None,
    per_gpu: int | None,
) -> _Remote | None:
    """Probe the --ssh hosts and plan their engines (errors before any start)."""
    if ssh is None:
        if ssh_key:
            raise ClusterError("--ssh-key is for --ssh hosts: add --ssh host1[:n],...")
        return None
    import gpucell
    from gpucell.cluster.remote import probe_hosts, ssh_args
    from gpucell.core.hosts import parse_ssh_hosts

    hosts = parse_ssh_hosts(ssh)
    if ssh_key and not os.path.isfile(os.path.expanduser(ssh_key)):
        raise ClusterError(f"No ssh key file {ssh_key!r}.")
    args = ssh_args(
        os.path.expanduser(ssh_key) if ssh_key else None, list(s.ssh_options)
    )
    py = python or s.remote_python
    plans = probe_hosts(
        hosts,
        py,
        args,
        gpucell.__version__,
        per_gpu=per_gpu if per_gpu is not None else s.per_gpu,
        pin_cpu_engines=s.pin_cpu_engines,
    )
    return _Remote(tuple(plans), py, tuple(args))


def _controller_ip(plans: Sequence[Any]) -> str:
    from gpucell.core.hosts import controller_address

    ip = controller_address([p.facts for p in plans])
    if ip is None:
        seen = ", ".join(f"{p.dest}: {p.facts.ssh_client}" for p in plans)
        raise ClusterError(
            f"The --ssh hosts reach this machine at different addresses ({seen}); "
            "pass --controller-ip with one address they can all reach. Nothing "
            "was started."
        )
    return ip


def remote_engine_args(engine_args: Sequence[str]) -> list[str]:
    """Remote engines keep their nanny (the kernel interrupts them through the
    controller, not by pid) and end once the controller has been silent for
    about 18 s (30 checks, 600 ms apart, with the fast-start heartbeat): a killed
    kernel's controller dies with it, and its remote engines soon after."""
    keep = [
        a
        for a in engine_args
        if "enable_nanny" not in a and "max_heartbeat_misses" not in a
    ]
    return [*keep, "--IPEngine.max_heartbeat_misses=30"]


def _stop_quietly(cluster: ipp.Cluster) -> BaseException | None:
    """Stop ``cluster``; the error when that failed (the caller says so)."""
    try:
        cluster.stop_cluster_sync()
    except Exception as e:
        return e
    return None
