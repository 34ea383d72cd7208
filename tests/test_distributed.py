"""``%%gpu_distributed``: one torch.distributed job on the cluster's engines (gloo
on CPU engines), with a real IPython shell and real engines.

The cells that fail on purpose run last, on the module's private cluster (a
rank is interrupted when another fails, and SIGINT lands anywhere in an engine).
"""

from __future__ import annotations

import ast
import time

import pytest

import gpucell
from gpucell.errors import RankFailed
from gpucell.kernel import distributed as dm

pytestmark = pytest.mark.cluster

torch = pytest.importorskip("torch")


@pytest.fixture(scope="module", autouse=True)
def _no_group_left_behind():
    """The ranks leave the group (and drop their names) once the module is done,
    so the session cluster's engines hold nothing of it."""
    yield
    dm.stop_group(echo=lambda _s: None)


# -- pure parts ----------------------------------------------------------------


def test_names_the_cell_reads_before_binding_them():
    src = (
        "import torch.distributed as dist\n"
        "model = build(width)\n"
        "total += 1\n"
        "def step(x):\n"
        "    return model(x) * scale\n"
        "ys = [step(x) for x in xs]\n"
        "model = model.train()\n"
    )
    assert dm.names_read(ast.parse(src)) == ["build", "width", "total", "scale", "xs"]


def test_out_names_are_checked():
    assert dm.parse_out("model, history@all") == ("model", "history@all")
    with pytest.raises(ValueError, match="history@all"):
        dm.parse_out("model,history@some")


def test_the_helpers_pass_through_without_a_group():
    """Serially (no process group) the same cell runs unchanged in the kernel."""
    net = torch.nn.Linear(2, 1)
    assert gpucell.ddp(net) is net
    loader = torch.utils.data.DataLoader(list(range(8)), batch_size=4)
    assert gpucell.shard(loader) is loader


def test_the_example_notebook_is_generated_from_its_script():
    import sys
    from pathlib import Path

    import nbformat

    root = Path(__file__).resolve().parent.parent
    sys.path.insert(0, str(root / "examples"))
    try:
        from make_distributed import build
    finally:
        sys.path.pop(0)
    on_disk = nbformat.read(root / "examples/notebooks/distributed.ipynb", as_version=4)
    assert [c.source for c in on_disk.cells] == [c.source for c in build().cells]


# -- on the session cluster -------------------------------------------------------

SETUP = """
import copy
import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset
torch.manual_seed(0)
net = nn.Sequential(nn.Linear(8, 16), nn.Tanh(), nn.Linear(16, 1))
X, Y = torch.randn(64, 8), torch.randn(64, 1)
loader = DataLoader(TensorDataset(X, Y), batch_size=16)
"""

#: the training cell a single process runs; on the ranks the same text (its one
#: changed line, gpucell.ddp, passes the model through when there is no group)
TRAIN = """
model = gpucell.ddp(copy.deepcopy(net))
opt = torch.optim.SGD(model.parameters(), lr=0.1)
history = []
for epoch in range(3):
    for xb, yb in gpucell.shard(loader):
        opt.zero_grad()
        loss = nn.functional.mse_loss(model(xb), yb)
        loss.backward()
        opt.step()
        history.append(loss.item())
"""


