"""A ``%%gpu_distributed`` cell on one rank: the process group and the cell.

Runs on engines; the kernel applies these functions by reference
(``kernel/distributed.py``), one engine per rank:

* :func:`rendezvous` (rank 0 only): the address the others reach this host at
  and a free port on it;
* :func:`join`: set ``RANK``, ``LOCAL_RANK``, ``WORLD_SIZE``,
  ``LOCAL_WORLD_SIZE``, ``MASTER_ADDR``, ``MASTER_PORT``, then
  ``init_process_group`` (blocks until every rank has joined); the group stays
  up between cells;
* :func:`run`: one cell in the rank's own namespace (kept across cells, so a
  model built in one cell is trained in the next), its inputs from the notebook
  loaded first, the ``--out`` names sent back;
* :func:`leave`: destroy the group (``%gpu_distributed stop``, or before a new
  group is formed).

A rank whose cell raises aborts its process group at once: its peers' pending
collectives then fail within milliseconds ("connection closed by peer")
instead of waiting for the timeout, and the kernel interrupts whatever still
runs.  Every report is plain data sent back through ipyparallel.
"""

from __future__ import annotations

import contextlib
import datetime
import importlib
import io
import linecache
import os
import socket
import sys
import time
import traceback
from collections import deque
from dataclasses import dataclass
from typing import Any

from gpucell.protocol import wire
from gpucell.protocol.program import AS_DEVICE, DEVICE

__all__ = ["join", "leave", "rendezvous", "run", "state"]


@dataclass
class _Group:
    """The process group this engine is a rank of."""

    owner: str  # the kernel that formed it
    epoch: int  # which of that kernel's groups
    rank: int
    world: int
    backend: str
    timeout: float
    broken: str | None = None  # why it cannot be used any more
    sockets: frozenset[str] = frozenset()  # gloo's, made by init_process_group


_GROUP: _Group | None = None
#: each kernel's namespace on this engine, kept across cells and re-formed groups
_NAMESPACES: dict[str, dict[str, Any]] = {}

#: lines of a hidden rank's output kept for its error report
TAIL_LINES = 20


def namespace(owner: str) -> dict[str, Any]:
    ns = _NAMESPACES.get(owner)
    if ns is None:
        import gpucell  # gpucell.ddp, gpucell.shard, gpucell.device in every cell

        ns = _NAMESPACES[owner] = {"__name__": "__main__", "gpucell": gpucell}
    return ns


# -- forming and leaving -----------------------------------------------------------


def rendezvous(peer: str | None) -> tuple[str, int]:
    """Where the other ranks reach rank 0: this host's address (loopback when
    every rank is on this host, ``peer`` being ``None``; else the address it
    routes to ``peer``, another rank's host, from) and a free port here."""
    addr = "127.0.0.1" if peer is None else _address_toward(peer)
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("", 0))
        port = int(s.getsockname()[1])
    return addr, port


def _address_toward(host: str) -> str:
    """The local address packets to ``host`` leave from (no packet is sent)."""
    try:
        with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
            s.connect((host, 9))
            return str(s.getsockname()[0])
    except OSError:
        return socket.gethostbyname(socket.gethostname())


def _interface_of(addr: str) -> str | None:
    """The network interface holding ``addr`` (for gloo and NCCL's sockets)."""
    try:
        import psutil
    except ImportError:
        return None
    for name, addrs in psutil.net_if_addrs().items():
        if any(a.address == addr for a in addrs):
            return str(name)
    return None


