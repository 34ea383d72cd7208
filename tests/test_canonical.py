"""Canonical workloads, written the way tutorials write them, on a real cluster.

Each workload is a notebook ``setup`` cell (classes, functions, data, and the
notebook's logging to a file) and a ``cell`` whose first top-level ``for`` loop
``%%gpu_parallel`` runs on the engines.  The cell runs twice in the same real
IPython shell: serially (``ip.run_cell``) and through the magic, each after a
fresh setup.  Every name the notebook holds afterwards must be equal (torch
modules by state dict, estimators by their fitted attributes, images by their
pixels, frames by ``.equals``), and the log file must hold the same lines in the
same order.

The second half: loops that change an input in place through a function's
argument (``np.add.at``, ``np.copyto``, ``out=``, ``torch.nn.init.*_``, ...)
must be refused before anything runs, or fail atomically with the notebook
unchanged, or give the serial namespace: never run silently different.
"""

from __future__ import annotations

import os
import shutil
import textwrap
from typing import Any

import numpy as np
import pytest

import gpucell
from gpucell.errors import InputChanged, IterationError, NotParallelizable

pytestmark = pytest.mark.cluster

_IPYTHON_OWN = ("In", "Out", "exit", "quit", "get_ipython")

LOG_HEADER = """\
import logging
logging.basicConfig(filename=@LOG@, level=logging.INFO,
                    format="%(levelname)s %(name)s %(message)s", force=True)
log = logging.getLogger(@NAME@)
"""


# ---------------------------------------------------------------- snapshots


from namespace_compare import (  # noqa: E402 - (shared with test_sweep_loops)
    clear,
    restored_logging,
    same,
    snapshot,
)


def assert_same_namespace(serial: dict, par: dict, what: str = "parallel") -> None:
    assert set(par) == set(serial), (
        f"names only serially: {sorted(set(serial) - set(par))}; "
        f"only in the {what} run: {sorted(set(par) - set(serial))}"
    )
    for k, v in serial.items():
        assert same(v, par[k]), f"{k}: serial {v!r}\n!= {what} {par[k]!r}"


# ---------------------------------------------------------------- the harness


class Notebook:
    """Runs a workload's setup and cell in the test shell, serially or through
    the magic, and gives back the namespace's snapshot and the log's lines.

    The root logger's handlers are put back as they were after every run
    (inside the test, so pytest's own capture handlers stay consistent)."""

    def __init__(self, ip, tmp_path):
        self.ip = ip
        self.tmp = tmp_path

    def setup(self, setup: str, log_name: str, logger: str = "nb") -> str:
        """Clear the namespace and run the setup cell with its logging header;
        return the log file's path."""
        clear(self.ip)
        path = str(self.tmp / log_name)
        header = LOG_HEADER.replace("@LOG@", repr(path)).replace("@NAME@", repr(logger))
        self.ip.run_cell(header + textwrap.dedent(setup)).raise_error()
        return path

    def run(
        self,
        setup: str,
        cell: str,
        line: str | None,
        log_name: str,
        logger: str = "nb",
    ) -> tuple[dict[str, Any], list[str]]:
        """``line`` None: the cell runs serially; else ``%%gpu_parallel line``."""
        ip = self.ip
        with restored_logging():
            path = self.setup(setup, log_name, logger)
            cell = textwrap.dedent(cell)
            if line is None:
                ip.run_cell(cell).raise_error()
            else:
                ip.run_cell_magic("gpu_parallel", line, cell)
                assert gpucell.last_run.status == "ok"
                assert not gpucell.last_run.inline  # it ran on the engines
            got = snapshot(ip)
        with open(path) as f:
            lines = f.read().splitlines()
        return got, lines

    def compare(
        self,
        setup: str,
        cell: str,
        line: str = "--quiet",
        logger: str = "nb",
        between=None,
        n_log: int | None = None,
    ) -> tuple[dict[str, Any], dict[str, Any]]:
        """Serial run, then the magic's; every name and the log must agree."""
        serial, serial_log = self.run(setup, cell, None, "serial.log", logger)
        if between is not None:
            between()
        par, par_log = self.run(setup, cell, line, "parallel.log", logger)
        assert serial_log, "the serial run logged nothing: the workload is wrong"
        if n_log is not None:
            assert len(serial_log) == n_log, serial_log
        assert_same_namespace(serial, par)
        assert par_log == serial_log, (
            f"log lines differ:\nserial:   {serial_log}\nparallel: {par_log}"
        )
        return serial, par


