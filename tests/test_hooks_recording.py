"""A hook on a model the loop uses that keeps what it sees in a notebook
container (``register_forward_hook(lambda m, i, o: acts.append(o.shape))``,
the forum's ``get_activation(name)`` closure writing ``activation[name]``):
the hook runs on the engines' copies, so what it records would stay there;
refused before anything runs (``kernel/preflight_functions``).  A hook that
keeps nothing of the notebook's runs."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")

from gpucell.errors import NotParallelizable  # noqa: E402

pytestmark = pytest.mark.cluster

SETUP = (
    "import torch\n"
    "net = torch.nn.Sequential(torch.nn.Linear(3, 4), torch.nn.ReLU())\n"
    "batches = [torch.ones(2, 3) * k for k in range(4)]\n"
    "outs = []\n"
    "acts = []\n"
    "activation = {}\n"
    "def get_activation(name):\n"
    "    def hook(model, inp, output):\n"
    "        activation[name] = output.detach()\n"
    "    return hook\n"
)
CELL = (
    "for b in batches:\n"
    "    with torch.no_grad():\n"
    "        outs.append(net(b).sum().item())\n"
)


@pytest.fixture
def shell(ip, cluster):
    ip.run_line_magic("config", "GpuCell.inline_below = 0")
    ip.run_cell(SETUP).raise_error()
    yield ip
    ip.run_line_magic("config", "GpuCell.inline_below = 0.005")


@pytest.mark.parametrize(
    "register",
    [
        "net[0].register_forward_hook(lambda m, i, o: acts.append(o.shape))",
        "net[1].register_forward_hook(get_activation('relu'))",
    ],
    ids=["lambda-into-a-list", "closure-into-a-dict"],
)
def test_a_hook_keeping_what_it_sees_in_the_notebook_is_refused(shell, register):
    shell.run_cell(register).raise_error()
    with pytest.raises(NotParallelizable, match="hook"):
        shell.run_cell_magic("gpu_parallel", "--quiet", CELL)
    assert shell.user_ns["outs"] == [] and shell.user_ns["acts"] == []
    assert shell.user_ns["activation"] == {}


def test_a_hook_that_keeps_nothing_runs(shell):
    shell.run_cell("net[1].register_forward_hook(lambda m, i, o: o * 2)").raise_error()
    shell.run_cell_magic("gpu_parallel", "--quiet", CELL)
    assert len(shell.user_ns["outs"]) == 4