def join(spec: dict[str, Any]) -> dict[str, Any]:
    """Become rank ``spec["rank"]`` of a new group (leaving any other first).

    ``spec``: owner, epoch, rank, world, local_rank, local_world, master_addr,
    master_port, backend, timeout (seconds), rewrap (wrap the namespace's
    DistributedDataParallel models again on the new group: every rank kept its
    namespace).  Returns what the kernel shows: host, pid, device, seconds, and
    the names of the models wrapped again.
    """
    global _GROUP
    t0 = time.perf_counter()
    leave(None)
    import torch
    import torch.distributed as dist

    from gpucell.engine.runtime import device

    if not dist.is_available():
        raise RuntimeError("this engine's torch has no torch.distributed")
    env = {
        "RANK": spec["rank"],
        "LOCAL_RANK": spec["local_rank"],
        "WORLD_SIZE": spec["world"],
        "LOCAL_WORLD_SIZE": spec["local_world"],
        "GROUP_RANK": spec.get("node_rank", 0),
        "MASTER_ADDR": spec["master_addr"],
        "MASTER_PORT": spec["master_port"],
    }
    os.environ.update({k: str(v) for k, v in env.items()})
    backend = spec["backend"]
    dev = device()
    if backend == "nccl":
        if dev.type != "cuda":
            raise RuntimeError("nccl needs a GPU engine; this one has none")
        torch.cuda.set_device(dev.index or 0)
        # a failed collective raises in the rank's code (the cell ends with an
        # error) instead of the watchdog killing the engine (torch's default)
        os.environ.setdefault("TORCH_NCCL_ASYNC_ERROR_HANDLING", "2")
    if spec["master_addr"].startswith("127."):
        iface = _interface_of("127.0.0.1")
    else:
        iface = _interface_of(_address_toward(spec["master_addr"]))
    if iface is not None:
        os.environ.setdefault("GLOO_SOCKET_IFNAME", iface)
        if backend == "nccl":
            os.environ.setdefault("NCCL_SOCKET_IFNAME", iface)
    timeout = datetime.timedelta(seconds=float(spec["timeout"]))
    before = _socket_inodes()
    dist.init_process_group(
        backend, rank=spec["rank"], world_size=spec["world"], timeout=timeout
    )
    _GROUP = _Group(
        owner=spec["owner"],
        epoch=spec["epoch"],
        rank=spec["rank"],
        world=spec["world"],
        backend=backend,
        timeout=float(spec["timeout"]),
        sockets=_socket_inodes() - before if backend == "gloo" else frozenset(),
    )
    rewrapped = _rewrap(namespace(spec["owner"])) if spec.get("rewrap") else []
    return {
        "host": socket.gethostname(),
        "pid": os.getpid(),
        "device": str(dev),
        "seconds": time.perf_counter() - t0,
        "rewrapped": rewrapped,
    }


def _rewrap(ns: dict[str, Any]) -> list[str]:
    """Models in ``ns`` wrapped in DistributedDataParallel on a group that is
    gone: wrapped again on this one (a collective: every rank does it, in name
    order, with the namespace every rank kept).  Their parameters are the same
    objects, so optimizers built on them go on working."""
    from torch.nn.parallel import DistributedDataParallel

    from gpucell.engine.ddp import ddp

    names = sorted(n for n, v in ns.items() if isinstance(v, DistributedDataParallel))
    for n in names:
        ns[n] = ddp(ns[n])
    return names


def leave(owner: str | None = None, forget: bool = False) -> bool:
    """Destroy this engine's process group (of ``owner``'s, or any when
    ``None``); ``forget`` also drops ``owner``'s namespace.  Whether there was
    one."""
    global _GROUP
    had = False
    g = _GROUP
    if g is not None and (owner is None or g.owner == owner):
        had = True
        _GROUP = None
        dist = _dist()
        if dist is not None and dist.is_initialized():
            with contextlib.suppress(Exception):
                dist.destroy_process_group()
    if forget and owner is not None:
        _NAMESPACES.pop(owner, None)
    return had


def _dist() -> Any:
    if "torch" not in sys.modules:
        return None
    import torch.distributed as dist

    return dist if dist.is_available() else None


