"""What each engine's first chunk of a cell carries: the program and inputs.

An input travels to an engine only when the engine's cached copy's
fingerprint differs; big ones go through the kernel's ``/dev/shm`` (written
once, mapped copy-on-write by every engine of this host) or, for engines of
another host, once per host (the first engine there publishes it in its
host's ``/dev/shm``).  The kernel's ``warnings`` filters and logging levels
ride along.  A mixin of :class:`gpucell.kernel.dispatch.Run`, whose state it
reads and fills (``setups``, ``mapped``, ``leaders``, ``host_share``).
"""

from __future__ import annotations

import os
import warnings
from typing import Any

from gpucell.errors import InputNotSendable
from gpucell.kernel import logs
from gpucell.protocol import fingerprint, shm, wire
from gpucell.protocol.program import Setup

__all__ = ["InputShipping"]


class InputShipping:
    """The input-shipping transitions of a run (see ``Run``)."""

    # (filled by Run.__init__; declared for the type checker)
    gc: Any
    inputs: dict[str, Any]
    alive: list[int]
    cell: str
    channel: Any
    record: Any
    status: Any
    programs: dict[int, Any]
    watch: Any
    cache_bytes: int
    telemetry: Any
    setups: dict[int, tuple[Any, Any]]
    mapped: dict[tuple[str, ...], list[Any]]
    leaders: dict[tuple[str, tuple[str, ...]], tuple[int, int, str]]
    host_share: dict[int, tuple[tuple[str, ...], int]]

    def ship_inputs(self) -> None:
        """Decide what each engine's first chunk carries: the program, and the
        inputs its cache lacks (fingerprints; big ones through /dev/shm)."""
        self._keys = {
            name: fingerprint.digest(fingerprint.fingerprint(v))
            for name, v in self.inputs.items()
        }
        self._encoded: dict[tuple[str, ...], list[Any]] = {}
        self._filters = _warning_filters()
        self._log_levels = logs.levels()
        self._state = process_state()
        for eid in self.alive:
            self._setup_engine(eid)
        if self.telemetry is not None:
            self.telemetry.start_remote(self.gc.client)

    def _setup_engine(self, eid: int) -> None:
        """What engine ``eid``'s first chunk carries (also for an engine that
        joins mid-cell after a restart)."""
        gc, inputs, keys, encoded = self.gc, self.inputs, self._keys, self._encoded
        have = gc.input_cache.get(eid, {})
        send = tuple(
            sorted(
                name
                for name in inputs
                if keys[name] is None or have.get(name) != keys[name]
            )
        )
        if send not in encoded:
            try:
                encoded[send] = _encode_inputs({k: inputs[k] for k in send})
            except InputNotSendable as e:
                self.status = self.record.status = "error"
                self.record.errors.append(str(e))
                raise
        frames = encoded[send]
        nbytes = wire.frames_nbytes(frames)
        ch = self.channel
        if ch is not None and nbytes >= ch.min_bytes and gc.sees_shm(eid):
            if send not in self.mapped:  # written once, mapped by each engine
                self.mapped[send] = shm.spill(frames, ch, f"in-{self.cell[:12]}-{eid}")
            if shm.spilled(self.mapped[send]):
                frames = self.mapped[send]
                self.record.shared_bytes += nbytes
        elif ch is not None and nbytes >= ch.min_bytes and send:
            # decided as its first chunk leaves: the first of its host to get a
            # chunk publishes (an engine given no chunk never would)
            self.host_share[eid] = (send, nbytes)
        setup: Setup = {
            "program": self.programs[eid],
            "names": sorted(inputs),
            "keys": keys,
            "watch": self.watch,
            "warnings": self._filters,
            "logging": self._log_levels,
            "state": self._state,
            "cache_bytes": self.cache_bytes,
            "cwd": os.getcwd(),
        }
        self.setups[eid] = (setup, frames)
        gc.input_cache.pop(eid, None)  # unknown until its first chunk answers

    def _once_per_host(
        self, eid: int, send: tuple[str, ...], nbytes: int, frames: list[Any]
    ) -> list[Any]:
        """Engine ``eid`` cannot map the kernel's /dev/shm (another host): the
        first such engine of its host gets the input and publishes it in its
        host's /dev/shm, the others of that host map it from there
        (gpucell.engine.hostcopy): one copy per host through the controller."""
        info = self.gc.engines.get(eid)
        if info is None or not info.host:
            return frames
        peers = [
            e
            for e in self.alive
            if e != eid
            and not self.gc.sees_shm(e)
            and getattr(self.gc.engines.get(e), "host", None) == info.host
        ]
        key = (info.host, send)
        leader = self.leaders.get(key)
        if leader is None or leader[0] not in self.alive:
            if not peers:
                return frames  # alone on its host: nothing to share
            tag = f"host-{self.cell[:12]}-{len(self.leaders)}"
            self.leaders[key] = (eid, info.pid, tag)
            return shm.lead(frames, self.channel, tag)
        lead_id, lead_pid, tag = leader
        self.record.shared_bytes += nbytes
        return shm.follow(self.channel, tag, lead_pid, lead_id)


def process_state() -> dict[str, Any]:
    """The kernel's process-wide settings that change what a loop computes:
    torch's default dtype (``torch.set_default_dtype(torch.float64)`` in an
    earlier cell makes every ``torch.zeros`` float64) and numpy's error modes
    (``np.seterr``).  Engines apply them around each chunk."""
    import os
    import sys

    # (and its environment and import path: what a change an iteration makes
    # there is measured against, engine/processstate.py)
    out: dict[str, Any] = {"environ": dict(os.environ), "sys_path": list(sys.path)}
    torch = sys.modules.get("torch")
    if torch is not None:
        dtype = str(torch.get_default_dtype()).removeprefix("torch.")
        if dtype != "float32":
            out["torch_dtype"] = dtype
    np = sys.modules.get("numpy")
    if np is not None:
        err = np.geterr()
        if err != {
            "divide": "warn",
            "over": "warn",
            "under": "ignore",
            "invalid": "warn",
        }:
            out["numpy_err"] = err
    return out


def _warning_filters() -> list[Any]:
    """The kernel's ``warnings`` filters as wire frames: a warning the notebook
    silenced stays silent on the engines ([] when they cannot travel)."""
    try:
        return [bytes(f) for f in wire.dumps(list(warnings.filters))]
    except Exception:
        return []


def _encode_inputs(values: dict[str, Any]) -> list[Any]:
    """Wire frames of the inputs, or an error naming each one that cannot travel."""
    if not values:
        return []
    try:
        return wire.dumps(values)
    except Exception:
        pass
    bad = []
    for name, value in values.items():
        try:
            wire.dumps(value)
        except Exception as e:
            bad.append(f"`{name}` ({type(value).__name__}): {e}")
    if not bad:  # only the combination failed; re-raise the original problem
        return wire.dumps(values)
    raise InputNotSendable(
        "%%gpu_parallel cannot send what the loop reads to the engines: "
        + "; ".join(bad)
        + ". Create such objects inside the loop (each engine gets its own), pass "
        "what they hold instead (a generator or iterator the loop advances with "
        "`next()`: its items, `items = list(gen)`, if each iteration takes its "
        "own), or run the cell without %%gpu_parallel. Nothing from the loop ran "
        "(the lines before it did, as they would serially)."
    )
