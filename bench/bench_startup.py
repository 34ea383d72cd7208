"""Cluster start-up benchmark: from "start a 2-worker local cluster" to "ready".

"Ready" means: client connected, both workers registered, and a trivial task answered
by both (``view.apply_sync(lambda: 1) == [1, 1]`` for ipyparallel, ``client.run`` for
Dask).

Every measurement runs in a fresh interpreter
(``python bench_startup.py --one VARIANT``), so import costs are paid each time, as in
a new Jupyter kernel.  The parent collects one JSON line per run, prints a table and
writes ``bench/results/startup.json``.

Variants
  ipp_bare         ipyparallel.Cluster(n=2).start_and_connect_sync()  (all defaults)
  ipp_tuned        the fastest configuration found, as plain Cluster/traitlets kwargs
                   (see tuned_cluster_kwargs below)
  ipp_tuned_nanny  the same, but keeping the engine nanny (client.send_signal works)
  gpucell          gpucell.start_cluster(n=2) (skipped when not available)
  dask             distributed.LocalCluster(n_workers=2, threads_per_worker=1,
                   processes=True) + Client (skipped when dask is not importable)

Columns: ready = start call -> trivial task answered (library already imported);
import = importing the library in the fresh process; stop = the stop call;
gone = stop call -> every child process of the run has exited (psutil).

Usage:  python bench/bench_startup.py [--runs 5] [--variants ipp_bare,ipp_tuned,...]
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import subprocess
import sys
import time
from pathlib import Path

_T_PROCESS = time.perf_counter()  # as early as possible in the --one child

VARIANTS = ["ipp_bare", "ipp_tuned", "ipp_tuned_nanny", "gpucell", "dask"]
RESULTS = Path(__file__).resolve().parent / "results" / "startup.json"
MARK = "BENCH_JSON "


# --------------------------------------------------------------------------------------
# The tuned ipyparallel configuration (plain ipyparallel settings; no patching).
# --------------------------------------------------------------------------------------

# Child-process bootstrap used as controller_cmd / engine_cmd. It runs before
# ipyparallel is imported in the child and:
#  * sets PR_SET_PDEATHSIG, so the child is signalled when the process that launched it
#    (the kernel) dies, even by SIGKILL; exits at once if the parent is already gone;
#  * (engines) pre-imports numpy while the engine would otherwise sit idle waiting for
#    the controller's connection file; ipyparallel's serializer imports numpy on the
#    first task anyway, on the critical path (~0.1 s).
_BOOT = r"""
import ctypes, os, runpy, signal, sys
libc = ctypes.CDLL(None, use_errno=True)
libc.prctl(1, int(signal.{sig}), 0, 0, 0)  # 1 == PR_SET_PDEATHSIG
if os.getppid() != {ppid}:
    os._exit(1)
for _m in {pre!r}:
    try:
        __import__(_m)
    except ImportError:
        pass
