"""Engine idle time while a long foreground cell runs beside a ``--background``
run (issue 30): the kernel's event loop, which steps the run between cells,
does not run during a cell, so without a feeding thread the engines idle once
their queued chunks are done.

A kernel (jupyter_client, as a notebook drives it) with a 2-engine CPU
cluster starts a background run of N iterations of ``time.sleep(S)``
(``--schedule dynamic --chunksize 1``: an engine holds one chunk running and
one queued), then at once runs a busy foreground cell of F seconds.  From the
run's chunk records (engine wall clock, this host), for each mode:

  idle      engine-seconds with no chunk running during the foreground cell
            (2 engines x F minus the chunks' time inside it)
  idle/left the same, up to the run's last chunk's end (idle while there
            was still work to send them)
  done      iterations finished when the foreground cell ended
  run       seconds from the background cell's start to the run's end

Modes: ``between cells`` (``background.FEED_DURING_CELLS = False``: stepped
only by the event loop, the behaviour before the thread) and ``thread``.
Then the median round trip of a cell that touches nothing of a pending run,
in each mode and with no run pending (the cost of handing the run to a thread
and back around every cell, and of the thread's steps meanwhile).
Not a test: timings on a shared machine vary; run it alone.

Usage:  python bench/bench_background_feed.py [--n 40] [--sleep 0.25] [--fg 6]
Writes bench/results/background_feed.json.
"""

from __future__ import annotations

import argparse
import ast
import json
from pathlib import Path
from typing import Any

RESULTS = Path(__file__).resolve().parent / "results" / "background_feed.json"


class Kernel:
    def __init__(self) -> None:
        from jupyter_client.manager import start_new_kernel

        self.km, self.kc = start_new_kernel(kernel_name="python3", startup_timeout=60)

    def run(self, code: str, timeout: float = 300) -> str:
        shown: list[str] = []

        def hook(msg: dict[str, Any]) -> None:
            if msg["msg_type"] == "stream":
                shown.append(msg["content"]["text"])
            elif msg["msg_type"] == "error":
                c = msg["content"]
                shown.append(f"{c['ename']}: {c['evalue']}\n")

        reply = self.kc.execute_interactive(code, timeout=timeout, output_hook=hook)
        text = "".join(shown)
        if reply["content"]["status"] != "ok":
            raise RuntimeError(text)
        return text

    def value(self, expr: str) -> Any:
        out = self.run(f"print(repr({expr}))")
        return ast.literal_eval(out.strip().splitlines()[-1])

    def close(self) -> None:
        self.kc.stop_channels()
        self.km.shutdown_kernel(now=False)


def one(k: Kernel, feed: bool, n: int, sleep: float, fg: float) -> dict[str, Any]:
    k.run(f"gpucell.kernel.background.FEED_DURING_CELLS = {feed}")
    k.run("t_bg = time.time()")
    k.run(
        "%%gpu_parallel -b --quiet --schedule dynamic --chunksize 1\nbench = []\n"
        f"for v in range({n}):\n    time.sleep({sleep})\n    bench.append(v)\n"
    )
    # a busy cell (pure Python: the GIL is contended, as in a real cell)
    k.run(
        "fg0 = time.time()\n"
        f"while time.time() - fg0 < {fg}:\n    sum(range(2000))\n"
        "fg1 = time.time()\n"
        "done_at_fg1 = int(gpucell.runs[-1].progress.split()[0])\n"
    )
    k.run("%gpu_wait")
    chunks = k.value(
        "[(c.engine, c.t_start, c.t_end, c.state) for c in gpucell.last_run.chunks]"
    )
    fg0, fg1, t_bg = k.value("(fg0, fg1, t_bg)")
    busy = sum(
        max(0.0, min(e, fg1) - max(s, fg0)) for _eid, s, e, st in chunks if st == "done"
    )
    engines = len({c[0] for c in chunks})
    end = max(c[2] for c in chunks)
    until = min(fg1, end)  # while the run still had work
    busy_left = sum(
        max(0.0, min(e, until) - max(s, fg0))
        for _eid, s, e, st in chunks
        if st == "done"
    )
    assert k.value("bench") == list(range(n))
    return {
        "mode": "thread" if feed else "between cells",
        "foreground_s": round(fg1 - fg0, 3),
        "engines": engines,
        "idle_engine_s": round(engines * (fg1 - fg0) - busy, 3),
        "idle_while_work_left_s": round(engines * max(0.0, until - fg0) - busy_left, 3),
        "done_at_fg_end": k.value("done_at_fg1"),
        "run_s": round(end - t_bg, 3),
    }


