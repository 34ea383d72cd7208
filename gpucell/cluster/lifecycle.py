"""The cluster lifecycle: start, connect, describe, stop.

Everything here goes through ipyparallel's own ``Cluster``, launchers and ``Client``;
gpucell only decides which engines to start (:mod:`gpucell.core.topology`) and pins them
through its launch hook (:mod:`gpucell.cluster.launcher`).  The magics call these
functions.
"""

from __future__ import annotations

import atexit
import contextlib
import os
import signal
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, Any

from gpucell import config as _config
from gpucell.cluster.engines import (
    EngineInfo,
)
from gpucell.cluster.engines import answers as _answers
from gpucell.cluster.engines import describe_engines as _describe_engines
from gpucell.cluster.engines import engine_env as _engine_env
from gpucell.cluster.engines import info_from as _info_from
from gpucell.cluster.engines import preimport as _preimport
from gpucell.cluster.restart import Restarts
from gpucell.core.costmodel import CostMemory
from gpucell.core.states import BUSY, DEAD, IDLE, EngineState
from gpucell.core.topology import EngineSpec, parse_gpu_selection, plan_engines
from gpucell.devices.discovery import cpu_device, discover
from gpucell.devices.host import kernel_key, pid_running
from gpucell.errors import ClusterError, NoCluster

if TYPE_CHECKING:  # imported lazily at run time: ipyparallel costs ~0.3 s
    import ipyparallel as ipp

    from gpucell.devices.nvml import NvmlApi

__all__ = [
    "EngineInfo",
    "GpuCluster",
    "connect",
    "current",
    "start_cluster",
    "status",
    "stop",
]


