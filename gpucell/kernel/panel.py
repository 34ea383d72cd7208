"""The kernel's end of the JupyterLab panel: one comm, state pushed, requests served.

``%load_ext gpucell`` registers the comm target (the panel opens a comm when it
attaches to this kernel) and opens one itself (for a panel that attached before
gpucell was loaded).  A daemon thread builds the panel's state twice a second
(:mod:`gpucell.ui.panel_state`) and sends it only when it changed, so a
notebook without a cluster sends nothing (with one, the charts' history gains a
point a second); it never touches the ipyparallel client, which belongs to the
main thread.  Requests (select, start, stop, cancel) run in the main thread,
as comm messages are handled there, through the code the magics use (cancel:
the background run's own ``cancel()``).
"""

from __future__ import annotations

import contextlib
import dataclasses
import io
import json
import sys
import threading
import time
from typing import Any

from gpucell.kernel.session import current
from gpucell.protocol import panel as schema
from gpucell.ui import panel_state

__all__ = [
    "PanelEndpoint",
    "install",
    "run_ended",
    "run_progress",
    "run_started",
    "uninstall",
]

#: seconds between two looks at the state (2 Hz while something changes)
PERIOD = 0.5
#: the charts over time: seconds kept, and seconds between two points
HISTORY_WINDOW, HISTORY_PERIOD = 300.0, 1.0
#: NVML for this host's GPU engines: None, the real one; tests put a fake
#: (tests/fake_nvml.py) here before they start a cluster of fake GPUs
NVML: Any = None


def _cluster() -> Any:
    mod = sys.modules.get("gpucell.cluster.lifecycle")
    return None if mod is None else mod.current_or_none()


def _background_facts(now: float) -> list[panel_state.BackgroundFacts]:
    """The kernel's background runs (recent ones, pending among them), read
    from the panel's thread: plain attribute reads, no lock (the run's own
    driver never waits on the panel)."""
    s = current()
    pending = list(s.pending)
    runs = list(s.recent) + [bg for bg in pending if bg not in s.recent]
    if not runs:
        return []
    from gpucell.kernel.background_wait import one_line

    facts = []
    for bg in runs:
        snap = getattr(bg.watched, "last", None) or bg.last
        done, total = (snap.done, snap.total) if snap is not None else (0, 0)
        ended = bg.ended
        facts.append(
            panel_state.BackgroundFacts(
                cell=bg.cell,
                state=bg.state,
                pending=bg in pending,
                done=done,
                total=total,
                elapsed=(ended if ended is not None else now) - bg.started,
                started_at=getattr(bg, "started_at", 0.0),
                writes=tuple(sorted(bg.footprint.writes)),
                error=None if bg.error is None else one_line(bg.error),
            )
        )
    return facts


def _background_snaps() -> list[Any]:
    """The snapshots of the background runs (the cell's run view is theirs
    while one is pending: the background list shows it instead)."""
    s = current()
    out = []
    for bg in list(s.recent) + list(s.pending):
        out += [getattr(bg.watched, "last", None), bg.last]
    return [x for x in out if x is not None]


def _connection(gc: Any) -> dict[str, Any]:
    engines = list(gc.engines.values())
    cluster = getattr(gc, "cluster", None)
    profile = getattr(cluster, "profile", None) or None
    launcher = str(getattr(cluster, "engine_launcher_class", "") or "")
    if not gc.owned:
        kind = "connected"
    elif "slurm" in launcher.lower():
        kind = "slurm"
    elif any(not e.local for e in engines):
        kind = "ssh"
    else:
        kind = "local"
    return panel_state.connection_view(kind, engines, profile, "")


def _engines(gc: Any) -> list[Any]:
    """The cluster's engines, a dead one whose device is being restarted now
    marked ``restarting`` (its ``EngineInfo`` says so only as of the last
    status; the restarts themselves are read, not stepped: that is the main
    thread's)."""
    restarts = getattr(gc, "restarts", None)
    out = []
    for e in list(gc.engines.values()):
        now = restarts is not None and restarts.shown_restarting(gc, int(e.id))
        if dataclasses.is_dataclass(e) and bool(getattr(e, "restarting", now)) != now:
            e = dataclasses.replace(e, restarting=now)
        out.append(e)
    return out


class Slots:
    """Which row each engine goes on in: a device's first engine's, so an
    engine restarted after dying (a new id, the same device) takes its
    predecessor's place instead of going to the end of its host's rows."""

    def __init__(self) -> None:
        self._of: Any = None
        self._first: dict[tuple[str, str], int] = {}

    def __call__(self, gc: Any, engines: list[Any]) -> dict[int, int]:
        if self._of != id(gc):  # another cluster: its own devices
            self._of, self._first = id(gc), {}
        slots = {}
        for e in sorted(engines, key=lambda e: int(e.id)):
            label = getattr(e, "label", "") or ""
            if not label:
                continue
            first = self._first.setdefault((e.host, label), int(e.id))
            if first != int(e.id):
                slots[int(e.id)] = first
        return slots


