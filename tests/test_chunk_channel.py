"""``GpuCell.chunk_channel``: a local engine takes a cell's chunks after its
first through /dev/shm (one serving task per engine per cell), and the cell
leaves what the serial cell leaves, prints what it prints, in order, and fails
and stops as a run of one task per chunk does (an engine SIGKILLed mid-cell, on
both paths: tests/test_failures.py)."""

from __future__ import annotations

import glob
import os
import time

import pytest
from helpers import children, press_stop, wait_gone

import gpucell

pytestmark = pytest.mark.cluster


def _answered(c) -> int:
    """Chunks the engines answered through the channel so far."""

    def count() -> int:
        from gpucell.engine import served

        return served.ANSWERED[0]

    return sum(c.client[c.live_ids()].apply_sync(count))


def _left() -> list[str]:
    return glob.glob(f"/dev/shm/gpucell-chunks-{os.getpid()}-*")


@pytest.fixture
def channel_on(ip):
    ip.run_line_magic("config", "GpuCell.chunk_channel = True")
    ip.run_line_magic("config", "GpuCell.inline_below = 0")
    yield ip
    from gpucell import config

    config.settings().chunk_channel = type(
        config.settings()
    ).chunk_channel.default_value


def test_many_cheap_chunks_take_the_channel_and_equal_serial(channel_on, cluster):
    ip = channel_on
    before = _answered(cluster)
    cell = "out = []\ntotal = 0\nfor i in range(400):\n    out.append(i * i)\n"
    cell += "    total += i\n"
    ip.run_cell_magic("gpu_parallel", "--quiet --schedule dynamic --chunksize 4", cell)
    assert ip.user_ns["out"] == [i * i for i in range(400)]
    assert ip.user_ns["total"] == sum(range(400))
    # the first chunk of each engine is a task; the other 98 or more are not
    assert _answered(cluster) - before >= 100 - 2 * len(cluster.live_ids())
    assert not _left()


def _started(c) -> int:
    def count() -> int:
        from gpucell.engine import served

        return served.STARTED[0]

    return sum(c.client[c.live_ids()].apply_sync(count))


def test_one_chunk_an_engine_starts_no_serving_task(channel_on, cluster):
    """The serving task starts with an engine's second chunk: a loop split
    once per engine would pay for it (a task each) and never use it."""
    ip = channel_on
    before = _started(cluster)
    ip.run_cell_magic(
        "gpu_parallel",
        "--quiet --schedule static",
        "halves = []\nfor i in range(10):\n    halves.append(i / 2)\n",
    )
    assert ip.user_ns["halves"] == [i / 2 for i in range(10)]
    assert len(gpucell.last_run.chunks) == len(cluster.live_ids())
    assert _started(cluster) == before


def test_channel_chunks_print_in_iteration_order(channel_on, cluster, capsys):
    ip = channel_on
    cell = "seen = []\nfor i in range(24):\n    print('line', i)\n    seen.append(i)\n"
    ip.run_cell_magic("gpu_parallel", "--quiet --schedule dynamic --chunksize 2", cell)
    out = capsys.readouterr().out
    lines = [ln.split("] ", 1)[-1] for ln in out.splitlines() if "line " in ln]
    assert lines == [f"line {i}" for i in range(24)]
    assert ip.user_ns["seen"] == list(range(24))


def test_no_output_stays_awaited_after_channel_cells(channel_on, cluster):
    """Every task and channel chunk of a cell has its output complete, or is
    forgotten, once the cell is over: the serving task's "idle" comes after
    its reply, and the client reads it only while it has the task's record."""
    import concurrent.futures

    ip = channel_on
    for body in ("print('it', i)\n    got.append(i)\n", "got.append(i)\n"):
        ip.run_cell_magic(
            "gpu_parallel",
            "--quiet --schedule dynamic --chunksize 2",
            "got = []\nfor i in range(12):\n    " + body,
        )
        assert ip.user_ns["got"] == list(range(12))
    client = cluster.client
    waiting = [f for f in list(client._output_futures.values()) if not f.done()]
    concurrent.futures.wait(waiting, timeout=2.0)
    assert not [m for m, f in list(client._output_futures.items()) if not f.done()]


