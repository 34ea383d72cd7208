"""Where a chunk's CPU goes, per process: cProfile in the kernel and in every
engine's main thread over re-runs of ``bench_scale``'s uniform loop.

Why cProfile in the engines' main thread: that thread receives the task,
runs gpucell's ``worker.answer`` and sends the reply; enabling a profiler
from an ``execute`` leaves it on for every later request on that thread, so
ipyparallel's and ipykernel's own handling is measured beside gpucell's.
cProfile slows Python calls several-fold: read the shares, not the totals
(``bench_scale.py`` gives unprofiled CPU per chunk).

With ``--phases``, no profiler: per-phase ``time.thread_time_ns`` counters
around gpucell's functions (the engines' and the kernel's), beside each
process's whole CPU (per thread, from ``/proc``): the table of where a chunk's
CPU goes at full speed.

Usage:  python bench/bench_chunk_cost.py [--engines 8] [--cells 6] [--top 25]
        [--loop uniform|uneven] [--first] [--phases]
"""

from __future__ import annotations

import argparse
import cProfile
import math
import os
import pstats
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

from bench_scale import CELL_UNEVEN, CELL_UNIFORM  # noqa: E402

#: gpucell's engine phases, by (file suffix, function name): cumulative time
PHASES = [
    ("engine/worker.py", "answer", "worker.answer (all gpucell)"),
    ("engine/sessions.py", "set_up", "  set_up (first chunk of a cell)"),
    ("protocol/wire.py", "loads", "  wire.loads (chunk bounds)"),
    ("engine/envelope.py", "__enter__", "  Envelope enter"),
    ("engine/envelope.py", "__exit__", "  Envelope exit"),
    ("engine/chunk.py", "run_chunk", "  run_chunk (iterations)"),
    ("engine/envelope.py", "check_out", "  check_out"),
    ("engine/worker.py", "_chunk_timing", "  timing"),
    ("engine/worker.py", "_reply", "  _reply (result)"),
    ("protocol/wire.py", "dumps", "    wire.dumps"),
    ("protocol/shm.py", "spill", "    shm.spill"),
    ("engine/runtime.py", "when_idle", "  runtime.when_idle"),
]

#: (module, attribute, label): engine phases timed with ``--phases``
ENGINE_PHASES = [
    ("gpucell.engine.worker", "answer", "worker.answer (all gpucell)"),
    ("gpucell.engine.worker", "set_up", "set_up (a cell's first chunk)"),
    ("gpucell.protocol.wire", "loads", "wire.loads"),
    ("gpucell.engine.envelope.Envelope", "__enter__", "Envelope enter"),
    ("gpucell.engine.checkin", "snapshot", "  checkin.snapshot"),
    ("gpucell.engine.envelope", "feedback", "  feedback handles"),
    ("gpucell.engine.runtime", "generator_states", "  generator_states (x2)"),
    ("gpucell.engine.rngstate", "states", "  rngstate.states (x2)"),
    ("gpucell.engine.envelope", "_kernel_warning_filters", "  warnings filters"),
    ("gpucell.engine.envelope", "_enter_cwd", "  working directory"),
    ("gpucell.engine.tohost", "copier", "  tohost.copier"),
    ("gpucell.engine.streams.Tagged", "__init__", "  Tagged streams (x2)"),
    ("gpucell.engine.logs.Capture", "__enter__", "logs.Capture enter"),
    ("gpucell.engine.logs.Capture", "__exit__", "logs.Capture exit"),
    ("gpucell.engine.worker", "run_chunk", "run_chunk (the iterations)"),
    ("gpucell.engine.envelope.Envelope", "check_out", "check_out"),
    ("gpucell.engine.envelope.Envelope", "__exit__", "Envelope exit"),
    ("gpucell.engine.worker", "_chunk_timing", "timing"),
    ("gpucell.protocol.wire", "dumps", "wire.dumps (reply)"),
    ("gpucell.protocol.shm", "spill", "shm.spill"),
    ("gpucell.engine.runtime", "when_idle", "runtime.when_idle"),
]