def cell_cost(k: Kernel, cells: int) -> dict[str, float]:
    """Median round trip (ms) of a cell touching nothing of the run: with no
    run pending, and with one pending in each mode (the thread is started
    before the cell and handed back to the event loop after it), the modes
    interleaved in blocks of 10 cells (the machine's load drifts)."""
    import statistics
    import time

    def round_trips(n: int) -> list[float]:
        times = []
        for i in range(n):
            t0 = time.perf_counter()
            k.run(f"z = {i}")
            times.append((time.perf_counter() - t0) * 1e3)
        return times

    out = {"no run pending": round_trips(cells)}
    k.run(
        "%%gpu_parallel -b --quiet --schedule dynamic --chunksize 1\nlong = []\n"
        "for v in range(4000):\n    time.sleep(0.05)\n    long.append(v)\n"
    )
    for _ in range(max(1, cells // 10)):
        for feed in (False, True):
            k.run(f"gpucell.kernel.background.FEED_DURING_CELLS = {feed}")
            mode = "thread" if feed else "between cells"
            out.setdefault(mode, []).extend(round_trips(10))
    k.run("gpucell.runs[-1].cancel()")
    return {m: round(statistics.median(t), 3) for m, t in out.items()}


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--n", type=int, default=40)
    p.add_argument("--sleep", type=float, default=0.25)
    p.add_argument("--fg", type=float, default=6.0)
    p.add_argument("--rounds", type=int, default=2)
    p.add_argument("--cells", type=int, default=60)
    a = p.parse_args()
    k = Kernel()
    rows = []
    try:
        k.run(
            "%load_ext gpucell\nimport gpucell, gpucell.kernel.background, time\n"
            "gpucell.start_cluster(2, gpus='none')"
        )
        for _ in range(a.rounds):
            for feed in (False, True):
                rows.append(one(k, feed, a.n, a.sleep, a.fg))
                print(rows[-1], flush=True)
        cost = cell_cost(k, a.cells)
        k.run("gpucell.stop()")
    finally:
        k.close()
    work = a.n * a.sleep / 2
    print(
        f"\n{a.n} iterations of {a.sleep} s on 2 engines ({work:.1f} s of work "
        f"each); a busy foreground cell of {a.fg} s started right after the run"
    )
    print(
        f"{'mode':<14} {'idle engine-s':>13} {'idle/left':>9} "
        f"{'done at fg end':>15} {'run s':>7}"
    )
    for r in rows:
        print(
            f"{r['mode']:<14} {r['idle_engine_s']:>13.2f} "
            f"{r['idle_while_work_left_s']:>9.2f} "
            f"{r['done_at_fg_end']:>15} {r['run_s']:>7.2f}"
        )
    print(f"\nround trip of a cell touching nothing of the run, median of {a.cells}:")
    for mode, ms in cost.items():
        print(f"  {mode:<16} {ms:.2f} ms")
    RESULTS.parent.mkdir(exist_ok=True)
    data = {"args": vars(a), "rows": rows, "cell_round_trip_ms": cost}
    RESULTS.write_text(json.dumps(data, indent=1) + "\n")


if __name__ == "__main__":
    main()
