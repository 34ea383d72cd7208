"""The process group of ``%%gpu_distributed`` cells as the kernel knows it:
formed before the first cell (every rank joins at the rendezvous rank 0 picked),
kept across cells, re-formed when it broke or its engines changed, taken down
by ``%gpu_distributed stop``.  Each step is one ipyparallel ``apply`` per rank
of :mod:`gpucell.engine.distributed`."""

from __future__ import annotations

import concurrent.futures
import signal
import time
import uuid
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any

from gpucell.errors import RankFailed
from gpucell.kernel.dispatch import signal_engines, stop_button
from gpucell.kernel.distributed_inputs import Synced

__all__ = [
    "OWNER",
    "Group",
    "current_group",
    "default_backend",
    "ensure_group",
    "rank_order",
    "remote_message",
    "status_text",
    "stop_group",
]

#: this kernel, as engines tell its group and namespace from another notebook's
OWNER = uuid.uuid4().hex

#: default collective timeout, seconds (torch's own is 30 minutes)
DEFAULT_TIMEOUT = 300.0
#: seconds the other ranks get to stop by themselves after one failed (their
#: collectives fail at once: the failed rank aborted its group), before SIGINT
STOP_GRACE = 1.0
#: seconds after the first SIGINT before a rank still running is given up on
GIVE_UP = 15.0
#: seconds to wait for every rank to join a new group, beyond its timeout
JOIN_SLACK = 30.0
#: seconds an engine may stay busy with earlier work (its first import of
#: torch, a rank that ignored SIGINT) before forming a group is given up
BUSY_WAIT = 60.0

# -- the group ---------------------------------------------------------------------


@dataclass
class Group:
    """The process group as the kernel knows it."""

    cluster: Any
    engines: tuple[int, ...]  # rank r is engines[r]
    procs: tuple[tuple[str, int], ...]  # (host, pid) of each rank
    backend: str
    epoch: int
    timeout: float
    master: tuple[str, int]
    seconds: float = 0.0  # to form it
    broken: str | None = None  # why the next cell re-forms it
    formed_at: float = field(default_factory=time.time)

    @property
    def world(self) -> int:
        return len(self.engines)


@dataclass
class _Kernel:
    group: Group | None = None
    epochs: int = 0
    synced: Synced = field(default_factory=Synced)


_STATE = _Kernel()


def current_group() -> Group | None:
    return _STATE.group


def rank_order(gc: Any, targets: Iterable[int]) -> list[int]:
    """Ranks by host (this host's engines first, then each host's together,
    torchrun's node-major order), by engine id within a host."""
    hosts: list[str] = []
    ids = sorted(targets)
    for e in sorted(ids, key=lambda e: not gc.engines[e].local):
        h = gc.engines[e].host
        if h not in hosts:
            hosts.append(h)
    return sorted(ids, key=lambda e: (hosts.index(gc.engines[e].host), e))


def default_backend(gc: Any, targets: Iterable[int], asked: str) -> str:
    """``--backend``: nccl when every rank has a GPU, gloo otherwise."""
    if asked != "auto":
        return asked
    kinds = {gc.engines[e].kind for e in targets}
    return "nccl" if kinds == {"gpu"} else "gloo"


def ensure_group(
    gc: Any, targets: list[int], backend: str, timeout: float
) -> tuple[Group, str | None, list[str]]:
    """The group the cell runs in: the last one if it still fits, else a new
    one.  Returns it, why it was (re-)formed (``"formed"`` the first time,
    ``None`` when kept) and the models wrapped again on it."""
    order = tuple(rank_order(gc, targets))
    procs = tuple((gc.engines[e].host, gc.engines[e].pid) for e in order)
    g = _STATE.group
    why: str | None = "formed"
    if g is not None:
        if g.cluster is not gc:
            why = "re-formed: a new cluster"
            _STATE.synced = Synced()
        elif g.engines != order:
            why = f"re-formed: engines {_ids(order)} instead of {_ids(g.engines)}"
        elif g.procs != procs:
            why = "re-formed: an engine was restarted"
        elif g.backend != backend:
            why = f"re-formed: --backend {backend} instead of {g.backend}"
        elif g.broken:
            why = f"re-formed: {g.broken}"
        else:
            return g, None, []
        _release(g, keep=set(order))
    _STATE.group = None
    # the namespaces of processes that were ranks of the old group are kept,
    # so their DistributedDataParallel models can be wrapped again when every
    # rank of the new group is such a process
    rewrap = g is not None and g.procs == procs and g.cluster is gc
    new, rewrapped = _form(gc, order, procs, backend, timeout, rewrap)
    _STATE.group = new
    return new, why, rewrapped