@pytest.fixture(scope="module", autouse=True)
def _always_send(ip):
    """Every magic here runs on the engines (never the inline path)."""
    ip.run_line_magic("config", "GpuCell.inline_below = 0")
    try:
        yield
    finally:
        ip.run_line_magic("config", "GpuCell.inline_below = 0.005")


@pytest.fixture
def nb(ip, tmp_path):
    here = os.getcwd()
    try:
        yield Notebook(ip, tmp_path)
    finally:
        os.chdir(here)
        ip.user_ns.pop("_gpucell_seed", None)
        clear(ip)


# ---------------------------------------------------------------- 1. torch sweep

TORCH_SETUP = """
import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc1 = nn.Linear(4, 16)
        self.fc2 = nn.Linear(16, 1)

    def forward(self, x):
        return self.fc2(torch.relu(self.fc1(x)))

torch.manual_seed(0)
X = torch.randn(64, 4)
Y = X.sum(dim=1, keepdim=True) + 0.1 * torch.randn(64, 1)
X_val = torch.randn(32, 4)
Y_val = X_val.sum(dim=1, keepdim=True)
loss_fn = nn.MSELoss()
"""

SWEEP_BODY = """
    model.train()
    epoch_losses = []
    for epoch in range(3):
        running = 0.0
        for xb, yb in train_loader:
            opt.zero_grad()
            loss = loss_fn(model(xb), yb)
            loss.backward()
            opt.step()
            running += loss.item()
        epoch_losses.append(running / len(train_loader))
    model.eval()
    with torch.no_grad():
        val = loss_fn(model(X_val), Y_val).item()
    losses[lr] = val
    history[lr] = epoch_losses
    log.info("lr=%g val_loss=%.5f", lr, val)
best_lr = min(losses, key=losses.get)
"""


def _check_optimizer_holds_the_models_parameters(ip):
    """Serially ``opt`` steps the very tensors of ``model``: so must the
    names the magic leaves."""
    opt, model = ip.user_ns["opt"], ip.user_ns["model"]
    assert opt.param_groups[0]["params"][0] is model.fc1.weight, (
        "`opt` no longer holds `model`'s parameters (serially it does)"
    )


def test_torch_sweep_notebook_module(nb, cluster):
    setup = (
        TORCH_SETUP + "train_loader = DataLoader(TensorDataset(X, Y), batch_size=8)\n"
    )
    cell = (
        "losses = {}\nhistory = {}\nfor lr in [0.1, 0.03, 0.01, 0.003]:\n"
        "    torch.manual_seed(0)\n    model = Net()\n"
        "    opt = torch.optim.SGD(model.parameters(), lr=lr)\n" + SWEEP_BODY
    )
    serial, par = nb.compare(setup, cell, logger="sweep", n_log=4)
    assert len(serial["history"]) == 4 and serial["best_lr"] in (0.1, 0.03)
    _check_optimizer_holds_the_models_parameters(nb.ip)


def test_torch_sweep_notebook_module_loader_built_in_the_loop(nb, cluster):
    cell = (
        "losses = {}\nhistory = {}\nfor lr in [0.1, 0.03, 0.01, 0.003]:\n"
        "    torch.manual_seed(0)\n"
        "    train_loader = DataLoader(TensorDataset(X, Y), batch_size=8)\n"
        "    model = Net()\n"
        "    opt = torch.optim.SGD(model.parameters(), lr=lr)\n" + SWEEP_BODY
    )
    nb.compare(TORCH_SETUP, cell, logger="sweep", n_log=4)
    _check_optimizer_holds_the_models_parameters(nb.ip)


