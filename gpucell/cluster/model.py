"""The cluster as the kernel holds it: its client, its engines and their states,
the restarts under way, and how it is stopped or left.

Made by :mod:`.starting` (a cluster this kernel owns) or :mod:`.connecting` (one
started elsewhere); :mod:`.lifecycle` keeps the active one.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, Any

from gpucell import config as _config
from gpucell.cluster.engines import EngineInfo
from gpucell.cluster.restart import Restarts
from gpucell.core.costmodel import CostMemory
from gpucell.core.states import BUSY, DEAD, IDLE, EngineState
from gpucell.core.topology import EngineSpec
from gpucell.devices.host import kernel_key

if TYPE_CHECKING:  # imported lazily at run time: ipyparallel costs ~0.3 s
    import ipyparallel as ipp

__all__ = ["GpuCluster"]


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
    # the controller's pid when it runs on this host but another kernel started
    # it (connect): watched so a dead owner's cluster fails at once, not hangs
    watched_pid: int | None = None

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
        """The controller's pid on this host: started by this kernel, or watched
        (``watched_pid``) when another kernel of this host started it."""
        if not self.owned:
            return self.watched_pid
        pid = getattr(getattr(self.cluster, "controller", None), "pid", None)
        return pid if isinstance(pid, int) and pid > 0 else None

    def controller_alive(self) -> bool:
        """False once the controller (this kernel's, or a watched one of this
        host) has exited (one /proc read).  One elsewhere is not watched here."""
        from gpucell.devices.host import pid_running

        pid = self.controller_pid
        return pid is None or pid_running(pid)

    def check_controller(self) -> None:
        """Raise :class:`ControllerLost` (before any call that would wait on it
        for ever) when the controller is gone."""
        if not self.controller_alive():
            from gpucell.errors import ControllerLost

            again = (
                "`%gpu_cluster stop` then `%gpu_cluster start` starts a new cluster"
                if self.owned
                else "the kernel that started it is likely gone too: "
                "`%gpu_cluster stop` leaves it, then start or connect to another"
            )
            raise ControllerLost(
                f"the cluster's controller (pid {self.controller_pid}) is gone, so "
                f"no engine can be reached. {again} (a cell's finished chunks are "
                "kept: `%%gpu_parallel --resume`)."
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
        self.restarts.notice(self)
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
            restarting = state == DEAD and self.restarts.restarting(eid)
            info = replace(info, state=state, restarting=restarting)
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
        from gpucell.cluster.shm_channel import release

        release(self._channel)
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