def _abort(why: str) -> None:
    """Tear this rank's group down now: peers waiting in a collective on this
    rank fail at once instead of at the timeout.  The group is unusable after
    it: the kernel forms a new one before the next cell."""
    global _GROUP
    if _GROUP is not None:
        _GROUP.broken = why
        _cut(_GROUP.sockets)
    dist = _dist()
    if dist is None or not dist.is_initialized():
        return
    from torch.distributed import distributed_c10d as c10d

    abort = getattr(c10d, "_abort_process_group", None)
    with contextlib.suppress(Exception):
        if abort is not None:
            abort()
        else:
            dist.destroy_process_group()
    if dist.is_initialized():
        with contextlib.suppress(Exception):
            dist.destroy_process_group()


def _socket_inodes() -> frozenset[str]:
    """This process's sockets (``socket:[inode]``, as /proc/self/fd shows)."""
    out = set()
    with contextlib.suppress(OSError):
        for fd in os.listdir("/proc/self/fd"):
            with contextlib.suppress(OSError):
                link = os.readlink(f"/proc/self/fd/{fd}")
                if link.startswith("socket:"):
                    out.add(link)
    return frozenset(out)


def _cut(sockets: frozenset[str]) -> None:
    """Half-close (``SHUT_WR``) the group's gloo connections, so every peer
    waiting on this rank fails at once.  Aborting or destroying a gloo group
    closes nothing while a DistributedDataParallel model still holds it (a
    peer would wait for the whole --timeout, deaf to SIGINT); a full shutdown
    would make this process's gloo thread read EOF and abort the engine."""
    if not sockets:
        return
    with contextlib.suppress(OSError):
        for fd in os.listdir("/proc/self/fd"):
            try:
                if os.readlink(f"/proc/self/fd/{fd}") not in sockets:
                    continue
                s = socket.socket(fileno=os.dup(int(fd)))
            except (OSError, ValueError):
                continue
            with contextlib.suppress(OSError):
                s.shutdown(socket.SHUT_WR)
            s.close()


def state(owner: str) -> dict[str, Any] | None:
    """This engine's group as ``%gpu_distributed`` shows it (``None``: none)."""
    g = _GROUP
    if g is None:
        return None
    return {
        "mine": g.owner == owner,
        "epoch": g.epoch,
        "rank": g.rank,
        "world": g.world,
        "backend": g.backend,
        "broken": g.broken,
        "names": sorted(n for n in namespace(owner) if not n.startswith("__")),
    }


# -- running a cell ----------------------------------------------------------------


class _Lines(io.TextIOBase):
    """A stream that puts ``prefix`` at the start of each line (``--ranks all``),
    or keeps only the last lines (a rank whose output is not shown)."""

    def __init__(self, target: Any, prefix: str = "") -> None:
        self.target = target
        self.prefix = prefix
        self.tail: deque[str] = deque(maxlen=TAIL_LINES)
        self._at_start = True
        self._partial = ""

    def writable(self) -> bool:
        return True

    def write(self, s: str) -> int:
        if self.target is None:
            text = self._partial + s
            *whole, self._partial = text.split("\n")
            self.tail.extend(whole)
            return len(s)
        out = []
        for piece in s.splitlines(keepends=True):
            if self._at_start:
                out.append(self.prefix)
            out.append(piece)
            self._at_start = piece.endswith("\n")
        self.target.write("".join(out))
        return len(s)

    def flush(self) -> None:
        if self.target is not None:
            self.target.flush()

    def lines(self) -> list[str]:
        return [*self.tail, *([self._partial] if self._partial else [])]


@contextlib.contextmanager
def _streams(rank: int, show: str) -> Any:
    """stdout and stderr while the cell runs: rank 0's as they are (default),
    every rank's tagged ``[rank r]`` (``show == "all"``), others kept out."""
    out, err = sys.stdout, sys.stderr
    if show == "all":
        new_out = _Lines(out, f"[rank {rank}] ")
        new_err = _Lines(err, f"[rank {rank}] ")
    elif rank == 0:
        yield None
        return
    else:
        new_out, new_err = _Lines(None), _Lines(None)
    sys.stdout, sys.stderr = new_out, new_err
    try:
        yield new_out
    finally:
        with contextlib.suppress(Exception):
            new_out.flush()
            new_err.flush()
        sys.stdout, sys.stderr = out, err


