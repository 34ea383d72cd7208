"""Write the example notebooks in examples/notebooks/ from the cells below (kept as
code so the notebooks' diffs stay reviewable).  Run: python examples/make_examples.py

Each notebook is one job people bring to gpucell, small enough to run on the CPU
engines of a laptop in seconds.  tests/test_examples.py executes each headless on a
real cluster and again serially (the ``%%gpu_parallel`` lines dropped, and the cells
tagged ``gpucell-only``), and compares the names listed in the notebook's metadata.
"""

from __future__ import annotations

from pathlib import Path

import nbformat
from notebook_cells import notebook

HERE = Path(__file__).parent

# a cell is (kind, source) or ("code", source, tags); cells tagged "gpucell-only"
# are left out of the serial run the tests compare with
START = [
    ("code", "%load_ext gpucell", ["gpucell-only"]),
    ("code", "%gpu_cluster start", ["gpucell-only"]),
]
STOP = [("code", "%gpu_cluster stop", ["gpucell-only"])]
DEVICE = (
    "# code written for one device: 'cuda' where the kernel sees a GPU; each engine\n"
    "# then runs it on its own GPU (cuda:0 there), CPU engines on their CPU\n"
    'device = "cuda" if torch.cuda.is_available() else "cpu"'
)

SWEEP = {
    "title": "A hyper-parameter sweep",
    "compare": ["final_loss", "val_acc", "best"],
    "cells": [
        (
            "md",
            "# A hyper-parameter sweep\n\nOne model per setting, each trained from "
            "the same seed: the iterations are independent, so `%%gpu_parallel` runs "
            "them on every engine and `final_loss` and `val_acc` come back as the "
            "serial loop builds them. The model is a class defined in the notebook.",
        ),
        *START,
        (
            "code",
            "import torch\n"
            "from torch import nn\n"
            "\n"
            "class MLP(nn.Module):\n"
            "    def __init__(self, hidden, dropout=0.1):\n"
            "        super().__init__()\n"
            "        self.net = nn.Sequential(\n"
            "            nn.Linear(16, hidden), nn.ReLU(), nn.Dropout(dropout),\n"
            "            nn.Linear(hidden, 2))\n"
            "\n"
            "    def forward(self, x):\n"
            "        return self.net(x)\n"
            "\n" + DEVICE + "\n"
            "torch.manual_seed(0)\n"
            "X = torch.randn(400, 16)\n"
            "y = (X[:, :4].sum(1) > 0).long()\n"
            "X_train, y_train, X_val, y_val = X[:300], y[:300], X[300:], y[300:]\n"
            "grid = [(lr, hidden) for lr in (0.01, 0.03, 0.1) for hidden in (8, 32)]",
        ),
        (
            "md",
            "`torch.manual_seed(0)` at the top of the body: every iteration draws "
            "the numbers it would draw serially, on whichever engine it runs.",
        ),
        (
            "code",
            "%%gpu_parallel\n"
            "final_loss = {}\n"
            "val_acc = {}\n"
            "for lr, hidden in grid:\n"
            "    torch.manual_seed(0)\n"
            "    model = MLP(hidden).to(device)\n"
            "    opt = torch.optim.Adam(model.parameters(), lr=lr)\n"
            "    model.train()\n"
            "    for epoch in range(30):\n"
            "        opt.zero_grad()\n"
            "        loss = nn.functional.cross_entropy(\n"
            "            model(X_train.to(device)), y_train.to(device))\n"
            "        loss.backward()\n"
            "        opt.step()\n"
            "    model.eval()\n"
            "    with torch.no_grad():\n"
            "        hits = model(X_val.to(device)).argmax(1) == y_val.to(device)\n"
            "    final_loss[lr, hidden] = round(loss.item(), 5)\n"
            "    val_acc[lr, hidden] = round(hits.float().mean().item(), 4)",
        ),
        (
            "code",
            "best = max(val_acc, key=val_acc.get)\n"
            "print('best (lr, hidden):', best, 'accuracy', val_acc[best])\n"
            "model  # the last iteration's model, as after the serial loop",
        ),
        *STOP,
    ],
}