def test_torch_sweep_reading_the_last_batch_loss_after_the_epochs(nb, cluster):
    """``loss.item()`` after ``for epoch in range(epochs): for xb, yb in
    loader:`` (the tutorial's last line): accepted because the kernel checks
    ``range(epochs)`` and the loader yield an item before the run."""
    setup = (
        TORCH_SETUP
        + "train_loader = DataLoader(TensorDataset(X, Y), batch_size=16)\nepochs = 2\n"
    )
    cell = (
        "losses = {}\nfor lr in [0.1, 0.03, 0.01]:\n"
        "    torch.manual_seed(0)\n    model = Net()\n"
        "    opt = torch.optim.SGD(model.parameters(), lr=lr)\n"
        "    for epoch in range(epochs):\n"
        "        for xb, yb in train_loader:\n"
        "            opt.zero_grad()\n"
        "            loss = loss_fn(model(xb), yb)\n"
        "            loss.backward()\n"
        "            opt.step()\n"
        "    losses[lr] = loss.item()\n"
        "    log.info('lr=%g loss=%.5f', lr, loss.item())\n"
    )
    nb.compare(setup, cell, logger="sweep", n_log=3)


# ---------------------------------------------------------------- 2. checkpoints


def test_torch_checkpoints_evaluated_with_a_model_per_item(nb, cluster):
    setup = """
    import torch
    from torch import nn

    class Net(nn.Module):
        def __init__(self):
            super().__init__()
            self.fc1 = nn.Linear(6, 12)
            self.fc2 = nn.Linear(12, 3)

        def forward(self, x):
            return self.fc2(torch.relu(self.fc1(x)))

    torch.manual_seed(0)
    ckpts = [Net().state_dict() for _ in range(5)]
    X_val = torch.randn(40, 6)
    y_val = torch.randint(0, 3, (40,))
    """
    cell = """
    accs = []
    for i, sd in enumerate(ckpts):
        m = Net()
        m.load_state_dict(sd)
        m.eval()
        with torch.no_grad():
            logits = m(X_val)
            acc = (logits.argmax(dim=1) == y_val).float().mean().item()
        accs.append(acc)
        log.info("checkpoint %d acc=%.4f", i, acc)
    best = max(range(len(accs)), key=accs.__getitem__)
    """
    nb.compare(setup, cell, logger="ckpt", n_log=5)


# ---------------------------------------------------------------- 3. k-fold CV

CV_CELL = """
scores = []
kf = KFold(n_splits=5, shuffle=True, random_state=0)
for fold, (train_idx, test_idx) in enumerate(kf.split(X)):
    est = @EST@
    est.fit(X[train_idx], y[train_idx])
    score = est.score(X[test_idx], y[test_idx])
    scores.append(score)
    log.info("fold %d score=%.5f", fold, score)
mean_score = float(np.mean(scores))
"""


@pytest.mark.parametrize(
    ("data", "est"),
    [
        (
            "make_classification(n_samples=200, n_features=6, random_state=0)",
            "LogisticRegression(max_iter=500)",
        ),
        (
            "make_regression(n_samples=200, n_features=6, noise=5.0, random_state=0)",
            "Ridge(alpha=1.0)",
        ),
    ],
    ids=["logistic", "ridge"],
)
def test_sklearn_kfold_cross_validation(nb, cluster, data, est):
    setup = f"""
    import numpy as np
    from sklearn.datasets import make_classification, make_regression
    from sklearn.linear_model import LogisticRegression, Ridge
    from sklearn.model_selection import KFold
    X, y = {data}
    """
    serial, _ = nb.compare(setup, CV_CELL.replace("@EST@", est), logger="cv", n_log=5)
    assert len(serial["scores"]) == 5


def test_kfold_cross_validation_with_a_notebook_estimator_class(nb, cluster):
    setup = """
    import numpy as np
    from sklearn.datasets import make_classification
    from sklearn.model_selection import KFold

    class NearestCentroid:
        \"\"\"A classifier written in the notebook: one mean per class.\"\"\"
        def __init__(self, shrink=0.0):
            self.shrink = shrink

        def fit(self, X, y):
            self.classes_ = np.unique(y)
            means = np.stack([X[y == c].mean(axis=0) for c in self.classes_])
            self.centroids_ = means * (1 - self.shrink)
            return self

        def predict(self, X):
            d = ((X[:, None, :] - self.centroids_[None]) ** 2).sum(axis=-1)
            return self.classes_[d.argmin(axis=1)]

        def score(self, X, y):
            return float((self.predict(X) == y).mean())

    X, y = make_classification(n_samples=200, n_features=6, random_state=0)
    """
    cell = CV_CELL.replace("@EST@", "NearestCentroid(shrink=0.1)")
    nb.compare(setup, cell, logger="cv", n_log=5)