#: the same in the kernel
KERNEL_PHASES = [
    ("gpucell.kernel.execute", "prepare", "prepare (analysis)"),
    ("gpucell.kernel.execute", "run", "execute.run (dispatch)"),
    ("gpucell.kernel.dispatch.Run", "submit", "  Run.submit (sending)"),
    ("gpucell.kernel.dispatch.Run", "_task", "    Run._task"),
    ("gpucell.kernel.dispatch", "send_wave", "    send_wave"),
    ("gpucell.kernel.sending", "plain", "      plain"),
    ("ipyparallel.client.client.Client", "direct_view", "      Client.direct_view"),
    ("ipyparallel.client.view.DirectView", "apply_async", "      View.apply_async"),
    ("ipyparallel.client.asyncresult.AsyncResult", "split", "      AsyncResult.split"),
    ("gpucell.kernel.dispatch.Run", "on_done", "  Run.on_done (a reply)"),
    ("gpucell.protocol.shm", "unspill", "    shm.unspill"),
    ("gpucell.protocol.wire", "loads", "    wire.loads"),
    ("gpucell.kernel.dispatch.Run", "_tell", "    Run._tell (state)"),
    ("gpucell.kernel.execute", "conclude", "conclude (merge)"),
]


def install_counters(phases: list[tuple[str, str, str]]) -> dict[str, list[int]]:
    """Wrap each phase's function with a thread-CPU counter (``[ns, calls]``)."""
    import functools
    import importlib
    import time

    counts: dict[str, list[int]] = {}
    for where, attr, label in phases:
        try:
            owner = importlib.import_module(where)
        except ImportError:
            modname, _, clsname = where.rpartition(".")
            try:
                owner = getattr(importlib.import_module(modname), clsname)
            except (ImportError, AttributeError):
                continue  # (a phase another version of gpucell does not have)
        fn = getattr(owner, attr, None)
        if fn is None or getattr(fn, "_gp_counted", False):
            continue
        cell = counts.setdefault(label, [0, 0])

        def wrap(fn=fn, cell=cell):
            @functools.wraps(fn)
            def counted(*a, **k):
                t = time.thread_time_ns()
                try:
                    return fn(*a, **k)
                finally:
                    cell[0] += time.thread_time_ns() - t
                    cell[1] += 1

            counted._gp_counted = True
            return counted

        setattr(owner, attr, wrap())
    return counts


START = (
    "import cProfile as _gp_cp\n"
    "import time as _gp_t\n"
    "_gp_prof = _gp_cp.Profile(_gp_t.thread_time)\n"
    "_gp_prof.enable()\n"
)


def _stop_and_dump(path: str) -> str:
    """Run on an engine: stop its profiler and write its stats."""
    import __main__

    prof = __main__.__dict__.pop("_gp_prof")
    prof.disable()
    prof.dump_stats(path)
    return path


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--engines", type=int, default=8)
    ap.add_argument("--cells", type=int, default=6)
    ap.add_argument("--iterations", type=int, default=64)
    ap.add_argument("--loop", default="uniform", choices=("uniform", "uneven"))
    ap.add_argument("--top", type=int, default=25)
    ap.add_argument("--first", action="store_true", help="a new cell text each time")
    ap.add_argument("--phases", action="store_true", help="counters, no profiler")
    ap.add_argument(
        "--cold",
        action="store_true",
        help="no warm-up cell: the first cell measured is the cluster's first",
    )
    args = ap.parse_args()
    from IPython.testing.globalipapp import start_ipython

    import gpucell
    from gpucell.core import topology

    n = args.iterations
    ip = start_ipython()
    ip.run_line_magic("load_ext", "gpucell")
    ip.user_ns["T_UNIFORM"] = 0.05
    ip.user_ns["U_UNEVEN"] = 0.005 * (64 / n) ** 2
    ip.run_cell("import time")
    cores = len(os.sched_getaffinity(0))
    topology.ENGINES_PER_CORE = max(
        topology.ENGINES_PER_CORE, math.ceil(args.engines / cores)
    )
    ip.run_line_magic("gpu_cluster", f"start -n {args.engines} --gpus none")
    tmp = Path(tempfile.mkdtemp(prefix="gpucell-chunkcost-"))
    try:
        client = gpucell.current().client
        view = client.direct_view(list(client.ids))
        template = CELL_UNIFORM if args.loop == "uniform" else CELL_UNEVEN
        cell = template.format(tag="warm", n=n)
        for _ in range(0 if args.cold else 2):
            ip.run_cell_magic("gpu_parallel", "--quiet", cell)
        time.sleep(0.5)
        if args.phases:
            phases(args, ip, client, template, cell, n)
            return
        view.execute(START, block=True)
        kprof = cProfile.Profile(time.thread_time)
        ioprof = cProfile.Profile(time.thread_time)
        io_loop = client._io_loop
        _in_io(io_loop, ioprof.enable)
        chunks = 0
        t = time.perf_counter()
        for r in range(args.cells):
            if args.first:
                cell = template.format(tag=f"f{r}-{time.time_ns()}", n=n)
            kprof.enable()
            ip.run_cell_magic("gpu_parallel", "--quiet", cell)
            kprof.disable()
            chunks += len(gpucell.last_run.chunks)
            time.sleep(0.3)  # the engines' after-cell tidy, as between cells
        wall = time.perf_counter() - t
        _in_io(io_loop, ioprof.disable)
        paths = [
            client[e].apply_sync(_stop_and_dump, f"{tmp}/e{e}.prof") for e in client.ids
        ]
        kpath = tmp / "kernel.prof"
        kprof.dump_stats(str(kpath))
        iopath = tmp / "io.prof"
        ioprof.dump_stats(str(iopath))
        report(args, chunks, wall, [str(kpath)], [str(iopath)], paths)
    finally:
        gpucell.stop()
        for p in tmp.iterdir():
            p.unlink()
        tmp.rmdir()


