"""``%%gpu_parallel --background`` on a real ipykernel driven through
jupyter_client (as a notebook front end drives it): the cell returns while
its run goes on, and a later cell that could touch the run first waits for it,
so the namespace ends as the serial run of the cells would leave it.

One kernel and one 2-engine cluster for the module (tests run in order).
"""

from __future__ import annotations

import os
import time
from collections.abc import Iterator
from typing import Any

import pytest

pytestmark = pytest.mark.cluster


class Kernel:
    def __init__(self) -> None:
        from jupyter_client.manager import start_new_kernel

        self.km, self.kc = start_new_kernel(kernel_name="python3", startup_timeout=60)

    def run(self, code: str, timeout: float = 120) -> tuple[dict, str, float]:
        """(reply content, text shown, seconds the cell took)."""
        shown: list[str] = []

        def hook(msg: dict) -> None:
            kind, c = msg["msg_type"], msg["content"]
            if kind == "stream":
                shown.append(c["text"])
            elif kind == "error":
                shown.append(f"{c['ename']}: {c['evalue']}\n")
            elif kind in ("display_data", "update_display_data"):
                shown.append(c["data"].get("text/plain", "") + "\n")

        t0 = time.perf_counter()
        reply = self.kc.execute_interactive(code, timeout=timeout, output_hook=hook)
        return reply["content"], "".join(shown), time.perf_counter() - t0

    def ok(self, code: str, timeout: float = 120) -> tuple[str, float]:
        reply, text, took = self.run(code, timeout)
        assert reply["status"] == "ok", text
        return text, took

    def value(self, expr: str) -> Any:
        text, _ = self.ok(f"print(repr({expr}))")
        import ast

        return ast.literal_eval(text.strip().splitlines()[-1])


@pytest.fixture(scope="module")
def kernel() -> Iterator[Kernel]:
    k = Kernel()
    try:
        k.ok(
            "%load_ext gpucell\nimport gpucell, time\n"
            "gpucell.start_cluster(2, gpus='none')"
        )
        yield k
    finally:
        k.kc.stop_channels()
        if k.km.has_kernel:
            k.km.shutdown_kernel(now=True)


def _waited(text: str) -> bool:
    return "gpucell: waiting for the background run of cell [" in text


def test_a_background_cell_returns_and_only_cells_that_need_it_wait(kernel):
    # an ~8 s run: 32 iterations of 0.5 s on 2 engines
    text, took = kernel.ok(
        "%%gpu_parallel --background --schedule dynamic --chunksize 2\n"
        "data = list(range(32))\nout = []\ntotal = 0\n"
        "for v in data:\n    time.sleep(0.5)\n    out.append(v * 3)\n"
        "    total += v\n    print('iteration', v)\n"
        "best = max(out)\nprint('after the loop', best)\n"
    )
    # under a second (issue 30); on this 2-core host under a load of several
    # test sessions the same work stretches, still far below the ~8 s run
    assert took < (1.0 if os.getloadavg()[0] < 4 else 2.0), (took, text)
    assert "runs in the background (32 iterations on 2 engines)" in text
    assert "iteration 0" not in text  # engine output waits for the merge
    # a cell that touches none of the run's names runs at once
    text, took = kernel.ok("z = 40 + 2\nprint(z)\n[i * 2 for i in range(3)]")
    assert took < 0.5 and text.strip() == "42", (took, text)
    assert kernel.value("gpucell.runs[-1].state") == "running"
    # the stop button while nothing waits does not touch the run
    kernel.km.interrupt_kernel()
    time.sleep(0.5)
    progress = kernel.value("gpucell.runs[-1].progress")
    assert progress.endswith("running") and not progress.startswith("32 of"), progress
    # a cell reading the sink waits, and sees the serial values
    text, took = kernel.ok("print(out == [v * 3 for v in range(32)], total, best)")
    assert _waited(text) and "(this cell uses `out`, which the run writes)" in text
    assert text.strip().splitlines()[-1] == "True 496 93", text
    lines = [ln for ln in text.splitlines() if "] iteration " in ln]
    assert [int(ln.split()[-1]) for ln in lines] == list(range(32))  # in order
    assert text.index("] iteration 31") < text.index("after the loop 93")
    assert kernel.value("gpucell.runs[-1].state") == "merged"
    # once merged, nothing waits
    text, took = kernel.ok("out.append(0)\nprint(len(out))")
    assert not _waited(text) and text.strip() == "33"


