"""Dead engines come back: restarted on the same device, in the background.

An engine that dies (killed, out of host memory, a crash in a library) leaves
its device idle for the rest of the session unless something starts a new one.
Through ipyparallel's own engine sets (``Cluster.start_engines``), with the
dead engine's spec (device, environment, CPU affinity), a new engine is launched;
the kernel notices it registering, describes it, and hands it to whoever asks
(the running cell's scheduling, ``%gpu_cluster status``).  Never blocking: each
:meth:`Restarts.step` does what is ready and returns.  Attempts are bounded,
with a growing pause between them.
"""

from __future__ import annotations

import dataclasses
import time
from dataclasses import dataclass, field
from typing import Any

__all__ = ["MAX_ATTEMPTS", "Restart", "Restarts"]

#: launches per dead engine before gpucell gives up on its device
MAX_ATTEMPTS = 3
#: seconds before the first attempt; doubled after each failed one
BACKOFF = 0.5


@dataclass
class Restart:
    """One dead engine's way back."""

    label: str  # the engine set label of its spec (its device)
    dead: int  # the engine id that died
    restarts: int  # how many times this device's engine was restarted before
    attempt: int = 0
    next_at: float = 0.0
    deadline: float = 0.0
    known: frozenset[int] = frozenset()  # engine ids registered before the launch
    launched: bool = False
    new_id: int | None = None
    describing: Any = None  # the describe task of the new engine
    gave_up: str | None = None


@dataclass
class Restarts:
    """The restarts under way for one cluster (``GpuCluster.restarts``)."""

    pending: list[Restart] = field(default_factory=list)

    def begin(self, gc: Any, eid: int) -> Restart | None:
        """Start bringing engine ``eid`` back, if this kernel started it."""
        info = gc.engines.get(eid)
        spec = _spec_for(gc, info)
        if spec is None or gc.stopping or any(r.dead == eid for r in self.pending):
            return None
        r = Restart(
            label=spec.label,
            dead=eid,
            restarts=getattr(info, "restarts", 0),
            next_at=time.monotonic() + BACKOFF,
        )
        self.pending.append(r)
        return r

    def step(self, gc: Any) -> list[tuple[Restart, Any]]:
        """Advance every restart; the ``(restart, EngineInfo)`` of each engine
        that is back now (already in ``gc.engines``)."""
        back = []
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
                gc.warnings.append(r.gave_up)
        return back

    def _step(self, gc: Any, r: Restart) -> Any:
        from gpucell import config
        from gpucell.cluster import engines

        now = time.monotonic()
        if gc.stopping:
            r.gave_up = "the cluster stopped"
            return None
        if not r.launched:
            if now < r.next_at:
                return None
            spec = _spec_for(gc, gc.engines.get(r.dead))
            if spec is None:
                r.gave_up = f"no spec for engine {r.dead}"
                return None
            r.known = frozenset(gc.client.ids) | frozenset(gc.engines)
            r.attempt += 1
            gc.cluster.start_engines_sync(
                1,
                engine_set_id=f"{spec.label}-r{r.restarts + 1}-{r.attempt}",
                environment=engines.engine_env(spec),
                engine_args=list(gc.engine_args),
            )
            timeout = config.settings().start_timeout
            r.launched, r.deadline = True, now + timeout
            return None
        if r.new_id is None:
            fresh = sorted(set(gc.client.ids) - r.known)
            if fresh:
                r.new_id = fresh[0]
                r.describing = engines.describe_async(gc, r.new_id)
            elif now > r.deadline:
                self._failed(gc, r, "it did not register in time")
            return None
        if not r.describing.ready():
            if now > r.deadline:
                self._failed(gc, r, "it did not answer in time")
            return None
        (d,) = r.describing.get(timeout=0)
        info = engines.info_from(r.new_id, d)
        info = dataclasses.replace(info, restarts=r.restarts + 1)
        gc.engines.pop(r.dead, None)
        gc.input_cache.pop(r.dead, None)
        gc.engines[r.new_id] = info
        if gc.selected is not None and r.dead in gc.selected:
            gc.selected = tuple(r.new_id if e == r.dead else e for e in gc.selected)
        engines.preimport(gc.client, [r.new_id])
        return info

    def _failed(self, gc: Any, r: Restart, why: str) -> None:
        if r.attempt >= MAX_ATTEMPTS:
            r.gave_up = (
                f"engine {r.dead} ({r.label}) could not be restarted after "
                f"{r.attempt} attempts ({why}); the cluster goes on without it"
            )
            return
        r.launched, r.new_id, r.describing = False, None, None
        r.next_at = time.monotonic() + BACKOFF * 2**r.attempt


def _spec_for(gc: Any, info: Any) -> Any:
    if info is None or not gc.owned or gc.cluster is None:
        return None
    for spec in gc.specs:
        if spec.label == info.label:
            return spec
    return None
