"""What the JupyterLab panel shows, as the JSON of :mod:`gpucell.protocol.panel`.

The panel renders strings made here, by the same formatting as the in-cell widget
(:mod:`gpucell.ui.model`), so the two never disagree and the TypeScript side stays
a thin renderer.  Pure: engine records, telemetry samples and run snapshots in,
plain dicts out.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from gpucell.core.runstate import DEAD, RESTARTING, RunSnapshot
from gpucell.protocol.panel import VERSION
from gpucell.ui import model

__all__ = [
    "NO_CLUSTER",
    "BackgroundFacts",
    "background_status",
    "background_view",
    "cluster_view",
    "connection_view",
    "last_view",
    "run_view",
    "state_message",
    "status_text",
]

NO_CLUSTER = "gpucell: no cluster"


def _plural(n: int, one: str, many: str | None = None) -> str:
    return f"{n} {one if n == 1 else (many or one + 's')}"


def connection_view(
    kind: str, engines: Sequence[Any], profile: str | None, description: str
) -> dict[str, Any]:
    """Where the cluster is: ``kind`` (local, ssh, slurm or connected), its hosts
    in display order (this host first) and one line of text."""
    hosts: list[str] = []
    for eid in model.engine_order({int(e.id): e for e in engines}):
        host = next(e.host for e in engines if int(e.id) == eid)
        if host not in hosts:
            hosts.append(host)
    text = description or (
        f"{_plural(len(engines), 'engine')} on {', '.join(hosts) or 'no host'}"
    )
    if profile:
        text += f" (profile {profile})"
    return {"kind": kind, "text": text, "profile": profile, "hosts": hosts}


def _device(row: model.DeviceRow, selected: Sequence[int] | None) -> dict[str, Any]:
    eid = int(row.engine) if row.engine is not None else -1
    return {
        "engine": eid,
        "host": row.host,
        "label": row.label,
        "state": row.state,
        "color": row.color,
        "selected": selected is None or eid in selected,
        "util": row.util,
        "util_text": row.util_text,
        "mem": row.mem,
        "mem_text": row.mem_text,
        "extra": row.extra,
        "note": row.note,
        "done_text": row.done_text,
    }


def cluster_view(
    engines: Sequence[Any],
    connection: dict[str, Any],
    selected: Sequence[int] | None,
    samples: Iterable[Any] | None = None,
    snap: RunSnapshot | None = None,
    slots: Mapping[int, int] | None = None,
) -> dict[str, Any]:
    """One row per engine (``EngineInfo``-like), this host's first, then each
    host's together; a running cell's rows carry its progress.

    ``slots``: engine id -> the id of the engine whose place it takes (an
    engine restarted after dying goes on in its device's row, not at the end).
    """
    samples = list(samples or ())
    slots = slots or {}
    by_id = {int(e.id): e for e in engines}
    # model.engine_order, with a restarted engine where its device was
    order = sorted(
        by_id,
        key=lambda e: (
            not getattr(by_id[e], "local", True),
            by_id[e].host,
            slots.get(e, e),
            e,
        ),
    )
    rows = {
        r.engine: r
        for r in model.monitor_rows([by_id[i] for i in order], samples)
        if r.engine is not None
    }
    if snap is not None and snap.status == "running":
        for r in model.run_view(snap, samples).rows:
            if r.engine is not None and r.engine in rows:
                rows[r.engine] = r
    sel = None if selected is None else [int(i) for i in selected]
    return {
        "connection": connection,
        "selected": sel,
        "devices": [_device(rows[i], sel) for i in order if i in rows],
    }


def status_text(
    cluster: dict[str, Any] | None, background: dict[str, Any] | None = None
) -> str:
    """``gpucell: 4 GPUs · 2 hosts · 63% busy`` (``– busy`` when unknown), and
    `` · 1 background run 37%`` while one is pending.

    Only the devices with a live engine are counted and averaged; a device
    whose engine is being restarted is said apart (`` · 1 restarting``), as is
    one nothing restarts (`` · 1 dead``)."""
    if cluster is None:
        return NO_CLUSTER
    gone = (DEAD, RESTARTING)
    devices = [d for d in cluster["devices"] if d["state"] not in gone]
    gpus = sum(1 for d in devices if " GPU " in f" {d['label']} ")
    cpus = len(devices) - gpus
    parts = []
    if gpus:
        parts.append(_plural(gpus, "GPU"))
    if cpus or not gpus:
        parts.append(_plural(cpus, "CPU engine"))
    what = " + ".join(parts)
    hosts = _plural(len(cluster["connection"]["hosts"]), "host")
    utils = [d["util"] for d in devices if d["util"] is not None]
    busy = f"{100 * sum(utils) / len(utils):.0f}%" if utils else model.NA
    tail = ""
    for state in (RESTARTING, DEAD):
        n = sum(1 for d in cluster["devices"] if d["state"] == state)
        tail += f" · {n} {state}" if n else ""
    tail += background_status(background)
    return f"gpucell: {what} · {hosts} · {busy} busy{tail}"


def run_view(snap: RunSnapshot) -> dict[str, Any]:
    overall = model.overall_row(snap)
    return {
        "total": snap.total,
        "done": snap.done,
        "elapsed": round(snap.elapsed, 3),
        "eta": None if snap.eta is None else round(snap.eta, 3),
        "status": snap.status,
        "text": overall.text,
    }


def last_view(run_id: int, last_run: Any) -> dict[str, Any]:
    """The last finished run: its summary lines and its timeline as SVG."""
    lines = [ln for ln in str(last_run.summary()).splitlines() if ln.strip()]
    lines += [f"error: {e}" for e in getattr(last_run, "errors", ())[:3]]
    svg: str | None
    try:
        svg = last_run.timeline().svg() if getattr(last_run, "chunks", None) else None
    except Exception:  # a picture never stops the panel
        svg = None
    return {
        "id": run_id,
        "status": str(last_run.status),
        "lines": lines,
        "timeline_svg": svg,
    }


# ---------------------------------------------------------------- background


@dataclass(frozen=True)
class BackgroundFacts:
    """One ``--background`` run as the panel needs it (read off the kernel's
    ``BackgroundRun`` by kernel/panel.py, so this module stays pure)."""

    cell: int
    #: running, finished, failed (pending); merging, merged, raised, cancelled
    state: str
    pending: bool
    done: int
    total: int
    #: seconds since it started (to its end once it ended)
    elapsed: float
    #: wall-clock start, seconds since the epoch
    started_at: float
    #: names the merge binds or changes: a later cell using one waits
    writes: tuple[str, ...]
    #: the error's type and first line, when it failed
    error: str | None = None


#: a finished run's state -> what the panel calls its outcome
_OUTCOME = {"merged": "merged", "raised": "failed", "cancelled": "cancelled"}


def _figures(f: BackgroundFacts) -> str:
    pct = f" ({100 * f.done // f.total}%)" if f.total else ""
    return f"{f.done} of {f.total} iterations{pct}, {f.elapsed:.1f} s"


def _pending_view(f: BackgroundFacts) -> dict[str, Any]:
    if f.state == "failed":
        note = f"failed: {f.error}; raised in the next cell that waits for it"
    elif f.state == "finished":
        note = "finished; merged when a later cell uses its names (%gpu_wait)"
    else:
        note = ""
    return {
        "cell": f.cell,
        "state": f.state,
        "done": f.done,
        "total": f.total,
        "elapsed": round(f.elapsed, 1),
        "started_at": round(f.started_at, 3),
        "writes": list(f.writes),
        "text": f"cell [{f.cell}]: {_figures(f)}, {f.state}",
        "note": note,
    }


def _recent_view(f: BackgroundFacts) -> dict[str, Any]:
    outcome = _OUTCOME.get(f.state, f.state)
    what = f"failed: {f.error}" if outcome == "failed" and f.error else outcome
    return {
        "cell": f.cell,
        "outcome": outcome,
        "error": f.error if outcome == "failed" else None,
        "text": f"cell [{f.cell}]: {what} ({_figures(f)})",
    }


def background_view(
    facts: Sequence[BackgroundFacts], recent: int = 5
) -> dict[str, Any] | None:
    """The pending runs (start order) and the last ``recent`` that ended
    (newest first); ``None`` when the kernel has none."""
    if not facts:
        return None
    ended = [f for f in facts if not f.pending and f.state != "merging"]
    return {
        "pending": [_pending_view(f) for f in facts if f.pending],
        "recent": [_recent_view(f) for f in reversed(ended)][:recent],
    }


def background_status(background: dict[str, Any] | None) -> str:
    """`` · 1 background run 37%`` (done of all pending runs' iterations),
    `` · 1 failed`` added when one failed; ``""`` when none is pending."""
    pending = (background or {}).get("pending") or []
    if not pending:
        return ""
    done = sum(p["done"] for p in pending)
    total = sum(p["total"] for p in pending)
    pct = f" {100 * done // total}%" if total else ""
    failed = sum(1 for p in pending if p["state"] == "failed")
    tail = f" · {failed} failed" if failed else ""
    return f" · {_plural(len(pending), 'background run')}{pct}{tail}"


def state_message(
    seq: int,
    cluster: dict[str, Any] | None,
    run: dict[str, Any] | None,
    last: dict[str, Any] | None,
    background: dict[str, Any] | None = None,
) -> dict[str, Any]:
    return {
        "v": VERSION,
        "type": "state",
        "seq": seq,
        "status": status_text(cluster, background),
        "cluster": cluster,
        "run": run,
        "last": last,
        "background": background,
    }