# ---------------------------------------------------------------- 4. bootstrap

BOOT_SETUP = """
import numpy as np
data = np.random.default_rng(123).normal(10.0, 2.0, size=300)
n_boot = 24
"""

BOOT_CELL = """
means = []
for b in range(n_boot):
    idx = np.random.choice(len(data), size=len(data), replace=True)
    m = float(data[idx].mean())
    means.append(m)
    log.info("resample %d mean=%.6f", b, m)
ci = (float(np.percentile(means, 2.5)), float(np.percentile(means, 97.5)))
"""


def test_bootstrap_with_seed_is_the_same_on_one_or_two_engines(nb, cluster):
    """README: ``--seed S`` gives the same random numbers on any number of
    engines; docs/ARCHITECTURE.md: random, numpy and torch are seeded from
    (S, iteration index) before every iteration.  So the reference is the
    seeded run on one engine, and the serial cell seeded that way before each
    iteration."""
    two, two_log = nb.run(BOOT_SETUP, BOOT_CELL, "--quiet --seed 0", "two.log", "boot")
    one, one_log = nb.run(
        BOOT_SETUP,
        BOOT_CELL,
        f"--quiet --seed 0 --targets {cluster.ids[0]}",
        "one.log",
        "boot",
    )
    assert len(two_log) == 24 and len(set(two["means"])) > 20
    assert_same_namespace(one, two, "two-engine")
    assert two_log == one_log
    # the serial cell, each iteration seeded from (0, b) as the engines seed it
    seeded = BOOT_CELL.replace(
        "for b in range(n_boot):\n", "for b in range(n_boot):\n    _gpucell_seed(b)\n"
    )
    serial, serial_log = nb.run(
        BOOT_SETUP + "from gpucell.engine.worker import _seeder\n"
        "_gpucell_seed = _seeder(0)\ndel _seeder\n",
        seeded,
        None,
        "serial.log",
        "boot",
    )
    nb.ip.user_ns.pop("_gpucell_seed", None)
    assert_same_namespace(serial, two)
    assert two_log == serial_log


# ---------------------------------------------------------------- 5. images


def _write_pngs(folder) -> None:
    from PIL import Image

    folder.mkdir()
    rng = np.random.default_rng(5)
    for k in range(8):
        arr = rng.integers(0, 256, size=(24 + 2 * k, 32, 3), dtype=np.uint8)
        Image.fromarray(arr, "RGB").save(folder / f"img_{k:02d}.png")


IMG_SETUP = """
import os
from glob import glob
import numpy as np
from PIL import Image
paths = sorted(glob(os.path.join(@DIR@, "*.png")))
"""


def test_pil_per_file_statistics(nb, cluster, tmp_path):
    _write_pngs(tmp_path / "imgs")
    setup = IMG_SETUP.replace("@DIR@", repr(str(tmp_path / "imgs")))
    cell = """
    means = []
    stats = {}
    for p in paths:
        img = Image.open(p).convert("L").resize((16, 16))
        m = float(np.asarray(img).mean())
        means.append(m)
        stats[os.path.basename(p)] = {"mean": m, "size": img.size}
        log.info("%s mean=%.3f", os.path.basename(p), m)
    """
    serial, _ = nb.compare(setup, cell, logger="images", n_log=8)
    assert len(serial["stats"]) == 8


def test_pil_thumbnails_written_one_file_per_item(nb, cluster, tmp_path):
    _write_pngs(tmp_path / "imgs")
    out = tmp_path / "thumbs"
    out.mkdir()
    setup = IMG_SETUP.replace("@DIR@", repr(str(tmp_path / "imgs"))) + (
        f"OUT = {str(out)!r}\n"
    )
    cell = """
    written = []
    for p in paths:
        name = os.path.splitext(os.path.basename(p))[0]
        with Image.open(p) as im:
            im = im.convert("RGB")
            im.thumbnail((12, 12))
            dest = os.path.join(OUT, name + "_thumb.png")
            im.save(dest)
        written.append(dest)
        log.info("saved %s %s", name, im.size)
    """

    def set_serial_files_aside():
        shutil.move(str(out), str(tmp_path / "thumbs_serial"))
        out.mkdir()

    nb.compare(setup, cell, logger="images", between=set_serial_files_aside, n_log=8)
    want = sorted(p.name for p in (tmp_path / "thumbs_serial").iterdir())
    assert len(want) == 8
    assert sorted(p.name for p in out.iterdir()) == want
    for name in want:
        serial_bytes = (tmp_path / "thumbs_serial" / name).read_bytes()
        assert (out / name).read_bytes() == serial_bytes, name


