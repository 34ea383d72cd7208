"""Results written into the chunk's shared-memory file while the loop computes.

The copy-landed event is the one CUDA object in the path: a CPU tensor with an event
whose ``synchronize`` is a no-op stands in for a pinned copy that has landed (the
real GPU path is tests/test_tohost.py's gpu test and ``bench/gpu_proof.py``)."""

from __future__ import annotations

import errno
import os

import torch

from gpucell.engine import writebehind
from gpucell.protocol import shm, wire

MiB = 1 << 20


class Landed:
    """A copy that has landed (``torch.cuda.Event`` where there is a GPU)."""

    def __init__(self) -> None:
        self.waited = 0

    def synchronize(self) -> None:
        self.waited += 1


def files(ch) -> list[str]:
    return sorted(n for n in os.listdir(ch.directory) if "probe" not in n)


def count_writes(monkeypatch) -> list[int]:
    sizes: list[int] = []
    real = shm.write_all

    def spy(fd, view, at):
        sizes.append(view.nbytes)
        real(fd, view, at)

    monkeypatch.setattr(shm, "write_all", spy)
    return sizes


def test_the_spill_reuses_what_was_written_ahead_and_adds_the_rest(
    channel, monkeypatch
):
    early = [torch.full((MiB // 4,), float(i)) for i in range(3)]  # 1 MiB each
    late = torch.arange(MiB // 2, dtype=torch.float64)  # 4 MiB, recorded at the end
    small = torch.ones(10)  # stays in the message
    wb = writebehind.start(channel, "c1")
    assert wb is not None
    events = [Landed() for _ in early]
    for t, e in zip(early, events, strict=True):
        wb.add(t, e)
    wb.add(small, Landed())
    pre = wb.finish()
    assert pre is not None and len(pre.written) == 3
    assert [e.waited for e in events] == [1, 1, 1]
    sizes = count_writes(monkeypatch)
    value = {"early": early, "late": late, "small": small}
    frames = shm.spill(wire.dumps(value), channel, "c1", pre)
    assert shm.spilled(frames)
    assert sizes == [late.numel() * 8]  # only what was not written ahead
    back = wire.loads(shm.unspill(frames))
    assert all(torch.equal(a, b) for a, b in zip(back["early"], early, strict=True))
    assert torch.equal(back["late"], late) and torch.equal(back["small"], small)
    assert files(channel) == []  # the kernel unlinked it on mapping


def test_a_failed_write_ahead_leaves_no_file_and_the_spill_writes_everything(
    channel, monkeypatch
):
    def full(*_a):
        raise OSError(errno.ENOSPC, "No space left on device")

    wb = writebehind.start(channel, "c2")
    assert wb is not None
    monkeypatch.setattr(shm, "write_all", full)
    ts = [torch.full((MiB // 4,), float(i)) for i in range(2)]
    for t in ts:
        wb.add(t, Landed())
    assert wb.finish() is None
    assert files(channel) == []
    monkeypatch.undo()
    frames = shm.spill(wire.dumps(ts), channel, "c2", None)
    assert shm.spilled(frames)
    assert all(
        torch.equal(a, b)
        for a, b in zip(wire.loads(shm.unspill(frames)), ts, strict=True)
    )


def test_a_failed_chunk_discards_the_file(channel):
    wb = writebehind.start(channel, "c3")
    assert wb is not None
    wb.add(torch.ones(MiB), Landed())
    wb.discard()
    wb._join()
    assert files(channel) == []


def test_an_unsendable_result_discards_what_was_written(channel):
    wb = writebehind.start(channel, "c4")
    wb.add(torch.ones(MiB), Landed())
    pre = wb.finish()
    assert pre is not None and files(channel) != []
    shm.discard(pre)
    assert files(channel) == []


def test_no_write_ahead_beyond_the_room_of_shm_or_without_a_channel(channel, tmp_path):
    assert writebehind.start(None, "x") is None
    elsewhere = shm.Channel(token="999999-nothere", directory=str(tmp_path))
    assert writebehind.start(elsewhere, "x") is None  # another host
    wb = writebehind.start(channel, "c5")
    wb._limit = 3 * MiB
    kept = [torch.ones(MiB // 4) for _ in range(5)]  # 1 MiB each
    for t in kept:
        wb.add(t, Landed())
    pre = wb.finish()
    assert pre is not None and len(pre.written) == 3  # the rest waits for the spill
    frames = shm.spill(wire.dumps(kept), channel, "c5", pre)
    back = wire.loads(shm.unspill(frames))
    assert all(torch.equal(a, b) for a, b in zip(back, kept, strict=True))


def test_a_result_without_big_buffers_removes_the_file(channel):
    wb = writebehind.start(channel, "c6")
    wb.add(torch.ones(MiB), Landed())
    pre = wb.finish()
    frames = wire.dumps(3)  # the big value never made it into the result
    assert shm.spill(frames, channel, "c6", pre) == frames or not shm.spilled(frames)
    assert files(channel) == []