class PanelEndpoint:
    """Every open panel comm of this kernel, and the thread that feeds them."""

    def __init__(self, shell: Any) -> None:
        self.shell = shell
        self.comms: list[Any] = []
        self.seq = 0
        self.errors = 0
        self._last_sent = ""
        self._lock = threading.RLock()
        self._stop = threading.Event()
        self._wake = threading.Event()
        self._run_snap: Any = None
        self._run_tele: Any = None
        self._tele: Any = None  # between cells: the cluster's own telemetry
        self._tele_of: Any = None
        # the charts' points, kept across cells while the cluster lives
        self.history: Any = None
        self._history_of: Any = None
        self._last: tuple[Any, ...] = ()
        self._last_view: dict[str, Any] | None = None
        self._runs = 0
        self._slots = Slots()
        self._thread = threading.Thread(
            target=self._loop, name="gpucell-panel", daemon=True
        )

    # ------------------------------------------------------------ comms

    def start(self) -> None:
        from comm import create_comm, get_comm_manager

        get_comm_manager().register_target(schema.TARGET, self._on_open)
        self._thread.start()
        # a panel that attached before gpucell was loaded is told now
        try:
            c = create_comm(target_name=schema.TARGET, data=self._first_state())
        except Exception:
            self.errors += 1
        else:
            self._add(c)

    def _on_open(self, comm: Any, msg: Any) -> None:
        self._add(comm)
        self.send(force=True)

    def _add(self, comm: Any) -> None:
        comm.on_msg(lambda msg: self._on_msg(comm, msg))
        comm.on_close(lambda msg: self._drop(comm))
        with self._lock:
            self.comms.append(comm)
        self._wake.set()

    def _drop(self, comm: Any) -> None:
        with self._lock:
            if comm in self.comms:
                self.comms.remove(comm)

    def close(self) -> None:
        self._stop.set()
        self._wake.set()
        with self._lock:
            comms, self.comms = self.comms, []
        for c in comms:
            with contextlib.suppress(Exception):
                c.close()
        with contextlib.suppress(Exception):
            from comm import get_comm_manager

            get_comm_manager().unregister_target(schema.TARGET, self._on_open)
        if self._thread.is_alive() and threading.current_thread() is not self._thread:
            self._thread.join(2.0)
        self._close_tele()

    # ------------------------------------------------------------ state

    def _samples(self, gc: Any) -> list[Any]:
        """Engines on this host measured by the panel's own telemetry (its own
        psutil handles: sampling the run's would halve the widget's CPU
        intervals); engines elsewhere from what the running cell's dispatcher
        collected (they publish only while they run a task)."""
        key = (id(gc), tuple(sorted(gc.engines)))
        if self._tele_of != key:
            self._close_tele()
            from gpucell.kernel.telemetry import for_cluster

            self._tele, self._tele_of = for_cluster(gc, nvml=NVML), key
        run_tele = self._run_tele
        remote = run_tele.remote if run_tele is not None else self._tele.remote
        return sorted(
            list(self._tele.local.sample()) + list(remote.sample()),
            key=lambda s: s.engine,
        )

    def _close_tele(self) -> None:
        tele, self._tele, self._tele_of = self._tele, None, None
        if tele is not None:
            with contextlib.suppress(Exception):
                tele.close()

    def _last_run_view(self) -> dict[str, Any] | None:
        gpucell = sys.modules.get("gpucell")
        rec = getattr(gpucell, "last_run", None)
        if rec is None or rec.status == "running":
            return self._last_view
        key = (id(rec), rec.status, len(rec.chunks))
        if key != self._last:
            self._runs += 1
            self._last = key
            self._last_view = panel_state.last_view(self._runs, rec)
        return self._last_view

    def state(self) -> dict[str, Any]:
        """The whole state now, as one ``state`` message (seq not yet set)."""
        gc = _cluster()
        snap = self._run_snap
        cluster = run = history = None
        if gc is not None and not getattr(gc, "stopping", False):
            samples: list[Any] = []
            try:
                samples = self._samples(gc)
            except Exception:  # telemetry never breaks the panel
                self.errors += 1
            history = self._record(gc, samples)
            engines = _engines(gc)
            cluster = panel_state.cluster_view(
                engines,
                _connection(gc),
                gc.selected,
                samples,
                snap,
                self._slots(gc, engines),
            )
        else:
            if self._tele is not None:
                self._close_tele()
            self.history = self._history_of = None
        background = None
        try:
            background = panel_state.background_view(
                _background_facts(time.monotonic())
            )
        except Exception:  # a run changing under the read: next look
            self.errors += 1
        if snap is not None and not any(snap is b for b in _background_snaps()):
            run = panel_state.run_view(snap)
        msg = panel_state.state_message(
            self.seq, cluster, run, self._last_run_view(), background
        )
        msg["history"] = history
        return msg

    def _record(self, gc: Any, samples: list[Any]) -> dict[str, Any] | None:
        """Add the samples to the charts' history (a new cluster: a new one)."""
        from gpucell.kernel.telemetry import LoadHistory

        if self._history_of != id(gc) or self.history is None:
            self.history = LoadHistory(HISTORY_WINDOW, HISTORY_PERIOD)
            self._history_of = id(gc)
        try:
            self.history.record(time.monotonic(), samples)
            view: dict[str, Any] | None = self.history.view()
        except Exception:  # a chart never breaks the panel
            self.errors += 1
            view = None
        return view

    def _first_state(self) -> dict[str, Any]:
        with self._lock:
            self.seq += 1
            return {**self.state(), "seq": self.seq}

    def send(self, force: bool = False) -> bool:
        """Send the state if it changed since the last send (or ``force``)."""
        with self._lock:
            if not self.comms:
                return False
            msg = self.state()
            body = json.dumps({**msg, "seq": 0}, sort_keys=True)
            if body == self._last_sent and not force:
                return False
            self._last_sent = body
            self.seq += 1
            msg["seq"] = self.seq
            for c in list(self.comms):
                try:
                    c.send(msg)
                except Exception:
                    self.errors += 1
                    self._drop(c)
            return True

    def _loop(self) -> None:
        while not self._stop.is_set():
            self._wake.wait(PERIOD)
            self._wake.clear()
            if self._stop.is_set():
                return
            try:
                self.send()
            except Exception:
                self.errors += 1

    # ------------------------------------------------------------ a cell's run

    # plain assignments, no lock: the dispatcher's thread never waits on the
    # panel's sampling

    def run_started(self, tele: Any) -> None:
        self._run_tele = tele
        self._run_snap = None

    def run_progress(self, snap: Any) -> None:
        self._run_snap = snap

    def run_ended(self, snap: Any) -> None:
        self._run_snap = snap
        self._run_tele = None
        self._wake.set()

    # ------------------------------------------------------------ requests

    def _on_msg(self, comm: Any, msg: Any) -> None:
        data = (msg or {}).get("content", {}).get("data", {})
        problems = schema.validate(data)
        if problems:
            return  # a panel of another version: nothing to act on
        kind = data["type"]
        if kind == "hello":
            self.send(force=True)
            return
        if kind not in schema.REQUESTS:
            return
        ok, text = self._serve(kind, data)
        with contextlib.suppress(Exception):
            comm.send(schema.reply(kind, ok, text))
        self.send(force=True)

    def _serve(self, kind: str, data: dict[str, Any]) -> tuple[bool, str]:
        """Run the request through the magic's own code; its output is the reply."""
        if kind == "select":
            engines = data["engines"]
            line = (
                "select all"
                if engines is None
                else "select " + ",".join(str(int(e)) for e in engines)
            )
        elif kind == "cancel":
            return self._cancel(int(data["cell"]))
        elif kind == "start":
            line = ("start " + data["args"]).strip()
        else:
            line = "stop"
        out = io.StringIO()
        try:
            with contextlib.redirect_stdout(out), contextlib.redirect_stderr(out):
                self.shell.run_line_magic("gpu_cluster", line)
        except BaseException as e:  # UsageError, KeyboardInterrupt: said, not raised
            text = out.getvalue().strip()
            return False, (text + "\n" if text else "") + f"{type(e).__name__}: {e}"
        return True, out.getvalue().strip() or f"%gpu_cluster {line}: done"

    def _cancel(self, cell: int) -> tuple[bool, str]:
        """``gpucell.runs.cell(N).cancel()``: its printed line is the reply."""
        bg = next((b for b in current().pending if b.cell == cell), None)
        if bg is None:
            return False, (
                f"gpucell: no pending background run of cell [{cell}] "
                "(merged, raised or cancelled already)"
            )
        out = io.StringIO()
        try:
            with contextlib.redirect_stdout(out), contextlib.redirect_stderr(out):
                bg.cancel()
        except BaseException as e:
            text = out.getvalue().strip()
            return False, (text + "\n" if text else "") + f"{type(e).__name__}: {e}"
        return True, out.getvalue().strip()


# ---------------------------------------------------------------- module API


def install(shell: Any) -> PanelEndpoint | None:
    """Start the panel's endpoint in an ipykernel (a no-op in a terminal)."""
    session = current()
    if session.panel is not None:
        return session.panel
    if getattr(shell, "kernel", None) is None:
        return None
    ep = PanelEndpoint(shell)
    try:
        ep.start()
    except Exception:  # no comm support: the panel is optional
        ep.close()
        return None
    session.panel = ep
    return ep


def uninstall() -> None:
    session = current()
    ep, session.panel = session.panel, None
    if ep is not None:
        ep.close()


def run_started(tele: Any) -> None:
    if (ep := current().panel) is not None:
        ep.run_started(tele)


def run_progress(snap: Any) -> None:
    if (ep := current().panel) is not None:
        ep.run_progress(snap)


def run_ended(snap: Any) -> None:
    if (ep := current().panel) is not None:
        ep.run_ended(snap)
