"""One ``%%gpu_distributed`` cell, end to end, and the process group it runs in.

The kernel's side of ``engine/distributed.py``.  Every message goes through
ipyparallel (one ``apply`` per rank on the cluster's views):

1. the cell is parsed here (a syntax error never reaches the engines), CUDA
   selections rewritten for CPU engines as ``%%gpu_parallel`` does;
2. the names the cell reads that the notebook has are serialised
   (:mod:`gpucell.protocol.wire`) for each rank whose namespace lacks them or
   holds an older version (:class:`Synced`);
3. the group is formed, or kept from the last cell, or re-formed when it
   broke, the engines changed or were restarted (:func:`ensure_group`);
4. every rank runs the cell; the kernel relays rank 0's output (or every
   rank's, tagged), watches for a failed or dead rank and for the stop button,
   and stops the other ranks when one fails;
5. ``--out`` names are bound in the notebook (rank 0's value, or a list of
   every rank's for ``name@all``); without ``--out`` the notebook's namespace
   is left as it was.
"""

from __future__ import annotations

import ast
import concurrent.futures
import os
import signal
import sys
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any

from gpucell import config as _config
from gpucell.core.provenance import LastRun
from gpucell.errors import DeviceSelectionError
from gpucell.kernel.dispatch import signal_engines, stop_button
from gpucell.kernel.distributed_group import (
    _STATE,
    DEFAULT_TIMEOUT,
    GIVE_UP,
    OWNER,
    STOP_GRACE,
    Group,
    _ids,
    current_group,
    default_backend,
    ensure_group,
    rank_order,
    status_text,
    stop_group,
)
from gpucell.kernel.distributed_inputs import (
    Synced,
    for_cpu,
    inputs_of,
    modules_of,
    names_read,
    rank_frames,
)
from gpucell.kernel.distributed_ranks import Rank, died, fail, record_ranks, take

__all__ = [
    "DistRequest",
    "DistributedRun",
    "Group",
    "current_group",
    "ensure_group",
    "names_read",
    "run_distributed",
    "status_text",
    "stop_group",
]


@dataclass(frozen=True)
class DistRequest:
    """What the magic line asked for."""

    devices: str | None = None
    targets: str | None = None
    backend: str = "auto"
    out: tuple[str, ...] = ()
    ranks: str = "0"  # whose output is shown: "0" or "all"
    timeout: float | None = None
    quiet: bool = False


def parse_out(spec: str | None) -> tuple[str, ...]:
    """``"model,history@all"`` -> ``("model", "history@all")``, checked."""
    if not spec:
        return ()
    out = []
    for tok in (t.strip() for t in spec.split(",")):
        name, _, where = tok.partition("@")
        if not tok or not name.isidentifier() or where not in ("", "all"):
            raise ValueError(
                f"--out {spec!r}: expected names like 'model,history' or "
                "'history@all' (a list of every rank's value)."
            )
        if tok not in out:
            out.append(tok)
    return tuple(out)


# -- the cell ----------------------------------------------------------------------


@dataclass
class DistributedRun(LastRun):
    """``gpucell.last_run`` after a ``%%gpu_distributed`` cell: one chunk
    record per rank (``start`` is the rank), the timeline shows each."""

    backend: str = ""
    formed: str | None = None  # how the group came to be, when not kept
    formed_seconds: float = 0.0
    out: tuple[str, ...] = ()
    made: tuple[str, ...] = ()  # names the cell left in the ranks' namespace

    def summary(self) -> str:
        n = len(self.engines)
        s = (
            f"gpucell: the cell ran on {n} rank{'s' if n != 1 else ''} "
            f"({self.backend}; engines {_ids(self.engines)}) in {self.wall:.2f} s"
        )
        if self.formed:
            s += f"; process group {self.formed} in {self.formed_seconds:.2f} s"
        if self.status != "ok":
            return s + f"; {self.status}, nothing in the notebook changed"
        if self.out:
            parts = [
                f"{o[:-4]} (every rank)" if o.endswith("@all") else f"{o} (rank 0)"
                for o in self.out
            ]
            return s + "; in the notebook now: " + ", ".join(parts)
        kept = f"; the ranks keep {_few(self.made)}" if self.made else ""
        return s + f"; the notebook's namespace is unchanged (no --out){kept}"


