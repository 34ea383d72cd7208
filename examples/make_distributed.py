"""Write examples/notebooks/distributed.ipynb from the cells below (kept as code so
the notebook diff stays reviewable).  Run: python examples/make_distributed.py

The notebook trains one small model twice with the same cell: serially in the
kernel, then with ``%%gpu_distributed`` across the engines (DDP), and shows the
two loss curves side by side.  Run it headless with
``python examples/run_quickstart.py examples/notebooks/distributed.ipynb``.
"""

from __future__ import annotations

from pathlib import Path

import nbformat
from notebook_cells import notebook

TRAIN = (
    "dev = gpucell.device()\n"
    "model = gpucell.ddp(copy.deepcopy(net))   # the one changed line\n"
    "opt = torch.optim.SGD(model.parameters(), lr=0.2, momentum=0.9)\n"
    "history = []\n"
    "for epoch in range(4):\n"
    "    for xb, yb in gpucell.shard(loader):\n"
    "        opt.zero_grad()\n"
    "        loss = nn.functional.cross_entropy(model(xb.to(dev)), yb.to(dev))\n"
    "        loss.backward()\n"
    "        opt.step()\n"
    "        history.append(loss.item())\n"
    "    print(f'epoch {epoch}: loss {history[-1]:.4f}')"
)

CELLS = [
    (
        "md",
        "# One model on every GPU: `%%gpu_distributed`\n\n"
        "The same training cell, first serially in the kernel, then as one "
        "`torch.distributed` job across the cluster's engines (DDP, one rank per "
        "GPU; CPU engines and gloo stand in without GPUs). The kernel keeps using "
        "torch (or CUDA) as it likes: the ranks are the engines, separate "
        "processes pinned to their GPU before CUDA starts.",
    ),
    ("code", "%load_ext gpucell\n%gpu_cluster start"),
    (
        "code",
        "import copy\n"
        "import time\n"
        "import gpucell\n"
        "import torch\n"
        "from torch import nn\n"
        "from torch.utils.data import DataLoader, TensorDataset\n"
        "\n"
        "ranks = len(gpucell.current().live_ids())\n"
        "\n"
        "class Net(nn.Module):\n"
        "    def __init__(self):\n"
        "        super().__init__()\n"
        "        self.body = nn.Sequential(nn.Linear(20, 64), nn.ReLU(), "
        "nn.Linear(64, 2))\n"
        "\n"
        "    def forward(self, x):\n"
        "        return self.body(x)\n"
        "\n"
        "torch.manual_seed(0)\n"
        "X = torch.randn(2048, 20)\n"
        "Y = (X[:, :5].sum(1) > 0).long()\n"
        "net = Net()\n"
        "# each rank takes batch_size / ranks items of every batch\n"
        "loader = DataLoader(TensorDataset(X, Y), batch_size=32 * ranks)\n"
        "ranks",
    ),
    (
        "md",
        "## Serially, in the kernel\n\n"
        "`gpucell.ddp(model)` moves the model to `gpucell.device()` and, where a "
        "process group is initialised, wraps it in `DistributedDataParallel`; "
        "`gpucell.shard(loader)` gives each rank its part of every batch. In the "
        "kernel there is no group, so both hand back what they got: this is the "
        "plain single-device cell.",
    ),
    ("code", "t0 = time.time()\n" + TRAIN + "\nserial_seconds = time.time() - t0"),
    ("code", "serial_model, serial_history = model, history"),
    (
        "md",
        "## The same cell on every engine\n\n"
        "`--out model,history@all` brings rank 0's model (unwrapped, on the CPU) "
        "and every rank's loss list back into the notebook. Without `--out` the "
        "notebook's namespace would not change.",
    ),
    ("code", "%%gpu_distributed --out model,history@all\n" + TRAIN),
    (
        "md",
        "Each rank's loss is on its part of the batch; their mean is the loss on "
        "the whole batch, and DDP averages the gradients, so both runs take the "
        "same steps (to float rounding):",
    ),
    (
        "code",
        "dist_history = [sum(step) / len(step) for step in zip(*history)]\n"
        "worst = max(abs(a - b) for a, b in zip(dist_history, serial_history))\n"
        "weights = max(\n"
        "    (a - b).abs().max().item()\n"
        "    for a, b in zip(model.state_dict().values(),\n"
        "                    serial_model.state_dict().values())\n"
        ")\n"
        "print(f'{len(dist_history)} steps on {len(history)} ranks; largest loss '\n"
        "      f'difference {worst:.2e}, largest weight difference {weights:.2e}')",
    ),
    (
        "code",
        "try:\n"
        "    import matplotlib.pyplot as plt\n"
        "except ImportError:  # no matplotlib: the curves as a table\n"
        "    plt = None\n"
        "if plt is not None:\n"
        "    fig, (a, b) = plt.subplots(1, 2, figsize=(10, 3.5), sharey=True)\n"
        "    a.plot(serial_history)\n"
        "    a.set_title('serial, in the kernel')\n"
        "    b.plot(dist_history, color='tab:orange')\n"
        "    b.set_title(f'%%gpu_distributed, {len(history)} ranks')\n"
        "    for ax in (a, b):\n"
        "        ax.set_xlabel('step')\n"
        "    a.set_ylabel('loss')\n"
        "    plt.show()\n"
        "else:\n"
        "    print(f\"{'step':>4}  {'serial':>8}  {'distributed':>11}\")\n"
        "    for i in range(0, len(dist_history), 8):\n"
        "        print(f'{i:>4}  {serial_history[i]:>8.4f}  "
        "{dist_history[i]:>11.4f}')",
    ),
    (
        "md",
        "## Built in one cell, trained in the next\n\n"
        "The process group and each rank's namespace are kept between cells, as "
        "a notebook is worked in: build the model in one cell, train it in "
        "another, bring it back when you want it.",
    ),
    (
        "code",
        "%%gpu_distributed\n"
        "big = gpucell.ddp(Net())\n"
        "opt = torch.optim.Adam(big.parameters(), lr=1e-3)\n"
        "steps = 0",
    ),
    (
        "code",
        "%%gpu_distributed --out steps\n"
        "for xb, yb in gpucell.shard(loader):\n"
        "    opt.zero_grad()\n"
        "    nn.functional.cross_entropy(big(xb.to(gpucell.device())),\n"
        "                                yb.to(gpucell.device())).backward()\n"
        "    opt.step()\n"
        "    steps += 1",
    ),
    ("code", "%gpu_distributed"),
    ("code", "print(gpucell.last_run.summary())"),
    ("code", "%gpu_cluster stop"),
]


def build() -> nbformat.NotebookNode:
    return notebook(CELLS)


if __name__ == "__main__":
    out = Path(__file__).parent / "notebooks" / "distributed.ipynb"
    nbformat.write(build(), out)
    print(f"wrote {out}")