INFERENCE = {
    "title": "Batch inference",
    "compare": ["labels", "confidence"],
    "cells": [
        (
            "md",
            "# Batch inference over many inputs\n\nOne trained model in eval mode, "
            "many batches: each engine gets the model once (cached across cells) "
            "and its share of the batches; the predictions come back in order.",
        ),
        *START,
        (
            "code",
            "import torch\n"
            "from torch import nn\n"
            "\n"
            "class Classifier(nn.Module):\n"
            "    def __init__(self):\n"
            "        super().__init__()\n"
            "        self.body = nn.Sequential(\n"
            "            nn.Linear(32, 64), nn.BatchNorm1d(64), nn.ReLU(),\n"
            "            nn.Dropout(0.2), nn.Linear(64, 5))\n"
            "\n"
            "    def forward(self, x):\n"
            "        return self.body(x)\n"
            "\n" + DEVICE + "\n"
            "torch.manual_seed(0)\n"
            "model = Classifier().eval()  # dropout off, batch-norm statistics fixed\n"
            "batches = [torch.randn(64, 32) for _ in range(48)]",
        ),
        (
            "code",
            "%%gpu_parallel\n"
            "predictions = []\n"
            "confidence = []\n"
            "for batch in batches:\n"
            "    with torch.no_grad():\n"
            "        probs = model.to(device)(batch.to(device)).softmax(-1)\n"
            "    predictions.append(probs.argmax(-1).cpu())\n"
            "    confidence.append(round(probs.max(-1).values.mean().item(), 5))",
        ),
        (
            "code",
            "labels = torch.cat(predictions)\n"
            "labels.shape, labels.bincount(minlength=5).tolist()",
        ),
        *STOP,
    ],
}

SIMULATION = {
    "title": "A seeded simulation sweep",
    # the serial loop draws from one generator; --seed seeds each iteration from
    # (seed, index): the notebook compares its two runs itself (1 and all engines)
    "compare": [],
    "cells": [
        (
            "md",
            "# A simulation sweep with `--seed`\n\nA stochastic epidemic model, "
            "20 runs per infection rate. With `--seed S`, `random`, `numpy` and "
            "`torch` are seeded from (S, iteration) before every iteration, so the "
            "results are the same on one engine or on all of them.",
        ),
        *START,
        (
            "code",
            "import numpy as np\n"
            "\n"
            "def epidemic(beta, gamma=0.1, n=1000, days=120):\n"
            '    """Peak number infected in one run of a stochastic SIR model."""\n'
            "    s, i, peak = n - 5, 5, 5\n"
            "    for _ in range(days):\n"
            "        new_i = np.random.binomial(s, 1 - np.exp(-beta * i / n))\n"
            "        new_r = np.random.binomial(i, gamma)\n"
            "        s, i = s - new_i, i + new_i - new_r\n"
            "        peak = max(peak, i)\n"
            "    return peak\n"
            "\n"
            "betas = [round(b, 2) for b in np.linspace(0.1, 0.5, 9)]",
        ),
        (
            "code",
            "%%gpu_parallel --seed 7\n"
            "peaks = {}\n"
            "for beta in betas:\n"
            "    runs = [epidemic(beta) for _ in range(20)]\n"
            "    peaks[beta] = float(np.mean(runs))",
        ),
        ("code", "on_all_engines = dict(peaks)\npeaks"),
        (
            "md",
            "The same cell on engine 0 alone (`-t 0`) gives the same numbers:",
        ),
        (
            "code",
            "%%gpu_parallel --seed 7 -t 0\n"
            "peaks = {}\n"
            "for beta in betas:\n"
            "    runs = [epidemic(beta) for _ in range(20)]\n"
            "    peaks[beta] = float(np.mean(runs))",
        ),
        (
            "code",
            "assert peaks == on_all_engines\nprint('same on 1 engine and on all')",
        ),
        *STOP,
    ],
}

