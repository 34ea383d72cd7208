"""``python -m gpucell.cluster.boot gpucell.cluster.controller [args]``: ipyparallel's
own controller, with its direct queue telling the hub of each message without its
buffers (:mod:`gpucell.cluster.lean_monitor`).  Nothing else differs."""

from __future__ import annotations

import runpy
import sys

from gpucell.cluster import lean_monitor

if __name__ == "__main__":
    lean_monitor.install()
    sys.argv[0] = "ipyparallel.controller"
    runpy.run_module("ipyparallel.controller", run_name="__main__", alter_sys=True)