def test_ddp_on_two_ranks_ends_with_the_weights_of_one_process(ip, cluster, capsys):
    """Each rank trains on half of every batch; DDP averages the gradients, so
    after 12 steps the weights are those of one process on the whole batches,
    and --out model puts that model (unwrapped, a plain module) in the notebook.
    The kernel has used torch (and trained this model) before the first
    distributed cell."""
    ip.run_cell("import gpucell")
    ip.run_cell(SETUP)
    ip.run_cell(TRAIN)  # serially, in the kernel: the reference
    serial = {k: v.clone() for k, v in ip.user_ns["model"].state_dict().items()}
    serial_history = list(ip.user_ns["history"])
    ip.user_ns["model"] = "before"
    capsys.readouterr()

    ip.run_cell_magic("gpu_distributed", "--out model,history@all", TRAIN)

    out = capsys.readouterr().out
    assert "in the notebook now: model (rank 0), history (every rank)" in out
    model = ip.user_ns["model"]
    assert type(model) is torch.nn.Sequential  # not DistributedDataParallel
    for k, v in model.state_dict().items():
        assert v.device.type == "cpu"
        torch.testing.assert_close(v, serial[k], rtol=1e-5, atol=1e-6)
    history = ip.user_ns["history"]
    assert len(history) == 2 and all(len(h) == 12 for h in history)
    # each rank's loss is on its half batch; their mean is the whole batch's
    first = (history[0][0] + history[1][0]) / 2
    assert first == pytest.approx(serial_history[0], rel=1e-5)
    rec = gpucell.last_run
    assert rec.status == "ok" and rec.backend == "gloo"
    assert sorted(c.engine for c in rec.chunks) == sorted(cluster.live_ids())


def test_a_model_built_in_one_cell_is_trained_in_the_next(ip, cluster, capsys):
    """The ranks keep their namespace: a notebook-defined class's model built and
    wrapped in one cell goes on training (same optimizer) in the next ones; a
    cell without --out leaves the notebook's namespace as it was, and says so."""
    ip.run_cell(
        "class Net(nn.Module):\n"
        "    def __init__(self):\n"
        "        super().__init__()\n"
        "        self.lin = nn.Linear(8, 1)\n"
        "    def forward(self, x):\n"
        "        return self.lin(x) * scale\n"
        "scale = 2.0\n"
        "steps = 0\n"
        "net2 = 'older, from the notebook'\n"
    )
    before = dict(ip.user_ns)
    capsys.readouterr()
    ip.run_cell_magic(
        "gpu_distributed",
        "",
        "torch.manual_seed(1)\n"
        "net2 = gpucell.ddp(Net())\n"
        "opt2 = torch.optim.SGD(net2.parameters(), lr=0.05, momentum=0.9)\n",
    )
    out = capsys.readouterr().out
    assert "the notebook's namespace is unchanged (no --out)" in out
    assert "net2" in out and "opt2" in out  # the ranks keep them
    assert ip.user_ns.keys() == before.keys()
    # the ranks' net2 wins over the notebook's older one of the same name
    assert ip.user_ns["net2"] == "older, from the notebook"
    step = (
        "for xb, yb in gpucell.shard(loader):\n"
        "    opt2.zero_grad()\n"
        "    nn.functional.mse_loss(net2(xb), yb).backward()\n"
        "    opt2.step()\n"
        "steps += 1\n"
        "momentum = sum(len(s) for s in opt2.state.values())\n"
    )
    ip.run_cell_magic("gpu_distributed", "--quiet", step)
    ip.run_cell_magic("gpu_distributed", "--quiet --out net2,steps,momentum", step)
    assert ip.user_ns["steps"] == 2  # the ranks' own count, from the notebook's 0
    assert ip.user_ns["momentum"] == 2  # the optimizer of the first cell, kept
    assert type(ip.user_ns["net2"]) is ip.user_ns["Net"]  # the notebook's class
    # a name the notebook changes is sent again; one it leaves alone is not
    ip.run_cell("scale = 3.0")
    ip.run_cell_magic("gpu_distributed", "--quiet --out s", "s = (scale, steps)")
    assert ip.user_ns["s"] == (3.0, 2)


def test_output_of_every_rank_tagged_and_the_torchrun_variables(ip, cluster, capsys):
    ip.run_cell_magic(
        "gpu_distributed",
        "--ranks all --quiet --out env@all",
        "import os\n"
        "env = {k: os.environ[k] for k in ('RANK', 'LOCAL_RANK', 'WORLD_SIZE',\n"
        "       'LOCAL_WORLD_SIZE', 'MASTER_ADDR', 'MASTER_PORT')}\n"
        "print('hello from', env['RANK'])\n",
    )
    out = capsys.readouterr().out
    assert "[rank 0] hello from 0" in out and "[rank 1] hello from 1" in out
    env = ip.user_ns["env"]
    assert [e["RANK"] for e in env] == ["0", "1"]
    assert [e["LOCAL_RANK"] for e in env] == ["0", "1"]
    assert {e["WORLD_SIZE"] for e in env} == {"2"}
    assert {e["LOCAL_WORLD_SIZE"] for e in env} == {"2"}
    assert {e["MASTER_ADDR"] for e in env} == {"127.0.0.1"}
    assert len({e["MASTER_PORT"] for e in env}) == 1
    ip.run_cell_magic("gpu_distributed", "", "print('only rank 0 speaks')\n")
    out = capsys.readouterr().out
    assert out.count("only rank 0 speaks") == 1 and "[rank" not in out
    ip.run_line_magic("gpu_distributed", "")
    assert "process group: 2 ranks, gloo" in capsys.readouterr().out


