"""An engine's first chunk pays nothing a re-run does not: what it paid
(finding where the generators keep their state, first calls of the wire and
the log capture) is done by ``worker.warm``, the task every engine gets as it
registers (``cluster/engines.preimport``), and leaves nothing a cell can see."""

from __future__ import annotations

import subprocess
import sys

FRESH_ENGINE = """
import random, sys
import numpy as np
from gpucell.engine import rngstate, sessions, worker

before = (random.getstate(), np.random.get_state()[1].tobytes())
assert rngstate._random_view[0] is None and rngstate._numpy_views[0] is None
worker.warm(["json"])
assert "json" in sys.modules
assert rngstate._random_view[0] is not None, "random's state not located"
assert rngstate._numpy_views[0] is not None, "numpy's state not located"
assert (random.getstate(), np.random.get_state()[1].tobytes()) == before
assert sessions.by_kernel == {}, "warm left a kernel's session"
print("OK")
"""


def test_warm_readies_a_fresh_engine_process_and_changes_nothing_it_runs():
    p = subprocess.run(
        [sys.executable, "-c", FRESH_ENGINE], capture_output=True, text=True
    )
    assert p.returncode == 0 and p.stdout.strip() == "OK", p.stderr[-2000:]


def test_the_warm_task_is_sent_by_name():
    from gpucell.engine import worker

    assert callable(worker.warm)
    assert worker.ByName("warm").name == "warm"  # pickles as a name, not code
