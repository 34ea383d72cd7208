"""Big results through /dev/shm: the pure round trip, its fallbacks and clean-up, and
the real cluster returning arrays and tensors that way."""

from __future__ import annotations

import errno
import os
import subprocess
import sys
import textwrap
import time

import numpy as np
import pytest
import torch

import gpucell
from gpucell.cluster import shm_channel
from gpucell.core.provenance import LastRun
from gpucell.protocol import shm, wire

MiB = 1 << 20


def files(ch) -> list[str]:
    return sorted(n for n in os.listdir(ch.directory) if ch.token in n)


def test_round_trip_is_one_writable_mapping_and_leaves_no_file(channel):
    arrays = [np.full(MiB // 4, i, np.float32) for i in range(3)]
    tensor = torch.arange(300_000, dtype=torch.float64)
    value = {"a": arrays, "t": tensor, "small": np.arange(5)}
    sent = shm.spill(wire.dumps(value), channel, "x")
    assert sent[0] == shm.MARK
    # the big buffers left the message; only headers travel
    assert wire.frames_nbytes(sent) < 64 * 1024
    assert len(files(channel)) == 2  # probe + the result
    record = LastRun()
    back = wire.loads(shm.unspill(sent, record))
    assert files(channel) == [os.path.basename(channel.probe)]  # unlinked on map
    assert record.shared_bytes >= 3 * MiB + tensor.numel() * 8
    for a, b in zip(arrays, back["a"], strict=True):
        assert b.flags.writeable and np.array_equal(a, b)
    assert torch.equal(back["t"], tensor)
    back["a"][0][0] = 7  # writable, and not shared with anyone any more
    assert arrays[0][0] == 0


def test_small_results_and_unreachable_channels_travel_as_frames(channel, tmp_path):
    small = wire.dumps([np.zeros(1000)])
    assert shm.spill(small, channel, "s") is small
    big = wire.dumps([np.zeros(MiB)])
    elsewhere = shm.Channel(token="999999-nothere", directory=str(tmp_path))
    assert shm.spill(big, elsewhere, "b") is big  # no probe: another host
    assert shm.unspill(big) == big


def test_a_full_shm_falls_back_and_leaves_nothing(channel, monkeypatch):
    def full(*_a):
        raise OSError(errno.ENOSPC, "No space left on device")

    # a full /dev/shm cannot be made here without mounting one; its symptom can
    monkeypatch.setattr(shm.os, "pwrite", full)
    frames = wire.dumps([np.ones(2 * MiB)])
    assert shm.spill(frames, channel, "f") is frames
    assert files(channel) == [os.path.basename(channel.probe)]


def test_a_small_or_crowded_shm_is_left_alone(channel, monkeypatch):
    real = os.statvfs(channel.directory)

    def fake(total, free):
        class St:
            f_frsize = 4096
            f_blocks = total // 4096
            f_bavail = free // 4096

        # /dev/shm's size is the machine's: the symptom is what can be made here
        monkeypatch.setattr(shm.os, "statvfs", lambda _d: St)

    frames = wire.dumps([np.ones(2 * MiB)])  # 16 MiB
    fake(64 * MiB, 64 * MiB)  # Docker's default size
    assert shm.spill(frames, channel, "a") is frames
    fake(8 << 30, 40 * MiB)  # big, but mostly taken (by results the kernel holds)
    assert shm.spill(frames, channel, "b") is frames
    fake(8 << 30, 8 << 30)
    assert shm.spilled(shm.spill(frames, channel, "c"))
    assert real.f_blocks > 0


def test_a_vanished_result_is_a_clear_error(channel):
    sent = shm.spill(wire.dumps([np.ones(2 * MiB)]), channel, "v")
    shm_channel.sweep(channel)
    with pytest.raises(OSError, match="shared memory .* is gone"):
        shm.unspill(sent)


def test_sweeps_remove_leftovers_and_files_of_dead_kernels(tmp_path):
    dead = subprocess.run(
        [sys.executable, "-c", "import os; print(os.getpid())"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout.strip()
    stale = tmp_path / f"gpucell-{dead}-abc-0-1-ff"
    stale.write_bytes(b"x")
    old = time.time() - 2 * shm_channel.STALE_AFTER
    os.utime(stale, (old, old))
    recent = tmp_path / f"gpucell-{dead}-def-probe"  # maybe another pid namespace's
    recent.write_bytes(b"x")
    other = tmp_path / "unrelated-file"
    other.write_bytes(b"x")
    ch = shm_channel.open_channel(str(tmp_path))  # opening sweeps dead kernels' files
    assert ch is not None
    assert not stale.exists() and other.exists() and recent.exists()
    recent.unlink()
    shm.spill(wire.dumps([np.ones(2 * MiB)]), ch, "left")
    assert shm_channel.sweep(ch) == 1
    assert os.path.exists(ch.probe)
    shm_channel.close_channel(ch)
    assert sorted(os.listdir(tmp_path)) == ["unrelated-file"]


def test_inputs_are_mapped_copy_on_write_and_released_by_the_sender(channel):
    data = np.arange(MiB, dtype=np.float64)
    sent = shm.spill(wire.dumps({"data": data}), channel, "in-x")
    first = wire.loads(shm.unspill(sent, shared=True))["data"]
    second = wire.loads(shm.unspill(sent, shared=True))["data"]
    assert len(files(channel)) == 2  # still there for other engines
    first[:10] = -1  # an engine writing to its input changes only its own copy
    assert np.array_equal(second, data)
    third = wire.loads(shm.unspill(sent, shared=True))["data"]
    assert np.array_equal(third, data)
    shm.release(sent)
    assert files(channel) == [os.path.basename(channel.probe)]
    assert np.array_equal(second, data)  # mappings outlive the file
    shm.release(sent)  # twice is harmless


# -- on the real cluster -------------------------------------------------------------


def leftovers(cluster) -> list[str]:
    ch = cluster.results_channel()
    return [n for n in files(ch) if not n.endswith("-probe")]


@pytest.mark.cluster
def test_cluster_results_come_back_through_shm_and_match_serial(ip, cluster):
    cell = textwrap.dedent(
        """
        big = []
        for i in range(6):
            big.append((np.full(MiB // 4, i, np.float32), torch.full((MiB // 8,), i)))
        """
    )
    ip.user_ns.update(np=np, torch=torch, MiB=MiB)
    ip.run_cell_magic("gpu_parallel", "--quiet", cell)
    assert gpucell.last_run.shared_bytes >= 6 * 2 * MiB
    got = ip.user_ns["big"]
    for i, (a, t) in enumerate(got):
        assert a.dtype == np.float32 and (a == i).all() and a.flags.writeable
        assert t.dtype == torch.int64 and bool((t == i).all())
    got[0][0][:] = 99  # the user's arrays are theirs to change
    assert leftovers(cluster) == []


@pytest.mark.cluster
def test_a_big_input_reaches_every_engine_through_shm_once(ip, cluster):
    ip.user_ns.update(np=np, table=np.arange(2 * MiB, dtype=np.float64))
    cell = "s = []\nfor i in range(4):\n    s.append(float(table[i::4].sum()))\n"
    ip.run_cell_magic("gpu_parallel", "--quiet --schedule static", cell)
    expect = [float(np.arange(2 * MiB, dtype=np.float64)[i::4].sum()) for i in range(4)]
    assert ip.user_ns["s"] == expect
    assert gpucell.last_run.shared_bytes >= 2 * 16 * MiB  # one mapping per engine
    assert leftovers(cluster) == []  # released once both engines had it
    ip.run_cell_magic("gpu_parallel", "--quiet --schedule static", cell)
    assert gpucell.last_run.shared_bytes == 0  # cached on the engines
    assert ip.user_ns["s"] == expect


@pytest.mark.cluster
def test_shm_can_be_turned_off_and_failures_leave_no_files(ip, cluster):
    ip.user_ns.update(np=np, MiB=MiB)
    ip.run_line_magic("config", "GpuCell.shared_memory = False")
    try:
        ip.run_cell_magic(
            "gpu_parallel",
            "--quiet",
            "r = []\nfor i in range(4):\n    r.append(np.ones(MiB))\n",
        )
        assert gpucell.last_run.shared_bytes == 0
        assert all((x == 1).all() for x in ip.user_ns["r"])
    finally:
        ip.run_line_magic("config", "GpuCell.shared_memory = True")
    ip.user_ns.pop("bad", None)
    with pytest.raises(ValueError, match="iteration 7"):
        ip.run_cell_magic(
            "gpu_parallel",
            "--quiet --schedule dynamic --chunksize 1",
            "bad = []\nfor i in range(8):\n"
            "    if i == 7:\n        raise ValueError('iteration 7')\n"
            "    bad.append(np.ones(MiB))\n",
        )
    assert ip.user_ns["bad"] == []  # the prelude ran; nothing from the loop merged
    assert leftovers(cluster) == []