def _engine_counters(phases_, reset: bool, install) -> dict:
    """On an engine: install the counters once; return (and reset) them."""
    import __main__

    counts = __main__.__dict__.get("_gp_counts")
    if counts is None:
        counts = __main__._gp_counts = install(phases_)
    out = {k: list(v) for k, v in counts.items()}
    if reset:
        for v in counts.values():
            v[0] = v[1] = 0
    return out


def phases(args, ip, client, template: str, cell: str, n: int) -> None:
    """Per-phase thread-CPU counters in engines and kernel over ``args.cells``."""
    import threading

    from bench_scale import cpu_snapshot, thread_cpu

    import gpucell

    cur = gpucell.current()
    view = client.direct_view(list(client.ids))
    view.apply_sync(_engine_counters, ENGINE_PHASES, True, install_counters)
    kcounts = install_counters(KERNEL_PHASES)
    gc_seen = _watch_gc()
    eng_pids = [i.pid for i in cur.engines.values() if i.pid]
    main_tid = threading.get_native_id()
    io_tid = client._io_thread.native_id
    ctl = [p for p in _tree(cur.controller_pid) if p not in eng_pids]
    time.sleep(0.5)
    for v in kcounts.values():
        v[0] = v[1] = 0
    gc_seen.clear()
    view.apply_sync(_engine_counters, ENGINE_PHASES, True, install_counters)
    e0, c0 = cpu_snapshot(eng_pids), cpu_snapshot(ctl)
    k0, io0 = thread_cpu([main_tid]), thread_cpu([io_tid])
    chunks, cells, walls = 0, 0.0, []
    for r in range(args.cells):
        if args.first:
            cell = template.format(tag=f"f{r}-{time.time_ns()}", n=n)
        t, w = time.thread_time(), time.perf_counter()
        ip.run_cell_magic("gpu_parallel", "--quiet", cell)
        walls.append(time.perf_counter() - w)
        cells += time.thread_time() - t
        chunks += len(gpucell.last_run.chunks)
        time.sleep(0.3)
    k1, io1 = thread_cpu([main_tid]), thread_cpu([io_tid])
    e1, c1 = cpu_snapshot(eng_pids), cpu_snapshot(ctl)
    got = view.apply_sync(_engine_counters, ENGINE_PHASES, False, install_counters)
    eng_main = sum(v1 - e0.get(k, 0.0) for k, v1 in e1.items() if k[0] == k[1])
    eng_all = sum(v1 - e0.get(k, 0.0) for k, v1 in e1.items())
    ctl_all = sum(v1 - c0.get(k, 0.0) for k, v1 in c1.items())
    print(
        f"{args.engines} engines, {args.cells} cells ({args.loop}"
        f"{', first runs' if args.first else ', re-runs'}), {chunks} chunks; load "
        f"{os.getloadavg()[0]:.2f}.  CPU ms per chunk (thread time, unprofiled)"
    )
    serial = (
        n * 0.05
        if args.loop == "uniform"
        else sum(i * 0.005 * (64 / n) ** 2 for i in range(n))
    )
    effs = sorted(serial / (args.engines * w) for w in walls)
    print(
        f"efficiency per cell: median {effs[len(effs) // 2]:.3f} "
        f"[{effs[0]:.3f}-{effs[-1]:.3f}]"
    )
    print("engines (incl. the sleeps' own ~0 CPU):")
    print(f"  {'all threads':<40} {eng_all / chunks * 1e3:7.3f}")
    print(f"  {'main thread':<40} {eng_main / chunks * 1e3:7.3f}")
    for _w, _a, label in ENGINE_PHASES:
        ns = sum(g[label][0] for g in got if label in g)
        calls = sum(g[label][1] for g in got if label in g)
        print(f"  {label:<40} {ns / chunks / 1e6:7.3f}  ({calls / chunks:.1f} calls)")
    print(f"controller, all processes/threads: {ctl_all / chunks * 1e3:7.3f}")
    print("kernel:")
    print(f"  {'main + IO thread':<40} {(k1 - k0 + io1 - io0) / chunks * 1e3:7.3f}")
    print(f"  {'main thread (cells)':<40} {cells / chunks * 1e3:7.3f}")
    print(f"  {'ipp IO thread':<40} {(io1 - io0) / chunks * 1e3:7.3f}")
    for _w, _a, label in KERNEL_PHASES:
        ns, calls = kcounts.get(label, [0, 0])
        print(f"  {label:<40} {ns / chunks / 1e6:7.3f}  ({calls / chunks:.1f} calls)")
    for gen in (0, 1, 2):
        ns = [d for g, d in gc_seen if g == gen]
        print(
            f"  {f'gc generation {gen} (all threads)':<40} "
            f"{sum(ns) / chunks / 1e6:7.3f}  ({len(ns)} in all, max "
            f"{max(ns, default=0) / 1e6:.1f} ms)"
        )


