"""Time from a ``%%gpu_distributed`` cell's start to its first training step,
beside ``torch.multiprocessing.spawn`` of the same job from a script.

The job: a small MLP wrapped in DistributedDataParallel, a sharded DataLoader,
SGD; each rank stamps ``time.time()`` once its first ``opt.step()`` is done,
then trains a few more steps.  Rank 0's stamp minus the start:

  spawn/launch   ``python job.py`` started by this script: the interpreter,
                 ``import torch``, then ``mp.spawn`` of N ranks (each a fresh
                 interpreter importing torch, ``init_process_group``, the model)
  spawn/call     the same run, from the ``mp.spawn`` call (torch already
                 imported in the parent)
  cell/first     the first ``%%gpu_distributed`` cell in a kernel whose cluster
                 started PAUSE s earlier (engines imported torch meanwhile, as
                 the kernel had it): forms the group, sends the notebook's
                 model and data
  cell/next      the same cell again: the group is kept
  (forming)      of cell/first, the seconds spent forming the group

Each round runs every variant once (the kernel in a fresh interpreter, as a
notebook is); the table shows the median and range over rounds.

Usage:  python bench/bench_distributed.py [--ranks 2] [--rounds 3]
Writes bench/results/distributed.json.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

RESULTS = Path(__file__).resolve().parent / "results" / "distributed.json"
MARK = "BENCH_JSON "
PAUSE = 3.0

SETUP = """
import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset
torch.manual_seed(0)
net = nn.Sequential(nn.Linear(64, 256), nn.ReLU(), nn.Linear(256, 10))
data = TensorDataset(torch.randn(4096, 64), torch.randint(0, 10, (4096,)))
loader = DataLoader(data, batch_size=256, shuffle=True)
"""

#: the training cell; ``model`` and ``loader`` come from SETUP
TRAIN = """
import time
import gpucell
model = gpucell.ddp(net)
opt = torch.optim.SGD(model.parameters(), lr=0.05)
t_first = None
for xb, yb in gpucell.shard(loader):
    opt.zero_grad()
    nn.functional.cross_entropy(model(xb), yb).backward()
    opt.step()
    if t_first is None:
        t_first = time.time()
"""

SCRIPT = """
import os, sys, time
t_script = time.time()
import torch
import torch.distributed as dist
import torch.multiprocessing as mp

def rank_main(rank, world, port, out):
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port),
                      RANK=str(rank), WORLD_SIZE=str(world), LOCAL_RANK=str(rank))
    torch.set_num_threads(1)
    dist.init_process_group("gloo", rank=rank, world_size=world)
    ns = {}
    exec(SETUP + TRAIN, ns)
    if rank == 0:
        with open(out, "w") as f:
            f.write(repr(ns["t_first"]))
    dist.destroy_process_group()

SETUP = %(setup)r
TRAIN = %(train)r

if __name__ == "__main__":
    world, port, out = int(sys.argv[1]), int(sys.argv[2]), sys.argv[3]
    t_call = time.time()
    mp.spawn(rank_main, args=(world, port, out), nprocs=world)
    print("%(mark)s" + repr({"t_script": t_script, "t_call": t_call}))
"""


def free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def spawn_round(ranks: int) -> dict[str, float]:
    with tempfile.TemporaryDirectory() as d:
        script = Path(d) / "job.py"
        out = Path(d) / "t_first"
        script.write_text(
            SCRIPT % {"setup": SETUP, "train": TRAIN, "mark": MARK.strip() + " "}
        )
        t0 = time.time()
        p = subprocess.run(
            [sys.executable, str(script), str(ranks), str(free_port()), str(out)],
            capture_output=True,
            text=True,
            check=True,
            timeout=300,
        )
        t_first = float(out.read_text())
    line = next(ln for ln in p.stdout.splitlines() if ln.startswith(MARK.strip()))
    stamps = eval(line.split(" ", 1)[1])  # noqa: S307 - our own repr of a dict
    return {"spawn/launch": t_first - t0, "spawn/call": t_first - stamps["t_call"]}


def cell_round(ranks: int, pause: float) -> dict[str, float]:
    """One kernel, in this fresh interpreter (run with --cell)."""
    from IPython.testing.globalipapp import start_ipython

    import gpucell

    ip = start_ipython()
    ip.run_line_magic("load_ext", "gpucell")
    ip.run_cell("import torch")
    ip.run_line_magic("gpu_cluster", f"start -n {ranks} --gpus none")
    time.sleep(pause)
    ip.run_cell(SETUP)
    times = {}
    for name in ("cell/first", "cell/next"):
        t0 = time.time()
        ip.run_cell_magic("gpu_distributed", "--quiet --out t_first", TRAIN)
        times[name] = ip.user_ns["t_first"] - t0
        if name == "cell/first":
            times["(forming)"] = gpucell.last_run.formed_seconds
    ip.run_line_magic("gpu_cluster", "stop")
    return times


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--ranks", type=int, default=2)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument(
        "--pause",
        type=float,
        default=PAUSE,
        help="seconds between the cluster's start and the first cell",
    )
    ap.add_argument("--cell", action="store_true", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.cell:
        print(MARK + json.dumps(cell_round(args.ranks, args.pause)))
        return
    rows: dict[str, list[float]] = {}
    for _ in range(args.rounds):
        got = spawn_round(args.ranks)
        p = subprocess.run(
            [
                sys.executable,
                __file__,
                "--cell",
                "--ranks",
                str(args.ranks),
                "--pause",
                str(args.pause),
            ],
            capture_output=True,
            text=True,
            check=True,
            timeout=600,
        )
        line = next(ln for ln in p.stdout.splitlines() if ln.startswith(MARK))
        got.update(json.loads(line[len(MARK) :]))
        for k, v in got.items():
            rows.setdefault(k, []).append(v)
    load = os.getloadavg()[0]
    print(
        f"time to the first training step, {args.ranks} CPU ranks (gloo), "
        f"{args.rounds} rounds, {os.cpu_count()} cores, load {load:.1f}, "
        f"first cell {args.pause:g} s after the start"
    )
    print(f"{'variant':<14}{'median s':>10}{'min':>8}{'max':>8}")
    for k, v in rows.items():
        print(f"{k:<14}{statistics.median(v):>10.2f}{min(v):>8.2f}{max(v):>8.2f}")
    RESULTS.parent.mkdir(exist_ok=True)
    RESULTS.write_text(
        json.dumps(
            {"ranks": args.ranks, "pause": args.pause, "load": load, "seconds": rows},
            indent=1,
        )
    )


if __name__ == "__main__":
    main()
