"""Memory of a big input: one copy per host, and nothing kept after it is gone.

A numpy input of ``--gib`` GiB read by every engine of a real 2-engine cluster,
with shared memory on (the input travels through ``/dev/shm`` and each engine
maps it), with the engines told they cannot see the kernel's ``/dev/shm`` (as on
another host: one engine receives the input through the controller and publishes
it in its host's ``/dev/shm`` for the other), and off (it travels through the
controller to each engine).
For each: memory before the input exists, at the cell's end, and after
``del big`` plus one more cell.

Columns (MiB): the kernel's RSS; the controller's RSS; each engine's private
memory (USS: pages no other process shares); /dev/shm in use; and the host's
used memory (what ``free`` says), each as a change from before.

Usage:  python bench/bench_memory.py [--gib 2]
Writes bench/results/memory.json.
"""

from __future__ import annotations

import argparse
import gc as pygc
import json
import os
import platform
import shutil
import sys
import time
from pathlib import Path

RESULTS = Path(__file__).resolve().parent / "results" / "memory.json"
MIB = 2**20


def _uss(pid: int) -> int:
    import psutil

    try:
        return int(psutil.Process(pid).memory_full_info().uss)
    except Exception:
        return 0


def _rss(pid: int | None) -> int:
    import psutil

    try:
        return int(psutil.Process(pid).memory_info().rss)
    except Exception:
        return 0


def _shm_used() -> int:
    total, used, _free = shutil.disk_usage("/dev/shm")
    return int(used)


def _host_used() -> int:
    import psutil

    vm = psutil.virtual_memory()
    return int(vm.total - vm.available)


def measure(gc, settle: float = 0.5) -> dict[str, int]:
    pygc.collect()
    time.sleep(settle)
    out = {
        "kernel": _rss(os.getpid()),
        "controller": _rss(gc.controller_pid),
        "shm": _shm_used(),
        "host": _host_used(),
    }
    for eid, info in sorted(gc.engines.items()):
        out[f"engine {eid}"] = _uss(info.pid)
    return out


def run(shared: bool, gib: float, remote: bool = False) -> dict[str, dict[str, int]]:
    """``remote``: shared memory on, but the engines are told they cannot map
    the kernel's /dev/shm (as engines on another host): one of them receives
    the input and publishes it for the other (gpucell.engine.hostcopy)."""
    from IPython import get_ipython
    from IPython.testing.globalipapp import start_ipython

    import gpucell
    from gpucell import config

    ip = start_ipython() or get_ipython()
    if "gpu_parallel" not in ip.magics_manager.magics["cell"]:
        ip.run_line_magic("load_ext", "gpucell")
    config.settings().shared_memory = shared
    config.settings().inline_below = 0.0
    gc = gpucell.start_cluster(2, gpus="none")
    if remote:
        import dataclasses

        for e in list(gc.engines):
            gc.engines[e] = dataclasses.replace(gc.engines[e], shm=False)
    try:
        ip.run_cell("import numpy as np")
        cell = (
            "sums = []\nfor i in range(8):\n    sums.append(float(big[i::8].sum()))\n"
        )
        ip.run_cell_magic(
            "gpu_parallel", "--quiet", "w = []\nfor i in range(4):\n    w.append(i)\n"
        )
        before = measure(gc)
        ip.run_cell(f"big = np.ones(int({gib} * 2**30 // 8))")
        ip.run_cell_magic("gpu_parallel", "--quiet", cell)
        after = measure(gc)
        ip.run_cell("del big")
        ip.run_cell_magic(
            "gpu_parallel", "--quiet", "w = []\nfor i in range(4):\n    w.append(i)\n"
        )
        gone = measure(gc)
        later = measure(gc, settle=5.0)
    finally:
        gpucell.stop()
        config.settings().shared_memory = True
    return {
        "before": before,
        "after cell": after,
        "after del + cell": gone,
        "5 s later": later,
    }


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--gib", type=float, default=2.0)
    args = ap.parse_args()
    report: dict = {
        "python": sys.version.split()[0],
        "machine": platform.machine(),
        "input_gib": args.gib,
        "results": {},
    }
    for name, shared, remote in (
        ("shared memory", True, False),
        ("engines as on another host", True, True),
        ("no shared memory", False, False),
    ):
        report["results"][name] = run(shared, args.gib, remote)
    for name, phases in report["results"].items():
        print(f"\n{name}: change from before (MiB), input {args.gib:g} GiB")
        keys = list(phases["before"])
        print(f"{'':20}" + "".join(f"{k:>12}" for k in keys))
        for phase in ("after cell", "after del + cell", "5 s later"):
            row = [
                (phases[phase].get(k, 0) - phases["before"].get(k, 0)) / MIB
                for k in keys
            ]
            print(f"{phase:20}" + "".join(f"{v:12.0f}" for v in row))
    RESULTS.parent.mkdir(parents=True, exist_ok=True)
    RESULTS.write_text(json.dumps(report, indent=2))
    print(f"wrote {RESULTS}")


if __name__ == "__main__":
    main()