# ---------------------------------------------------------------- 6. pandas groups


def test_pandas_per_group_summary(nb, cluster):
    setup = """
    import numpy as np
    import pandas as pd
    rng = np.random.default_rng(0)
    df = pd.DataFrame({
        "k": rng.choice(list("abcdef"), size=120),
        "x": rng.normal(size=120),
        "y": rng.integers(0, 100, size=120),
    })
    """
    cell = """
    rows = []
    for key, g in df.groupby("k"):
        rows.append({
            "k": key,
            "n": len(g),
            "mean_x": g["x"].mean(),
            "std_x": g["x"].std(),
            "max_y": g["y"].max(),
        })
        log.info("group %s n=%d mean_x=%.4f", key, len(g), g["x"].mean())
    summary = pd.DataFrame(rows).set_index("k")
    """
    serial, _ = nb.compare(setup, cell, logger="groups", n_log=6)
    assert list(serial["summary"].index) == list("abcdef")


# ---------------------------------------------------------------- 7. Monte-Carlo


def test_seeded_monte_carlo_simulation(nb, cluster):
    setup = """
    import numpy as np
    n_trials = 20
    n_points = 2000
    """
    cell = """
    results = []
    total = 0
    for trial in range(n_trials):
        rng = np.random.default_rng(trial)
        pts = rng.random((n_points, 2))
        inside = int(((pts ** 2).sum(axis=1) <= 1.0).sum())
        results.append(4 * inside / n_points)
        total += inside
        log.info("trial %d inside=%d", trial, inside)
    pi_est = 4 * total / (n_trials * n_points)
    """
    serial, _ = nb.compare(setup, cell, logger="mc", n_log=20)
    assert abs(serial["pi_est"] - np.pi) < 0.05


# ---------------------------------------------------------------- 8. dataclass configs


def test_dataclass_configs_train_one_model_each(nb, cluster):
    setup = """
    from dataclasses import dataclass
    import torch
    from torch import nn

    @dataclass
    class Config:
        lr: float
        epochs: int = 3

    configs = [Config(0.1), Config(0.01), Config(0.05, epochs=5), Config(0.2, epochs=2)]
    torch.manual_seed(0)
    X = torch.randn(50, 4)
    Y = X @ torch.tensor([[1.0], [-2.0], [0.5], [3.0]])
    """
    cell = """
    results = []
    for cfg in configs:
        torch.manual_seed(0)
        model = nn.Linear(4, 1)
        opt = torch.optim.SGD(model.parameters(), lr=cfg.lr)
        for epoch in range(cfg.epochs):
            opt.zero_grad()
            loss = ((model(X) - Y) ** 2).mean()
            loss.backward()
            opt.step()
        with torch.no_grad():
            final = ((model(X) - Y) ** 2).mean().item()
        results.append((cfg, final))
        log.info("%s final_loss=%.5f", cfg, final)
    best_cfg, best_loss = min(results, key=lambda r: r[1])
    """
    nb.compare(setup, cell, logger="cfg", n_log=4)
    ns = nb.ip.user_ns
    # serially the results hold the very Config objects of `configs`
    assert all(r[0] is c for r, c in zip(ns["results"], ns["configs"], strict=True))
    losses = [r[1] for r in ns["results"]]
    assert ns["best_cfg"] is ns["configs"][losses.index(ns["best_loss"])]


# ---------------------------------------------------------------- 9. class attributes


def test_class_with_class_attributes_instantiated_per_item(nb, cluster):
    setup = """
    import numpy as np

    class Scaler:
        factor = 2.0
        offsets = (0.5, -0.5)

        def __init__(self, shift=0.0):
            self.shift = shift

        def apply(self, x):
            return x * self.factor + self.shift + self.offsets[0]

    arrays = [np.arange(6, dtype=np.float64) * k for k in range(7)]
    """
    cell = """
    out = {}
    for i, x in enumerate(arrays):
        s = Scaler(shift=float(i))
        y = s.apply(x)
        out[i] = y
        log.info("scaled %d sum=%.3f factor=%s", i, y.sum(), Scaler.factor)
    """
    nb.compare(setup, cell, n_log=7)
    assert nb.ip.user_ns["Scaler"].factor == 2.0