def _few(names: Iterable[str], k: int = 6) -> str:
    names = list(names)
    more = len(names) - k
    return ", ".join(names[:k]) + (f" and {more} more" if more > 0 else "")


@dataclass
class _Cell:
    """A cell ready to run: parsed, its ranks chosen, its inputs serialised."""

    src: str
    filename: str
    gc: Any
    order: list[int]
    cpu: set[int]  # ranks on CPU engines (run the CUDA-rewritten program)
    programs: dict[bool, ast.Module]
    backend: str
    timeout: float
    procs: dict[int, tuple[str, int]]
    synced: Synced
    wanted: dict[int, list[str]]
    payloads: dict[int, list[Any]]
    imports: dict[str, str]  # modules the cell reads: {name: module}, by name


def run_distributed(
    shell: Any, cell: str, req: DistRequest, echo: Callable[[str], None] = print
) -> None:
    """Run ``cell`` as ``%%gpu_distributed`` does (see the magic's docstring)."""
    ns = shell.user_ns
    c = _prepare(shell, cell, req, echo)  # refusals: nothing ran
    record = DistributedRun(
        iterations=len(c.order), engines=tuple(c.order), schedule="distributed"
    )
    record.backend = c.backend
    record.out = req.out
    _set_last_run(record)
    t0 = time.perf_counter()
    g = _group_for(c, req, record, ns, echo)
    ranks = _start_ranks(c, g, req)
    for eid in g.engines:
        c.synced.sent(c.procs[eid], c.wanted[eid], ns)
    try:
        status = _wait(c.gc, g, ranks, req.ranks)
    finally:
        record.wall = time.perf_counter() - t0
    record_ranks(record, c.gc, ranks)
    if status != "ok":
        record.status = "interrupted" if status == "interrupted" else "error"
        fail(c.gc, g, ranks, status, record, c.filename)
    made = {n for rk in ranks for n in (rk.report or {}).get("made", ())}
    record.made = tuple(sorted(made))
    _bind(ns, req.out, ranks)
    for rk in ranks:
        assert rk.report is not None
        c.synced.after(
            c.procs[rk.engine],
            rk.report.get("names", ()),
            ns,
            bound=(o.partition("@")[0] for o in req.out),
        )
    record.status = "ok"
    if not req.quiet:
        echo(record.summary())


