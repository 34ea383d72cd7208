"""One copy of an input per host, and nothing kept once the kernel lets go
(issue 16): measured on real engines, not timed."""

from __future__ import annotations

import time

import numpy as np
import psutil
import pytest
from helpers import needs_shared_shm

import gpucell

pytestmark = pytest.mark.cluster

MIB = 2**20


def _uss(pid: int) -> int:
    return int(psutil.Process(pid).memory_full_info().uss)


def _small_cell(ip) -> None:
    """A cell with no input: what engines do after any cell (tidy) is done."""
    ip.run_cell_magic(
        "gpu_parallel", "--quiet", "w = []\nfor i in range(4):\n    w.append(i)\n"
    )


def _cached_names(c) -> dict[int, list[str]]:
    def names():
        from gpucell.engine import worker

        return worker.cached_names()

    return {eid: c.client[eid].apply_sync(names) for eid in c.live_ids()}


def test_an_input_is_shared_not_copied_and_dropped_after_del(ip, private_cluster):
    c = private_cluster
    needs_shared_shm(c)
    size = 256 * MIB
    ip.user_ns["np"] = np
    _small_cell(ip)
    time.sleep(0.3)
    before = {e: _uss(c.engines[e].pid) for e in c.live_ids()}
    ip.user_ns["big"] = np.ones(size // 8)
    ip.run_cell_magic(
        "gpu_parallel",
        "--quiet",
        "sums = []\nfor i in range(8):\n    sums.append(float(big[i::8].sum()))\n",
    )
    assert ip.user_ns["sums"] == [size / 64] * 8
    time.sleep(0.3)
    for e in c.live_ids():
        grew = _uss(c.engines[e].pid) - before[e]
        assert grew < 0.1 * size, f"engine {e} copied the input ({grew / MIB:.0f} MiB)"
        # a write stays the engine's own (copy on write) and is refused anyway
    assert all("big" in names for names in _cached_names(c).values())
    del ip.user_ns["big"]
    _small_cell(ip)
    deadline = time.monotonic() + 5
    while any("big" in n for n in _cached_names(c).values()):
        assert time.monotonic() < deadline, "engines kept a deleted input"
        time.sleep(0.1)


def test_the_client_forgets_a_cells_tasks(ip, cluster):
    client = cluster.client
    ip.run_cell_magic(
        "gpu_parallel", "--quiet", "w = []\nfor i in range(40):\n    w.append(i)\n"
    )
    n = len(client.results)
    for _ in range(3):
        ip.run_cell_magic(
            "gpu_parallel",
            "--quiet --schedule dynamic --chunksize 2",
            "w = []\nfor i in range(40):\n    w.append(i)\n",
        )
    assert len(client.results) <= n + 3 * len(cluster.live_ids()) + 2  # tidy tasks


def test_last_run_stays_bounded_for_a_million_iterations(ip, cluster):
    from gpucell.protocol.chunks import DETAIL_MAX

    ip.run_cell_magic(
        "gpu_parallel",
        "--quiet --schedule dynamic --chunksize 50000",
        "acc = 0\nfor i in range(10**6):\n    acc += i\n",
    )
    import gpucell

    assert ip.user_ns["acc"] == sum(range(10**6))
    r = gpucell.last_run
    stamps = sum(len(c.iteration_starts) for c in r.chunks)
    assert stamps <= DETAIL_MAX < 10**6
    assert len(r.chunks) <= 10**6 // 50000 + 4


def test_engines_keep_cached_inputs_within_their_budget(ip, private_cluster):
    from gpucell import config

    c = private_cluster
    settings = config.settings()
    old = settings.engine_cache_bytes
    settings.engine_cache_bytes = 48 * MIB
    try:
        ip.user_ns.update(np=np, a=np.ones(4 * MIB), b=np.ones(4 * MIB))  # 32 MiB each
        for name in ("a", "b"):
            ip.run_cell_magic(
                "gpu_parallel",
                "--quiet --schedule static",
                f"s = []\nfor i in range(4):\n    s.append(float({name}[i]))\n",
            )
            assert ip.user_ns["s"] == [1.0] * 4
        cached = _cached_names(c)
        assert all("b" in n and "a" not in n for n in cached.values()), cached
    finally:
        settings.engine_cache_bytes = old


def _host_files() -> list[str]:
    import os

    try:
        return sorted(f for f in os.listdir("/dev/shm") if "-host-" in f)
    except OSError:
        return []


def test_engines_that_cannot_map_the_kernels_shm_get_one_copy_per_host(
    ip, private_cluster
):
    """Engines on another host: the input crosses to one of them, which publishes
    it in its host's /dev/shm; the other maps it (its private memory does not
    grow) and the files are gone after the cell.  The 'other host' here is this
    one, with the engines told they cannot see the kernel's /dev/shm."""
    import dataclasses

    c = private_cluster
    needs_shared_shm(c)
    saved = dict(c.engines)
    for e in c.live_ids():  # as for engines on another host
        c.engines[e] = dataclasses.replace(c.engines[e], shm=False)
    try:
        size = 192 * MIB
        ip.user_ns["np"] = np
        _small_cell(ip)
        time.sleep(0.3)
        before = {e: _uss(c.engines[e].pid) for e in c.live_ids()}
        ip.user_ns["big2"] = np.arange(size // 8, dtype=np.float64)
        cell = (
            "sums = []\nfor i in range(8):\n    sums.append(float(big2[i::8].sum()))\n"
        )
        ip.run_cell_magic("gpu_parallel", "--quiet", cell)
        expected = [float(ip.user_ns["big2"][i::8].sum()) for i in range(8)]
        assert ip.user_ns["sums"] == expected
        assert {r.engine for r in gpucell.last_run.chunks} == set(c.live_ids())
        assert gpucell.last_run.shared_bytes >= size  # the follower's copy
        time.sleep(0.3)
        grown = {e: _uss(c.engines[e].pid) - before[e] for e in c.live_ids()}
        assert min(grown.values()) < 0.1 * size, f"both engines copied it: {grown}"
        assert max(grown.values()) < 0.1 * size, f"an engine kept a copy: {grown}"
        deadline = time.monotonic() + 5
        while _host_files():
            assert time.monotonic() < deadline, f"left behind: {_host_files()}"
            time.sleep(0.1)
        # both keep it cached: the next cell sends nothing
        assert all("big2" in n for n in _cached_names(c).values())
        ip.run_cell_magic("gpu_parallel", "--quiet", cell)
        assert ip.user_ns["sums"] == expected
        assert gpucell.last_run.shared_bytes == 0
    finally:
        c.engines.update(saved)
        ip.user_ns.pop("big2", None)


def _tree_uss(pid: int) -> int:
    p = psutil.Process(pid)
    return sum(_uss(q.pid) for q in [p, *p.children(recursive=True)])


def test_the_controller_lets_go_of_an_input_as_the_cell_ends(ip, private_cluster):
    """Without shared memory an input crosses the controller, whose direct queue
    also tells the hub of every message it relays: the controller must not still
    hold the input after the cell (with the hub sent whole messages it held 3.8
    GiB of this 1 GiB input, freed seconds later; at 512 MiB the hub kept up)."""
    from gpucell import config

    c = private_cluster
    settings = config.settings()
    old = settings.shared_memory
    settings.shared_memory = False
    try:
        size = 1024 * MIB
        _small_cell(ip)
        time.sleep(0.5)
        before = _tree_uss(c.controller_pid)
        ip.user_ns["big3"] = np.ones(size // 8)
        ip.run_cell_magic(
            "gpu_parallel",
            "--quiet",
            "s3 = []\nfor i in range(8):\n    s3.append(float(big3[i::8].sum()))\n",
        )
        assert ip.user_ns["s3"] == [size / 64] * 8
        time.sleep(0.3)
        grew = _tree_uss(c.controller_pid) - before
        assert grew < 0.05 * size, f"the controller kept {grew / MIB:.0f} MiB"
    finally:
        settings.shared_memory = old
        ip.user_ns.pop("big3", None)


def _programs_loaded(c) -> dict[int, bool]:
    def loaded():
        from gpucell.engine import worker

        return any(s.program is not None for s in worker._sessions.values())

    return {eid: c.client[eid].apply_sync(loaded) for eid in c.live_ids()}


def _set_after_cell_idle(c, seconds: float) -> None:
    def put(s):
        from gpucell.engine import worker

        worker.AFTER_CELL_IDLE = s

    c.client[c.live_ids()].apply_sync(put, seconds)


def test_engines_tidy_a_cell_away_by_themselves_once_idle(ip, private_cluster):
    """No message from the kernel: an engine idle for a moment after its last
    chunk lets go of the cell's program and inputs."""
    ip.user_ns["data"] = list(range(100))
    ip.run_cell_magic(
        "gpu_parallel", "--quiet", "s = []\nfor i in range(8):\n    s.append(data[i])\n"
    )
    assert ip.user_ns["s"] == list(range(8))
    deadline = time.monotonic() + 10
    while any(_programs_loaded(private_cluster).values()):
        assert time.monotonic() < deadline, "engines kept the cell's program"
        time.sleep(0.1)


def test_a_chunk_that_finds_its_cell_tidied_away_runs_again_with_the_program(
    ip, private_cluster
):
    """Engines that tidy at the first idle instant (a loaded host can make any
    engine wait between two chunks): every chunk that came too late is sent
    again with the program and inputs, and the namespace is the serial one."""
    ip.user_ns.update(np=np, weights=np.arange(50.0), offset=3)
    cell = (
        "out = []\ntotal = 0.0\n"
        "for i in range(60):\n"
        "    total += float(weights[i % 50]) + offset\n"
        "    out.append(i * offset)\n"
    )
    _set_after_cell_idle(private_cluster, 0.0)
    time.sleep(0.5)  # what an earlier cell left waiting has been tidied
    try:
        ip.run_cell_magic(
            "gpu_parallel", "--quiet --schedule dynamic --chunksize 1", cell
        )
        reloads = gpucell.last_run.reloads
    finally:
        _set_after_cell_idle(private_cluster, 0.25)
    assert ip.user_ns["out"] == [i * 3 for i in range(60)]
    assert ip.user_ns["total"] == sum(float(i % 50) + 3 for i in range(60))
    assert gpucell.last_run.status == "ok"
    assert reloads > 0  # the path was taken, not merely available
