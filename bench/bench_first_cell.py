"""The first torch cell after a cluster starts, beside a re-run of it.

Engines gpucell starts import, in a background thread while they boot, the heavy
libraries the kernel already has (torch, pandas, ...): the first cell should not
wait for them.  Each variant runs in a fresh interpreter:

  preimport   torch imported in the kernel before %gpu_cluster start (engines
              import it in a task of their own as soon as they are up)
  cold        torch imported only after the start (engines import it on the
              first cell, as before)

Both wait PAUSE seconds (3) between the start and the first cell, as a person
does; a first cell sent at once waits for the import either way.

Columns: start = the start call; first = the first cell (a small torch loop);
rerun = the same cell again; serial = the loop in the kernel.

Usage:  python bench/bench_first_cell.py [--runs 3]
Writes bench/results/first_cell.json.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import time
from pathlib import Path

RESULTS = Path(__file__).resolve().parent / "results" / "first_cell.json"
MARK = "BENCH_JSON "
PAUSE = 3.0
CELL = (
    "outs = []\nfor x in batches:\n    with torch.no_grad():\n"
    "        outs.append(float(model(x).sum()))\n"
)
SETUP = (
    "import torch\ntorch.manual_seed(0)\nmodel = torch.nn.Linear(64, 8)\n"
    "batches = [torch.randn(16, 64) for _ in range(20)]\n"
)


def one(variant: str) -> dict[str, float]:
    from IPython.testing.globalipapp import start_ipython

    ip = start_ipython()
    ip.run_line_magic("load_ext", "gpucell")
    ip.run_line_magic("config", "GpuCell.inline_below = 0")
    if variant == "preimport":
        ip.run_cell("import torch")
    t0 = time.perf_counter()
    ip.run_line_magic("gpu_cluster", "start -n 2 --gpus none")
    start = time.perf_counter() - t0
    time.sleep(PAUSE)
    ip.run_cell(SETUP)
    t0 = time.perf_counter()
    ip.run_cell_magic("gpu_parallel", "--quiet", CELL)
    first = time.perf_counter() - t0
    t0 = time.perf_counter()
    ip.run_cell_magic("gpu_parallel", "--quiet", CELL)
    rerun = time.perf_counter() - t0
    t0 = time.perf_counter()
    ip.run_cell(CELL)
    serial = time.perf_counter() - t0
    ip.run_line_magic("gpu_cluster", "stop")
    return {"start": start, "first": first, "rerun": rerun, "serial": serial}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--one")
    args = ap.parse_args()
    if args.one:
        print(MARK + json.dumps(one(args.one)), flush=True)
        return
    report: dict = {"runs": args.runs, "results": {}}
    for variant in ("preimport", "cold"):
        rows = []
        for _ in range(args.runs):
            out = subprocess.run(
                [sys.executable, __file__, "--one", variant],
                capture_output=True,
                text=True,
                timeout=600,
            ).stdout
            line = next(x for x in out.splitlines() if x.startswith(MARK))
            rows.append(json.loads(line[len(MARK) :]))
        report["results"][variant] = {
            k: statistics.median(r[k] for r in rows) for k in rows[0]
        } | {"all": rows}
    print(f"{'variant':10} {'start':>7} {'first':>7} {'rerun':>7} {'serial':>7}  (s)")
    for v, r in report["results"].items():
        print(
            f"{v:10} {r['start']:7.2f} {r['first']:7.2f} {r['rerun']:7.3f} "
            f"{r['serial']:7.3f}"
        )
    RESULTS.parent.mkdir(parents=True, exist_ok=True)
    RESULTS.write_text(json.dumps(report, indent=2))
    print(f"wrote {RESULTS}")


if __name__ == "__main__":
    main()