@dataclass
class GpuCluster:
    """A cluster gpucell started (``owned``) or connected to, and its engines."""

    client: ipp.Client
    engines: dict[int, EngineInfo]
    cluster: ipp.Cluster | None = None
    owned: bool = False
    startup_seconds: float = 0.0
    description: str = ""
    specs: tuple[EngineSpec, ...] = ()
    selected: tuple[int, ...] | None = None  # default targets of later cells
    warnings: list[str] = field(default_factory=list)
    # set first thing by stop(): a cell running meanwhile (in another thread)
    # reports a stopped cluster, not dying engines
    stopping: bool = False
    # engine id -> {input name: fingerprint} of what that engine caches
    input_cache: dict[int, dict[str, Any]] = field(default_factory=dict)
    # what each cell's last run on these engines cost (inline, static, profile)
    cost_history: CostMemory = field(default_factory=CostMemory)
    # the engines' command-line arguments, and the restarts of dead engines
    engine_args: tuple[str, ...] = ()
    restarts: Restarts = field(default_factory=Restarts, repr=False)
    _views: dict[int, Any] = field(default_factory=dict, repr=False)
    # the kernel's shared-memory channel (shm.Channel), opened before the engines
    # were described so each could say whether it sees it (EngineInfo.shm)
    _channel: Any = field(default=None, repr=False)

    def results_channel(self) -> Any:
        """Where engines on this host put big results (``None``: nowhere, or off)."""
        return self._channel if _config.settings().shared_memory else None

    def sees_shm(self, eid: int) -> bool:
        """Whether engine ``eid`` maps files in the kernel's /dev/shm (and it is on)."""
        info = self.engines.get(eid)
        return self.results_channel() is not None and info is not None and info.shm

    def sweep_results(self) -> None:
        """Remove result files a finished cell left unread (abandoned chunks)."""
        if self._channel:
            from gpucell.cluster import shm_channel

            shm_channel.sweep(self._channel)

    @property
    def controller_pid(self) -> int | None:
        """The controller's pid when this kernel started it (on this host)."""
        ctl = getattr(self.cluster, "controller", None) if self.owned else None
        pid = getattr(ctl, "pid", None)
        return pid if isinstance(pid, int) and pid > 0 else None

    def controller_alive(self) -> bool:
        """False once the controller this kernel started has exited (one /proc
        read).  A controller elsewhere is not watched here."""
        from gpucell.devices.host import pid_running

        pid = self.controller_pid
        return pid is None or pid_running(pid)

    def check_controller(self) -> None:
        """Raise :class:`ControllerLost` (before any call that would wait on it
        for ever) when the controller is gone."""
        if not self.controller_alive():
            from gpucell.errors import ControllerLost

            raise ControllerLost(
                f"the cluster's controller (pid {self.controller_pid}) is gone, so "
                "no engine can be reached. `%gpu_cluster stop` then "
                "`%gpu_cluster start` starts a new cluster (a cell's finished "
                "chunks are kept: `%%gpu_parallel --resume`)."
            )

    @property
    def ids(self) -> list[int]:
        return sorted(self.engines)

    def view(self, eid: int) -> Any:
        """A DirectView on one engine, made once (making one costs ~0.3 ms)."""
        if eid not in self._views:
            self._views[eid] = self.client.direct_view(eid)
        return self._views[eid]

    @property
    def dead(self) -> set[int]:
        """Engines known dead (their state says so: the one record of a death)."""
        return {eid for eid, e in self.engines.items() if e.state == DEAD}

    def mark_dead(self, eid: int) -> None:
        """An engine died mid-cell: later cells skip it, status shows it dead."""
        self.input_cache.pop(eid, None)
        if eid in self.engines:
            self.engines[eid] = replace(self.engines[eid], state=DEAD)

    def forget_cached(self, eid: int, gone: Callable[[str], bool]) -> list[str]:
        """Take out of engine ``eid``'s cache record the inputs ``gone`` names
        (the kernel no longer has them); the names, for the engine to drop."""
        cached = self.input_cache.get(eid, {})
        drop = sorted(n for n in cached if gone(n))
        for n in drop:
            cached.pop(n, None)
        return drop

    def live_ids(self) -> list[int]:
        """Engines that are registered and not known dead."""
        registered = set(self.client.ids)
        return [e for e in self.ids if e in registered and e not in self.dead]

    def refresh(self) -> list[EngineInfo]:
        """Engine states now: dead if unregistered, busy if it has work queued
        (engines being restarted join as soon as they are back)."""
        self.check_controller()
        from gpucell.devices.host import pid_running

        for eid, info in list(self.engines.items()):
            gone = eid not in self.client.ids or (
                info.local and not pid_running(info.pid)
            )
            if gone and info.state != DEAD:
                self.mark_dead(eid)  # seen dead at once (local: by its process)
                self.restarts.begin(self, eid)
        self.restarts.step(self)
        alive = set(self.client.ids)
        try:
            queues = self.client.queue_status(verbose=False)
        except Exception:
            queues = {}
        rows = []
        dead = self.dead
        for eid in self.ids:
            info = self.engines[eid]
            q = queues.get(eid, {}) if isinstance(queues, dict) else {}
            state: EngineState
            if eid not in alive or eid in dead:
                state = DEAD
            elif q.get("queue", 0) or q.get("tasks", 0):
                state = BUSY
            else:
                state = IDLE
            info = replace(info, state=state)
            self.engines[eid] = info
            rows.append(info)
        return rows

    def stop(self) -> None:
        """Stop what we started; only disconnect from a cluster we merely joined,
        taking back what gpucell left on its engines."""
        self.stopping = True
        if not self.owned:
            self._leave_engines()
        try:
            self.client.close()
        except Exception:
            pass
        if self.owned and self.cluster is not None:
            try:
                self.cluster.stop_cluster_sync()
            finally:  # a controller that died first left its connection files
                from gpucell.cluster.leftovers import forget_cluster

                forget_cluster(self.cluster.profile_dir, self.cluster.cluster_id)
        _release_channel(self._channel)
        self._channel = None

    def _leave_engines(self, timeout: float = 5.0) -> None:
        """Clear cached inputs and stop the telemetry sampler on engines that stay
        running for someone else (best effort: a dead engine has nothing left)."""
        from gpucell.engine.worker import leave

        ids = self.live_ids()
        if not ids:
            return
        try:
            view = self.client.direct_view(ids)
            view.apply_async(leave, kernel_key()).get(timeout=timeout)
        except Exception as e:
            self.warnings.append(f"could not clear gpucell's state on engines: {e!r}")
        self.input_cache.clear()