@contextlib.contextmanager
def _in_dir(cwd: str | None) -> Any:
    """In the kernel's working directory while the cell runs (a relative path
    names the notebook's file, as ``%%gpu_parallel`` chunks do), when this
    host has it."""
    try:
        home: str | None = os.getcwd()
    except OSError:
        home = None
    moved = False
    if cwd and cwd != home:
        with contextlib.suppress(OSError):
            os.chdir(cwd)
            moved = True
    try:
        yield
    finally:
        if moved:
            with contextlib.suppress(OSError):
                os.chdir(home or "/")


def run(task: dict[str, Any], frames: list[Any]) -> list[Any]:
    """Run one cell on this rank; the report (and ``--out`` values) as wire frames.

    ``task``: owner, epoch, code (the cell's AST, CUDA selections already
    rewritten on CPU engines), filename, source (for tracebacks), device (bind
    the device names the rewrite uses), timeout, show ("0" or "all"), out
    (names this rank sends back), cwd (the kernel's working directory),
    imports (``{name: module}``: the modules the cell reads, imported here).
    ``frames``: the notebook's names this rank lacks, as
    :func:`gpucell.protocol.wire.dumps` made them.
    """
    t_start = time.time()
    g = _GROUP
    report: dict[str, Any] = {"t_start": t_start, "host": socket.gethostname()}
    if g is None or g.owner != task["owner"] or g.epoch != task["epoch"]:
        report.update(status="nogroup")
        return wire.dumps({"report": report, "values": {}})
    if g.broken:
        report.update(status="nogroup", why=g.broken)
        return wire.dumps({"report": report, "values": {}})
    report["rank"] = g.rank
    ns = namespace(task["owner"])
    try:
        _set_timeout(g, float(task["timeout"]))
        from gpucell.engine.runtime import device

        dev = device() if "torch" in sys.modules or task.get("device") else None
        _load_inputs(ns, task, frames, dev)
        if task.get("device"):
            from gpucell.engine.chunk import as_device

            ns[DEVICE] = dev
            ns[AS_DEVICE] = lambda value, _t=dev: as_device(_t, value)
        filename, source = task["filename"], task["source"]
        linecache.cache[filename] = (
            len(source),
            None,
            source.splitlines(keepends=True),
            filename,
        )
        code = compile(task["code"], filename, "exec")
        before = set(ns)  # what the cell makes is reported (not what it got)
    except BaseException as e:  # noqa: BLE001 - reported, with its traceback
        _abort(f"rank {g.rank} could not start the cell")
        report.update(_error_report(e, task, g, None), status="error")
        return wire.dumps({"report": report, "values": {}})
    with _streams(g.rank, task["show"]) as hidden, _in_dir(task.get("cwd")):
        try:
            exec(code, ns)
        except BaseException as e:  # noqa: BLE001 - every rank must stop: abort
            from gpucell.engine.runtime import interrupts_held

            with interrupts_held():
                _abort(f"rank {g.rank} raised {type(e).__name__}")
                report.update(_error_report(e, task, g, hidden), status="error")
                return wire.dumps({"report": report, "values": {}})
    report["t_end"] = time.time()
    report["status"] = "ok"
    report["made"] = sorted(n for n in set(ns) - before if not n.startswith("__"))
    report["names"] = sorted(n for n in ns if not n.startswith("__"))
    values: dict[str, Any] = {}
    for name in task["out"]:
        if name not in ns:
            report.update(status="error", kind="out", type="NameError")
            report["message"] = f"--out {name}: rank {g.rank} has no name {name!r}"
            return wire.dumps({"report": report, "values": {}})
        values[name] = _plain(ns[name])
    try:
        return wire.dumps({"report": report, "values": values})
    except Exception as e:  # an --out value that cannot travel
        report.update(status="error", kind="out", type=type(e).__name__)
        report["message"] = (
            f"--out {', '.join(task['out'])}: rank {g.rank} could not send it "
            f"back ({type(e).__name__}: {e})"
        )
        return wire.dumps({"report": report, "values": {}})