def test_a_cell_rebinding_a_sink_ends_with_the_serial_value(kernel):
    kernel.ok(
        "%%gpu_parallel -b\nsquares = []\n"
        "for v in range(12):\n    time.sleep(0.25)\n    squares.append(v * v)\n"
    )
    text, _ = kernel.ok("squares = ['mine']")  # serially after the loop
    assert _waited(text) and "uses `squares`, which the run writes" in text
    assert kernel.value("squares") == ["mine"]


def test_a_cell_changing_an_input_in_place_waits_first(kernel):
    kernel.ok("cfg = {'k': 2}\nalias = cfg")
    cell = (
        "%%gpu_parallel -b\nscaled = []\n"
        "for v in range(12):\n    time.sleep(0.25)\n    scaled.append(v * cfg['k'])\n"
    )
    kernel.ok(cell)
    text, _ = kernel.ok("cfg['k'] = 100")
    assert _waited(text) and "uses `cfg`, which the run reads" in text, text
    assert kernel.value("scaled") == [v * 2 for v in range(12)]
    # another name for the input object waits too (one level: `alias is cfg`)
    kernel.ok(cell)
    text, _ = kernel.ok("alias['k'] = 7")
    assert _waited(text), text
    assert "uses `alias`, which is the same object as `cfg`" in text, text
    assert kernel.value("scaled") == [v * 100 for v in range(12)]
    assert kernel.value("cfg") == {"k": 7}


def test_two_background_runs_merge_in_start_order(kernel):
    kernel.ok("order = []")
    kernel.ok(
        "%%gpu_parallel -b\nsq = []\nfor v in range(8):\n    time.sleep(0.25)\n"
        "    sq.append(v * v)\norder.append('first')\n"
    )
    # a second %%gpu_parallel waits for the first (one run on the cluster at
    # a time), which merges and runs its epilogue before the second starts
    text, took = kernel.ok(
        "%%gpu_parallel -b\ncu = []\nfor v in range(8):\n    time.sleep(0.25)\n"
        "    cu.append(v ** 3)\norder.append('second')\n"
    )
    assert "(this cell uses `%%gpu_parallel`)" in text, text
    # which run holds the cluster, and how to stop waiting or cancel it
    assert "one run at a time on a cluster: the background run of cell [" in text
    assert "The stop button stops this wait, not the run;" in text, text
    assert ".cancel()` cancels the run" in text, text
    assert "runs in the background (8 iterations" in text
    text, _ = kernel.ok("print(order, sq[-1], cu[-1])")
    assert _waited(text) and "uses `cu`" in text, text
    assert text.strip().splitlines()[-1] == "['first', 'second'] 49 343"


def test_engines_are_fed_while_a_foreground_cell_runs(kernel):
    """The kernel's event loop does not run during a cell: a thread steps the
    run meanwhile, so it ends during a long cell instead of after it (its
    engines would otherwise idle once their queued chunks were done)."""
    kernel.ok(
        "%%gpu_parallel -b --quiet --schedule dynamic --chunksize 1\nfed = []\n"
        "for v in range(12):\n    time.sleep(0.2)\n    fed.append(v)\n"
    )
    text, _ = kernel.ok(
        "t0 = time.monotonic()\n"
        "while gpucell.runs[-1].state == 'running' and time.monotonic() - t0 < 60:\n"
        "    sum(range(10000))\n"  # a busy cell: the thread still gets its turns
        "print(gpucell.runs[-1].state)\n"
    )
    assert not _waited(text) and text.strip().splitlines()[-1] == "finished", text
    assert kernel.value("fed") == list(range(12))


ERROR_CELL = (
    "%%gpu_parallel {opts}\nseen = 'prelude ran'\nvals = []\n"
    "for v in range(12):\n    time.sleep(0.2)\n"
    "    if v == 7:\n        raise ValueError(f'bad {{v}}')\n    vals.append(v)\n"
    "after = 'the epilogue ran'\n"
)


