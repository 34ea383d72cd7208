"""Dead engines come back: restarted on the same device, in the background.

An engine that dies (killed, out of host memory, a crash in a library) leaves
its device idle for the rest of the session unless something starts a new one.
Through ipyparallel's own engine sets (``Cluster.start_engines``), with the
dead engine's spec (device, environment, CPU affinity), a new engine is launched;
the kernel notices it registering, describes it, and hands it to whoever asks
(the running cell's scheduling, ``%gpu_cluster status``).  Never blocking: each
:meth:`Restarts.step` does what is ready and returns.

Restarts converge:
- a new engine is matched to the restart of the device it describes itself as
  (its label), never to whichever restart looks first: two engines restarted at
  the same moment are two engines, and an engine no restart wants (a late one of
  an attempt given up) is shut down, not left running unused;
- each device has a budget over time: its engine restarted ``BUDGET`` times
  within ``BUDGET_WINDOW`` seconds and dead again is not restarted any more (an
  engine that dies a few seconds after every start would be restarted without
  bound);
- a launch whose process exits is a failed attempt at once (not after the start
  timeout), and every way a restart ends unsuccessfully is said at once, through
  ``Restarts.echo``, as well as kept in the cluster's warnings.
"""

from __future__ import annotations

import contextlib
import dataclasses
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

#: a restart any new engine fills (a resubmitted batch job's: slurm_jobs)
ANY_ENGINE = "*"

__all__ = ["BUDGET", "BUDGET_WINDOW", "MAX_ATTEMPTS", "Restart", "Restarts"]

#: what the restarts do (an engine lost, each attempt, an engine back, the
#: budget spent), for users who ask: ``logging.getLogger("gpucell")`` with a
#: handler and a level
log = logging.getLogger(__name__)

#: launches per dead engine before gpucell gives up on its device
MAX_ATTEMPTS = 3
#: seconds before the first attempt; doubled after each failed one
BACKOFF = 0.5
#: restarts of one device within BUDGET_WINDOW seconds; dead once more, it stays dead
BUDGET = 3
BUDGET_WINDOW = 120.0


def _say(text: str) -> None:
    print(f"gpucell: {text}", flush=True)


@dataclass
class Restart:
    """One dead engine's way back."""

    label: str  # the engine set label of its spec (its device)
    dead: int  # the engine id that died
    restarts: int  # how many times this device's engine was restarted before
    attempt: int = 0
    next_at: float = 0.0
    deadline: float = 0.0
    launched: bool = False
    engine_set: str = ""  # ipyparallel's engine set of the current attempt
    # its launchers, kept: ipyparallel drops a stopped set from Cluster.engines
    launchers: tuple[Any, ...] = ()
    new_id: int | None = None
    info: Any = None  # the new engine's EngineInfo, once it described itself
    gave_up: str | None = None