_current: GpuCluster | None = None


def current() -> GpuCluster:
    """The active cluster, or :class:`NoCluster` with the command to start one."""
    if _current is None:
        raise NoCluster()
    return _current


def current_or_none() -> GpuCluster | None:
    """The active cluster, or ``None``: for displays and checks that must not raise."""
    return _current


def _cores() -> list[int]:
    try:
        return sorted(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        return list(range(os.cpu_count() or 1))


def _profile_dir(profile: str, create: bool = False) -> str:
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


def _fast_start_settings(fast: bool) -> tuple[dict[str, Any], list[str], list[str]]:
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
        # (_remote_engine_args).
        "--IPEngine.max_heartbeat_misses=0",
        "--IPEngine.wait_for_url_file=60",
        # ipyparallel's engine gives up when the controller has not answered
        # its registration in 5 s, and exits: on a loaded 2-core host a
        # controller still starting up (its schedulers are processes) can take
        # longer, and one engine of a start went missing about once in 30
        "--IPEngine.timeout=30",
    ]
    return cluster_kw, controller, engine


def _summary(engines: dict[int, EngineInfo]) -> str:
    counts: dict[str, int] = {}
    for e in engines.values():
        key = f"{e.device} ({e.name})" if e.kind == "gpu" else "CPU"
        counts[key] = counts.get(key, 0) + 1
    return ", ".join(f"{n} × {k}" if n > 1 else k for k, n in counts.items())