def _prepare(
    shell: Any, cell: str, req: DistRequest, echo: Callable[[str], None]
) -> _Cell:
    """Parse the cell, choose its ranks, serialise what each lacks; raises
    (a syntax error, no engine, a name that cannot travel) before anything ran."""
    from gpucell.cluster.lifecycle import current
    from gpucell.kernel.request import CellRequest, select_targets

    ns = shell.user_ns
    src = "# %%gpu_distributed\n" + shell.transform_cell(cell)
    filename = shell.compile.cache(src)
    tree = ast.parse(src, filename)
    compile(tree, filename, "exec")  # any SyntaxError here, before anything runs
    gc = current()
    gc.check_controller()
    ask = CellRequest(devices=req.devices, targets=req.targets)
    targets = select_targets(gc, ask)
    back = [e for e in targets if gc.restarts.restarting(e)]
    if back:  # the group's size is every selected device: wait for the new engines
        echo(f"gpucell: waiting for the restart of engine(s) {back}")
        gc.restarts.wait_for(gc, back, _config.settings().start_timeout)
        targets = select_targets(gc, ask)
    if not targets:
        raise DeviceSelectionError("no live engine to run the cell on")
    order = rank_order(gc, targets)
    cpu = {e for e in order if gc.engines[e].kind != "gpu"}
    programs = {False: tree}
    if cpu:
        programs[True], cuda_lines = for_cpu(src, filename)
        if cuda_lines and not req.quiet:
            echo(
                "gpucell: note: CPU engines stand in for GPUs: CUDA device "
                f"selections on line{'s' if len(cuda_lines) > 1 else ''} "
                f"{', '.join(map(str, cuda_lines))} use the engine's device."
            )
    hidden = {
        n for n, v in getattr(shell, "user_ns_hidden", {}).items() if ns.get(n) is v
    }
    names = inputs_of(tree, ns, hidden)
    imports = modules_of(names, ns)
    names = [n for n in names if n not in imports]
    procs = {e: (gc.engines[e].host, gc.engines[e].pid) for e in order}
    synced = _STATE.synced
    if _STATE.group is not None and _STATE.group.cluster is not gc:
        synced = _STATE.synced = Synced()
    wanted = {e: synced.wanted(procs[e], names, ns) for e in order}
    return _Cell(
        src=src,
        filename=filename,
        gc=gc,
        order=order,
        cpu=cpu,
        programs=programs,
        backend=default_backend(gc, targets, req.backend),
        timeout=req.timeout or DEFAULT_TIMEOUT,
        procs=procs,
        synced=synced,
        wanted=wanted,
        payloads=rank_frames(wanted, ns),  # refuses what cannot travel
        imports=imports,
    )


def _group_for(
    c: _Cell,
    req: DistRequest,
    record: DistributedRun,
    ns: dict[str, Any],
    echo: Callable[[str], None],
) -> Group:
    """The group the cell runs in (kept, formed or re-formed, saying which)."""
    g, why, rewrapped = ensure_group(c.gc, c.order, c.backend, c.timeout)
    if why is not None:
        record.formed, record.formed_seconds = why, g.seconds
        if why != "formed" and not req.quiet:
            echo(f"gpucell: process group {why} ({g.world} ranks, {g.backend}).")
        if rewrapped and not req.quiet:
            echo(
                f"gpucell: wrapped {_few(rewrapped)} in DistributedDataParallel "
                "again on the new group (rank 0's weights broadcast to every rank)."
            )
        _warn_missing(g, c.synced, ns, echo)
    return g


def _start_ranks(c: _Cell, g: Group, req: DistRequest) -> list[Rank]:
    """Every rank's task sent (the cell, its inputs, the names it returns)."""
    from gpucell.engine.distributed import run

    out_of = {
        r: tuple(o.partition("@")[0] for o in req.out if r == 0 or o.endswith("@all"))
        for r in range(g.world)
    }
    ranks: list[Rank] = []
    for r, eid in enumerate(g.engines):
        task = {
            "owner": OWNER,
            "epoch": g.epoch,
            "code": c.programs[eid in c.cpu],
            "device": eid in c.cpu,
            "filename": c.filename,
            "source": c.src,
            "timeout": c.timeout,
            "show": req.ranks,
            "out": out_of[r],
            "cwd": os.getcwd(),
            "imports": c.imports,
        }
        ar = c.gc.view(eid).apply_async(run, task, c.payloads[eid])
        ranks.append(Rank(r, eid, ar))
    return ranks


def _set_last_run(record: Any) -> None:
    from gpucell.kernel.session import current  # (gpucell.last_run reads it)

    current().last_run = record


def _warn_missing(
    g: Group, synced: Synced, notebook: Iterable[str], echo: Callable[[str], None]
) -> None:
    """A new group whose ranks' namespaces differ (a restarted engine, another
    engine): names earlier cells left on some ranks only."""
    held = [synced.names.get(p) for p in g.procs]
    known = [h for h in held if h is not None]
    if not known:
        return
    # the notebook's names are sent where needed, and every namespace has gpucell
    every = set.union(*known) - set(notebook) - {"gpucell"}
    for rank, h in enumerate(held):
        missing = sorted(every - (h or set()))
        if missing:
            echo(
                f"gpucell: note: rank {rank} (engine {g.engines[rank]}) lacks "
                f"{_few(missing)}, which earlier distributed cells left on other "
                "ranks; run the cells that make them again."
            )