def _watch_gc() -> list[tuple[int, int]]:
    """The kernel's garbage collections: (generation, thread ns) each."""
    import gc

    seen: list[tuple[int, int]] = []
    began = [0]

    def cb(phase: str, info: dict) -> None:
        if phase == "start":
            began[0] = time.thread_time_ns()
        else:
            seen.append((info["generation"], time.thread_time_ns() - began[0]))

    gc.callbacks.append(cb)
    return seen


def _tree(pid) -> list[int]:
    from bench_scale import tree_pids

    return tree_pids(pid)


def _in_io(io_loop, fn) -> None:
    """Run ``fn`` on the client's IO thread (a profiler is per thread)."""
    import threading

    done = threading.Event()

    def call() -> None:
        fn()
        done.set()

    io_loop.add_callback(call)
    done.wait(10)


def report(
    args,
    chunks: int,
    wall: float,
    kpaths: list[str],
    iopaths: list[str],
    epaths: list[str],
) -> None:
    print(
        f"{args.engines} engines, {args.cells} cells ({args.loop}), {chunks} chunks, "
        f"{wall:.1f} s; load {os.getloadavg()[0]:.2f}; times are cProfile's "
        "(inflated), per chunk"
    )
    es = pstats.Stats(*epaths)
    total = sum(v[2] for v in es.stats.values())  # tottime: all profiled code
    print(f"\nengines, main thread: {total / chunks * 1e3:.2f} ms per chunk profiled")
    for suffix, fn, label in PHASES:
        ct = sum(
            v[3]
            for (f, _line, name), v in es.stats.items()
            if f.endswith(suffix) and name == fn
        )
        print(f"  {label:<40} {ct / chunks * 1e3:7.3f} ms")
    _top("engines", es, chunks, args.top)
    ks = pstats.Stats(*kpaths)
    ktotal = sum(v[2] for v in ks.stats.values())
    print(f"\nkernel, main thread: {ktotal / chunks * 1e3:.2f} ms per chunk profiled")
    _top("kernel", ks, chunks, args.top)
    ios = pstats.Stats(*iopaths)
    iototal = sum(v[2] for v in ios.stats.values())
    print(
        f"\nkernel, ipp IO thread: {iototal / chunks * 1e3:.2f} ms per chunk profiled"
    )
    _top("kernel IO", ios, chunks, args.top)


def _top(who: str, st: pstats.Stats, chunks: int, k: int) -> None:
    rows = sorted(st.stats.items(), key=lambda kv: -kv[1][3])
    print(f"  {who}: top by cumulative (ms per chunk; calls per chunk)")
    for (f, line, name), v in rows[:k]:
        short = "/".join(f.split("/")[-2:])
        ms, calls = v[3] / chunks * 1e3, v[1] / chunks
        print(f"    {ms:7.3f}  {calls:6.1f}  {short}:{line} {name}")
    rows = sorted(st.stats.items(), key=lambda kv: -kv[1][2])
    print(f"  {who}: top by own time")
    for (f, line, name), v in rows[:k]:
        short = "/".join(f.split("/")[-2:])
        ms, calls = v[2] / chunks * 1e3, v[1] / chunks
        print(f"    {ms:7.3f}  {calls:6.1f}  {short}:{line} {name}")


if __name__ == "__main__":
    main()
