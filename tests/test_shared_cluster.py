"""Two notebooks on one cluster: each kernel's cells, programs and cached inputs
stay its own on the shared engines.

Two real kernel processes (IPython shells with gpucell) connect to one cluster that
``ipcluster start`` runs, and run cells at the same time and in turns, each with an
input of the same name (``data``) but its own values, so a program or cached input
of the other kernel would show as a wrong result or a "missing from the cache"
error.
"""

from __future__ import annotations

import subprocess
import sys

import pytest
from helpers import wait_for_ipcluster

pytestmark = pytest.mark.cluster

KERNEL = r"""
import sys
import numpy as np
from IPython.testing.globalipapp import start_ipython

tag = int(sys.argv[1])
ip = start_ipython()
ip.run_line_magic("load_ext", "gpucell")
ip.run_line_magic("gpu_cluster", "connect --profile X --timeout 60")
print("connected", flush=True)
k = 0
for line in sys.stdin:  # one cell per line read
    # the same name in both kernels, each its own values; every other cell
    # reuses the last one (a cache hit on the engines)
    ip.user_ns["data"] = np.full(50_000, float(tag * 1000 + k // 2))
    ip.user_ns["scale"] = tag + 1
    ip.user_ns["out"] = []
    if k % 2:
        body = f"for i in range(24):\n    out.append(float(data[i]) * scale + {tag})\n"
    else:
        body = "for j in range(30):\n    out.append(float(data[j]) - j * scale)\n"
    r = ip.run_cell("%%gpu_parallel --quiet\n" + body)
    want = []
    exec(body, {"data": ip.user_ns["data"], "scale": tag + 1, "out": want})
    ok = r.error_in_exec is None and ip.user_ns["out"] == want
    print(f"cell {k} {'ok' if ok else 'FAIL'} {r.error_in_exec!r}", flush=True)
    k += 1
ip.run_line_magic("gpu_cluster", "stop")
"""


class Kernel:
    """A notebook's kernel in its own process, running a cell per ``send``."""

    def __init__(self, tag: int) -> None:
        self.p = subprocess.Popen(
            [sys.executable, "-c", KERNEL, str(tag)],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
        )
        self.lines: list[str] = []
        self._expect("connected")

    def _expect(self, start: str) -> str:
        while True:
            line = self.p.stdout.readline()
            assert line, "kernel exited:\n" + "".join(self.lines)
            self.lines.append(line)
            if line.startswith(start):
                return line

    def send(self) -> None:
        self.p.stdin.write("go\n")
        self.p.stdin.flush()

    def result(self) -> str:
        return self._expect("cell ").strip()

    def close(self) -> None:
        self.p.stdin.close()
        self.p.wait(60)


@pytest.fixture
def kernels(ipcluster):
    wait_for_ipcluster()
    ks = [Kernel(1), Kernel(2)]
    try:
        yield ks
    finally:
        for k in ks:
            if k.p.poll() is None:
                k.p.kill()


def test_two_kernels_run_cells_at_the_same_time_and_in_turns_each_its_own(kernels):
    """One cluster and its two kernels (starting them costs seconds) for both
    orders: cells in flight at once, then cells taking turns."""
    for _ in range(6):
        for k in kernels:
            k.send()  # both cells are in flight at once
        results = [k.result() for k in kernels]
        assert all(r.split()[2] == "ok" for r in results), results
    for _ in range(3):
        for k in kernels:  # A's cell, then B's, then A's again: same input name
            k.send()
            r = k.result()
            assert r.split()[2] == "ok", r
    for k in kernels:
        k.close()