# ---------------------------------------------------------------- in-place writes
# through a function's argument: refused, atomic failure, or serial; never
# silently different.


def assert_refused_or_serial(nb, setup: str, cell: str, line: str = "--quiet"):
    """Either the magic raises NotParallelizable / InputChanged /
    IterationError and every name the setup made is as it was, or it runs
    and the namespace is the serial one.  Returns the error, if any."""
    ip = nb.ip
    serial, _ = nb.run(setup, cell, None, "serial.log")
    with restored_logging():
        nb.setup(setup, "parallel.log")
        before = snapshot(ip)
        try:
            ip.run_cell_magic("gpu_parallel", line, textwrap.dedent(cell))
        except (NotParallelizable, InputChanged, IterationError) as e:
            after = snapshot(ip)
            for k, v in before.items():
                assert k in after, f"{k} gone after the failed cell"
                assert same(v, after[k]), (
                    f"{type(e).__name__} but `{k}` changed: {v!r} -> {after[k]!r}"
                )
            return e
        assert_same_namespace(serial, snapshot(ip))
    return None


INPLACE = {
    "np.add.at": (
        "import numpy as np\ncounts = np.zeros(5, dtype=np.int64)\n"
        "batches = [np.array([i % 5, (i * 3) % 5, 1]) for i in range(8)]\n",
        "sizes = []\nfor idx in batches:\n    np.add.at(counts, idx, 1)\n"
        "    sizes.append(len(idx))\n",
    ),
    "np.copyto": (
        "import numpy as np\nbuf = np.zeros(4)\n"
        "xs = [np.full(4, float(i)) for i in range(6)]\n",
        "sums = []\nfor x in xs:\n    np.copyto(buf, x)\n"
        "    sums.append(float(buf.sum()))\n",
    ),
    "np.put": (
        "import numpy as np\na = np.zeros(8)\n",
        "for i in range(8):\n    np.put(a, [i], i * 10.0)\n",
    ),
    "np.random.shuffle": (
        "import numpy as np\narr = np.arange(10)\n",
        "firsts = []\nfor i in range(6):\n    np.random.seed(i)\n"
        "    np.random.shuffle(arr)\n    firsts.append(int(arr[0]))\n",
    ),
    "np.multiply out=": (
        "import numpy as np\na = np.ones(5)\n",
        "tot = []\nfor i in range(4):\n    np.multiply(a, 2, out=a)\n"
        "    tot.append(float(a.sum()))\n",
    ),
    "torch.add out=": (
        "import torch\nt = torch.zeros(3)\n",
        "vals = []\nfor i in range(4):\n    torch.add(t, 1, out=t)\n"
        "    vals.append(float(t.sum()))\n",
    ),
    "torch.nn.init.zeros_": (
        "import torch\nw = torch.ones(3, 3)\n",
        "vals = []\nfor i in range(4):\n    torch.nn.init.zeros_(w)\n"
        "    vals.append(float(w.sum()) + i)\n",
    ),
    "torch.nn.init.normal_ on a model": (
        "import torch\nfrom torch import nn\n"
        "class Tiny(nn.Module):\n    def __init__(self):\n        super().__init__()\n"
        "        self.fc = nn.Linear(3, 2)\n    def forward(self, x):\n"
        "        return self.fc(x)\n"
        "torch.manual_seed(0)\nmodel = Tiny()\nx = torch.ones(1, 3)\n",
        "outs = []\nfor i in range(4):\n    torch.manual_seed(i)\n"
        "    torch.nn.init.normal_(model.fc.weight)\n"
        "    with torch.no_grad():\n        outs.append(model(x).sum().item())\n",
    ),
}


@pytest.mark.parametrize("case", list(INPLACE))
def test_in_place_change_through_a_function_argument_is_never_silent(nb, cluster, case):
    setup, cell = INPLACE[case]
    assert_refused_or_serial(nb, setup, cell)