def _ids(engines: Iterable[int]) -> str:
    return ", ".join(map(str, engines))


def _release(g: Group, keep: set[int]) -> None:
    """Engines of the old group that are not in the new one leave it (not
    waited for; an engine that died is skipped)."""
    from gpucell.engine.distributed import leave

    gc = g.cluster
    if getattr(gc, "stopping", False):
        return
    try:
        live = set(gc.client.ids)
    except Exception:
        return
    for eid in g.engines:
        if eid not in keep and eid in live:
            try:
                gc.view(eid).apply_async(leave, OWNER)
            except Exception:
                pass


def _form(
    gc: Any,
    order: tuple[int, ...],
    procs: tuple[tuple[str, int], ...],
    backend: str,
    timeout: float,
    rewrap: bool,
) -> tuple[Group, list[str]]:
    from gpucell.engine.distributed import join, leave, rendezvous

    t0 = time.perf_counter()
    _refuse_busy(gc, order)
    hosts = [gc.engines[e].host for e in order]
    peer = next((h for h in hosts if h != hosts[0]), None)
    last_error: BaseException | None = None
    for _attempt in range(2):  # a port taken between the pick and the bind
        addr, port = gc.view(order[0]).apply_async(rendezvous, peer).get(BUSY_WAIT)
        _STATE.epochs += 1
        epoch = _STATE.epochs
        node_of = {h: i for i, h in enumerate(dict.fromkeys(hosts))}
        specs = []
        for rank in range(len(order)):
            h = hosts[rank]
            specs.append(
                {
                    "owner": OWNER,
                    "epoch": epoch,
                    "rank": rank,
                    "world": len(order),
                    "local_rank": hosts[:rank].count(h),
                    "local_world": hosts.count(h),
                    "node_rank": node_of[h],
                    "master_addr": addr,
                    "master_port": port,
                    "backend": backend,
                    "timeout": timeout,
                    "rewrap": rewrap,
                }
            )
        ars = {
            eid: gc.view(eid).apply_async(join, spec)
            for eid, spec in zip(order, specs, strict=True)
        }
        errors = _wait_joined(gc, ars, timeout + JOIN_SLACK)
        if not errors:
            facts = {eid: ar.get() for eid, ar in ars.items()}
            rewrapped = facts[order[0]]["rewrapped"]
            g = Group(
                cluster=gc,
                engines=order,
                procs=procs,
                backend=backend,
                epoch=epoch,
                timeout=timeout,
                master=(addr, port),
                seconds=time.perf_counter() - t0,
            )
            return g, rewrapped
        for eid in order:  # whoever joined leaves again
            try:
                gc.view(eid).apply_async(leave, OWNER)
            except Exception:
                pass
        last_error = RankFailed(
            "gpucell: the process group could not be formed ("
            + f"{backend}, {len(order)} ranks on engines {_ids(order)}, master "
            + f"{addr}:{port}):\n"
            + "\n".join(f"  engine {eid}: {msg}" for eid, msg in errors.items())
        )
        if not any("address already in use" in m.lower() for m in errors.values()):
            break
    assert last_error is not None
    raise last_error


def _refuse_busy(gc: Any, order: Iterable[int]) -> None:
    """An engine still running earlier work (importing torch after the start, a
    rank that ignored SIGINT, another notebook's task) would leave every other
    rank waiting in the rendezvous: wait for it (saying so after 2 s), and give
    up after :data:`BUSY_WAIT` s."""
    order = list(order)
    t0 = time.monotonic()
    said = False
    while True:
        try:
            q = gc.client.queue_status(targets=order, verbose=False)
        except Exception:
            return
        busy = [
            e
            for e in order
            if isinstance(q.get(e), dict) and (q[e].get("queue") or q[e].get("tasks"))
        ]
        if not busy:
            return
        waited = time.monotonic() - t0
        if waited > 2 and not said:
            said = True
            print(
                f"gpucell: waiting for engine{'s' if len(busy) > 1 else ''} "
                f"{_ids(busy)} (busy with earlier work) to form the process group"
            )
        if waited > BUSY_WAIT:
            raise RankFailed(
                f"gpucell: engine{'s' if len(busy) > 1 else ''} {_ids(busy)} "
                f"{'are' if len(busy) > 1 else 'is'} still busy with earlier work "
                "(a cell that did not stop?), so the process group cannot be "
                "formed. Wait for it, or `%gpu_cluster stop` and `start`."
            )
        time.sleep(0.1)


