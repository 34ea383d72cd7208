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
import uuid
import weakref
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any

from gpucell.core.provenance import ChunkRecord, LastRun
from gpucell.errors import DeviceSelectionError, RankFailed

__all__ = [
    "DistRequest",
    "DistributedRun",
    "Group",
    "ensure_group",
    "names_read",
    "run_distributed",
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


# -- which names the cell reads ----------------------------------------------------


def names_read(tree: ast.Module) -> list[str]:
    """Names the cell reads before binding them at its top level, in order of
    first use (a name assigned by an earlier top-level statement is the cell's
    own; one read inside a function the cell defines counts as read)."""
    free = _global_names(tree)
    bound: set[str] = set()
    out: list[str] = []
    for stmt in tree.body:
        loads, stores = _uses(stmt)
        for n in loads:
            if n in free and n not in bound and n not in out:
                out.append(n)
        bound |= stores
    return out


def _global_names(tree: ast.Module) -> set[str]:
    """Names the cell's code looks up in its namespace: read at its top level,
    or read as globals inside the functions, classes and comprehensions it
    defines (not their parameters and locals)."""
    import symtable

    top = symtable.symtable(ast.unparse(tree), "<cell>", "exec")
    out = {s.get_name() for s in top.get_symbols()}  # `x += 1` is not "referenced"
    todo = list(top.get_children())
    while todo:
        table = todo.pop()
        out.update(
            s.get_name()
            for s in table.get_symbols()
            if s.is_referenced() and s.is_global()
        )
        todo.extend(table.get_children())
    return out


def _uses(stmt: ast.stmt) -> tuple[list[str], set[str]]:
    loads: list[str] = []
    stores: set[str] = set()
    for node in ast.walk(stmt):
        if isinstance(node, ast.Name):
            if isinstance(node.ctx, ast.Load):
                loads.append(node.id)
        elif isinstance(node, ast.AugAssign) and isinstance(node.target, ast.Name):
            loads.append(node.target.id)  # x += 1 reads x
    _top_level_stores(stmt, stores)
    return loads, stores


def _top_level_stores(node: ast.AST, stores: set[str]) -> None:
    """Names ``node`` binds in the cell's own (module) scope."""
    if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
        stores.add(node.name)
        return
    if isinstance(node, (ast.Lambda, ast.ListComp, ast.SetComp, ast.DictComp)):
        return
    if isinstance(node, ast.GeneratorExp):
        return
    if isinstance(node, ast.Name) and isinstance(node.ctx, ast.Store):
        stores.add(node.id)
    elif isinstance(node, (ast.Import, ast.ImportFrom)):
        for a in node.names:
            stores.add((a.asname or a.name).split(".")[0])
    for child in ast.iter_child_nodes(node):
        _top_level_stores(child, stores)


def inputs_of(tree: ast.Module, ns: dict[str, Any], hidden: Iterable[str]) -> list[str]:
    """The notebook's names a rank needs for this cell: those it reads, and the
    globals the notebook functions and classes among them read (they run on
    the rank's namespace, as in the notebook)."""
    from gpucell.core.globalreads import code_globals, notebook_functions

    skip = set(hidden)
    want = [n for n in names_read(tree) if n in ns and n not in skip]
    seen = set(want)
    for _via, fn in notebook_functions({n: ns[n] for n in want}, ns):
        for n in sorted(code_globals(fn.__code__)):
            if n in ns and n not in seen and n not in skip:
                seen.add(n)
                want.append(n)
    return [n for n in want if not (n.startswith("__") and n.endswith("__"))]


# -- what each rank's namespace holds of the notebook's ------------------------------


@dataclass(frozen=True)
class _Token:
    """A notebook value as it was when a rank last got it (or last had a
    name of its own by that name): equal tokens mean "not changed since"."""

    fp: Any  # its content fingerprint (protocol.fingerprint), None when none
    ident: int
    ref: Any  # a weak (else strong) reference, so the id is not reused

    @classmethod
    def of(cls, value: Any) -> _Token:
        from gpucell.protocol.fingerprint import fingerprint

        try:
            ref: Any = weakref.ref(value)
        except TypeError:
            ref = value
        try:
            fp = fingerprint(value)
        except Exception:  # an object whose attributes cannot be read
            fp = None
        return cls(fp, id(value), ref)

    def same(self, value: Any) -> bool:
        if self.fp is not None:
            return self.fp == _Token.of(value).fp
        held = self.ref() if isinstance(self.ref, weakref.ref) else self.ref
        return held is value


@dataclass
class Synced:
    """Per rank process ((host, pid): its namespace lives as long as it does),
    the notebook's names it holds and the token of each when it got them.

    A name is sent to a rank when the notebook has it and the rank does not,
    or when the notebook's value changed since (rebound; for tensors, arrays,
    modules and containers of them also changed in place).  Otherwise the rank
    keeps its own: a model a distributed cell trained goes on training in the
    next one.  An object without a content fingerprint (an optimizer, a
    notebook class's instance) is sent again only when the notebook binds the
    name to another object.
    """

    tokens: dict[tuple[str, int], dict[str, _Token]] = field(default_factory=dict)
    names: dict[tuple[str, int], set[str]] = field(default_factory=dict)

    def wanted(
        self, proc: tuple[str, int], names: list[str], ns: dict[str, Any]
    ) -> list[str]:
        have = self.tokens.get(proc, {})
        return [n for n in names if n not in have or not have[n].same(ns[n])]

    def sent(
        self, proc: tuple[str, int], names: Iterable[str], ns: dict[str, Any]
    ) -> None:
        have = self.tokens.setdefault(proc, {})
        for n in names:
            have[n] = _Token.of(ns[n])

    def after(
        self,
        proc: tuple[str, int],
        held: Iterable[str],
        ns: dict[str, Any],
        bound: Iterable[str] = (),
    ) -> None:
        """A cell ended on ``proc``, whose namespace now holds ``held``; the
        notebook's names in ``bound`` were just set from the ranks (--out).
        A held name the notebook has without a token (the rank made its own)
        and a bound one get the notebook's value's token now: that value is
        not newer than the rank's.  Other tokens stay as they are (a rank that
        changed a name it was sent keeps its own until the notebook changes
        the name)."""
        held = set(held)
        self.names[proc] = held
        have = self.tokens.setdefault(proc, {})
        fresh = set(bound)
        for n in held:
            if n in ns and (n in fresh or n not in have):
                have[n] = _Token.of(ns[n])

    def forget(self, proc: tuple[str, int]) -> None:
        self.tokens.pop(proc, None)
        self.names.pop(proc, None)


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
    from gpucell.kernel.dispatch import _signal_engines, _stop_button

    deadline = time.monotonic() + limit
    with _stop_button() as pressed:
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
            _signal_engines(gc, still, signal.SIGINT)
            concurrent.futures.wait([ars[e] for e in still], timeout=5)
        if pressed:
            raise KeyboardInterrupt("gpucell: interrupted while forming the group")
    errors: dict[int, str] = {}
    for eid, ar in ars.items():
        if not ar.done():
            errors[eid] = "did not join (still busy after SIGINT)"
        elif ar.exception() is not None:
            errors[eid] = _remote_message(ar.exception())
    if errors:
        errors = {e: errors.get(e, "joined; left again") for e in ars}
    return errors


def _remote_message(e: BaseException) -> str:
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
class _Rank:
    rank: int
    engine: int
    ar: Any
    report: dict[str, Any] | None = None
    values: dict[str, Any] = field(default_factory=dict)
    signalled: float | None = None  # first SIGINT
    last_signal: float | None = None


def run_distributed(
    shell: Any, cell: str, req: DistRequest, echo: Callable[[str], None] = print
) -> None:
    """Run ``cell`` as ``%%gpu_distributed`` does (see the magic's docstring)."""
    from gpucell.cluster.lifecycle import current
    from gpucell.kernel.execute import CellRequest, select_targets

    ns = shell.user_ns
    src = "# %%gpu_distributed\n" + shell.transform_cell(cell)
    filename = shell.compile.cache(src)
    tree = ast.parse(src, filename)
    compile(tree, filename, "exec")  # any SyntaxError here, before anything runs
    gc = current()
    gc.check_controller()
    targets = select_targets(gc, CellRequest(devices=req.devices, targets=req.targets))
    if not targets:
        raise DeviceSelectionError("no live engine to run the cell on")
    backend = default_backend(gc, targets, req.backend)
    timeout = req.timeout or DEFAULT_TIMEOUT
    order = rank_order(gc, targets)
    cpu = {e for e in order if gc.engines[e].kind != "gpu"}
    programs = {False: tree}
    if cpu:
        programs[True], cuda_lines = _for_cpu(src, filename)
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
    procs = {e: (gc.engines[e].host, gc.engines[e].pid) for e in order}
    synced = _STATE.synced
    if _STATE.group is not None and _STATE.group.cluster is not gc:
        synced = _STATE.synced = Synced()
    wanted = {e: synced.wanted(procs[e], names, ns) for e in order}
    payloads = _payloads(wanted, ns)  # refuses what cannot travel: nothing ran

    record = DistributedRun(
        iterations=len(order), engines=tuple(order), schedule="distributed"
    )
    record.backend = backend
    record.out = req.out
    _set_last_run(record)
    t0 = time.perf_counter()
    g, why, rewrapped = ensure_group(gc, order, backend, timeout)
    if why is not None:
        record.formed, record.formed_seconds = why, g.seconds
        if why != "formed" and not req.quiet:
            echo(f"gpucell: process group {why} ({g.world} ranks, {g.backend}).")
        if rewrapped and not req.quiet:
            echo(
                f"gpucell: wrapped {_few(rewrapped)} in DistributedDataParallel "
                "again on the new group (rank 0's weights broadcast to every rank)."
            )
        _warn_missing(g, synced, ns, echo)
    out_of = {
        r: tuple(o.partition("@")[0] for o in req.out if r == 0 or o.endswith("@all"))
        for r in range(g.world)
    }
    ranks: list[_Rank] = []
    from gpucell.engine.distributed import run

    for r, eid in enumerate(g.engines):
        task = {
            "owner": OWNER,
            "epoch": g.epoch,
            "code": programs[eid in cpu],
            "device": eid in cpu,
            "filename": filename,
            "source": src,
            "timeout": timeout,
            "show": req.ranks,
            "out": out_of[r],
            "cwd": os.getcwd(),
        }
        ar = gc.view(eid).apply_async(run, task, payloads[eid])
        ranks.append(_Rank(r, eid, ar))
    for eid in g.engines:
        synced.sent(procs[eid], wanted[eid], ns)
    try:
        status = _wait(gc, g, ranks, req.ranks)
    finally:
        record.wall = time.perf_counter() - t0
    _record(record, gc, ranks)
    if status != "ok":
        record.status = "interrupted" if status == "interrupted" else "error"
        _fail(gc, g, ranks, status, record, filename)
    made = {n for rk in ranks for n in (rk.report or {}).get("made", ())}
    record.made = tuple(sorted(made))
    _bind(ns, req.out, ranks)
    for rk in ranks:
        assert rk.report is not None
        synced.after(
            procs[rk.engine],
            rk.report.get("names", ()),
            ns,
            bound=(o.partition("@")[0] for o in req.out),
        )
    record.status = "ok"
    if not req.quiet:
        echo(record.summary())


def _set_last_run(record: Any) -> None:
    import gpucell

    gpucell.last_run = record


def _for_cpu(src: str, filename: str) -> tuple[ast.Module, tuple[int, ...]]:
    """The cell with its CUDA selections on the engine's device, as
    ``%%gpu_parallel`` runs ``.cuda()`` code on CPU engines."""
    from gpucell.core.analysis.rewrite import rewrite_cuda

    tree, lines, _wrapped = rewrite_cuda(ast.parse(src, filename))
    return ast.fix_missing_locations(tree), lines


def _payloads(wanted: dict[int, list[str]], ns: dict[str, Any]) -> dict[int, list[Any]]:
    """Each rank's names as wire frames (ranks that want the same names share
    one serialisation); a name that cannot travel is refused by name."""
    from gpucell.errors import InputNotSendable
    from gpucell.protocol import wire

    made: dict[tuple[str, ...], list[Any]] = {}
    out: dict[int, list[Any]] = {}
    for eid, names in wanted.items():
        key = tuple(names)
        if key not in made:
            if not names:
                made[key] = []
            else:
                try:
                    made[key] = wire.dumps({n: ns[n] for n in names}, cell_globals=ns)
                except Exception as e:
                    bad = _unsendable(names, ns)
                    raise InputNotSendable(
                        f"gpucell: {bad} cannot travel to the ranks "
                        f"({type(e).__name__}: {e}). Make it inside the "
                        "%%gpu_distributed cell instead (each rank then builds "
                        "its own). Nothing ran."
                    ) from None
        out[eid] = made[key]
    return out


def _unsendable(names: list[str], ns: dict[str, Any]) -> str:
    from gpucell.protocol import wire

    for n in names:
        try:
            wire.dumps(ns[n], cell_globals=ns)
        except Exception:
            return f"`{n}` ({type(ns[n]).__name__})"
    return "a name the cell reads"


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


def _wait(gc: Any, g: Group, ranks: list[_Rank], show: str) -> str:
    """Until every rank has reported (or is given up on): ``"ok"``,
    ``"error"`` (a rank failed or died) or ``"interrupted"``.  Output is
    relayed as it arrives; when one rank fails, the others get
    :data:`STOP_GRACE` to fail by themselves, then SIGINT."""
    from gpucell.devices.host import pid_running
    from gpucell.kernel.dispatch import _signal_engines, _stop_button
    from gpucell.kernel.relay import OutputRelay

    relay = OutputRelay(gc.client, _to_stdout)
    for rk in ranks:
        if show == "all" or rk.rank == 0:
            relay.watch(rk.ar)
    status = "ok"
    failed_at: float | None = None
    last_check = 0.0
    with _stop_button() as pressed:
        while True:
            running = [rk for rk in ranks if rk.report is None]
            for rk in running:
                if rk.ar.done():
                    _take(rk)
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
                        rk.report = _died(rk, info)
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
                    _signal_engines(gc, [rk.engine for rk in late], signal.SIGINT)
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


def _take(rk: _Rank) -> None:
    """A finished rank's report and values (or the error its task raised)."""
    from gpucell.protocol import wire

    try:
        got = wire.loads(rk.ar.get(0))
        rk.report, rk.values = got["report"], got["values"]
    except Exception as e:  # the task itself failed (not the cell)
        rk.report = {
            "status": "error",
            "kind": "engine",
            "type": getattr(e, "ename", None) or type(e).__name__,
            "message": _remote_message(e),
            "traceback": "".join(getattr(e, "traceback", None) or ""),
        }


def _died(rk: _Rank, info: Any) -> dict[str, Any]:
    return {
        "status": "error",
        "kind": "died",
        "type": "EngineDied",
        "host": getattr(info, "host", "?"),
        "message": f"engine {rk.engine} died (its process ended)",
    }


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


def _record(record: DistributedRun, gc: Any, ranks: list[_Rank]) -> None:
    """One chunk record per rank (its engine's wall-clock span)."""
    for rk in ranks:
        rep = rk.report or {}
        info = gc.engines.get(rk.engine)
        t_start = float(rep.get("t_start") or 0.0)
        t_end = float(rep.get("t_end") or rep.get("t_error") or t_start)
        kind = rep.get("kind")
        if rep.get("status") == "ok":
            state = "done"
        elif kind == "died":
            state = "lost"
        elif kind in ("interrupt", "peer", "stuck"):
            state = "cancelled"  # stopped because another rank failed
        else:
            state = "failed"
        record.add_chunk(
            ChunkRecord(
                start=rk.rank,
                stop=rk.rank + 1,
                engine=rk.engine,
                host=str(rep.get("host") or getattr(info, "host", "?")),
                device=getattr(info, "device", "?"),
                t_start=t_start,
                t_end=t_end,
                compute=max(0.0, t_end - t_start),
                attempt=0,
                state=state,  # type: ignore[arg-type]
            )
        )


#: how telling each kind of failure is: the first of the lowest is the cause
_CAUSE = {"user": 0, "out": 0, "engine": 1, "died": 1, "timeout": 2, "nogroup": 3}


def _fail(
    gc: Any,
    g: Group,
    ranks: list[_Rank],
    status: str,
    record: DistributedRun,
    filename: str,
) -> None:
    """Raise the error that names what went wrong, and on which rank."""
    for rk in ranks:
        rep = rk.report or {}
        if rep.get("status") == "nogroup":
            rep.setdefault("kind", "nogroup")
    if status == "interrupted":
        g.broken = "the last cell was interrupted"
        record.errors.append("interrupted")
        raise KeyboardInterrupt(
            "gpucell: interrupted; every rank stopped and nothing in the notebook "
            "changed. The next %%gpu_distributed cell re-forms the process group."
        )
    bad = [rk for rk in ranks if (rk.report or {}).get("status") != "ok"]
    bad.sort(
        key=lambda rk: (
            _CAUSE.get((rk.report or {}).get("kind", ""), 4),
            (rk.report or {}).get("t_error", 0.0),
            rk.rank,
        )
    )
    cause = bad[0]
    rep = cause.report or {}
    g.broken = f"rank {cause.rank} failed in the last cell"
    info = gc.engines.get(cause.engine)
    host = rep.get("host") or getattr(info, "host", "?")
    where = f"rank {cause.rank} (engine {cause.engine} on {host})"
    kind = rep.get("kind")
    line = rep.get("line")
    src_line = _line_text(filename, line)
    at = f" at line {line}" + (f": `{src_line}`" if src_line else "") if line else ""
    if kind == "timeout":
        waited = rep.get("timeout") or g.timeout
        what = rep.get("collective") or "a collective"
        others = _absent(ranks, cause)
        head = (
            f"gpucell: {where} waited {waited:g} s (--timeout) in {what}{at} and "
            f"gave up: {others}. Every rank must call each collective, in the "
            "same order (a rank that skips an all_reduce leaves the others "
            "waiting)."
        )
    elif kind == "died":
        head = f"gpucell: {where} died while running the cell."
    elif kind == "nogroup":
        head = (
            f"gpucell: {where} had no process group"
            + (f" ({rep['why']})" if rep.get("why") else "")
            + "."
        )
    else:
        head = f"gpucell: {where} raised {rep.get('type', 'an error')}{at}."
    msg = [head]
    if kind in ("user", "timeout", "engine", "out") and rep.get("traceback"):
        msg.append(_indent(rep["traceback"].rstrip()))
    elif rep.get("message") and kind not in ("died",):
        msg.append(_indent(f"{rep.get('type', 'Error')}: {rep['message']}"))
    if rep.get("tail"):
        msg.append(f"  its last output lines:\n{_indent(''.join(rep['tail']), 4)}")
    stopped = [_stopped(rk) for rk in ranks if rk is not cause]
    if stopped:
        msg.append("The other ranks: " + "; ".join(stopped) + ".")
    msg.append(
        "The process group is broken: the next %%gpu_distributed cell re-forms "
        "it. Nothing in the notebook changed."
    )
    record.errors.append(head)
    raise RankFailed("\n".join(msg))


def _line_text(filename: str, line: int | None) -> str:
    """The cell's line ``line`` (the kernel cached the cell's text)."""
    if not line:
        return ""
    import linecache

    return linecache.getline(filename, line).strip()


def _absent(ranks: list[_Rank], cause: _Rank) -> str:
    """Which ranks did not come to the collective ``cause`` waited in."""
    waiting = {
        rk.rank
        for rk in ranks
        if (rk.report or {}).get("kind") == "timeout"
        and (rk.report or {}).get("line") == (cause.report or {}).get("line")
    }
    parts = []
    for rk in ranks:
        if rk.rank in waiting:
            continue
        rep = rk.report or {}
        if rep.get("status") == "ok":
            parts.append(f"rank {rk.rank} never called it (it finished the cell)")
        elif rep.get("kind") == "timeout":
            parts.append(
                f"rank {rk.rank} was waiting elsewhere (line {rep.get('line')}, "
                f"{rep.get('collective') or 'a collective'})"
            )
        else:
            parts.append(f"rank {rk.rank} did not arrive ({_stopped(rk)})")
    return "; ".join(parts) or "no other rank arrived"


def _stopped(rk: _Rank) -> str:
    rep = rk.report or {}
    kind = rep.get("kind")
    where = f" at line {rep['line']}" if rep.get("line") else ""
    if rep.get("status") == "ok":
        return f"rank {rk.rank} finished the cell"
    if kind == "peer":
        what = rep.get("collective") or "a collective"
        return f"rank {rk.rank} stopped in {what}{where} (its peer left the group)"
    if kind == "interrupt":
        return f"rank {rk.rank} was interrupted{where}"
    if kind == "stuck":
        return (
            f"rank {rk.rank} (engine {rk.engine}) did not stop: it may stay busy "
            "(`%gpu_cluster stop` ends it)"
        )
    if kind == "died":
        return f"rank {rk.rank} died"
    if kind == "timeout":
        return f"rank {rk.rank} also timed out{where}"
    return f"rank {rk.rank} raised {rep.get('type', 'an error')}{where}"


def _indent(text: str, n: int = 2) -> str:
    pad = " " * n
    return "\n".join(pad + ln if ln else ln for ln in text.splitlines())


def _bind(ns: dict[str, Any], out: tuple[str, ...], ranks: list[_Rank]) -> None:
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
