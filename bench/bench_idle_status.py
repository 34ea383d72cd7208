"""What one status message per task costs: CPU per task of the kernel, the
controller and the engines, with every task's "idle" status sent and with it
left out on the engines (a patch installed for this measurement only).

Why: after the "busy" status (engine/tuning), a chunk's messages are its
request, its reply and its "idle"; this says what the "idle" costs before
building anything to drop it (``GpuCell.quiet_idle`` does, for chunks that sent
no output).  No-op tasks, two kept queued per engine (as queue-ahead keeps
chunks), rounds with and without alternating.  Left out, ipyparallel's client
never sees a task's output complete: only for this measurement.

Usage:  python bench/bench_idle_status.py [--engines 8] [--tasks 60] [--rounds 3]
"""

from __future__ import annotations

import argparse
import os
import sys
import threading
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import bench_scale as bs  # noqa: E402


def _set_quiet(quiet: bool) -> None:
    """On an engine: leave out (or send again) every task's "idle"."""
    from IPython import get_ipython

    k = get_ipython().kernel
    if not hasattr(k, "_bench_publish"):
        k._bench_publish = orig = k._publish_status

        def publish(status, *a, **kw):
            if getattr(k, "_bench_quiet", False) and status == "idle":
                return None
            return orig(status, *a, **kw)

        k._publish_status = publish
    k._bench_quiet = quiet


def one_round(client, views, noop, pids, quiet: bool, per_engine: int) -> dict:
    """CPU ms per task over ``per_engine`` no-op tasks on every engine."""
    eng, ctl, tids = pids
    client.direct_view(list(client.ids)).apply_sync(_set_quiet, quiet)
    time.sleep(0.3)
    e0, c0, k0 = bs.cpu_snapshot(eng), bs.cpu_snapshot(ctl), bs.thread_cpu(tids)
    t = time.perf_counter()
    total = per_engine * len(views)
    queued = [[v.apply_async(noop), v.apply_async(noop)] for v in views]
    sent, done = 2 * len(views), 0
    while done < total:
        for v, q in zip(views, queued, strict=True):
            while q and q[0].ready():
                q.pop(0)
                done += 1
                if sent < total:
                    q.append(v.apply_async(noop))
                    sent += 1
        time.sleep(0.0005)
    wall = time.perf_counter() - t
    e1, c1, k1 = bs.cpu_snapshot(eng), bs.cpu_snapshot(ctl), bs.thread_cpu(tids)
    return {
        "engines": bs.cpu_delta(e0, e1) / total * 1e3,
        "controller": bs.cpu_delta(c0, c1) / total * 1e3,
        "kernel": (k1 - k0) / total * 1e3,
        "wall": wall,
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--engines", type=int, default=8)
    ap.add_argument("--tasks", type=int, default=60, help="tasks per engine a round")
    ap.add_argument("--rounds", type=int, default=3)
    args = ap.parse_args()
    from IPython.testing.globalipapp import start_ipython

    import gpucell
    from gpucell.engine import worker

    ip = start_ipython()
    ip.run_line_magic("load_ext", "gpucell")
    S = bs.Systems(ip, args.engines)
    S.start_gpucell()
    try:
        bs.settle()
        cur = gpucell.current()
        client = cur.client
        views = [client.direct_view(e) for e in client.ids]
        eng = [i.pid for i in cur.engines.values() if i.pid]
        ctl = [p for p in bs.tree_pids(cur.controller_pid) if p not in eng]
        tids = [threading.get_native_id(), client._io_thread.native_id]
        noop = worker.ByName("_engine_id")
        for _ in range(args.rounds):
            for quiet in (False, True):
                r = one_round(client, views, noop, (eng, ctl, tids), quiet, args.tasks)
                print(
                    f"idle {'left out' if quiet else 'sent    '}: engines "
                    f"{r['engines']:.3f}, controller {r['controller']:.3f}, kernel "
                    f"{r['kernel']:.3f} ms CPU per task; wall {r['wall']:.2f} s, "
                    f"load {os.getloadavg()[0]:.1f}",
                    flush=True,
                )
        client.direct_view(list(client.ids)).apply_sync(_set_quiet, False)
    finally:
        S.close()


if __name__ == "__main__":
    main()
