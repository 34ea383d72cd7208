"""What a ``%%gpu_parallel`` line asks for, and which engines it names.

Apart from the cell run so the magic, ``%%gpu_ddp`` and the selector widget
share one reading of ``--targets``/``--devices`` without importing the run.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

__all__ = ["CellRequest", "parse_engine_ids", "select_targets"]


@dataclass(frozen=True)
class CellRequest:
    """What the magic line asked for."""

    devices: str | None = None
    targets: str | None = None
    schedule: str | None = None
    chunksize: int | None = None
    seed: int | None = None
    timeout: float | None = None
    retries: int = 2
    dry_run: bool = False
    quiet: bool = False
    resume: bool = False
    checkpoint: str | None = None
    background: bool = False  # --background: the cell returns, the run goes on

    def asks_for_engines(self) -> bool:
        """Explicit engines, schedule, chunk size, seed or timeout: the cell must
        run on the engines (never inline in the kernel)."""
        explicit = (
            self.seed,
            self.targets,
            self.devices,
            self.schedule,
            self.chunksize,
            self.timeout,
        )
        return any(x is not None for x in explicit)


def parse_engine_ids(spec: str, live: list[int], option: str) -> list[int]:
    """``"0,2"`` -> ``[0, 2]``, all live engines, or an error naming ``option``."""
    from gpucell.errors import DeviceSelectionError

    try:
        ids = [int(t) for t in spec.split(",") if t.strip()]
    except ValueError:
        raise DeviceSelectionError(
            f"{option} {spec!r}: expected engine ids like '0,2'."
        ) from None
    bad = [i for i in ids if i not in live]
    if bad or not ids:
        raise DeviceSelectionError(
            f"{option}: no live engine {bad or spec!r} (live engines: {live})."
        )
    return ids


def select_targets(gc: Any, req: CellRequest) -> list[int]:
    """Engine ids a cell runs on: --targets, --devices, the selection, or all live.

    An engine being restarted is one of them (its device's): the run waits for
    it or takes it when it is back, with the program built for its device."""

    restarts = getattr(gc, "restarts", None)
    back = [e for e in gc.dead if restarts is not None and restarts.restarting(e)]
    live = sorted([*gc.live_ids(), *back])
    if req.targets:
        return parse_engine_ids(req.targets, live, "--targets")
    if req.devices:
        return _engines_for_devices(gc, live, req.devices)
    if gc.selected:
        sel = [e for e in gc.selected if e in live]
        if sel:
            return sel
    return live


def _engines_for_devices(gc: Any, live: list[int], spec: str) -> list[int]:
    """``--devices 0,1`` / ``cpu``: the live engines on those devices, every
    device named found.  On a cluster without GPU engines, GPU index k means the
    k-th CPU engine standing in for it (one note), so a notebook written for a
    GPU node runs unchanged on a laptop."""
    from gpucell.errors import DeviceSelectionError

    want = [t.strip().lower() for t in spec.split(",") if t.strip()]
    gpus = {gc.engines[e].index: e for e in live if gc.engines[e].kind == "gpu"}
    cpus = [e for e in live if gc.engines[e].kind == "cpu"]
    have = ", ".join(sorted({gc.engines[e].device for e in live})) or "none"
    ids: list[int] = []
    stand_ins = []
    for tok in want:
        if tok == "cpu":
            found = cpus
        elif tok.isdigit() and gpus:
            found = [gpus[int(tok)]] if int(tok) in gpus else []
        elif tok.isdigit() and int(tok) < len(cpus):
            found = [cpus[int(tok)]]
            stand_ins.append(f"GPU {tok} -> engine {cpus[int(tok)]}")
        else:
            found = []
        if not found:
            raise DeviceSelectionError(
                f"--devices {spec!r}: no live engine on device {tok!r} (devices: "
                f"{have}; use GPU indices like '0,1' or 'cpu')."
            )
        ids.extend(e for e in found if e not in ids)
    if stand_ins:
        print(
            "gpucell: note: this cluster has no GPU engines; CPU engines stand in for "
            "the GPUs asked for (" + ", ".join(stand_ins) + ")."
        )
    return ids