def test_stop_ends_the_group_and_a_busy_engine_is_waited_for(ip, cluster, capsys):
    """`%gpu_distributed stop`: the ranks leave the group and drop their names;
    the next cell forms a new group, waiting (and saying so) for an engine still
    busy with earlier work instead of leaving the others in the rendezvous."""
    ip.run_line_magic("gpu_distributed", "stop")
    assert "the ranks dropped their names" in capsys.readouterr().out
    busy = cluster.live_ids()[1]
    ar = cluster.client[busy].apply_async(time.sleep, 5.0)  # said after 2 s
    deadline = time.monotonic() + 5  # the hub hears of the task a moment later
    while time.monotonic() < deadline:
        q = cluster.client.queue_status(targets=[busy], verbose=False)
        if q.get(busy, {}).get("queue"):
            break
        time.sleep(0.05)
    ip.run_cell_magic(
        "gpu_distributed", "--quiet --out kept", "kept = 'net2' in globals()"
    )
    ar.get(10)
    out = capsys.readouterr().out
    assert f"waiting for engine {busy} (busy with earlier work)" in out
    assert ip.user_ns["kept"] is False


@pytest.mark.gpu
def test_nccl_on_every_gpu_with_a_kernel_that_uses_cuda(ip, no_active_cluster):
    """On a GPU machine: one rank per GPU with nccl; a CUDA tensor of the
    kernel's lands on each rank's GPU, and results come back as CPU objects."""
    c = gpucell.start_cluster(gpus="all")
    try:
        ip.run_cell("import torch\nkernel_t = torch.arange(4.0, device='cuda')")
        ip.run_cell_magic(
            "gpu_distributed",
            "--quiet --out t,where@all,lin",
            "import torch.distributed as dist\n"
            "where = (str(kernel_t.device), dist.get_backend())\n"
            "t = kernel_t * (dist.get_rank() + 1)\n"
            "dist.all_reduce(t)\n"
            "lin = gpucell.ddp(torch.nn.Linear(4, 1))\n"
            "lin(t[None]).sum().backward()\n",
        )
        n = len(c.live_ids())
        t = ip.user_ns["t"]
        assert t.device.type == "cpu"
        torch.testing.assert_close(t, torch.arange(4.0) * (n * (n + 1) / 2))
        assert all(w == ("cuda:0", "nccl") for w in ip.user_ns["where"])
        assert next(ip.user_ns["lin"].parameters()).device.type == "cpu"
    finally:
        gpucell.stop()


# -- failures, on the module's own cluster ------------------------------------------