PER_FILE = {
    "title": "A per-file job",
    "compare": ["summary", "outputs"],
    "cells": [
        (
            "md",
            "# One job per file\n\nThe notebook writes a dozen CSV files to a "
            "temporary folder, then summarises each and writes one result file per "
            "input. Engines on the kernel's host read and write the same paths "
            "(they run in the kernel's working directory).",
        ),
        *START,
        (
            "code",
            "import shutil\n"
            "import tempfile\n"
            "from pathlib import Path\n"
            "\n"
            "import numpy as np\n"
            "\n"
            "data_dir = Path(tempfile.mkdtemp(prefix='gpucell-example-'))\n"
            "rng = np.random.default_rng(0)\n"
            "for k in range(12):\n"
            "    readings = rng.normal(k, 1 + k / 10, size=(500, 3))\n"
            "    path = data_dir / f'sensor_{k:02d}.csv'\n"
            "    np.savetxt(path, readings, delimiter=',')\n"
            "files = sorted(data_dir.glob('*.csv'))\n"
            "len(files)",
        ),
        (
            "md",
            "A file per iteration (its path built from the loop variable) is fine; "
            "one fixed file written by every iteration would be refused.",
        ),
        (
            "code",
            "%%gpu_parallel\n"
            "summary = {}\n"
            "for path in files:\n"
            "    data = np.loadtxt(path, delimiter=',')\n"
            "    summary[path.stem] = {'rows': len(data),\n"
            "                          'mean': data.mean(0).round(6).tolist(),\n"
            "                          'max': round(float(data.max()), 6)}\n"
            "    np.savetxt(path.with_suffix('.std.txt'), data.std(0))",
        ),
        (
            "code",
            "outputs = sorted(p.name for p in data_dir.glob('*.std.txt'))\n"
            "print(len(outputs), 'result files;', outputs[0], '...')\n"
            "summary['sensor_03']",
        ),
        ("code", "shutil.rmtree(data_dir)  # the notebook cleans up after itself"),
        *STOP,
    ],
}

FIT_MODELS = {
    "title": "Fit a list of models in place",
    "compare": ["scores"],
    "cells": [
        (
            "md",
            "# Fit a list of scikit-learn models in place\n\n`for m in models: "
            "m.fit(X, y)` changes each item: the engines send back what each "
            "iteration changed in its own item and the kernel writes it into the "
            "notebook's objects, so every model in `models` comes back fitted, as "
            "serially.",
        ),
        *START,
        (
            "code",
            "from sklearn.datasets import make_classification\n"
            "from sklearn.ensemble import RandomForestClassifier\n"
            "from sklearn.linear_model import LogisticRegression\n"
            "from sklearn.neighbors import KNeighborsClassifier\n"
            "from sklearn.svm import SVC\n"
            "from sklearn.tree import DecisionTreeClassifier\n"
            "\n"
            "X, y = make_classification(n_samples=400, n_features=10, random_state=0)\n"
            "models = [\n"
            "    LogisticRegression(max_iter=500),\n"
            "    RandomForestClassifier(n_estimators=40, random_state=0),\n"
            "    SVC(C=1.0),\n"
            "    KNeighborsClassifier(n_neighbors=7),\n"
            "    DecisionTreeClassifier(max_depth=4, random_state=0),\n"
            "    LogisticRegression(C=0.1, max_iter=500),\n"
            "]",
        ),
        ("code", "%%gpu_parallel\nfor m in models:\n    m.fit(X, y)"),
        (
            "code",
            "scores = {f'{i}: {type(m).__name__}': round(m.score(X, y), 4)\n"
            "          for i, m in enumerate(models)}\n"
            "scores",
        ),
        *STOP,
    ],
}

NOTEBOOKS = {
    "sweep": SWEEP,
    "batch_inference": INFERENCE,
    "simulation": SIMULATION,
    "per_file": PER_FILE,
    "fit_models": FIT_MODELS,
}


def build(name: str) -> nbformat.NotebookNode:
    spec = NOTEBOOKS[name]
    nb = notebook(spec["cells"])
    nb.metadata["gpucell_example"] = {"compare": spec["compare"]}
    return nb


if __name__ == "__main__":
    for name in NOTEBOOKS:
        out = HERE / "notebooks" / f"{name}.ipynb"
        nbformat.write(build(name), out)
        print(f"wrote {out}")