def _wait_joined(gc: Any, ars: dict[int, Any], limit: float) -> dict[int, str]:
    """Wait for every rank's join; each failed one's error, in words.  Once one
    rank failed, the others (waiting for it in the rendezvous) get a moment,
    then SIGINT."""
    deadline = time.monotonic() + limit
    with stop_button() as pressed:
        first_failure: float | None = None
        while not pressed:
            pending = [ar for ar in ars.values() if not ar.done()]
            if not pending:
                break
            now = time.monotonic()
            if first_failure is None and any(
                ar.done() and ar.exception() is not None for ar in ars.values()
            ):
                first_failure = now
            if now > deadline or (
                first_failure is not None and now - first_failure > STOP_GRACE
            ):
                break
            concurrent.futures.wait(pending, timeout=0.1)
        still = [e for e, ar in ars.items() if not ar.done()]
        if still:
            signal_engines(gc, still, signal.SIGINT)
            concurrent.futures.wait([ars[e] for e in still], timeout=5)
        if pressed:
            raise KeyboardInterrupt("gpucell: interrupted while forming the group")
    errors: dict[int, str] = {}
    for eid, ar in ars.items():
        if not ar.done():
            errors[eid] = "did not join (still busy after SIGINT)"
        elif ar.exception() is not None:
            errors[eid] = remote_message(ar.exception())
    if errors:
        errors = {e: errors.get(e, "joined; left again") for e in ars}
    return errors


def remote_message(e: BaseException) -> str:
    ename = getattr(e, "ename", None) or type(e).__name__
    evalue = getattr(e, "evalue", None) or str(e)
    return f"{ename}: {evalue}".strip()


def stop_group(echo: Callable[[str], None] = print) -> None:
    """``%gpu_distributed stop``: every rank leaves the group and drops the
    names distributed cells left in its namespace (freeing their memory)."""
    from gpucell.engine.distributed import leave

    g = _STATE.group
    _STATE.group = None
    if g is None:
        echo("gpucell: no process group.")
        return
    gc = g.cluster
    try:
        live = set(gc.client.ids)
        ars = [
            gc.view(e).apply_async(leave, OWNER, True) for e in g.engines if e in live
        ]
        concurrent.futures.wait(ars, timeout=10)
    except Exception:
        pass
    for proc in g.procs:
        _STATE.synced.forget(proc)
    echo(
        f"gpucell: the process group of {g.world} ranks is gone and the ranks "
        "dropped their names; the next %%gpu_distributed cell forms a new one."
    )


def status_text() -> str:
    """``%gpu_distributed``: the group, rank by rank."""
    g = _STATE.group
    if g is None:
        return "gpucell: no process group (the first %%gpu_distributed cell forms one)."
    state = f"broken ({g.broken}): the next cell re-forms it" if g.broken else "ready"
    head = (
        f"process group: {g.world} ranks, {g.backend}, master "
        f"{g.master[0]}:{g.master[1]}, timeout {g.timeout:g} s, formed "
        f"{time.strftime('%H:%M:%S', time.localtime(g.formed_at))} in "
        f"{g.seconds:.2f} s; {state}"
    )
    rows = [("rank", "engine", "host", "pid", "device")]
    for rank, (eid, (host, pid)) in enumerate(zip(g.engines, g.procs, strict=True)):
        info = g.cluster.engines.get(eid)
        rows.append((str(rank), str(eid), host, str(pid), info.device if info else "?"))
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    table = [
        "  ".join(c.ljust(w) for c, w in zip(r, widths, strict=True)).rstrip()
        for r in rows
    ]
    held = _STATE.synced.names.get(g.procs[0], set())
    names = ", ".join(sorted(held)) if held else "none"
    return "\n".join([head, *table, f"names on rank 0: {names}"])