def test_an_exception_on_rank_1_stops_rank_0_and_names_it(ip, private_cluster, capsys):
    """Rank 0 waits in a collective for rank 1, which raises: rank 0 is out of
    its all_reduce at once (rank 1 aborted its group), the error names rank 1,
    its host and line, and the next cell re-forms the group, saying so."""
    host = private_cluster.engines[private_cluster.ids[1]].host
    ip.user_ns["result"] = "untouched"
    t0 = time.monotonic()
    with pytest.raises(RankFailed) as err:
        ip.run_cell_magic(
            "gpu_distributed",
            "--out result",
            "import torch.distributed as dist\n"
            "if dist.get_rank() == 1:\n"
            "    raise ValueError('bad batch')\n"
            "dist.all_reduce(torch.ones(1))\n"
            "result = 'rank 0 went on'\n",
        )
    assert time.monotonic() - t0 < 20  # not the 300 s collective timeout
    msg = str(err.value)
    assert (
        f"rank 1 (engine {private_cluster.ids[1]} on {host}) raised ValueError" in msg
    )
    assert "at line 4: `raise ValueError('bad batch')`" in msg
    assert "ValueError: bad batch" in msg
    assert "rank 0 stopped in all_reduce at line 5" in msg
    assert ip.user_ns["result"] == "untouched"
    assert gpucell.last_run.status == "error"
    capsys.readouterr()
    ip.run_cell_magic("gpu_distributed", "--out result", "result = dist.get_rank()\n")
    out = capsys.readouterr().out
    assert "process group re-formed: rank 1 failed in the last cell" in out
    assert ip.user_ns["result"] == 0


def test_a_rank_failing_mid_epoch_names_it_and_changes_nothing(ip, private_cluster):
    """DDP training where rank 1 raises in the second epoch, between steps:
    rank 0 (in DDP's all_reduce) stops, the error names rank 1 and its line,
    the notebook's names are as before the cell, and the next cell trains on a
    re-formed group to the serial weights."""
    import re

    failing = TRAIN.replace(
        "        history.append(loss.item())\n",
        "        history.append(loss.item())\n"
        "        if epoch == 1 and len(history) == 6 "
        "and torch.distributed.get_rank() == 1:\n"
        "            raise RuntimeError('bad batch on rank 1')\n",
    )
    ip.run_cell("import gpucell")
    ip.run_cell(SETUP)
    ip.run_cell(TRAIN)  # the serial reference
    serial = {k: v.clone() for k, v in ip.user_ns["model"].state_dict().items()}
    ip.user_ns["model"] = ip.user_ns["history"] = "untouched"
    host = private_cluster.engines[private_cluster.ids[1]].host
    t0 = time.monotonic()
    with pytest.raises(RankFailed) as err:
        ip.run_cell_magic("gpu_distributed", "--quiet --out model,history", failing)
    assert time.monotonic() - t0 < 20  # not the collective timeout
    msg = str(err.value)
    assert (
        f"rank 1 (engine {private_cluster.ids[1]} on {host}) raised RuntimeError" in msg
    )
    assert re.search(r"at line \d+: `raise RuntimeError\('bad batch on rank 1'\)`", msg)
    assert "RuntimeError: bad batch on rank 1" in msg
    assert "The other ranks: rank 0 " in msg
    assert "Nothing in the notebook changed" in msg
    assert ip.user_ns["model"] == "untouched" and ip.user_ns["history"] == "untouched"
    assert gpucell.last_run.status == "error"
    ip.run_cell_magic("gpu_distributed", "--out model", TRAIN)
    for k, v in ip.user_ns["model"].state_dict().items():
        torch.testing.assert_close(v, serial[k], rtol=1e-5, atol=1e-6)


def test_a_rank_busy_outside_any_collective_is_interrupted(ip, private_cluster):
    """Rank 0 computes (no collective to fail) when rank 1 raises: the kernel
    interrupts it, and the cell ends within seconds."""
    t0 = time.monotonic()
    with pytest.raises(RankFailed, match="raised KeyError") as err:
        ip.run_cell_magic(
            "gpu_distributed",
            "--quiet",
            "import time\n"
            "if dist.get_rank() == 1:\n"
            "    {}['missing']\n"
            "while True:\n"
            "    time.sleep(0.01)\n",
        )
    assert time.monotonic() - t0 < 15
    assert "rank 0 was interrupted at line" in str(err.value)


def test_a_skipped_collective_is_reported_at_its_timeout(ip, private_cluster):
    t0 = time.monotonic()
    with pytest.raises(RankFailed) as err:
        ip.run_cell_magic(
            "gpu_distributed",
            "--timeout 2 --quiet",
            "if dist.get_rank() == 0:\n    dist.all_reduce(torch.ones(1))\n",
        )
    elapsed = time.monotonic() - t0
    assert 2 <= elapsed < 15, elapsed
    msg = str(err.value)
    assert "rank 0 (engine" in msg and "waited 2 s (--timeout) in all_reduce" in msg
    assert "at line 3: `dist.all_reduce(torch.ones(1))`" in msg
    assert "rank 1 never called it (it finished the cell)" in msg
    # the group is formed again for the next cell, which runs
    ip.run_cell_magic("gpu_distributed", "--quiet --out n", "n = dist.get_world_size()")
    assert ip.user_ns["n"] == 2


