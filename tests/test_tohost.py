"""GPU results copied to the host as they are recorded (tohost.py).

The copier's only GPU-specific part is the copy itself; here the recorder's use of
it is checked through the same two-method interface (call, wait) with a stand-in
that records what passes, and the real copy runs where a GPU exists.
"""

from __future__ import annotations

import pytest
import torch

from gpucell.core.analysis import analyse, make_chunker
from gpucell.engine.chunk import run_chunk
from gpucell.engine.tohost import HostCopier, copier

CELL = """# %%gpu_parallel
outs = []
table = {}
total = 0
for i in range(6):
    y = base * i
    outs.append((y, [y + 1]))
    table[i] = y
    total += y
"""


def chunk(to_host, device="cpu", inputs=None):
    plan = analyse(CELL, filename="<t>", known_names=frozenset({"base"}))
    ch = make_chunker(plan.iter_space, [range(6)])
    inputs = inputs or {"base": torch.ones(3)}
    return run_chunk(plan.engine_program(), inputs, ch.chunk(0, 6), 0, to_host=to_host)


class Recording:
    """Stands in for the GPU copy: marks what it was given, counts waits."""

    def __init__(self) -> None:
        self.seen: list[object] = []
        self.waits = 0

    def __call__(self, value):
        self.seen.append(value)
        return ("moved", value)

    def wait(self) -> None:
        self.waits += 1


def test_only_gpu_engines_get_a_copier():
    assert copier("cpu") is None and copier(None) is None
    assert isinstance(copier("cuda"), HostCopier)
    assert isinstance(copier(torch.device("cuda", 0)), HostCopier)


def test_cpu_values_pass_through_unchanged():
    c = HostCopier()
    t = torch.arange(4)
    value = [t, (t, {"k": t}), 3, "s"]
    got = c(value)
    assert got[0] is t and got[1][0] is t and got[1][1]["k"] is t
    assert got[2:] == [3, "s"]
    c.wait()  # nothing in flight: returns at once


def test_every_recorded_value_goes_through_the_copier_and_is_awaited_once():
    rec = Recording()
    r = chunk(rec)
    assert rec.waits == 1
    # gathered and written values as recorded, the rest at the end
    assert [g[0] for g in r.gathers["outs"]] == ["moved"] * 6
    assert [v[0] for _, v in r.writes["table"]] == ["moved"] * 6
    assert r.reductions["total"][1][0] == "moved"
    assert r.last_values["y"][2][0] == "moved"
    plain = chunk(None)
    assert torch.equal(plain.gathers["outs"][5][0], torch.full((3,), 5.0))


@pytest.mark.gpu
def test_cuda_results_come_back_as_pinned_host_tensors():
    base = torch.ones(1 << 20, device="cuda")
    r = chunk(copier("cuda"), inputs={"base": base})
    y, (y1,) = r.gathers["outs"][5]
    assert y.device.type == "cpu" and y.is_pinned() and bool((y == 5).all())
    assert y1.device.type == "cpu" and bool((y1 == 6).all())
    assert r.reductions["total"][1].device.type == "cpu"
    assert bool((r.reductions["total"][1] == 15).all())


@pytest.mark.gpu
def test_cuda_results_are_in_the_result_file_before_the_chunk_ends(
    tmp_path, monkeypatch
):
    """Write-behind on a real GPU: the copies land in /dev/shm during the loop, the
    spill at the end writes none of them again, and the kernel reads them back."""
    from gpucell.cluster import shm_channel
    from gpucell.engine import writebehind
    from gpucell.protocol import shm, wire

    ch = shm_channel.open_channel(str(tmp_path))
    try:
        c = copier("cuda")
        wb = writebehind.start(ch, "t")
        c.sink = wb.add
        base = torch.ones(1 << 20, device="cuda")  # 4 MiB results
        r = chunk(c, inputs={"base": base})
        pre = wb.finish()
        assert pre is not None and len(pre.written) >= 6
        late: list[int] = []
        real = shm.write_all
        monkeypatch.setattr(
            shm, "write_all", lambda fd, v, at: (late.append(v.nbytes), real(fd, v, at))
        )
        frames = shm.spill(wire.dumps(r.gathers["outs"]), ch, "t", pre)
        assert shm.spilled(frames) and late == []
        back = wire.loads(shm.unspill(frames))
        assert [float(y[0]) for y, _ in back] == [0.0, 1.0, 2.0, 3.0, 4.0, 5.0]
        assert [float(y1[0]) for _, (y1,) in back] == [1.0, 2.0, 3.0, 4.0, 5.0, 6.0]
    finally:
        shm_channel.close_channel(ch)