def start_cluster(
    n: int | None = None,
    *,
    gpus: str | Sequence[int] | None = None,
    per_gpu: int | None = None,
    cpu_engines: int | None = None,
    profile: str | None = None,
    timeout: float | None = None,
    nvml: NvmlApi | None = None,
    echo: Callable[[str], None] | None = None,
    ssh: str | None = None,
    ssh_key: str | None = None,
    python: str | None = None,
    controller_ip: str | None = None,
    slurm: Any = None,
) -> GpuCluster:
    """Start a cluster with one engine per GPU (or per core without GPUs), here
    and on the ``ssh`` hosts.

    Parameters
    ----------
    n
        CPU engines when there is no GPU (default: one per core); with GPUs, use the
        first ``n`` selected GPUs.
    gpus
        ``"all"`` (default), ``"none"``, or indices such as ``"0,2"`` / ``[0, 2]``.
    per_gpu, cpu_engines
        Engines per GPU; CPU engines added beside the GPU engines.
    profile
        An existing IPython profile whose ipyparallel config to use.
    timeout
        Seconds to wait for every engine; on expiry everything started is stopped.
    nvml
        NVML implementation (tests pass a fake).
    echo
        Where to print the one-line "ready" message (``print`` in the magics).
    ssh
        Other hosts, ``host1[:n],user@host2[:n]``: their engines start over ssh
        (one per GPU there, or ``n``), beside this host's.
    ssh_key, python
        The key for those logins; the Python with gpucell on those hosts
        (``GpuCell.remote_python``, ``python3`` by default).
    controller_ip
        The address the controller listens on (default: with ``ssh``, the address
        the hosts saw this machine connect from; with ``slurm``, this host name's
        address; else loopback only).
    slurm
        A :class:`gpucell.cluster.slurm.SlurmRequest`: the engines are one Slurm
        job (one per GPU on each node) instead of this host's.
    """
    global _current
    s = _config.settings()
    t0 = time.perf_counter()
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
    if _current is not None:
        if (
            slurm is None
            and _current.owned
            and [x.label for x in _current.specs] == [x.label for x in specs]
        ):
            if echo:
                echo(f"gpucell: cluster already running: {_current.description}")
            return _current
        raise ClusterError(
            f"A cluster is already running ({len(_current.engines)} engines). "
            "Stop it first with `%gpu_cluster stop` (or `gpucell.stop()`)."
        )
    profile_kw: dict[str, Any] = {}
    if profile:
        profile_kw["profile_dir"] = _profile_dir(profile, create=True)
        placed = _placement(ssh, ssh_key, python, controller_ip, slurm)
        if placed:
            _save_placement(profile_kw["profile_dir"], placed)
        else:
            saved = _saved_placement(profile_kw["profile_dir"])
            if saved:
                ssh, ssh_key, python, controller_ip, slurm = _unpack_placement(saved)
                if echo:
                    echo(f"gpucell: profile {profile}: {_describe_placement(saved)}")
    timeout = timeout if timeout is not None else s.start_timeout
    if python and ssh is None and slurm is None:
        raise ClusterError("--python is for --ssh hosts or --slurm nodes.")
    remote = _plan_remote(s, ssh, ssh_key, python, per_gpu)  # before anything starts
    if remote is not None:
        profile_kw["controller_ip"] = controller_ip or _controller_ip(remote.plans)
    elif slurm is not None:
        import socket

        try:
            here = socket.gethostbyname(socket.gethostname())
        except OSError:
            here = "*"
        profile_kw["controller_ip"] = controller_ip or here
    elif controller_ip:
        profile_kw["controller_ip"] = controller_ip

    cluster_kw, controller_args, engine_args = _fast_start_settings(s.fast_start)
    controller_args += [f"--IPController.log_level={s.cluster_log_level}"]
    engine_args += [f"--IPEngine.log_level={s.cluster_log_level}"]
    from gpucell.cluster import private_profile

    # its cluster file 0600, its logs 0600 (the launchers), folders 0700
    cluster = private_profile.cluster_class()(
        n=len(specs),
        engine_launcher_class="gpucell",
        controller_launcher_class="gpucell",
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
    channel = _open_channel()
    try:
        client = _start_and_connect(
            cluster, specs, engine_args, timeout, remote, slurm, python, echo
        )
        infos = _describe_engines(client, client.ids, timeout, channel)
    except BaseException as e:
        _release_channel(channel)
        stop_error = _stop_quietly(cluster)
        left = (
            "Nothing is left running."
            if stop_error is None
            else f"Stopping it failed too ({stop_error!r}): processes of profile "
            f"{cluster.profile_dir} may still run; `ipcluster stop "
            f"--profile-dir={cluster.profile_dir}` stops them."
        )
        if isinstance(e, ClusterError):
            if stop_error is None:
                raise
            raise ClusterError(f"{e} {left}") from e
        if isinstance(e, KeyboardInterrupt):
            raise
        raise ClusterError(f"Cluster failed to start: {e!r}. {left}") from e
    engines = {eid: _info_from(eid, d) for eid, d in infos.items()}
    _preimport(client, list(engines))
    elapsed = time.perf_counter() - t0
    gc = GpuCluster(
        client=client,
        engines=engines,
        cluster=cluster,
        owned=True,
        startup_seconds=elapsed,
        specs=tuple(specs),
        engine_args=tuple(engine_args),
        _channel=channel,
    )
    gc.description = f"{len(engines)} engines ({_summary(engines)})"
    if discovery.gpus == () and discovery.notes and select != "none":
        # the user asked for GPUs (the default): say why there are none
        gc.warnings.append("no GPU found (" + "; ".join(discovery.notes) + ")")
    _current = gc
    if echo:
        echo(f"gpucell: {gc.description} ready in {elapsed:.1f} s")
        for w in gc.warnings:
            echo(f"gpucell: note: {w}")
    return gc


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
            environment=_engine_env(spec),
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
            _remote_engine_args(engine_args),
            _engine_env,
        )
    if slurm is not None:
        from gpucell.cluster.slurm import start_slurm_engines, wait_for_job

        job = start_slurm_engines(
            cluster, slurm, _remote_engine_args(engine_args), python
        )
        client = cluster.connect_client_sync()
        try:
            wait_for_job(client, job, slurm.engines, timeout, echo)
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
        exited = _exited_engines(cluster)
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
            environment=_engine_env(spec),
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