def test_the_stop_button_stops_every_rank(ip, private_cluster):
    from helpers import press_stop

    pressed = press_stop(1.0)
    t0 = time.monotonic()
    try:
        with pytest.raises(KeyboardInterrupt, match="every rank stopped"):
            ip.run_cell_magic(
                "gpu_distributed",
                "--quiet",
                "import time\n"
                "while True:\n"
                "    dist.all_reduce(torch.ones(1))\n"
                "    time.sleep(0.01)\n",
            )
    finally:
        pressed.set()
    assert time.monotonic() - t0 < 1.0 + 8
    assert gpucell.last_run.status == "interrupted"
    ip.run_cell_magic("gpu_distributed", "--quiet --out n", "n = dist.get_world_size()")
    assert ip.user_ns["n"] == 2


def test_the_stop_button_stops_ddp_training_on_every_rank(ip, private_cluster):
    """The stop button during DDP training (ranks in DDP's all_reduce, in C++,
    where SIGINT waits): every rank stops within seconds, the notebook's model
    is untouched, and the next cell trains on a re-formed group."""
    from helpers import press_stop

    endless = TRAIN.replace("for epoch in range(3):", "for epoch in range(10**6):")
    ip.run_cell("import gpucell")
    ip.run_cell(SETUP)
    ip.user_ns["model"] = "untouched"
    pressed = press_stop(1.5)
    t0 = time.monotonic()
    try:
        with pytest.raises(KeyboardInterrupt, match="every rank stopped"):
            ip.run_cell_magic("gpu_distributed", "--quiet --out model", endless)
    finally:
        pressed.set()
    assert time.monotonic() - t0 < 1.5 + 8
    assert ip.user_ns["model"] == "untouched"
    ip.run_cell_magic("gpu_distributed", "--quiet --out n", "n = dist.get_world_size()")
    assert ip.user_ns["n"] == 2


def test_a_killed_engine_ends_the_cell_and_the_group_is_formed_again(
    ip, private_cluster, capsys
):
    """Rank 1's engine is killed mid-cell: the cell ends within seconds naming
    it, the engine is restarted on its device, and the next cell forms the
    group on the engines alive then (saying which names the new rank lacks)."""
    import os
    import signal
    import threading

    ip.run_cell_magic("gpu_distributed", "--quiet", "made_on_ranks = 1")
    victim = private_cluster.ids[1]
    pid = private_cluster.engines[victim].pid
    threading.Timer(1.0, os.kill, (pid, signal.SIGKILL)).start()
    t0 = time.monotonic()
    with pytest.raises(RankFailed, match=f"engine {victim} on .*\\) died"):
        ip.run_cell_magic(
            "gpu_distributed",
            "--quiet",
            "import time\n"
            "for i in range(400):\n"
            "    dist.all_reduce(torch.ones(1))\n"
            "    time.sleep(0.05)\n",
        )
    assert time.monotonic() - t0 < 1.0 + 8
    deadline = time.monotonic() + 30  # restarted in the background
    while len(private_cluster.live_ids()) < 2 and time.monotonic() < deadline:
        gpucell.status()
        time.sleep(0.2)
    capsys.readouterr()
    ip.run_cell_magic(
        "gpu_distributed",
        "--out n",
        "import torch.distributed as dist\nn = dist.get_world_size()",
    )
    out = capsys.readouterr().out
    assert "process group re-formed" in out
    assert ip.user_ns["n"] == len(private_cluster.live_ids())
    if len(private_cluster.live_ids()) == 2:
        note = next(ln for ln in out.splitlines() if "lacks" in ln)
        assert "rank 1" in note and "made_on_ranks" in note