sys.argv[0] = {mod!r}
runpy.run_module({mod!r}, run_name="__main__", alter_sys=True)
"""


def _boot_cmd(module: str, sig: str, pre=()) -> list[str]:
    code = _BOOT.format(sig=sig, ppid=os.getpid(), pre=list(pre), mod=module)
    return [sys.executable, "-c", code]


def tuned_cluster_kwargs(n: int = 2, nanny: bool = False) -> dict:
    """Keyword arguments for ipyparallel.Cluster that start 2 engines fastest."""
    from traitlets.config import Config

    cfg = Config()
    # no 0.1 s sleep between engine launches
    cfg.LocalEngineSetLauncher.delay = 0.0
    engine_args = [
        # the hub's heartbeat is 100 ms below; keep the engine's own "controller is
        # gone" timeout at ~3 min (300 x 0.6 s) instead of 50 x 0.6 s = 30 s
        "--IPEngine.max_heartbeat_misses=300",
        # engines are started before the controller has written its connection file;
        # give a slow/loaded controller more than the default 10 s to write it
        "--IPEngine.wait_for_url_file=60",
    ]
    if not nanny:
        # no extra Python process per engine on the registration path (-0.3..0.5 s);
        # interrupts then go by signalling the engine pids (Cluster.signal_engines)
        engine_args.append("--IPEngine.enable_nanny=False")
    cfg.EngineLauncher.engine_args = engine_args
    # die with the launching process: controller gets SIGTERM (its handler stops its
    # scheduler/heart-monitor children), engines get SIGKILL
    cfg.LocalControllerLauncher.controller_cmd = _boot_cmd(
        "ipyparallel.controller", "SIGTERM"
    )
    cfg.LocalEngineSetLauncher.engine_cmd = _boot_cmd(
        "ipyparallel.engine", "SIGKILL", ["numpy"]
    )
    return dict(
        n=n,
        delay=0,  # no fixed 1 s sleep between controller and engines
        # start engines at once, concurrently with the controller; they poll for the
        # connection file (every 0.1 s) instead of the Cluster waiting for it first
        send_engines_connection_env=False,
        controller_args=[
            # registration completes only when the heart monitor has seen a heartbeat:
            # 1-2 periods. Default 3000 ms -> ~4-6 s of the bare start-up.
            "--HeartMonitor.period=100",
            # keep ~30 s tolerance before an engine is declared dead (default 10 x 3 s)
            "--HeartMonitor.max_heartmonitor_misses=300",
            # schedulers as threads in the controller, not 7 forked processes
            "--IPController.use_threads=True",
        ],
        config=cfg,
    )


# --------------------------------------------------------------------------------------
# One measurement (runs in a fresh interpreter)
# --------------------------------------------------------------------------------------


def _children():
    import psutil

    return psutil.Process().children(recursive=True)


def _wait_gone(procs, t_ref, timeout=10.0):
    import psutil

    gone, alive = psutil.wait_procs(procs, timeout=timeout)
    return time.perf_counter() - t_ref, [p.pid for p in alive]


def _stop_and_report(t_import: float, t_ready: float, stop) -> dict:
    """Stop a ready cluster and time it: the same record for every variant."""
    t_since_process = time.perf_counter() - _T_PROCESS
    procs = _children()
    t0 = time.perf_counter()
    stop()
    t_stop = time.perf_counter() - t0
    t_gone, alive = _wait_gone(procs, t0)
    return dict(
        import_s=t_import,
        ready_s=t_ready,
        stop_s=t_stop,
        gone_s=t_gone,
        process_start_to_ready_s=t_since_process,
        nprocs=len(procs),
        leftover=alive,
    )


def _run_ipp(kwargs_factory) -> dict:
    t0 = time.perf_counter()
    import ipyparallel as ipp

    t_import = time.perf_counter() - t0
    t0 = time.perf_counter()
    cluster = ipp.Cluster(**kwargs_factory())
    client = cluster.start_and_connect_sync()
    r = client[:].apply_sync(lambda: 1)
    t_ready = time.perf_counter() - t0
    assert r == [1, 1], r
    return _stop_and_report(
        t_import, t_ready, lambda: (client.close(), cluster.stop_cluster_sync())
    )


def _run_gpucell() -> dict:
    t0 = time.perf_counter()
    try:
        import gpucell

        start_cluster = gpucell.start_cluster
    except Exception as e:  # ImportError, AttributeError, or an error at import
        return dict(
            skipped=f"gpucell.start_cluster unavailable ({type(e).__name__}: {e})"
        )
    t_import = time.perf_counter() - t0
    t0 = time.perf_counter()
    handle = start_cluster(n=2)
    r = handle.client[:].apply_sync(lambda: 1)
    t_ready = time.perf_counter() - t0
    assert r == [1, 1], r
    return _stop_and_report(t_import, t_ready, handle.stop)


def _run_dask() -> dict:
    t0 = time.perf_counter()
    try:
        from distributed import Client, LocalCluster
    except Exception as e:
        return dict(skipped=f"dask not importable ({type(e).__name__}: {e})")
    t_import = time.perf_counter() - t0
    t0 = time.perf_counter()
    cluster = LocalCluster(
        n_workers=2, threads_per_worker=1, processes=True, dashboard_address=None
    )
    client = Client(cluster)
    client.wait_for_workers(2)
    r = client.run(lambda: 1)
    t_ready = time.perf_counter() - t0
    assert list(r.values()) == [1, 1], r
    return _stop_and_report(
        t_import, t_ready, lambda: (client.close(), cluster.close())
    )


def run_one(variant: str) -> dict:
    if variant == "ipp_bare":
        out = _run_ipp(lambda: dict(n=2))
    elif variant == "ipp_tuned":
        out = _run_ipp(lambda: tuned_cluster_kwargs(2, nanny=False))
    elif variant == "ipp_tuned_nanny":
        out = _run_ipp(lambda: tuned_cluster_kwargs(2, nanny=True))
    elif variant == "gpucell":
        out = _run_gpucell()
    elif variant == "dask":
        out = _run_dask()
    else:
        raise SystemExit(f"unknown variant {variant!r}; choose from {VARIANTS}")
    out["variant"] = variant
    return out


# --------------------------------------------------------------------------------------
# Parent: spawn fresh processes, aggregate, print, save
# --------------------------------------------------------------------------------------


def _spawn(variant: str, timeout: float) -> dict:
    cmd = [sys.executable, os.path.abspath(__file__), "--one", variant]
    try:
        p = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout)
    except subprocess.TimeoutExpired:
        return dict(variant=variant, error=f"timed out after {timeout}s")
    for line in reversed(p.stdout.splitlines()):
        if line.startswith(MARK):
            return json.loads(line[len(MARK) :])
    tail = (p.stdout + p.stderr).strip().splitlines()[-5:]
    return dict(variant=variant, error=f"rc={p.returncode}: " + " | ".join(tail))


def _stats(xs):
    return dict(median=statistics.median(xs), min=min(xs), max=max(xs)) if xs else None


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--runs", type=int, default=5, help="runs per variant (default 5)")
    ap.add_argument(
        "--variants",
        default=",".join(VARIANTS),
        help=f"comma-separated subset of {','.join(VARIANTS)}",
    )
    ap.add_argument("--timeout", type=float, default=180.0, help="seconds per run")
    ap.add_argument("--one", metavar="VARIANT", help=argparse.SUPPRESS)
    ap.add_argument("--out", default=str(RESULTS), help="JSON output path")
    args = ap.parse_args(argv)

    if args.one:
        print(MARK + json.dumps(run_one(args.one)), flush=True)
        return 0

    variants = [v.strip() for v in args.variants.split(",") if v.strip()]
    report = dict(
        meta=dict(
            python=sys.version.split()[0],
            executable=sys.executable,
            platform=platform.platform(),
            cpus=os.cpu_count(),
            runs=args.runs,
            time=time.strftime("%Y-%m-%dT%H:%M:%S%z"),
        ),
        results={},
    )
    try:
        import ipyparallel

        report["meta"]["ipyparallel"] = ipyparallel.__version__
    except Exception:
        pass

    for v in variants:
        runs, skipped, errors = [], None, []
        for i in range(args.runs):
            r = _spawn(v, args.timeout)
            if "skipped" in r:
                skipped = r["skipped"]
                break
            if "error" in r:
                errors.append(r["error"])
                print(f"  {v} run {i + 1}: ERROR {r['error']}", file=sys.stderr)
                continue
            runs.append(r)
            print(
                f"  {v} run {i + 1}: ready {r['ready_s']:.2f}s  stop {r['stop_s']:.2f}s"
                f"  all-gone {r['gone_s']:.2f}s  leftover {len(r['leftover'])}",
                file=sys.stderr,
                flush=True,
            )
        entry = dict(runs=runs, errors=errors)
        if skipped:
            entry["skipped"] = skipped
        for key in (
            "ready_s",
            "import_s",
            "stop_s",
            "gone_s",
            "process_start_to_ready_s",
        ):
            entry[key] = _stats([r[key] for r in runs if r.get(key) is not None])
        entry["runs_with_leftover_processes"] = sum(bool(r["leftover"]) for r in runs)
        report["results"][v] = entry

    # table
    hdr = (
        f"{'variant':17s} {'n':>2s} {'ready med':>9s} {'min':>6s} {'max':>6s} "
        f"{'import':>6s} {'stop':>5s} {'gone':>5s} {'left':>4s}"
    )
    print(hdr)
    print("-" * len(hdr))
    for v, e in report["results"].items():
        if e.get("skipped"):
            label = (
                "gpucell.start_cluster unavailable" if v == "gpucell" else e["skipped"]
            )
            print(f"{v:17s} skipped: {label}")
            continue
        if not e["runs"]:
            print(f"{v:17s} failed: {e['errors'][:1]}")
            continue
        r, im, st, gn = e["ready_s"], e["import_s"], e["stop_s"], e["gone_s"]
        print(
            f"{v:17s} {len(e['runs']):2d} {r['median']:9.2f} {r['min']:6.2f} "
            f"{r['max']:6.2f} "
            f"{im['median']:6.2f} {st['median']:5.2f} {gn['median']:5.2f} "
            f"{e['runs_with_leftover_processes']:4d}"
        )
    print(
        "seconds; ready = start call -> trivial task answered by both workers; "
        "left = runs with processes alive 10 s after stop"
    )

    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(report, indent=2))
    print(f"wrote {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