def _exited_engines(cluster: Any) -> str:
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


#: where a profile keeps how its cluster was placed (hosts, Slurm job, Python)
_PLACEMENT_FILE = "gpucell_cluster.json"


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


def _save_placement(profile_dir: str, placed: dict[str, Any]) -> None:
    import json

    from gpucell.protocol import private

    # 0600, under a random temporary name (never through a planted link)
    path = os.path.join(profile_dir, _PLACEMENT_FILE)
    private.write(path, json.dumps(placed, indent=1).encode())


def _saved_placement(profile_dir: str) -> dict[str, Any] | None:
    import json

    from gpucell.protocol import private

    try:
        d = json.loads(private.read(os.path.join(profile_dir, _PLACEMENT_FILE)))
    except (OSError, ValueError):
        return None
    return d if isinstance(d, dict) else None


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


def _remote_engine_args(engine_args: Sequence[str]) -> list[str]:
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


def connect(
    *,
    profile: str | None = None,
    cluster_id: str | None = None,
    file: str | None = None,
    ssh: str | None = None,
    ssh_key: str | None = None,
    timeout: float | None = None,
    min_engines: int = 1,
    echo: Callable[[str], None] | None = None,
) -> GpuCluster:
    """Attach to a cluster started elsewhere (``ipcluster start``, another host).

    Engines are assigned devices by their local rank on each host: the r-th engine
    of a host with G GPUs gets GPU ``r % G``.  ``ssh`` (``user@host[:port]``)
    tunnels every connection through that server with the ``ssh`` command, using
    ``ssh_key`` or the user's ssh configuration; key-based login is needed (no
    password prompt can reach a notebook).
    """
    global _current
    if _current is not None:
        raise ClusterError(
            f"A cluster is already active ({len(_current.engines)} engines). "
            "Stop or leave it first with `%gpu_cluster stop`."
        )
    if not (profile or cluster_id or file):
        raise ClusterError(
            "connect needs --profile P, --cluster-id ID or "
            "--file ipcontroller-client.json."
        )
    if ssh_key and not ssh:
        raise ClusterError("--ssh-key needs --ssh user@host to tunnel through.")
    if ssh_key and not os.path.isfile(os.path.expanduser(ssh_key)):
        raise ClusterError(f"No ssh key file {ssh_key!r}.")
    s = _config.settings()
    timeout = timeout if timeout is not None else s.connect_timeout
    kw: dict[str, Any] = {"timeout": timeout}
    args: list[Any] = []
    if file:
        if not os.path.exists(file):
            raise ClusterError(f"No connection file {file!r}.")
        # positional: ipyparallel 9 accepts ``url_file=`` but ignores it, and
        # would fall back to the default profile's file (another cluster)
        args.append(os.path.abspath(os.path.expanduser(file)))
    if profile:
        kw["profile_dir"] = _profile_dir(profile)
        if not cluster_id and not file:
            # a cluster started with an id (gpucell's, `start --profile P`)
            # has no plain ipcontroller-client.json: find the one running
            cluster_id = _running_cluster_id(kw["profile_dir"], profile)
    if cluster_id:
        kw["cluster_id"] = cluster_id
    if ssh:
        kw["sshserver"] = ssh
        if ssh_key:
            kw["sshkey"] = os.path.expanduser(ssh_key)
    t0 = time.perf_counter()
    import ipyparallel as ipp

    try:
        with _tunnels_survive_hangup(bool(ssh)):
            client = ipp.Client(*args, **kw)
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
        channel = _open_channel()
        try:
            engines, pin_warnings = _assign_by_local_rank(client, ids, timeout, channel)
        except BaseException:
            _release_channel(channel)
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
    gc.description = f"{len(engines)} engines ({_summary(engines)})"
    _preimport(client, ids)
    _current = gc
    if echo:
        echo(f"gpucell: connected to {gc.description} in {elapsed:.1f} s")
        for w in gc.warnings:
            echo(f"gpucell: warning: {w}")
    return gc