def _wait(gc: Any, g: Group, ranks: list[Rank], show: str) -> str:
    """Until every rank has reported (or is given up on): ``"ok"``,
    ``"error"`` (a rank failed or died) or ``"interrupted"``.  Output is
    relayed as it arrives; when one rank fails, the others get
    :data:`STOP_GRACE` to fail by themselves, then SIGINT."""
    from gpucell.devices.host import pid_running
    from gpucell.kernel.relay import OutputRelay

    relay = OutputRelay(gc.client, _to_stdout)
    for rk in ranks:
        if show == "all" or rk.rank == 0:
            relay.watch(rk.ar)
    status = "ok"
    failed_at: float | None = None
    last_check = 0.0
    with stop_button() as pressed:
        while True:
            running = [rk for rk in ranks if rk.report is None]
            for rk in running:
                if rk.ar.done():
                    take(rk)
                    if show == "all" or rk.rank == 0:
                        relay.finished(rk.ar)
                    failed = (rk.report or {}).get("status") != "ok"
                    if failed and failed_at is None:
                        failed_at = time.monotonic()
                        status = "error"
            running = [rk for rk in ranks if rk.report is None]
            relay.poll(running)
            if not running:
                break
            now = time.monotonic()
            if now - last_check > 0.2:
                last_check = now
                gc.check_controller()
                live = set(gc.client.ids)
                for rk in running:
                    info = gc.engines.get(rk.engine)
                    dead = rk.engine not in live or (
                        info is not None and info.local and not pid_running(info.pid)
                    )
                    if dead:
                        rk.report = died(rk, info)
                        _lost(gc, rk.engine)
                        if failed_at is None:
                            failed_at = now
                            status = "error"
            if pressed and status == "ok":
                status = "interrupted"
                failed_at = now - STOP_GRACE  # stop them now
                pressed.clear()
            if failed_at is not None and now - failed_at >= STOP_GRACE:
                late = [
                    rk
                    for rk in running
                    if rk.report is None
                    and (rk.last_signal is None or now - rk.last_signal > 3.0)
                ]
                if late:
                    signal_engines(gc, [rk.engine for rk in late], signal.SIGINT)
                    for rk in late:
                        rk.signalled = rk.signalled or now
                        rk.last_signal = now
                for rk in running:
                    if rk.signalled is not None and now - rk.signalled > GIVE_UP:
                        rk.report = {
                            "status": "error",
                            "kind": "stuck",
                            "message": "did not stop after SIGINT",
                        }
            concurrent.futures.wait(
                [rk.ar for rk in running],
                timeout=0.05,
                return_when=concurrent.futures.FIRST_COMPLETED,
            )
        relay.flush([])
    return status


def _to_stdout(text: str) -> None:
    sys.stdout.write(text)
    sys.stdout.flush()


def _lost(gc: Any, eid: int) -> None:
    """A rank's engine died: later cells skip it and, when this kernel
    started it, it is restarted on its device (the cluster's own path)."""
    gc.mark_dead(eid)
    restarts = getattr(gc, "restarts", None)
    if restarts is not None:
        try:
            restarts.begin(gc, eid)
        except Exception:
            pass


def _bind(ns: dict[str, Any], out: tuple[str, ...], ranks: list[Rank]) -> None:
    """``--out`` values into the notebook, all at once (an interrupt waits)."""
    if not out:
        return
    from gpucell.kernel.interrupts import interrupts_deferred

    values: dict[str, Any] = {}
    for o in out:
        name, _, where = o.partition("@")
        if where == "all":
            values[name] = [rk.values[name] for rk in ranks]
        else:
            values[name] = ranks[0].values[name]
    with interrupts_deferred("the --out names were bound"):
        ns.update(values)