@dataclass
class Restarts:
    """The restarts under way for one cluster (``GpuCluster.restarts``), and
    what the cluster remembers of its devices' deaths."""

    pending: list[Restart] = field(default_factory=list)
    # device label -> when its engine died (time.monotonic), within the window
    deaths: dict[str, list[float]] = field(default_factory=dict)
    # devices whose engine is not restarted any more, and why
    retired: dict[str, str] = field(default_factory=dict)
    # engines registered but not yet matched to a restart -> their describe task
    arrivals: dict[int, Any] = field(default_factory=dict)
    # engines that died: the controller lists them until their heart is missed
    gone: set[int] = field(default_factory=set)
    # a connected cluster's dead engines, each waiting (launching nothing, so
    # not restarting) for the engine the kernel that owns the cluster may
    # restart on its device; and engines that registered for none of ours
    # (not ours to shut down)
    awaited: list[Restart] = field(default_factory=list)
    foreign: set[int] = field(default_factory=set)
    # where an unsuccessful end is said at once (the cell's output, in a kernel)
    echo: Callable[[str], None] = _say
    # engines still to come from batch jobs pending at the start (--jobs N):
    # an arrival no restart claims is one of them, and joins (replacing none)
    joining: int = 0
    # a Slurm cluster's jobs (gpucell.cluster.slurm_jobs.JobWatch): a job Slurm
    # ends is noticed, and with --checkpoint submitted again
    batch: Any = None

    def restarting(self, eid: int) -> bool:
        """Whether engine ``eid`` is dead and being restarted now."""
        return any(r.dead == eid for r in self.pending)

    def shown_restarting(self, gc: Any, eid: int) -> bool:
        """What a panel's or monitor's thread shows for engine ``eid`` whose
        process its telemetry found gone: ``restarting`` when a restart is
        under way, and also when the main thread has not judged the death yet
        but will restart it at its next look (a thread samples between two
        looks of the watch; "dead" then would be a false alarm).  Read only:
        the budget is counted as :meth:`begin` will count it."""
        from gpucell.core.states import DEAD

        if self.restarting(eid):
            return True
        info = gc.engines.get(eid)
        if info is None or info.state == DEAD or eid in self.gone or gc.stopping:
            return False  # judged (not restarted), or nothing will judge it
        spec = _spec_for(gc, info)
        if spec is None or spec.label in self.retired:
            return False
        now = time.monotonic()
        recent = [t for t in self.deaths.get(spec.label, []) if now - t < BUDGET_WINDOW]
        return len(recent) + 1 <= BUDGET

    def busy(self) -> bool:
        """Whether something waits to be stepped: a restart under way, an
        engine describing itself, a batch job's engine still to join."""
        return bool(self.pending or self.arrivals or self.joining or self.awaited)

    def wait_for(self, gc: Any, eids: Any, timeout: float) -> None:
        """Step the restarts until none of engines ``eids`` is being restarted
        (each back or given up), at most ``timeout`` seconds: for a caller that
        needs every device it was given (a process group's world size)."""
        deadline = time.monotonic() + timeout
        while any(self.restarting(e) for e in eids) and time.monotonic() < deadline:
            self.step(gc)
            time.sleep(0.05)

    def notice(self, gc: Any) -> list[int]:
        """Mark dead the engines gone since the last look (unregistered, or on
        this host their process ended: one /proc read each) and begin their
        restarts; the ids found dead now."""
        from gpucell.core.states import DEAD
        from gpucell.devices.host import pid_running

        registered = set(gc.client.ids)
        found = []
        for eid, info in list(gc.engines.items()):
            if info.state == DEAD:
                continue
            if eid not in registered or (info.local and not pid_running(info.pid)):
                # (restarting before dead: the panel's and monitor's threads
                # read the two apart, and must never see the device just dead)
                self.begin(gc, eid)
                gc.mark_dead(eid)  # seen dead at once (local: by its process)
                found.append(eid)
        return found

    def begin(self, gc: Any, eid: int) -> Restart | None:
        """Start bringing engine ``eid`` back, if this kernel started it and its
        device is within its restart budget."""
        info = gc.engines.get(eid)
        spec = _spec_for(gc, info)
        first = eid not in self.gone
        self.gone.add(eid)
        if spec is None or gc.stopping or self.restarting(eid):
            if spec is None and first and not gc.stopping:
                log.warning(
                    "engine %d (%s) was lost; it is not restarted (this kernel "
                    "did not start it)",
                    eid,
                    _who(info),
                )
                self._await_owner(gc, eid, info)
            return None
        if spec.label in self.retired:
            return None
        now = time.monotonic()
        times = [t for t in self.deaths.get(spec.label, []) if now - t < BUDGET_WINDOW]
        times.append(now)
        self.deaths[spec.label] = times
        if len(times) > BUDGET:
            why = (
                f"engine {eid} ({spec.label}) died {len(times)} times within "
                f"{BUDGET_WINDOW:.0f} s of being started; gpucell stops restarting "
                "it and the cluster goes on without it (its log is in "
                f"{_log_dir(gc)}; `%gpu_cluster stop` then `start` tries again)"
            )
            self.retired[spec.label] = why
            log.warning("restart budget of %s spent: %s", spec.label, why)
            self._tell(gc, why)
            return None
        r = Restart(
            label=spec.label,
            dead=eid,
            restarts=getattr(info, "restarts", 0),
            next_at=now + BACKOFF,
        )
        self.pending.append(r)
        log.warning(
            "engine %d (%s) was lost; restarting it (its device's restart %d of "
            "%d within %.0f s)",
            eid,
            _who(info),
            len(times),
            BUDGET,
            BUDGET_WINDOW,
        )
        return r

    def _await_owner(self, gc: Any, eid: int, info: Any) -> None:
        """On a connected cluster: await the engine the kernel that owns it may
        restart on the dead engine's device (its label), to take it in the
        dead one's place when it registers."""
        from gpucell import config

        label = getattr(info, "label", "")
        if gc.owned or not label:
            return
        r = Restart(label=label, dead=eid, restarts=getattr(info, "restarts", 0))
        r.launched = True  # (by its owner, if at all)
        r.deadline = time.monotonic() + config.settings().start_timeout * MAX_ATTEMPTS
        self.awaited.append(r)

    def step(self, gc: Any) -> list[tuple[Restart, Any]]:
        """Advance every restart; the ``(restart, EngineInfo)`` of each engine
        that is back now (already in ``gc.engines``)."""
        if self.batch is not None:
            self.batch.step(gc, self)
        if self.pending or self.arrivals or self.joining or self.awaited:
            self._match_arrivals(gc)
        back = []
        for r in list(self.awaited):  # (past its deadline: dead, as it is)
            if r.info is not None or time.monotonic() > r.deadline or gc.stopping:
                self.awaited.remove(r)
                if r.info is not None and not gc.stopping:
                    back.append((r, self._join(gc, r)))
        for r in list(self.pending):
            try:
                info = self._step(gc, r)
            except Exception as e:  # a launch that fails is an attempt that failed
                info = None
                self._failed(gc, r, repr(e))
            if info is not None:
                self.pending.remove(r)
                back.append((r, info))
            elif r.gave_up is not None:
                self.pending.remove(r)
                if not gc.stopping:
                    log.warning("%s", r.gave_up)
                    self._tell(gc, r.gave_up)
        return back

    def _tell(self, gc: Any, text: str) -> None:
        gc.warnings.append(text)
        with contextlib.suppress(Exception):
            self.echo(text)

    def _step(self, gc: Any, r: Restart) -> Any:
        now = time.monotonic()
        if gc.stopping:
            r.gave_up = "the cluster stopped"
            return None
        if not r.launched:
            if now >= r.next_at:
                self._launch(gc, r, now)
                if r.launched and not r.launchers:  # its set already stopped
                    self._failed(gc, r, "its process exited as it started")
            return None
        if r.info is not None:
            return self._join(gc, r)
        if r.new_id is None and (why := _exited(r.launchers)) is not None:
            self._failed(gc, r, why)
        elif now > r.deadline:
            self._failed(gc, r, "it did not register and describe itself in time")
        return None

    def _launch(self, gc: Any, r: Restart, now: float) -> None:
        from gpucell import config
        from gpucell.cluster import engines

        spec = _spec_for(gc, gc.engines.get(r.dead))
        if spec is None:
            r.gave_up = f"engine {r.dead} ({r.label}) has no spec to restart it from"
            return
        r.attempt += 1
        r.engine_set = f"{spec.label}-r{r.restarts + 1}-{r.attempt}"
        gc.cluster.start_engines_sync(
            1,
            engine_set_id=r.engine_set,
            environment=engines.engine_env(spec),
            engine_args=list(gc.engine_args),
        )
        es = getattr(gc.cluster, "engines", {}).get(r.engine_set)
        r.launchers = tuple(getattr(es, "launchers", {}).values()) if es else ()
        r.launched = True
        r.deadline = now + config.settings().start_timeout
        log.info(
            "restart attempt %d/%d of engine %d (%s)",
            r.attempt,
            MAX_ATTEMPTS,
            r.dead,
            r.label,
        )

    def _match_arrivals(self, gc: Any) -> None:
        """Describe every newly registered engine once, and hand each to the
        restart of the device it says it is (its label)."""
        from gpucell.cluster import engines

        waiting = self.pending + self.awaited
        claimed = {r.new_id for r in waiting if r.new_id is not None}
        known = set(gc.engines) | claimed | self.gone | self.foreign
        for eid in sorted(set(gc.client.ids) - known):
            if eid not in self.arrivals:
                self.arrivals[eid] = engines.describe_async(gc, eid)
        for eid, task in list(self.arrivals.items()):
            if not task.ready():
                continue
            del self.arrivals[eid]
            try:
                (d,) = task.get(timeout=0)
            except Exception:
                continue  # it died while describing itself: gone already
            r = next(
                (
                    r
                    for r in waiting
                    if r.label in (d.get("label"), ANY_ENGINE)
                    and r.launched
                    and r.new_id is None
                ),
                None,
            )
            if r is None and self.joining > 0:  # a later batch job's engine
                self.joining -= 1
                r = Restart(label=str(d.get("label")), dead=-1, restarts=-1)
                r.launched = True
                self.pending.append(r)
            if r is None and not gc.owned:  # another kernel's, not for us
                self.foreign.add(eid)
                continue
            if r is None:  # a late engine of an attempt given up: not wanted
                log.info("engine %d registered late for no restart; shut down", eid)
                self.gone.add(eid)
                self._shut_down(gc, eid)
                continue
            r.new_id = eid
            r.info = dataclasses.replace(
                engines.info_from(eid, d), restarts=r.restarts + 1
            )

    def _join(self, gc: Any, r: Restart) -> Any:
        """The new engine takes the dead one's place (id, selection, caches)."""
        from gpucell.cluster import engines

        assert r.new_id is not None
        gc.engines.pop(r.dead, None)
        gc.input_cache.pop(r.dead, None)
        gc.engines[r.new_id] = r.info
        if gc.selected is not None and r.dead in gc.selected:
            gc.selected = tuple(r.new_id if e == r.dead else e for e in gc.selected)
        engines.preimport(gc.client, [r.new_id])
        if r.dead >= 0:
            log.info(
                "engine %d (%s) is back as engine %d (pid %s), after %d attempt(s)",
                r.dead,
                r.label,
                r.new_id,
                getattr(r.info, "pid", "?"),
                r.attempt,
            )
        return r.info

    def _failed(self, gc: Any, r: Restart, why: str) -> None:
        if r.engine_set:  # nothing of a failed attempt may register later
            with contextlib.suppress(Exception):
                gc.cluster.stop_engines_sync(engine_set_id=r.engine_set)
        if r.new_id is not None:
            self._shut_down(gc, r.new_id)
        log.warning(
            "restart attempt %d/%d of engine %d (%s) failed: %s",
            r.attempt,
            MAX_ATTEMPTS,
            r.dead,
            r.label,
            why,
        )
        if r.attempt >= MAX_ATTEMPTS:
            r.gave_up = (
                f"engine {r.dead} ({r.label}) could not be restarted after "
                f"{r.attempt} attempts ({why}); the cluster goes on without it"
            )
            return
        r.launched, r.new_id, r.info, r.launchers = False, None, None, ()
        r.next_at = time.monotonic() + BACKOFF * 2**r.attempt

    def _shut_down(self, gc: Any, eid: int) -> None:
        self.gone.add(eid)
        with contextlib.suppress(Exception):
            gc.client.shutdown(targets=[eid], block=False)