def _running_cluster_id(profile_dir: str, profile: str) -> str | None:
    """The id of the one cluster running in a profile that has no plain
    connection file (None: let ipyparallel look for the plain file)."""
    import glob
    import json

    security = os.path.join(profile_dir, "security")
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


def _open_channel() -> Any:
    """The kernel's shared-memory channel for a cluster's engines (or ``None``)."""
    from gpucell.cluster import shm_channel

    channel = shm_channel.open_channel()
    if channel is not None:
        if not _open_channels:
            atexit.register(_release_all)
        _open_channels.add(channel)
    return channel


def _release_channel(channel: Any) -> None:
    from gpucell.cluster import shm_channel

    if channel is not None:
        shm_channel.close_channel(channel)
        _open_channels.discard(channel)


def _release_all() -> None:
    for channel in list(_open_channels):
        _release_channel(channel)


def _assign_by_local_rank(
    client: ipp.Client, ids: list[int], timeout: float, channel: Any = None
) -> tuple[dict[int, EngineInfo], list[str]]:
    from gpucell.engine.runtime import assign_device, describe, host_facts

    view = client.direct_view(ids)
    answers = _answers(view.apply_async(host_facts), timeout, "describe")
    described = _answers(view.apply_async(describe, channel), timeout, "describe")
    facts = dict(zip(ids, answers, strict=True))
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
                args = (
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
    engines = {eid: _info_from(eid, d) for eid, d in pinned.items()}
    warnings = []
    for eid, ar in results.items():
        d = _answers(ar, timeout, "pin")
        if not d.get("pinned", True):
            warnings.append(
                f"engine {eid} had initialised CUDA before gpucell connected; it "
                "keeps its current device (restart it to pin it by local rank)"
            )
        engines[eid] = _info_from(eid, d)
    return engines, warnings


def stop(echo: Callable[[str], None] | None = None) -> None:
    """Stop the cluster gpucell started (or disconnect from one it joined)."""
    global _current
    gc, _current = _current, None
    if gc is None:
        if echo:
            echo("gpucell: no cluster to stop.")
        return
    t0 = time.perf_counter()
    gc.stop()
    if echo:
        what = "stopped" if gc.owned else "disconnected from"
        echo(f"gpucell: {what} {gc.description} in {time.perf_counter() - t0:.1f} s")


def status() -> list[EngineInfo]:
    """Rows of the status table for the active cluster."""
    return current().refresh()


def format_status(
    rows: Sequence[EngineInfo], selected: Sequence[int] | None = None
) -> str:
    """The status table as text (pure): this host's engines first, then each
    other host's together."""
    head = ("engine", "host", "pid", "device", "name", "memory", "threads", "state")
    body = []
    for r in sorted(rows, key=lambda r: (not r.local, r.host, r.id)):
        mem = f"{r.memory_total / 2**30:.1f} GiB" if r.memory_total else "-"
        mark = "*" if selected is not None and r.id in selected else ""
        body.append(
            (
                f"{r.id}{mark}",
                r.host,
                str(r.pid),
                r.device,
                r.name,
                mem,
                str(r.threads or "-"),
                r.state
                + (f" (restarted {r.restarts}x)" if getattr(r, "restarts", 0) else ""),
            )
        )
    widths = [
        max(len(h), *(len(b[i]) for b in body)) if body else len(h)
        for i, h in enumerate(head)
    ]
    lines = ["  ".join(h.ljust(w) for h, w in zip(head, widths, strict=True))]
    for b in body:
        lines.append("  ".join(c.ljust(w) for c, w in zip(b, widths, strict=True)))
    return "\n".join(line.rstrip() for line in lines)