def _load_inputs(
    ns: dict[str, Any], task: dict[str, Any], frames: list[Any], dev: Any
) -> None:
    """The notebook's names into the rank's namespace: modules imported here
    by name, values from their frames (CUDA tensors onto this rank's GPU)."""
    for name, module in task.get("imports", {}).items():
        ns[name] = importlib.import_module(module)
    if frames:
        cuda_to = dev if dev is not None and dev.type == "cuda" else None
        ns.update(wire.loads(frames, cuda_to=cuda_to, cell_globals=ns))


def _plain(value: Any) -> Any:
    """What travels back for an ``--out`` name: a DistributedDataParallel
    model's module (the wrapper holds the process group, which cannot travel).
    CUDA tensors become CPU tensors on the way (:mod:`gpucell.protocol.wire`)."""
    t = type(value)
    if t.__name__ == "DistributedDataParallel" and t.__module__.startswith("torch"):
        return value.module
    return value


def _set_timeout(g: _Group, seconds: float) -> None:
    """The group's collective timeout for this cell (``--timeout``)."""
    if seconds == g.timeout:
        return
    from torch.distributed import distributed_c10d as c10d

    c10d._set_pg_timeout(datetime.timedelta(seconds=seconds))
    g.timeout = seconds


#: where torch.distributed's code lives (a frame there is inside a collective)
_DIST_DIR = os.sep + os.path.join("torch", "distributed") + os.sep


def _error_report(
    e: BaseException, task: dict[str, Any], g: _Group, hidden: Any
) -> dict[str, Any]:
    """What the kernel needs to name the failure: the exception, the cell line
    it came from, the collective it was in, and what kind of failure it is
    (``user``: the cell's own error; ``peer``: a collective failed because
    another rank left; ``timeout``: a collective waited ``--timeout``;
    ``interrupt``: stopped by the kernel)."""
    tb = traceback.extract_tb(e.__traceback__)
    cell = [f for f in tb if f.filename == task["filename"]]
    line = cell[-1].lineno if cell else None
    collective = None
    if cell:
        after = tb[tb.index(cell[-1]) + 1 :]
        names = [f.name for f in after if _DIST_DIR in f.filename]
        named = [n for n in names if n not in ("wrapper", "_wrapper")]
        collective = named[-1] if named else (names[-1] if names else None)
    text = str(e)
    low = text.lower()
    if isinstance(e, KeyboardInterrupt):
        kind = "interrupt"
    elif "timed out" in low or ("timeout" in low and collective is not None):
        kind = "timeout"
    elif (
        "connection closed by peer" in low
        or "connection reset by peer" in low
        or "broken pipe" in low
        or type(e).__name__ in ("DistNetworkError",)
    ):
        kind = "peer"
    else:
        kind = "user"
    # the traceback from the cell's own frames on (not this module's)
    frames = traceback.extract_tb(e.__traceback__)
    first = next((i for i, f in enumerate(frames) if f.filename == task["filename"]), 0)
    lines = ["Traceback (most recent call last):\n"]
    lines += traceback.format_list(frames[first:])
    lines += traceback.format_exception_only(type(e), e)
    return {
        "kind": kind,
        "type": type(e).__name__,
        "message": text,
        "line": line,
        "collective": collective,
        "traceback": "".join(lines),
        "t_error": time.time(),
        "tail": hidden.lines() if hidden is not None else [],
        "timeout": g.timeout,
    }