def test_an_error_in_a_channel_chunk_is_the_users_and_nothing_merges(
    channel_on, cluster
):
    ip = channel_on
    ip.user_ns["out"] = ["untouched"]
    cell = (
        "for i in range(80):\n"
        "    if i == 57:\n"
        "        raise ValueError(f'bad item {i}')\n"
        "    out.append(i)\n"
    )
    with pytest.raises(ValueError, match="bad item 57"):
        ip.run_cell_magic(
            "gpu_parallel", "--quiet --schedule dynamic --chunksize 2", cell
        )
    assert ip.user_ns["out"] == ["untouched"]
    ip.run_cell_magic("gpu_parallel", "--quiet", "sq = [i * 3 for i in range(7)]\n")
    assert ip.user_ns["sq"] == [i * 3 for i in range(7)]
    assert not _left()


def test_the_stop_button_withdraws_the_queued_chunks(channel_on, private_cluster):
    ip = channel_on
    ip.user_ns.update({"time": time, "out": ["untouched"]})
    cell = "for i in range(200):\n    time.sleep(0.02)\n    out.append(i)\n"
    pressed = press_stop(0.8)
    t0 = time.monotonic()
    try:
        with pytest.raises(KeyboardInterrupt):
            ip.run_cell_magic(
                "gpu_parallel", "--quiet --schedule dynamic --chunksize 1", cell
            )
    finally:
        pressed.set()
    assert time.monotonic() - t0 < 0.8 + 2.5
    assert ip.user_ns["out"] == ["untouched"]
    assert gpucell.last_run.status == "interrupted"
    ip.run_cell_magic(
        "gpu_parallel",
        "--quiet --schedule dynamic --chunksize 1",
        "for i in range(12):\n    out.append(i)\n",
    )
    assert ip.user_ns["out"] == ["untouched", *range(12)]
    assert not _left()


def test_off_every_chunk_is_a_task(ip, cluster):
    ip.run_line_magic("config", "GpuCell.chunk_channel = False")
    try:
        before = _answered(cluster)
        ip.run_cell_magic(
            "gpu_parallel",
            "--quiet --schedule dynamic --chunksize 2",
            "sq = []\nfor i in range(20):\n    sq.append(i)\n",
        )
        assert ip.user_ns["sq"] == list(range(20))
        assert _answered(cluster) == before
    finally:
        from gpucell import config

        config.settings().chunk_channel = type(
            config.settings()
        ).chunk_channel.default_value


FULL_SHM = r"""
import resource, signal, sys
import gpucell
from IPython.testing.globalipapp import start_ipython
gc = gpucell.start_cluster(2, gpus="none")
try:
    ip = start_ipython()
    ip.run_line_magic("load_ext", "gpucell")
    ip.run_line_magic("config", "GpuCell.inline_below = 0")
    ip.run_line_magic("config", "GpuCell.chunk_channel = True")
    ip.user_ns["words"] = ["w%d" % i + "x" * 3000 for i in range(40)]
    # a write past 2 KiB fails (EFBIG), as one into a full /dev/shm (ENOSPC)
    signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
    soft, hard = resource.getrlimit(resource.RLIMIT_FSIZE)
    resource.setrlimit(resource.RLIMIT_FSIZE, (2048, hard))
    try:
        ip.run_cell_magic(
            "gpu_parallel",
            "--quiet --schedule dynamic --chunksize 1",
            "sizes = []\nfor w in words:\n    sizes.append(len(w))\n",
        )
    finally:
        resource.setrlimit(resource.RLIMIT_FSIZE, (soft, hard))
    assert ip.user_ns["sizes"] == [len(w) for w in ip.user_ns["words"]]
    def count():
        from gpucell.engine import served

        return served.ANSWERED[0]

    answered = sum(gc.client[:].apply_sync(count))
    print("ANSWERED", answered, gpucell.last_run.status)
finally:
    gpucell.stop()
"""


def test_a_full_dev_shm_sends_the_rest_as_tasks(tmp_path):
    """Writing a chunk's request fails (a full /dev/shm, stood in for by a file
    size limit on the kernel): that engine's serving task ends after what it
    was sent, and its chunks go as tasks; the cell equals serial."""
    import subprocess
    import sys

    before, folders = children(), set(glob.glob("/dev/shm/gpucell-chunks-*"))
    script = tmp_path / "full_shm.py"
    script.write_text(FULL_SHM)
    p = subprocess.run(
        [sys.executable, str(script)], capture_output=True, text=True, timeout=120
    )
    assert p.returncode == 0, p.stdout[-2000:] + p.stderr[-3000:]
    assert "ANSWERED 0 ok" in p.stdout, p.stdout
    assert not wait_gone(children() - before)
    assert set(glob.glob("/dev/shm/gpucell-chunks-*")) <= folders