def _exited(launchers: tuple[Any, ...]) -> str | None:
    """Why an attempt's launched engine is gone (its process exited, with the
    last error it wrote), or ``None`` while it runs.  Read from its pid: the
    launcher's own state changes only when ipyparallel's event loop runs, which
    nothing does between cells."""
    from gpucell.devices.host import pid_running

    pids = [getattr(x, "pid", None) for x in launchers]
    if not pids or any(not isinstance(p, int) or pid_running(p) for p in pids):
        return None
    try:
        lines = [x for x in launchers[0].get_output().splitlines() if x.strip()]
    except Exception:
        lines = []
    errors = [x for x in lines if "rror" in x]  # Python's own last words first
    tail = (errors or lines or ["no output"])[-1].strip()[:200]
    return f"its process exited: {tail}"


def _who(info: Any) -> str:
    """``cpu1: CPU on node2, pid 4242``: a dead engine as a user finds it."""
    if info is None:
        return "unknown"
    return f"{info.label}: {info.device} on {info.host}, pid {info.pid}"


def _log_dir(gc: Any) -> str:
    return f"{getattr(gc.cluster, 'profile_dir', '?')}/log"


def _spec_for(gc: Any, info: Any) -> Any:
    if info is None or not gc.owned or gc.cluster is None:
        return None
    for spec in gc.specs:
        if spec.label == info.label:
            return spec
    return None