def test_an_iteration_error_is_raised_in_the_next_cell_that_waits(kernel):
    reply, text, _ = kernel.run(ERROR_CELL.format(opts="--quiet"))
    assert reply["status"] == "error"
    foreground = (reply["ename"], reply["evalue"])
    kernel.ok("del seen, vals")

    kernel.ok(ERROR_CELL.format(opts="-b --quiet"))
    text, took = kernel.ok("print('unrelated')")  # runs at once
    assert took < 0.5 and text.strip().endswith("unrelated")
    time.sleep(3)  # the run has failed by now: its widget and line say so
    text, _ = kernel.ok("print(gpucell.runs[-1].state)")
    assert text.strip().splitlines()[-1] == "failed"
    assert "note: the background run of cell [" in text  # said once, at once
    assert "(ValueError: bad 7)" in text, text
    text, _ = kernel.ok("print('unrelated again')")
    assert text.strip() == "unrelated again"
    reply, text, _ = kernel.run("print(vals)\nnever = 1")
    assert reply["status"] == "error"
    assert (reply["ename"], reply["evalue"]) == foreground
    assert "this cell's own code did not run" in "\n".join(reply["traceback"])
    # the serial contract for a failed loop: the prelude ran, nothing of the
    # loop was merged, the code after it did not run
    assert kernel.value("seen") == "prelude ran"
    assert kernel.value("vals") == []
    assert kernel.value("'after' in dir() or 'never' in dir()") is False
    assert kernel.value("gpucell.runs[-1].state") == "raised"
    text, _ = kernel.ok("%gpu_wait")
    assert "no background run is pending" in text


def test_interrupting_a_waiting_cell_stops_the_wait_not_the_run(kernel):
    kernel.ok(
        "%%gpu_parallel -b --quiet\nlate = []\n"
        "for v in range(16):\n    time.sleep(0.4)\n    late.append(v)\n"
    )
    kernel.kc.execute("print(late)")
    time.sleep(1.0)
    kernel.km.interrupt_kernel()
    reply = kernel.kc.get_shell_msg(timeout=30)["content"]
    assert reply["status"] == "error" and reply["ename"] == "KeyboardInterrupt"
    assert "stopped waiting for the background run" in reply["evalue"]
    assert kernel.value("gpucell.runs[-1].state") == "running"
    text, _ = kernel.ok("%gpu_wait")
    assert _waited(text)
    assert kernel.value("late") == list(range(16))


def test_an_engine_lost_in_a_background_run_gives_the_serial_result(kernel):
    import signal

    victim = kernel.value("max(e.pid for e in gpucell.current().engines.values())")
    kernel.ok(
        "%%gpu_parallel -b --schedule dynamic --chunksize 2\nlost = []\n"
        "for v in range(20):\n    time.sleep(0.2)\n    lost.append(v * v)\n"
    )
    time.sleep(0.8)
    os.kill(victim, signal.SIGKILL)
    text, _ = kernel.ok("print(lost == [v * v for v in range(20)])")
    assert _waited(text) and "died; re-running its" in text, text
    assert text.strip().splitlines()[-1] == "True"


def test_kernel_shutdown_with_a_pending_run_leaves_nothing_behind(kernel):
    """The last test: shuts the module's kernel down with a run pending."""
    from gpucell.protocol.shm import DEFAULT_DIR, PREFIX

    pids = kernel.value(
        "[gpucell.current().controller_pid] + [e.pid for e in "
        "gpucell.current().engines.values()] + [__import__('os').getpid()]"
    )
    kernel.ok(
        "%%gpu_parallel -b --quiet\nbusy = []\n"
        "for v in range(40):\n    time.sleep(0.5)\n    busy.append(v)\n"
    )
    time.sleep(1.0)
    assert kernel.value("gpucell.runs[-1].state") == "running"
    kernel.km.shutdown_kernel(now=False)  # a graceful shutdown: atexit runs
    deadline = time.monotonic() + 30
    alive = pids
    while alive and time.monotonic() < deadline:
        alive = [p for p in pids if _running(p)]
        time.sleep(0.2)
    assert not alive, alive
    kernel_pid = pids[-1]
    left = [
        n for n in os.listdir(DEFAULT_DIR) if n.startswith(f"{PREFIX}{kernel_pid}-")
    ]
    assert not left, left


def _running(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().split(")")[-1].split()[0] != "Z"
    except OSError:
        return False
