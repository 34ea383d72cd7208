"""Write examples/notebooks/quickstart.ipynb from the cells below (kept as code so
the notebook diff stays reviewable).  Run: python examples/make_quickstart.py"""

from __future__ import annotations

from pathlib import Path

import nbformat
from notebook_cells import notebook

CELLS = [
    (
        "md",
        "# gpucell quickstart\n\nRun a cell's loop on every GPU of a cluster. "
        "On a machine without GPUs, CPU engines stand in for them, so this "
        "notebook runs anywhere.",
    ),
    ("code", "%load_ext gpucell"),
    (
        "md",
        "Start a local cluster: one engine per GPU, pinned to its device "
        "(one per core, each with its share of threads, when there is no GPU).",
    ),
    ("code", "%gpu_cluster start"),
    ("code", "%gpu_cluster status"),
    (
        "md",
        "Each engine knows its device: `cuda` (its own GPU, as `cuda:0`) on a GPU "
        "engine, `cpu` otherwise.",
    ),
    (
        "code",
        "import gpucell\n"
        "rc = gpucell.current().client\n"
        "rc[:].apply_sync(lambda: str(__import__('gpucell').device()))",
    ),
    ("md", "The same as a Python API:"),
    ("code", "[(e.id, e.device, e.name, e.threads) for e in gpucell.status()]"),
    (
        "md",
        "## A torch loop written for one GPU\n\n`%%gpu_parallel` runs the loop's "
        "iterations on every engine. The `.cuda()` calls land on each engine's own "
        "GPU; on CPU engines they are rewritten to the CPU (with a one-line note). "
        "`--dry-run` shows the plan without running anything.",
    ),
    (
        "code",
        "import torch\n"
        "from torch import nn\n"
        "\n"
        "class Net(nn.Module):\n"
        "    def __init__(self, hidden=128):\n"
        "        super().__init__()\n"
        "        self.fc1 = nn.Linear(64, hidden)\n"
        "        self.fc2 = nn.Linear(hidden, 10)\n"
        "\n"
        "    def forward(self, x):\n"
        "        return self.fc2(torch.relu(self.fc1(x)))\n"
        "\n"
        "torch.manual_seed(0)\n"
        "model = Net()\n"
        "batches = [torch.randn(256, 64) for _ in range(32)]",
    ),
    (
        "code",
        "%%gpu_parallel --dry-run\n"
        "scores = []\n"
        "for x in batches:\n"
        "    y = model.cuda()(x.cuda())\n"
        "    scores.append(y.softmax(-1).max(-1).values.mean().item())",
    ),
    (
        "code",
        "%%gpu_parallel\n"
        "scores = []\n"
        "for x in batches:\n"
        "    y = model.cuda()(x.cuda())\n"
        "    scores.append(y.softmax(-1).max(-1).values.mean().item())",
    ),
    ("code", "len(scores), round(sum(scores) / len(scores), 4)"),
    (
        "md",
        "## A hyper-parameter sweep: one model per setting\n\nEach iteration "
        "builds its own `Net`, trains it and keeps its loss. The notebook's logging "
        "works as it does serially: the records the loop logs reach the notebook's "
        "handlers in iteration order (here a file), and the kernel may use CUDA "
        "before and after the cell, with no restart.",
    ),
    (
        "code",
        "import logging\n"
        "logging.basicConfig(filename='sweep.log', level=logging.INFO, force=True,\n"
        "                    format='%(levelname)s %(name)s %(message)s')\n"
        "log = logging.getLogger('sweep')\n"
        "X, Y = torch.randn(512, 64), torch.randint(0, 10, (512,))\n"
        "loader = torch.utils.data.DataLoader(\n"
        "    torch.utils.data.TensorDataset(X, Y), batch_size=64)",
    ),
    (
        "code",
        "%%gpu_parallel\n"
        "losses = {}\n"
        "accuracy = {}\n"
        "for lr in [0.003, 0.01, 0.03, 0.1]:\n"
        "    torch.manual_seed(0)\n"
        "    net = Net().cuda()\n"
        "    opt = torch.optim.SGD(net.parameters(), lr=lr)\n"
        "    net.train()\n"
        "    for epoch in range(3):\n"
        "        for xb, yb in loader:\n"
        "            opt.zero_grad()\n"
        "            loss = nn.functional.cross_entropy(net(xb.cuda()), yb.cuda())\n"
        "            loss.backward()\n"
        "            opt.step()\n"
        "    net.eval()\n"
        "    with torch.no_grad():\n"
        "        hits = (net(X.cuda()).argmax(-1) == Y.cuda()).float().mean().item()\n"
        "    losses[lr] = loss.item()\n"
        "    accuracy[lr] = hits\n"
        "    log.info('lr=%g loss=%.4f accuracy=%.3f', lr, loss.item(), hits)",
    ),
    ("code", "print(open('sweep.log').read())\nmax(accuracy, key=accuracy.get)"),
    (
        "md",
        "## A reduction\n\n`+=`, `max`/`min` and friends are combined across "
        "engines; the result is the serial one (floats up to rounding).",
    ),
    (
        "code",
        "%%gpu_parallel\n"
        "total = 0\n"
        "largest = 0\n"
        "for n in range(1, 20_001):\n"
        "    steps = 0\n"
        "    while n != 1:\n"
        "        n = n // 2 if n % 2 == 0 else 3 * n + 1\n"
        "        steps += 1\n"
        "    total += steps\n"
        "    largest = max(largest, steps)",
    ),
    ("code", "total, largest"),
    (
        "md",
        "## Monte Carlo with `--seed`\n\nWith `--seed`, every iteration is seeded "
        "from (seed, iteration), so the estimate is the same on 1, 2 or 8 engines.",
    ),
    (
        "code",
        "%%gpu_parallel --seed 42\n"
        "import random\n"
        "inside = 0\n"
        "for trial in range(200):\n"
        "    for _ in range(2_000):\n"
        "        x, y = random.random(), random.random()\n"
        "        inside += x * x + y * y <= 1.0",
    ),
    ("code", "pi_estimate = 4 * inside / (200 * 2_000)\npi_estimate"),
    (
        "md",
        "## An uneven workload\n\nIteration i costs i times more than the first. "
        "Guided scheduling (large chunks first, small at the end, sized by each "
        "engine's measured speed) keeps every engine busy to the end; "
        "`gpucell.last_run` shows where each iteration ran.",
    ),
    (
        "code",
        "import time\n"
        "def work(i):\n"
        "    t = time.perf_counter() + i * 0.002\n"
        "    while time.perf_counter() < t:\n"
        "        pass\n"
        "    return i",
    ),
    (
        "code",
        "%%gpu_parallel\ndone = []\nfor i in range(60):\n    done.append(work(i))",
    ),
    (
        "code",
        "run = gpucell.last_run\n"
        "print(run.summary())\n"
        "{engine: round(busy, 2) for engine, busy in run.busy.items()}",
    ),
    ("code", "%gpu_cluster stop"),
]


def build() -> nbformat.NotebookNode:
    return notebook(CELLS)


if __name__ == "__main__":
    out = Path(__file__).parent / "notebooks" / "quickstart.ipynb"
    nbformat.write(build(), out)
    print(f"wrote {out}")
