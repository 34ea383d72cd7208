"""``model.eval()`` (or ``model.train()``, ``model.train(False)``) as the
body's first use of a module from before the loop: each iteration sets the
mode before it runs the model, so no iteration depends on another's; the
engines take a change of mode alone for no change, and the kernel sets the
mode the body leaves at the merge (``LoopFacts.mode_calls``).  Compared with
the serial cell: outputs (dropout off) and the model's mode after."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")

from gpucell.core.analysis import analyse  # noqa: E402
from gpucell.errors import InputChanged  # noqa: E402

pytestmark = pytest.mark.cluster

SETUP = (
    "import torch\n"
    "torch.manual_seed(0)\n"
    "model = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.Dropout(0.5),"
    " torch.nn.Linear(8, 1))\n"
    "model.train()\n"
    "batches = [torch.ones(3, 4) * k for k in range(6)]\n"
    "outs = []\n"
)


@pytest.fixture
def shell(ip, cluster):
    ip.run_line_magic("config", "GpuCell.inline_below = 0")
    ip.run_cell(SETUP).raise_error()
    yield ip
    ip.run_line_magic("config", "GpuCell.inline_below = 0.005")


def _serial(cell: str) -> dict:
    ns: dict = {}
    exec(SETUP, ns)
    exec(cell, ns)
    return ns


def test_eval_first_in_the_body_runs_and_leaves_the_model_in_eval(shell):
    cell = (
        "for b in batches:\n"
        "    model.eval()\n"
        "    with torch.no_grad():\n"
        "        outs.append(model(b).sum().item())\n"
    )
    shell.run_cell_magic("gpu_parallel", "--quiet", cell)
    serial = _serial(cell)
    assert shell.user_ns["outs"] == pytest.approx(serial["outs"], rel=1e-6)
    model = shell.user_ns["model"]
    assert not model.training and not any(m.training for m in model.modules())


def test_the_last_mode_call_is_the_one_left(shell):
    cell = (
        "for b in batches:\n"
        "    model.eval()\n"
        "    with torch.no_grad():\n"
        "        outs.append(model(b).sum().item())\n"
        "    model.train()\n"
    )
    shell.run_cell_magic("gpu_parallel", "--quiet", cell)
    assert shell.user_ns["outs"] == pytest.approx(_serial(cell)["outs"], rel=1e-6)
    assert all(m.training for m in shell.user_ns["model"].modules())


def test_a_mode_set_after_the_model_ran_is_still_a_change():
    # serially the first iteration runs in train mode, the others in eval
    cell = "for b in batches:\n    outs.append(model(b))\n    model.eval()\n"
    plan = analyse(cell, known_names={"batches", "outs", "model"}, raise_errors=False)
    assert plan.facts.mode_calls == () and plan.watched()["modes"] == []


def test_other_changes_to_the_module_are_still_caught(shell):
    # (behind a call, where only the engines' check can see it)
    shell.run_cell(
        "def bump(m):\n    with torch.no_grad():\n        m[0].weight.add_(1.0)\n"
    ).raise_error()
    cell = "for b in batches:\n    model.eval()\n    bump(model)\n    outs.append(1)\n"
    before = shell.user_ns["model"][0].weight.clone()
    with pytest.raises(InputChanged, match="parameters"):
        shell.run_cell_magic("gpu_parallel", "--quiet", cell)
    model = shell.user_ns["model"]
    assert torch.equal(model[0].weight, before) and model.training
    assert shell.user_ns["outs"] == []
