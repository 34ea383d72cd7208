# ruff: noqa: E501  (the cells are notebook code, as tutorials write it)
"""A second held-in corpus of notebook loops (issue 28's categories), for
tests/test_sweep_loops_writeback.py: an iteration's own item written back
(and its unsafe twins), sinks, side effects and iteration forms, written the
way tutorials, docs and course notebooks write them.

Same shape as tests/sweep_loops_corpus.py (its ``Case``; see its docstring
for verdicts, kinds and ``@TMP@``).  The ids start with ``wb-`` and must not
clash with that corpus's.  Epilogues after a loop make identity visible where
the contract promises it (``alias is models[0]``, an alias's values): the
namespace comparison is by value, not by identity.
"""

from __future__ import annotations

import textwrap

from sweep_loops_corpus import CASES as _OTHER_CASES
from sweep_loops_corpus import Case

CASES: list[Case] = []


def case(id, verdict, setup, cell, kind="plain", note=""):
    """As sweep_loops_corpus.case, into this corpus's own list."""
    assert verdict in ("safe", "unsafe") and kind in ("plain", "seeded", "random")
    assert id.startswith("wb-"), id
    assert all(c.id != id for c in CASES + _OTHER_CASES), id
    CASES.append(
        Case(id, verdict, textwrap.dedent(setup), textwrap.dedent(cell), kind, note)
    )


# ---------------------------------------------------------------- shared setups

TORCH = """
import torch
from torch import nn
torch.manual_seed(0)
X = torch.randn(32, 4)
Y = X @ torch.tensor([[1.0], [-2.0], [0.5], [3.0]]) + 0.1 * torch.randn(32, 1)
batches = list(zip(X.split(8), Y.split(8)))
loss_fn = nn.MSELoss()
"""

SK = """
import numpy as np
from sklearn.datasets import make_classification
from sklearn.model_selection import train_test_split
from sklearn.linear_model import LogisticRegression, Ridge
from sklearn.tree import DecisionTreeClassifier
from sklearn.neighbors import KNeighborsClassifier
from sklearn.preprocessing import StandardScaler
from sklearn.pipeline import make_pipeline
X, y = make_classification(n_samples=80, n_features=5, n_informative=3, random_state=0)
X_tr, X_te, y_tr, y_te = train_test_split(X, y, test_size=0.25, random_state=0)
"""

FRAMES = """
import numpy as np
import pandas as pd
_r = np.random.default_rng(7)
def _frame(n):
    df = pd.DataFrame({"qty": _r.integers(1, 9, size=n).astype(float),
                       "price": _r.uniform(1, 5, size=n).round(2),
                       "city": _r.choice(["Oslo", "Rome", "Lima"], size=n)})
    df.loc[df.index[::3], "qty"] = np.nan
    return df
frames = [_frame(n) for n in (5, 6, 7, 4)]
"""

ARRAYS = """
import numpy as np
_r = np.random.default_rng(11)
arrays = [_r.normal(size=n) for n in (4, 6, 5, 3)]
mats = [_r.normal(size=(3, 3)) for _ in range(4)]
"""

DF = """
import numpy as np
import pandas as pd
_r = np.random.default_rng(5)
df = pd.DataFrame({"store": _r.choice(["A", "B", "C"], size=12),
                   "units": _r.integers(0, 20, size=12),
                   "price": _r.uniform(2, 9, size=12).round(2)})
"""

TEXT = """
docs = ["the quick brown fox", "jumps over the lazy dog", "The Dog sleeps",
        "a fox and a dog", "quick quick slow"]
"""

# ================================================================ own item, written back
# ---------------------------------------------------------------- torch

case(
    "wb-torch-nets-opt-in-body",
    "safe",
    TORCH
    + """
nets = []
for seed in range(3):
    torch.manual_seed(seed)
    nets.append(nn.Sequential(nn.Linear(4, 8), nn.ReLU(), nn.Linear(8, 1)))
first = nets[0]
first_weight = nets[0][0].weight
""",
    """
final_loss = []
for net in nets:
    opt = torch.optim.SGD(net.parameters(), lr=0.05)
    for epoch in range(3):
        for xb, yb in batches:
            opt.zero_grad()
            loss = loss_fn(net(xb), yb)
            loss.backward()
            opt.step()
    final_loss.append(loss.item())
same_first = first is nets[0] and first_weight is nets[0][0].weight
first_w = first_weight.detach().clone()
""",
    note="the common 'train each model in the list' cell; identity kept",
)

case(
    "wb-torch-nets-adam-zip-outside",
    "safe",
    TORCH
    + """
torch.manual_seed(1)
nets = [nn.Linear(4, 1) for _ in range(3)]
opts = [torch.optim.Adam(n.parameters(), lr=0.01) for n in nets]
""",
    """
for net, opt in zip(nets, opts):
    for xb, yb in batches:
        opt.zero_grad()
        loss_fn(net(xb), yb).backward()
        opt.step()
adam_steps = [len(o.state) for o in opts]
""",
    note="each optimizer made outside, paired with its own net: both are the iteration's item",
)

case(
    "wb-torch-models-items-helper",
    "safe",
    TORCH
    + """
torch.manual_seed(2)
models = {"linear": nn.Linear(4, 1),
          "mlp": nn.Sequential(nn.Linear(4, 6), nn.Tanh(), nn.Linear(6, 1))}
def train(model, epochs=2, lr=0.02):
    opt = torch.optim.SGD(model.parameters(), lr=lr, momentum=0.9)
    model.train()
    for _ in range(epochs):
        for xb, yb in batches:
            opt.zero_grad()
            loss = loss_fn(model(xb), yb)
            loss.backward()
            opt.step()
    model.eval()
    return loss.item()
""",
    """
history = {}
for name, model in models.items():
    history[name] = train(model)
    log.info("%s done", name)
""",
)

case(
    "wb-torch-opts-dict-outside",
    "safe",
    TORCH
    + """
torch.manual_seed(3)
models = {k: nn.Linear(4, 1) for k in ("a", "b", "c")}
optimizers = {k: torch.optim.SGD(m.parameters(), lr=0.05, momentum=0.5) for k, m in models.items()}
""",
    """
for name, model in models.items():
    opt = optimizers[name]
    for xb, yb in batches:
        opt.zero_grad()
        loss_fn(model(xb), yb).backward()
        opt.step()
""",
    note="serially safe: each iteration steps its own optimizer, looked up by key (an input changed)",
)

case(
    "wb-torch-finetune-freeze-backbone",
    "safe",
    TORCH
    + """
torch.manual_seed(4)
heads = [nn.Sequential(nn.Linear(4, 4), nn.Linear(4, 1)) for _ in range(3)]
""",
    """
for h in heads:
    for p in h[0].parameters():
        p.requires_grad = False
    opt = torch.optim.SGD([p for p in h.parameters() if p.requires_grad], lr=0.1)
    for xb, yb in batches:
        opt.zero_grad()
        loss_fn(h(xb), yb).backward()
        opt.step()
trainable = [sum(p.numel() for p in h.parameters() if p.requires_grad) for h in heads]
""",
)

case(
    "wb-torch-tensors-inplace-ops",
    "safe",
    """
import torch
torch.manual_seed(5)
weights = [torch.randn(3, 3) for _ in range(4)]
w0 = weights[0]
""",
    """
for w in weights:
    w.clamp_(-1.0, 1.0)
    w.div_(w.norm())
norm0 = float(w0.norm())
""",
)

case(
    "wb-torch-init-weights-apply",
    "safe",
    """
import torch
from torch import nn
def init_weights(m):
    if isinstance(m, nn.Linear):
        nn.init.constant_(m.weight, 0.5)
        nn.init.zeros_(m.bias)
nets = [nn.Sequential(nn.Linear(2, 3), nn.ReLU(), nn.Linear(3, 1)) for _ in range(3)]
""",
    """
for net in nets:
    net.apply(init_weights)
out = [net(torch.ones(1, 2)).item() for net in nets]
""",
)

case(
    "wb-torch-grad-left-on-params",
    "safe",
    TORCH
    + """
torch.manual_seed(6)
nets = [nn.Linear(4, 1) for _ in range(3)]
""",
    """
for net in nets:
    net.zero_grad()
    loss = loss_fn(net(X), Y)
    loss.backward()
grad_norms = [float(net.weight.grad.norm()) for net in nets]
""",
    note="gradients accumulated on each own net's parameters, not stepped",
)

# ---------------------------------------------------------------- scikit-learn

case(
    "wb-sk-fit-list-then-score",
    "safe",
    SK
    + """
models = [LogisticRegression(C=c, max_iter=200) for c in (0.01, 0.1, 1.0, 10.0)]
best_guess = models[2]
""",
    """
for m in models:
    m.fit(X_tr, y_tr)
scores = [m.score(X_te, y_te) for m in models]
guess_coef = best_guess.coef_.copy()
""",
)

case(
    "wb-sk-models-items-print",
    "safe",
    SK
    + """
models = {
    "logreg": LogisticRegression(max_iter=300),
    "tree": DecisionTreeClassifier(max_depth=3, random_state=0),
    "knn": KNeighborsClassifier(n_neighbors=5),
}
""",
    """
results = {}
for name, m in models.items():
    m.fit(X_tr, y_tr)
    acc = m.score(X_te, y_te)
    results[name] = acc
    print(f"{name:8s} accuracy={acc:.3f}")
""",
)

case(
    "wb-sk-pipelines-enumerate",
    "safe",
    SK
    + """
pipes = [make_pipeline(StandardScaler(), LogisticRegression(C=c)) for c in (0.1, 1.0, 5.0)]
""",
    """
test_acc = {}
for i, pipe in enumerate(pipes):
    pipe.fit(X_tr, y_tr)
    test_acc[i] = pipe.score(X_te, y_te)
scaler_means = [p[0].mean_.copy() for p in pipes]
""",
)

case(
    "wb-sk-set-params-then-fit",
    "safe",
    SK
    + """
trees = [DecisionTreeClassifier(random_state=0) for _ in range(4)]
""",
    """
for depth, tree in enumerate(trees, start=1):
    tree.set_params(max_depth=depth)
    tree.fit(X_tr, y_tr)
leaves = [t.get_n_leaves() for t in trees]
""",
)

case(
    "wb-sk-kmeans-dict-by-k",
    "safe",
    SK
    + """
from sklearn.cluster import KMeans
kms = {k: KMeans(n_clusters=k, n_init=3, random_state=0) for k in range(2, 6)}
""",
    """
inertia = {}
for k, km in kms.items():
    km.fit(X)
    inertia[k] = km.inertia_
""",
)

case(
    "wb-sk-zip-models-datasets",
    "safe",
    SK
    + """
regs = [Ridge(alpha=a) for a in (0.1, 1.0, 10.0)]
datasets = [(X[k::3], X[k::3, 0] * 2.0 + k) for k in range(3)]
""",
    """
for reg, (Xs, ys) in zip(regs, datasets):
    reg.fit(Xs, ys)
intercepts = [round(float(r.intercept_), 6) for r in regs]
""",
)

case(
    "wb-sk-scaler-per-column-own",
    "safe",
    """
import numpy as np
from sklearn.preprocessing import MinMaxScaler
_r = np.random.default_rng(2)
features = {"age": _r.integers(18, 80, size=(10, 1)).astype(float),
            "income": _r.lognormal(10, 1, size=(10, 1))}
scalers = {name: MinMaxScaler() for name in features}
""",
    """
scaled = {}
for name, sc in scalers.items():
    scaled[name] = sc.fit_transform(features[name])
""",
)

# ---------------------------------------------------------------- DataFrames

case(
    "wb-df-frames-fillna-inplace",
    "safe",
    FRAMES
    + """
first = frames[0]
""",
    """
for df in frames:
    df.fillna({"qty": 0}, inplace=True)
    df["revenue"] = df["qty"] * df["price"]
first_total = first["revenue"].sum()
""",
)

case(
    "wb-df-frames-sort-inplace",
    "safe",
    FRAMES,
    """
for df in frames:
    df.sort_values("price", ascending=False, inplace=True)
    df.reset_index(drop=True, inplace=True)
tops = [df.loc[0, "price"] for df in frames]
""",
)

case(
    "wb-df-frames-rename-drop",
    "safe",
    FRAMES,
    """
for df in frames:
    df.rename(columns=str.upper, inplace=True)
    df.drop(columns=["CITY"], inplace=True)
cols = [list(df.columns) for df in frames]
""",
)

case(
    "wb-df-dict-zscore-items",
    "safe",
    FRAMES
    + """
by_name = {f"shop{k}": f for k, f in enumerate(frames)}
""",
    """
for name, d in by_name.items():
    d["price_z"] = (d["price"] - d["price"].mean()) / d["price"].std()
    d["shop"] = name
same_objects = all(by_name[f"shop{k}"] is f for k, f in enumerate(frames))
""",
)

case(
    "wb-df-frames-astype-category",
    "safe",
    FRAMES,
    """
for df in frames:
    df["city"] = df["city"].astype("category")
    df["qty"] = df["qty"].fillna(df["qty"].median()).astype(int)
dtypes = [str(df["qty"].dtype) for df in frames]
""",
)

# ---------------------------------------------------------------- numpy arrays

case(
    "wb-np-arrays-imul",
    "safe",
    ARRAYS
    + """
a0 = arrays[0]
""",
    """
for a in arrays:
    a *= 2
    a += 1
a0_after = a0.copy()
""",
)

case(
    "wb-np-arrays-slice-assign-sort",
    "safe",
    ARRAYS,
    """
for a in arrays:
    a[:] = np.sort(a)[::-1]
""",
)

case(
    "wb-np-arrays-clip-out",
    "safe",
    ARRAYS,
    """
for a in arrays:
    a.clip(0, out=a)
nonneg = all((a >= 0).all() for a in arrays)
""",
)

case(
    "wb-np-fill-diagonal-helper",
    "safe",
    ARRAYS,
    """
for m in mats:
    np.fill_diagonal(m, 0.0)
    m /= np.abs(m).max()
""",
    note="the item changed by a numpy function, not through its own method",
)

case(
    "wb-np-images-uint8-brighten",
    "safe",
    """
import numpy as np
_r = np.random.default_rng(9)
imgs = [_r.integers(0, 256, size=(4, 5), dtype=np.uint8) for _ in range(4)]
""",
    """
for im in imgs:
    np.clip(im.astype(np.int16) + 40, 0, 255, out=im, casting="unsafe")
    im[0, :] = 255
""",
)

case(
    "wb-np-int-array-receives-float",
    "safe",
    """
import numpy as np
counts = [np.arange(5), np.arange(3) * 10, np.array([7, 8])]
""",
    """
for c in counts:
    c[:] = c / 3
""",
    note="float values written into an int item: truncated, as serially",
)

# ---------------------------------------------------------------- plain objects, dataclasses, nested

case(
    "wb-obj-particles-step",
    "safe",
    """
class Particle:
    def __init__(self, x, v):
        self.x = x
        self.v = v
particles = [Particle(float(k), 1.0 - 0.3 * k) for k in range(5)]
tracked = particles[2]
dt = 0.1
""",
    """
for p in particles:
    for _ in range(10):
        p.x += p.v * dt
        p.v *= 0.95
    p.done = True
tracked_x = tracked.x
""",
)

case(
    "wb-dataclass-deposit-method",
    "safe",
    """
from dataclasses import dataclass, field
@dataclass
class Account:
    owner: str
    balance: float = 0.0
    history: list = field(default_factory=list)
    def deposit(self, amount):
        self.balance += amount
        self.history.append(("deposit", amount))
accounts = [Account("ann", 10.0), Account("bob"), Account("cy", 99.5)]
""",
    """
for acct in accounts:
    acct.deposit(25.0)
    if acct.balance > 100:
        acct.deposit(-5.0)
balances = [a.balance for a in accounts]
""",
)

case(
    "wb-obj-students-grades-append",
    "safe",
    """
class Student:
    def __init__(self, name, grades):
        self.name = name
        self.grades = grades
students = [Student("ana", [70, 85]), Student("ben", [90]), Student("cai", [])]
""",
    """
for s in students:
    s.grades.append(100)
    s.avg = sum(s.grades) / len(s.grades)
""",
    note="an attribute list changed in place (not rebound), shared by nothing",
)

case(
    "wb-nested-records-sort-scores",
    "safe",
    """
records = [{"name": "ana", "scores": [3, 9, 1]},
           {"name": "ben", "scores": [5, 2]},
           {"name": "cai", "scores": [8]}]
""",
    """
for r in records:
    r["scores"].sort(reverse=True)
    r["best"] = r["scores"][0]
""",
    note="an element of a dict item changed in place (the docs refuse it: the kernel's element may be shared)",
)

case(
    "wb-nested-config-update",
    "safe",
    """
configs = [{"lr": 0.1, "opt": {"name": "sgd"}}, {"lr": 0.01, "opt": {"name": "adam"}}]
""",
    """
for cfg in configs:
    cfg.update(epochs=10, tag=f"lr{cfg['lr']}")
    cfg["opt"] = dict(cfg["opt"], momentum=0.9)
""",
)

case(
    "wb-list-items-extend-sort",
    "safe",
    """
buckets = [[5, 1, 4], [9, 2], [], [3]]
""",
    """
for b in buckets:
    b.extend([0, 10])
    b.sort()
sizes = [len(b) for b in buckets]
""",
)

case(
    "wb-dict-keys-own-value-rescale",
    "safe",
    """
prices = {"apple": 1.2, "pear": 0.8, "plum": 2.5, "fig": 3.0}
""",
    """
for k in prices:
    prices[k] = round(prices[k] * 1.1, 2)
""",
    note="own key written through iteration over the dict's keys (values replaced, no key added)",
)

# ---------------------------------------------------------------- unsafe twins

case(
    "wb-u-same-counter-twice",
    "unsafe",
    """
class Tally:
    def __init__(self):
        self.n = 0
    def bump(self, k):
        self.n += k
t = Tally()
tallies = [t, Tally(), t]
""",
    """
for tl in tallies:
    tl.bump(2)
""",
    note="serially t.n == 4 (bumped twice)",
)

case(
    "wb-u-same-frame-two-keys",
    "unsafe",
    """
import pandas as pd
base = pd.DataFrame({"x": [1, 2, 3]})
views = {"a": base, "b": base}
""",
    """
for key, f in views.items():
    f[key] = f["x"] * len(f.columns)
""",
    note="one frame twice: serially the second iteration sees the first's column",
)

case(
    "wb-u-item-reachable-from-item",
    "unsafe",
    """
class Node:
    def __init__(self, value, child=None):
        self.value = value
        self.child = child
leaf = Node(1.0)
nodes = [leaf, Node(2.0, leaf), Node(3.0)]
""",
    """
for n in nodes:
    n.value *= 10
    n.total = n.value + (n.child.value if n.child is not None else 0)
""",
)

case(
    "wb-u-item-is-also-input",
    "unsafe",
    ARRAYS
    + """
ref = arrays[0]
""",
    """
for a in arrays:
    a -= ref.mean()
""",
    note="serially iteration 0 centres ref; later iterations subtract its new mean (0)",
)

case(
    "wb-u-item-read-through-iterable",
    "unsafe",
    ARRAYS,
    """
for a in arrays:
    a /= np.abs(arrays[0]).max()
""",
)

case(
    "wb-u-shared-encoder-modules",
    "unsafe",
    TORCH
    + """
torch.manual_seed(8)
encoder = nn.Linear(4, 4)
nets = [nn.Sequential(encoder, nn.ReLU(), nn.Linear(4, 1)) for _ in range(3)]
""",
    """
for net in nets:
    opt = torch.optim.SGD(net.parameters(), lr=0.05)
    for xb, yb in batches:
        opt.zero_grad()
        loss_fn(net(xb), yb).backward()
        opt.step()
""",
    note="a shared submodule: serially each net trains what the previous one left",
)

case(
    "wb-u-item-and-world-state",
    "unsafe",
    """
class World:
    g = 9.8
class Ball:
    def __init__(self, h):
        self.h = h
world = World()
world.g = 9.8
balls = [Ball(10.0), Ball(20.0), Ball(5.0)]
""",
    """
for b in balls:
    b.h -= 0.5 * world.g * 0.1
    world.g *= 1.1
""",
    note="changes its own item and an input that later iterations read",
)

case(
    "wb-u-fit-item-and-outer-list",
    "unsafe",
    SK
    + """
models = [LogisticRegression(C=c) for c in (0.1, 1.0, 10.0)]
pool = [X_tr.copy()]
""",
    """
for m in models:
    m.fit(pool[-1], y_tr)
    pool.append(pool[-1] * 0.5)
""",
    note="each fit reads the data the previous iteration appended",
)

case(
    "wb-u-sklearn-warm-start-same-est",
    "unsafe",
    SK
    + """
from sklearn.linear_model import SGDClassifier
est = SGDClassifier(random_state=0, max_iter=5, tol=None, warm_start=True)
estimators = [est, est]
""",
    """
for e in estimators:
    e.fit(X_tr, y_tr)
""",
    note="warm start: serially the second fit starts from the first's coefficients",
)

case(
    "wb-u-dict-values-same-list",
    "unsafe",
    """
shared = []
groups = {"x": shared, "y": [1], "z": shared}
""",
    """
for k, lst in groups.items():
    lst.append(k)
""",
)

# ================================================================ sinks

case(
    "wb-sink-extend-tokens",
    "safe",
    TEXT,
    """
tokens = []
for d in docs:
    tokens.extend(w.lower() for w in d.split())
""",
)

case(
    "wb-sink-vocab-set-add-nested",
    "safe",
    TEXT,
    """
vocab = set()
for d in docs:
    for w in d.split():
        vocab.add(w.lower())
n_vocab = len(vocab)
""",
)

case(
    "wb-sink-counter-nested-keyed",
    "safe",
    TEXT
    + """
from collections import Counter
""",
    """
freq = Counter()
for d in docs:
    for w in d.lower().split():
        freq[w] += 1
top3 = freq.most_common(3)
""",
)

case(
    "wb-sink-html-concat",
    "safe",
    TEXT,
    """
html = "<ul>\\n"
for i, d in enumerate(docs):
    html += f"  <li id='{i}'>{d.title()}</li>\\n"
html += "</ul>"
""",
)

case(
    "wb-sink-running-min-with-epoch",
    "safe",
    """
import math
val_losses = [0.9, 0.7, 0.72, 0.55, 0.61, 0.55, 0.8]
""",
    """
best_loss = math.inf
best_epoch = None
for epoch, vl in enumerate(val_losses):
    if vl < best_loss:
        best_loss = vl
        best_epoch = epoch
""",
    note="early-stopping bookkeeping: a running argmin (known category)",
)

case(
    "wb-sink-max-builtin-running",
    "safe",
    TEXT,
    """
longest = 0
shortest = 10**9
for d in docs:
    longest = max(longest, len(d))
    shortest = min(shortest, len(d))
""",
)

case(
    "wb-sink-keyed-get-itertuples",
    "safe",
    DF,
    """
revenue = {}
units = {}
for row in df.itertuples():
    revenue[row.store] = revenue.get(row.store, 0.0) + row.units * row.price
    units[row.store] = units.get(row.store, 0) + row.units
""",
)

case(
    "wb-sink-defaultdict-list-iterrows",
    "safe",
    DF
    + """
from collections import defaultdict
""",
    """
by_store = defaultdict(list)
for idx, row in df.iterrows():
    by_store[row["store"]].append(idx)
""",
)

case(
    "wb-sink-df-loc-own-row",
    "safe",
    DF,
    """
df["revenue"] = 0.0
for i in range(len(df)):
    df.loc[i, "revenue"] = df.loc[i, "units"] * df.loc[i, "price"]
    df.loc[i, "band"] = "high" if df.loc[i, "revenue"] > 50 else "low"
""",
)

case(
    "wb-sink-df-at-iterrows",
    "safe",
    DF,
    """
for idx, row in df.iterrows():
    df.at[idx, "discounted"] = round(row["price"] * 0.9, 2)
""",
)

case(
    "wb-sink-arr-row-assign-2d",
    "safe",
    """
import numpy as np
_r = np.random.default_rng(4)
data = _r.normal(size=(6, 3))
""",
    """
out = np.empty_like(data)
for i in range(data.shape[0]):
    out[i, :] = (data[i] - data[i].min()) / (np.ptp(data[i]) + 1e-9)
""",
)

case(
    "wb-sink-int-array-float-values",
    "safe",
    """
import numpy as np
""",
    """
hist = np.zeros(6, dtype=int)
for i in range(6):
    hist[i] = i * 2.7
""",
    note="dtype-changing write: floats into an int array, truncated",
)

case(
    "wb-sink-uint8-image-rows",
    "safe",
    """
import numpy as np
""",
    """
img = np.zeros((5, 4), dtype=np.uint8)
for r in range(5):
    img[r] = np.linspace(0, 60 * r, 4)
""",
)

case(
    "wb-sink-torch-own-rows-no-grad",
    "safe",
    TORCH
    + """
torch.manual_seed(10)
model = nn.Linear(4, 2)
""",
    """
preds = torch.zeros(len(batches), 8, 2)
with torch.no_grad():
    for b, (xb, _) in enumerate(batches):
        preds[b] = model(xb)
""",
)

case(
    "wb-sink-del-own-keys",
    "safe",
    """
stock = {"apple": 3, "pear": 0, "plum": 7, "fig": 0, "kiwi": 1}
""",
    """
for item in list(stock):
    if stock[item] == 0:
        del stock[item]
""",
)

case(
    "wb-sink-combinations-keyed",
    "safe",
    """
import itertools
import numpy as np
_r = np.random.default_rng(6)
emb = {name: _r.normal(size=4) for name in ("cat", "dog", "car", "bus")}
""",
    """
sim = {}
for a, b in itertools.combinations(emb, 2):
    va, vb = emb[a], emb[b]
    sim[(a, b)] = float(va @ vb / (np.linalg.norm(va) * np.linalg.norm(vb)))
""",
)

# ================================================================ side effects

case(
    "wb-fx-log-list-handler",
    "safe",
    """
import logging
class Collect(logging.Handler):
    def __init__(self):
        super().__init__()
        self.lines = []
    def emit(self, record):
        self.lines.append(self.format(record))
collector = Collect()
train_log = logging.getLogger("nb.train")
train_log.setLevel(logging.INFO)
train_log.addHandler(collector)
""",
    """
for epoch in range(4):
    train_log.info("epoch %d loss %.3f", epoch, 1.0 / (epoch + 1))
lines = list(collector.lines)
train_log.removeHandler(collector)
""",
    note="the handler is the notebook's; serially it sees every record",
)

case(
    "wb-fx-log-file-handler",
    "safe",
    """
import logging, os, shutil
D = @TMP@
shutil.rmtree(D, ignore_errors=True)
os.makedirs(D)
fh = logging.FileHandler(os.path.join(D, "run.log"), mode="w")
fh.setFormatter(logging.Formatter("%(levelname)s:%(message)s"))
runlog = logging.getLogger("nb.file")
runlog.setLevel(logging.DEBUG)
runlog.propagate = False
runlog.addHandler(fh)
""",
    """
for k in range(5):
    runlog.debug("k=%d sq=%d", k, k * k)
    if k % 2:
        runlog.warning("odd %d", k)
fh.flush()
with open(os.path.join(D, "run.log")) as f:
    logged = f.read().splitlines()
runlog.removeHandler(fh)
fh.close()
""",
)

case(
    "wb-fx-one-file-per-item",
    "safe",
    """
import os, shutil, glob
D = @TMP@
shutil.rmtree(D, ignore_errors=True)
os.makedirs(D)
reports = {"north": [3, 4], "south": [1], "east": [9, 9, 2]}
""",
    """
for region, vals in reports.items():
    with open(os.path.join(D, f"{region}.txt"), "w") as f:
        f.write(f"{region}: total={sum(vals)}\\n")
        for v in vals:
            f.write(f"{v}\\n")
written = {os.path.basename(p): open(p).read() for p in sorted(glob.glob(os.path.join(D, "*.txt")))}
""",
)

case(
    "wb-fx-shared-file-print-helper",
    "unsafe",
    """
import os, shutil
D = @TMP@
shutil.rmtree(D, ignore_errors=True)
os.makedirs(D)
out_path = os.path.join(D, "results.csv")
def record(name, value):
    with open(out_path, "a") as f:
        print(name, value, sep=",", file=f)
""",
    """
for name in ["a", "b", "c", "d"]:
    for rep in range(2):
        record(name, rep)
with open(out_path) as f:
    rows = f.read().splitlines()
""",
    note="one file appended from a helper in a nested loop: order across iterations matters",
)

case(
    "wb-fx-tqdm-header",
    "safe",
    """
import io
from tqdm.auto import tqdm
items = list(range(8))
""",
    """
squares = []
for x in tqdm(items, desc="squaring", file=io.StringIO()):
    squares.append(x * x)
""",
)

case(
    "wb-fx-tqdm-enumerate-zip",
    "safe",
    """
import io
from tqdm import tqdm
a = [1, 2, 3, 4]
b = [10, 20, 30, 40]
""",
    """
prods = {}
for i, (p, q) in enumerate(tqdm(zip(a, b), total=len(a), file=io.StringIO())):
    prods[i] = p * q
""",
)

case(
    "wb-fx-warnings-catch-around",
    "safe",
    """
import warnings
values = [1.0, -2.0, 3.0, -0.5]
""",
    """
import math
roots = []
with warnings.catch_warnings(record=True) as caught:
    warnings.simplefilter("always")
    for v in values:
        if v < 0:
            warnings.warn(f"negative value {v}, using abs")
        roots.append(math.sqrt(abs(v)))
messages = [str(w.message) for w in caught]
""",
    note="warnings recorded into a list the with statement made in the kernel",
)

case(
    "wb-fx-warnings-logged",
    "safe",
    """
import warnings
values = [0.5, 2.0, -1.0]
""",
    """
ok = []
for v in values:
    if v > 1:
        warnings.warn("value above 1", UserWarning)
    ok.append(min(v, 1.0))
""",
)

case(
    "wb-fx-print-stderr",
    "safe",
    """
import sys
jobs = ["load", "clean", "fit"]
""",
    """
done = []
for j in jobs:
    print(f"[{j}] starting", file=sys.stderr)
    done.append(j.upper())
""",
)

case(
    "wb-fx-np-global-seeded",
    "safe",
    """
import numpy as np
""",
    """
samples = []
for i in range(5):
    samples.append(np.random.rand(3).round(6).tolist())
""",
    kind="seeded",
)

case(
    "wb-fx-random-sample-seeded",
    "safe",
    """
import random
population = list(range(50))
""",
    """
picks = {}
for trial in range(4):
    picks[trial] = random.sample(population, 3)
""",
    kind="seeded",
)

case(
    "wb-fx-torch-randperm-seeded",
    "safe",
    """
import torch
data = torch.arange(10.0)
""",
    """
perms = []
for ep in range(3):
    idx = torch.randperm(len(data))
    perms.append(data[idx][:4])
""",
    kind="seeded",
)

case(
    "wb-fx-from-numpy-rand-unseeded",
    "safe",
    """
from numpy.random import rand, normal
""",
    """
noise = []
for k in range(4):
    noise.append(rand() + normal(0, 0.1))
""",
    kind="random",
)

case(
    "wb-fx-shuffle-own-list-seeded",
    "safe",
    """
import random
decks = [list(range(k, k + 5)) for k in range(0, 20, 5)]
""",
    """
for deck in decks:
    random.shuffle(deck)
""",
    kind="seeded",
    note="own item changed in place by a random draw",
)

case(
    "wb-fx-np-choice-unseeded",
    "safe",
    """
import numpy as np
colors = ["red", "green", "blue"]
""",
    """
assigned = {}
for user in ["u1", "u2", "u3", "u4"]:
    assigned[user] = str(np.random.choice(colors))
""",
    kind="random",
)

# ================================================================ iteration forms

case(
    "wb-form-enumerate-start",
    "safe",
    TEXT,
    """
numbered = []
for n, d in enumerate(docs, start=1):
    numbered.append(f"{n}. {d}")
""",
)

case(
    "wb-form-zip-three",
    "safe",
    """
names = ["ann", "bob", "cy"]
ages = [31, 25, 40]
cities = ["Oslo", "Rome", "Lima"]
""",
    """
people = []
for name, age, city in zip(names, ages, cities):
    people.append({"name": name.title(), "age": age, "city": city, "senior": age > 35})
""",
)

case(
    "wb-form-sorted-items",
    "safe",
    """
scores = {"bob": 71, "ann": 92, "cy": 85, "dee": 60}
""",
    """
lines = []
for name, s in sorted(scores.items(), key=lambda kv: -kv[1]):
    grade = "A" if s >= 90 else "B" if s >= 80 else "C"
    lines.append(f"{name}: {grade}")
""",
)

case(
    "wb-form-iterrows-gather",
    "safe",
    DF,
    """
labels = []
for _, row in df.iterrows():
    if row["units"] == 0:
        continue
    labels.append(f"{row['store']}-{int(row['units'])}")
""",
)

case(
    "wb-form-range-len-reads",
    "safe",
    """
prices = [10.0, 10.5, 10.2, 11.0, 11.4, 10.9]
""",
    """
returns = [0.0] * len(prices)
for i in range(1, len(prices)):
    returns[i] = (prices[i] - prices[i - 1]) / prices[i - 1]
""",
)

case(
    "wb-form-generator-function",
    "safe",
    """
data = list(range(23))
def chunks(seq, n):
    for i in range(0, len(seq), n):
        yield seq[i:i + n]
""",
    """
sums = []
for batch in chunks(data, 5):
    sums.append(sum(batch))
""",
)

case(
    "wb-form-comprehension-before-loop",
    "safe",
    """
import math
""",
    """
xs = [i / 4 for i in range(8)]
table = {}
for x in xs:
    table[x] = (math.sin(x), math.cos(x))
""",
)

case(
    "wb-form-while-index",
    "unsafe",
    """
vals = [3, 1, 4, 1, 5, 9, 2]
""",
    """
out = []
i = 0
while i < len(vals):
    out.append(vals[i] * 2)
    i += 1
""",
    note="a while loop: refused or run as serially",
)

case(
    "wb-form-inner-break-only",
    "safe",
    """
words = ["sky", "tree", "rhythm", "apple", "crypt", "ounce"]
vowels = set("aeiou")
""",
    """
first_vowel = {}
for w in words:
    for pos, ch in enumerate(w):
        if ch in vowels:
            first_vowel[w] = pos
            break
    else:
        first_vowel[w] = None
""",
)

case(
    "wb-form-top-break-search",
    "unsafe",
    """
import math
nums = [4, 6, 8, 9, 11, 12, 13]
""",
    """
first_prime = None
for n in nums:
    if all(n % d for d in range(2, int(math.isqrt(n)) + 1)):
        first_prime = n
        break
""",
)

case(
    "wb-form-for-else-no-break",
    "safe",
    """
vals = [2, 4, 6]
""",
    """
total = 0
for v in vals:
    total += v
else:
    finished = True
""",
)

case(
    "wb-form-continue-try-except",
    "safe",
    """
raw = ["1.5", "n/a", "3", "", "-2.25"]
""",
    """
parsed = []
bad = 0
for s in raw:
    try:
        v = float(s)
    except ValueError:
        bad += 1
        continue
    parsed.append(v)
""",
)

case(
    "wb-form-enumerate-zip-nested-unpack",
    "safe",
    """
xs = [1.0, 2.0, 3.0]
ys = [2.0, 4.1, 5.9]
""",
    """
residuals = {}
for i, (x, y_) in enumerate(zip(xs, ys)):
    residuals[i] = y_ - 2 * x
""",
)

case(
    "wb-form-df-index-loc-write",
    "safe",
    DF,
    """
for idx in df.index:
    df.loc[idx, "price_bucket"] = int(df.loc[idx, "price"] // 2)
""",
)

case(
    "wb-form-columns-astype",
    "safe",
    """
import pandas as pd
raw_df = pd.DataFrame({"a": ["1", "2", "3"], "b": ["0.5", "1.5", "x"], "c": ["7", "8", "9"]})
""",
    """
for col in raw_df.columns:
    raw_df[col] = pd.to_numeric(raw_df[col], errors="coerce")
""",
)

case(
    "wb-form-iterate-numpy-array",
    "safe",
    """
import numpy as np
temps = np.array([12.5, 18.0, 25.3, 31.2, 8.4])
""",
    """
labels = []
for t in temps:
    labels.append("hot" if t > 25 else "mild" if t > 15 else "cold")
""",
)

case(
    "wb-form-reversed-range-own-index",
    "safe",
    """
import numpy as np
""",
    """
n = 6
fact = np.ones(n, dtype=np.int64)
for i in reversed(range(n)):
    fact[i] = np.prod(np.arange(1, i + 1))
""",
)

# ================================================================ second batch: more item kinds and twins

case(
    "wb-sk-fit-dict-values",
    "safe",
    SK
    + """
models = {"l1": LogisticRegression(C=0.5, max_iter=300), "tree": DecisionTreeClassifier(max_depth=2, random_state=0)}
""",
    """
for m in models.values():
    m.fit(X_tr, y_tr)
acc = {k: m.score(X_te, y_te) for k, m in models.items()}
""",
)

case(
    "wb-sk-fit-range-len-index",
    "safe",
    SK
    + """
models = [LogisticRegression(C=c) for c in (0.1, 1.0, 10.0)]
""",
    """
for i in range(len(models)):
    models[i].fit(X_tr, y_tr)
coefs = [m.coef_.round(6).tolist() for m in models]
""",
    note="the own item through the iterable and a range index, as many tutorials write it",
)

case(
    "wb-sk-grid-items-nested-tuple",
    "safe",
    SK
    + """
grid = {"shallow": (DecisionTreeClassifier(random_state=0), {"max_depth": 2}),
        "deep": (DecisionTreeClassifier(random_state=0), {"max_depth": 6})}
""",
    """
depths = {}
for name, (est, params) in grid.items():
    est.set_params(**params).fit(X_tr, y_tr)
    depths[name] = est.get_depth()
""",
)

case(
    "wb-u-estimators-share-randomstate",
    "unsafe",
    SK
    + """
from sklearn.ensemble import RandomForestClassifier
rng = np.random.RandomState(0)
forests = [RandomForestClassifier(n_estimators=4, max_depth=3, random_state=rng) for _ in range(3)]
""",
    """
for f in forests:
    f.fit(X_tr, y_tr)
importances = [f.feature_importances_.round(8).tolist() for f in forests]
""",
    note="one RandomState shared by every estimator: serially each fit draws after the previous one",
)

case(
    "wb-torch-batchnorm-buffers-train",
    "safe",
    """
import torch
from torch import nn
torch.manual_seed(12)
X = torch.randn(16, 3)
nets = [nn.Sequential(nn.Linear(3, 4), nn.BatchNorm1d(4)) for _ in range(3)]
""",
    """
for net in nets:
    net.train()
    for _ in range(2):
        net(X)
    net.eval()
running = [net[1].running_mean.clone() for net in nets]
tracked = [int(net[1].num_batches_tracked) for net in nets]
""",
)

case(
    "wb-u-input-is-submodule-of-item",
    "unsafe",
    TORCH
    + """
torch.manual_seed(13)
nets = [nn.Sequential(nn.Linear(4, 4), nn.Linear(4, 1)) for _ in range(3)]
backbone = nets[0][0]
""",
    """
probe = []
for net in nets:
    opt = torch.optim.SGD(net.parameters(), lr=0.1)
    opt.zero_grad()
    loss_fn(net(X), Y).backward()
    opt.step()
    probe.append(float(backbone(X).sum()))
""",
    note="`backbone` is nets[0]'s first layer: serially later iterations read it trained",
)

case(
    "wb-u-tied-parameter-items",
    "unsafe",
    """
import torch
from torch import nn
torch.manual_seed(14)
shared = nn.Parameter(torch.ones(2, 2))
layers = [nn.Linear(2, 2, bias=False) for _ in range(2)]
for lyr in layers:
    lyr.weight = shared
x = torch.ones(1, 2)
""",
    """
for lyr in layers:
    opt = torch.optim.SGD(lyr.parameters(), lr=0.5)
    opt.zero_grad()
    lyr(x).sum().backward()
    opt.step()
w_after = shared.detach().clone()
""",
    note="one Parameter tied into two modules: serially it takes both steps",
)

case(
    "wb-u-items-share-attr-list",
    "unsafe",
    """
class Run:
    def __init__(self, name, events):
        self.name = name
        self.events = events
shared_events = []
runs = [Run("a", shared_events), Run("b", shared_events), Run("c", [])]
""",
    """
for r in runs:
    r.events.append(r.name)
    r.n_events = len(r.events)
""",
)

case(
    "wb-u-class-attr-list-via-instance",
    "unsafe",
    """
class Bag:
    contents = []
    def __init__(self, label):
        self.label = label
    def put(self, x):
        self.contents.append(x)
bags = [Bag("x"), Bag("y"), Bag("z")]
""",
    """
for b in bags:
    b.put(b.label.upper())
    b.size = len(b.contents)
""",
    note="a class-level list shared by every instance (the classic mutable class attribute)",
)

case(
    "wb-tensor-row-views-items",
    "safe",
    """
import torch
W = torch.zeros(4, 3)
rows = list(W)
""",
    """
for k, r in enumerate(rows):
    r.add_(k + 1)
W_after = W.clone()
""",
    note="disjoint views of one tensor: serially W sees every row's change",
)

case(
    "wb-np-row-views-items",
    "safe",
    """
import numpy as np
A = np.arange(12.0).reshape(4, 3)
rows = [A[i] for i in range(4)]
""",
    """
for r in rows:
    r -= r.mean()
A_after = A.copy()
""",
)

case(
    "wb-bound-methods-items",
    "safe",
    """
class Counter:
    def __init__(self, start):
        self.value = start
    def tick(self):
        self.value += 1
        return self.value
counters = [Counter(k * 10) for k in range(3)]
ticks = [c.tick for c in counters]
""",
    """
results = []
for f in ticks:
    results.append(f())
values = [c.value for c in counters]
""",
    note="items are bound methods: calling one changes its own object",
)

case(
    "wb-rng-generators-items",
    "safe",
    """
import numpy as np
rngs = [np.random.default_rng(s) for s in range(3)]
""",
    """
draws = []
for g in rngs:
    draws.append(g.normal(size=2).round(8).tolist())
""",
    note="per-worker generators: each iteration advances its own item",
)

case(
    "wb-random-instances-items",
    "safe",
    """
import random
gens = [random.Random(s) for s in (1, 2, 3)]
""",
    """
rolls = []
for g in gens:
    rolls.append(g.randint(1, 6))
after = [g.random() for g in gens]
""",
)

case(
    "wb-iterators-items-next",
    "safe",
    """
streams = [iter([1, 2, 3]), iter("abc"), iter(range(5, 9))]
""",
    """
heads = []
for it in streams:
    heads.append(next(it))
rest = [list(it) for it in streams]
""",
)

case(
    "wb-deque-items-rotate",
    "safe",
    """
from collections import deque
rings = [deque([1, 2, 3]), deque("abcd"), deque()]
""",
    """
for d in rings:
    d.rotate(1)
    d.appendleft(0)
""",
)

case(
    "wb-set-items-add",
    "safe",
    """
tagsets = [{"a", "b"}, set(), {"z"}]
""",
    """
for s in tagsets:
    s.add("seen")
    s.discard("z")
""",
)

case(
    "wb-bytearray-items-extend",
    "safe",
    """
bufs = [bytearray(b"ab"), bytearray(), bytearray(b"xyz")]
""",
    """
for b in bufs:
    b.extend(b"!")
    b[0:0] = b">"
""",
)

# ------------------------------------------------ sets, deques, bytearrays, generators
# (each written back by its own means: checkout_kinds._stdlib_kind)

case(
    "wb-set-items-ior-alias",
    "safe",
    """
tagsets = {"ana": {"a"}, "ben": {"b", "c"}, "cai": set()}
first = tagsets["ana"]
""",
    """
for name, s in tagsets.items():
    s |= {name[0], "x"}
    s -= {"c"}
    s.update(name)
sizes = {k: len(s) for k, s in tagsets.items()}
same = first is tagsets["ana"]
""",
)

case(
    "wb-deque-maxlen-window",
    "safe",
    """
from collections import deque
windows = [deque([1, 2, 3], maxlen=3), deque(maxlen=2), deque([9], maxlen=5)]
last_window = windows[-1]
""",
    """
for w in windows:
    w.append(len(w) * 10)
    w.append(7)
    if len(w) > 1:
        w.popleft()
    w.rotate(-1)
caps = [w.maxlen for w in windows]
same = last_window is windows[-1]
""",
)

case(
    "wb-bytearray-slice-assign",
    "safe",
    """
bufs = [bytearray(b"hello"), bytearray(b"abc"), bytearray()]
alias = bufs[1]
""",
    """
for b in bufs:
    b[:] = b.upper() + b"."
    b.reverse()
alias_val = bytes(alias)
""",
)

case(
    "wb-random-instances-dict-gauss",
    "safe",
    """
import random
gens = {name: random.Random(seed) for name, seed in [("a", 1), ("b", 2), ("c", 3)]}
ga = gens["a"]
""",
    """
picks = {}
for name, g in gens.items():
    picks[name] = g.sample(range(100), 3)
    g.gauss(0, 1)
next_a = ga.random()
next_gauss = [g.gauss(0, 1) for g in gens.values()]
""",
    note="gauss caches its second draw: the state to write back includes it",
)

case(
    "wb-rng-randomstate-items-odd-randn",
    "safe",
    """
import numpy as np
states = [np.random.RandomState(s) for s in (3, 4, 5)]
""",
    """
draws = []
for rs in states:
    draws.append(rs.randn(3).round(8).tolist())
later = [rs.randn(2).round(8).tolist() for rs in states]
""",
    note="randn(3) leaves a cached Gaussian in the legacy state",
)

case(
    "wb-u-set-same-object-twice",
    "unsafe",
    """
shared = {"a"}
tagsets = [shared, {"b"}, shared]
""",
    """
for s in tagsets:
    s.add(len(s))
""",
    note="serially the third iteration sees the first one's element",
)

case(
    "wb-u-rng-shared-bit-generator",
    "unsafe",
    """
import numpy as np
bg = np.random.PCG64(7)
rngs = [np.random.Generator(bg) for _ in range(3)]
""",
    """
draws = []
for g in rngs:
    draws.append(float(g.random()))
""",
    note="one stream: serially each draw continues the previous one",
)

case(
    "wb-user-dict-subclass-attrs-alias",
    "safe",
    """
class Record(dict):
    def total(self):
        return sum(v for v in self.values() if isinstance(v, (int, float)))
recs = [Record(a=1, b=2), Record(a=5), Record()]
recs[0].source = "csv"
held = recs[1]
""",
    """
for r in recs:
    r["n"] = len(r)
    r.checked = r.total()
    r.pop("b", None)
same = held is recs[1]
checked = [r.checked for r in recs]
""",
)

case(
    "wb-u-user-list-subclass-shared-log",
    "unsafe",
    """
log = []
class Batch(list):
    def __init__(self, xs):
        super().__init__(xs)
        self.log = log
batches = [Batch([1, 2]), Batch([3]), Batch([])]
""",
    """
for b in batches:
    b.append(len(b.log))
    b.log.append(len(b))
""",
    note="every batch's log is one list: serially each append sees the others'",
)

case(
    "wb-u-bound-methods-one-object",
    "unsafe",
    """
class Meter:
    def __init__(self):
        self.n = 0
    def up(self):
        self.n += 1
        return self.n
    def double(self):
        self.n *= 2
        return self.n
m = Meter()
steps = [m.up, Meter().up, m.double, m.up]
""",
    """
out = []
for f in steps:
    out.append(f())
""",
    note="three of the methods are bound to one object: serially out == [1, 1, 2, 3]",
)

case(
    "wb-u-torch-opts-alone-step",
    "unsafe",
    TORCH
    + """
torch.manual_seed(21)
nets = [nn.Linear(4, 1) for _ in range(2)]
opts = [torch.optim.SGD(n.parameters(), lr=0.1) for n in nets]
for n in nets:
    loss_fn(n(X), Y).backward()
""",
    """
for opt in opts:
    opt.step()
w0 = nets[0].weight.detach().clone()
""",
    note="the optimizers step the nets' parameters, which are no item: they would be lost",
)

case(
    "wb-u-torch-one-net-two-pairs",
    "unsafe",
    TORCH
    + """
torch.manual_seed(22)
net = nn.Linear(4, 1)
pairs = [(net, torch.optim.SGD(net.parameters(), lr=0.1)) for _ in range(2)]
""",
    """
for n, opt in pairs:
    opt.zero_grad()
    loss_fn(n(X), Y).backward()
    opt.step()
w = net.weight.detach().clone()
""",
    note="one net trained by both iterations in turn",
)

TRAINER = """
class Trainer:
    def __init__(self, model):
        self.model = model
        self.losses = []
    def fit(self):
        opt = torch.optim.SGD(self.model.parameters(), lr=0.05)
        for xb, yb in batches:
            opt.zero_grad()
            loss = loss_fn(self.model(xb), yb)
            loss.backward()
            opt.step()
        self.losses.append(round(loss.item(), 6))
"""

case(
    "wb-u-trainers-share-one-model",
    "unsafe",
    TORCH
    + TRAINER
    + """
torch.manual_seed(23)
shared = nn.Linear(4, 1)
trainers = [Trainer(shared), Trainer(nn.Linear(4, 1)), Trainer(shared)]
""",
    """
for t in trainers:
    t.fit()
w = shared.weight.detach().clone()
""",
    note="the first and third trainers train one model in turn",
)

case(
    "wb-u-trainer-model-read-through-input",
    "unsafe",
    TORCH
    + TRAINER
    + """
torch.manual_seed(24)
nets = [nn.Linear(4, 1) for _ in range(2)]
trainers = [Trainer(n) for n in nets]
""",
    """
norms = []
for t in trainers:
    t.fit()
    norms.append(round(float(sum(n.weight.norm() for n in nets)), 5))
""",
    note="the body reads every net through `nets`: serially the second sum sees the first fit",
)

# ------------------------------------------------ containers inside an item
# (changed in place: written into the kernel's own, identity kept)

case(
    "wb-nested-tags-and-visits",
    "safe",
    """
people = [{"name": "ana", "tags": {"new"}, "visits": [3, 1]},
          {"name": "ben", "tags": set(), "visits": []},
          {"name": "cai", "tags": {"vip"}, "visits": [5]}]
ana_tags = people[0]["tags"]
ana_visits = people[0]["visits"]
""",
    """
for p in people:
    p["tags"].add(p["name"][0])
    p["tags"].discard("new")
    p["visits"].append(len(p["visits"]))
    p["visits"].sort()
seen_through_alias = (sorted(ana_tags), list(ana_visits))
""",
)

case(
    "wb-nested-inner-lists-sort",
    "safe",
    """
groups = [[[3, 1, 2], [9, 8]], [[5, 4]], [[0]]]
first_inner = groups[0][0]
""",
    """
for g in groups:
    g[0].sort()
    g[-1].append(len(g))
first_sorted = list(first_inner)
""",
)

case(
    "wb-u-nested-list-shared-by-two-items",
    "unsafe",
    """
common = [4, 2]
rows = [{"id": 1, "vals": common}, {"id": 2, "vals": common}, {"id": 3, "vals": [7]}]
""",
    """
for r in rows:
    r["vals"].append(r["id"])
    r["n"] = len(r["vals"])
""",
    note="serially the second row sees the first one's append (n == 4)",
)

case(
    "wb-u-nested-list-held-by-an-input",
    "unsafe",
    """
rows = [{"vals": [3, 1]}, {"vals": [2]}]
index = {"first": rows[0]["vals"]}
""",
    """
seen = []
for r in rows:
    r["vals"].append(0)
    seen.append(len(index["first"]))
""",
    note="serially the second iteration reads the first one's append through index",
)

case(
    "wb-u-bytearray-view-read",
    "unsafe",
    """
import numpy as np
bufs = [bytearray(b"abcd"), bytearray(b"efgh")]
views = [np.frombuffer(b, dtype=np.uint8) for b in bufs]
""",
    """
totals = []
for b in bufs:
    b[0] = 65
    totals.append(int(sum(int(v.sum()) for v in views)))
""",
    note="the views share the bytearrays' memory: serially they see each change",
)

case(
    "wb-counter-items-update",
    "safe",
    """
from collections import Counter
counts = [Counter("hello"), Counter(), Counter({"x": 2})]
""",
    """
for c in counts:
    c.update("hel")
    c["total"] = sum(c.values())
""",
)

case(
    "wb-defaultdict-items-new-list",
    "safe",
    """
from collections import defaultdict
indexes = [defaultdict(list), defaultdict(list)]
indexes[0]["a"].append(1)
""",
    """
for d in indexes:
    d["new"].append(len(d))
""",
)

case(
    "wb-ordereddict-items-move",
    "safe",
    """
from collections import OrderedDict
caches = [OrderedDict(a=1, b=2, c=3), OrderedDict(b=5, a=6)]
""",
    """
for od in caches:
    od.move_to_end("a")
    od.popitem(last=False)
""",
)

case(
    "wb-series-items-iloc-set",
    "safe",
    """
import pandas as pd
series_list = [pd.Series([1.0, 2.0, 3.0]), pd.Series([5.0, None]), pd.Series([0.5])]
""",
    """
for s in series_list:
    s.iloc[0] = -1.0
    s.fillna(0.0, inplace=True)
""",
)

case(
    "wb-df-items-insert-column",
    "safe",
    FRAMES,
    """
for df in frames:
    df.insert(0, "row_id", range(len(df)))
    df.loc[:, "price"] = df["price"] * 100
""",
)

case(
    "wb-obj-setattr-builtin",
    "safe",
    """
class Config:
    pass
cfgs = [Config(), Config()]
overrides = [{"lr": 0.1, "bs": 32}, {"lr": 0.01}]
""",
    """
for cfg, ov in zip(cfgs, overrides):
    for k, v in ov.items():
        setattr(cfg, k, v)
    cfg.ready = True
""",
)

case(
    "wb-obj-del-attr",
    "safe",
    """
class Rec:
    def __init__(self, k):
        self.k = k
        self.tmp = k * 2
recs = [Rec(1), Rec(2), Rec(3)]
""",
    """
for r in recs:
    r.final = r.tmp + 1
    del r.tmp
""",
)

case(
    "wb-items-from-generator-expression",
    "safe",
    """
class Acc:
    def __init__(self):
        self.n = 0
accs = {k: Acc() for k in "abc"}
order = ["c", "a", "b"]
""",
    """
for a in (accs[k] for k in order):
    a.n += 5
""",
)

# ---------------------------------------------------------------- more sinks

case(
    "wb-sink-product-non-augmented",
    "safe",
    """
factors = [1.5, 2.0, 0.5, 4.0]
""",
    """
prod = 1.0
total = 0
for f in factors:
    prod = prod * f
    total = total + 1
""",
)

case(
    "wb-sink-max-tuple-builtin",
    "safe",
    """
scores = {"ann": 0.81, "bob": 0.93, "cy": 0.93, "dee": 0.4}
""",
    """
best = (float("-inf"), None)
for name, s in scores.items():
    best = max(best, (s, name))
""",
)

case(
    "wb-sink-keyed-max-get",
    "safe",
    DF,
    """
top_price = {}
for _, row in df.iterrows():
    top_price[row["store"]] = max(top_price.get(row["store"], 0.0), row["price"])
""",
)

case(
    "wb-sink-np-hist-keyed-add",
    "safe",
    """
import numpy as np
vals = [0, 3, 3, 1, 4, 3, 0]
""",
    """
hist = np.zeros(5, dtype=int)
for v in vals:
    hist[v] += 1
""",
)

case(
    "wb-sink-np-add-at-outer",
    "safe",
    """
import numpy as np
groups = [np.array([0, 1, 1]), np.array([2, 2]), np.array([0])]
hist = np.zeros(3)
""",
    """
for g in groups:
    np.add.at(hist, g, 1.0)
""",
    note="a commutative in-place accumulation into an input array",
)

case(
    "wb-sink-list-slot-last-write-wins",
    "safe",
    """
assignments = [("ann", 2), ("bob", 0), ("cy", 2), ("dee", 4)]
""",
    """
slots = [None] * 5
for name, pos in assignments:
    slots[pos] = name
""",
    note="a repeated position: the later iteration's write is kept, as serially",
)

case(
    "wb-sink-df-mask-per-group",
    "safe",
    DF,
    """
df["share"] = 0.0
for s in df["store"].unique():
    mask = df["store"] == s
    df.loc[mask, "share"] = df.loc[mask, "units"] / df.loc[mask, "units"].sum()
""",
)

case(
    "wb-form-while-true-break",
    "unsafe",
    """
balance = 1000.0
""",
    """
years = 0
while True:
    balance *= 1.07
    years += 1
    if balance > 2000:
        break
""",
)

case(
    "wb-form-nested-own-grid",
    "safe",
    """
import numpy as np
""",
    """
grid = np.zeros((4, 5))
for i in range(4):
    for j in range(5):
        grid[i, j] = (i + 1) * (j + 1) / 7
""",
)

# ---------------------------------------------------------------- third batch: state outside the item's attributes

case(
    "wb-fx-redirect-stdout-around",
    "safe",
    """
import io, contextlib
buf = io.StringIO()
""",
    """
with contextlib.redirect_stdout(buf):
    for i in range(4):
        print("row", i, i * i)
captured = buf.getvalue()
""",
    note="print captured into a notebook buffer by a with around the loop",
)

case(
    "wb-fx-capture-warnings-logging",
    "safe",
    """
import logging, warnings
class Keep(logging.Handler):
    def __init__(self):
        super().__init__()
        self.msgs = []
    def emit(self, record):
        self.msgs.append(record.getMessage().splitlines()[0].split(": ", 1)[-1])
keep = Keep()
logging.getLogger("py.warnings").addHandler(keep)
logging.captureWarnings(True)
""",
    """
for v in [0.5, -1.0, 2.0, -3.0]:
    if v < 0:
        warnings.warn(f"negative input {v}")
warned_msgs = list(keep.msgs)
logging.captureWarnings(False)
logging.getLogger("py.warnings").removeHandler(keep)
""",
    note="logging.captureWarnings: serially each warning is a log record",
)

case(
    "wb-user-dict-subclass-items",
    "safe",
    """
class Row(dict):
    pass
rows = [Row(a=1), Row(a=2), Row(a=3)]
""",
    """
for r in rows:
    r["b"] = r["a"] * 10
""",
)

case(
    "wb-user-list-subclass-items",
    "safe",
    """
class Stack(list):
    def push(self, x):
        self.append(x)
stacks = [Stack([1]), Stack(), Stack([4, 5])]
""",
    """
for s in stacks:
    s.push(len(s))
""",
)

case(
    "wb-u-class-counter-via-type-self",
    "unsafe",
    """
class Job:
    done = 0
    def run(self):
        type(self).done += 1
        self.order = type(self).done
jobs = [Job(), Job(), Job()]
""",
    """
for j in jobs:
    j.run()
n_done = Job.done
""",
    note="a class-level counter bumped through the instance: serially each job sees the ones before it",
)

# ---------------------------------------------------------------- fourth batch: objects whose identity matters

case(
    "wb-torch-adam-zip-state-identity",
    "safe",
    TORCH
    + """
torch.manual_seed(15)
nets = [nn.Linear(4, 1) for _ in range(2)]
opts = [torch.optim.Adam(n.parameters(), lr=0.05) for n in nets]
""",
    """
for net, opt in zip(nets, opts):
    for xb, yb in batches:
        opt.zero_grad()
        loss_fn(net(xb), yb).backward()
        opt.step()
keys_ok = [all(p in opt.state for p in net.parameters()) for net, opt in zip(nets, opts)]
groups_ok = [all(a is b for a, b in zip(opt.param_groups[0]["params"], net.parameters())) for net, opt in zip(nets, opts)]
""",
    note="the optimizer must still hold the kernel's parameters (a next cell's step trains the net)",
)

case(
    "wb-torch-net-opt-scheduler-zip",
    "safe",
    TORCH
    + """
torch.manual_seed(16)
nets = [nn.Linear(4, 1) for _ in range(2)]
opts = [torch.optim.SGD(n.parameters(), lr=0.1) for n in nets]
scheds = [torch.optim.lr_scheduler.StepLR(o, step_size=2, gamma=0.5) for o in opts]
""",
    """
for net, opt, sched in zip(nets, opts, scheds):
    for xb, yb in batches:
        opt.zero_grad()
        loss_fn(net(xb), yb).backward()
        opt.step()
        sched.step()
lrs = [o.param_groups[0]["lr"] for o in opts]
""",
)

case(
    "wb-obj-trainer-holds-model",
    "safe",
    TORCH
    + """
class Trainer:
    def __init__(self, model, lr):
        self.model = model
        self.lr = lr
        self.history = []
    def fit(self, epochs=2):
        opt = torch.optim.SGD(self.model.parameters(), lr=self.lr)
        for _ in range(epochs):
            for xb, yb in batches:
                opt.zero_grad()
                loss = loss_fn(self.model(xb), yb)
                loss.backward()
                opt.step()
            self.history.append(loss.item())
torch.manual_seed(17)
nets = [nn.Linear(4, 1) for _ in range(2)]
trainers = [Trainer(n, lr) for n, lr in zip(nets, (0.01, 0.1))]
""",
    """
for t in trainers:
    t.fit()
same_model = [t.model is n for t, n in zip(trainers, nets)]
net_w = [n.weight.detach().clone() for n in nets]
""",
    note="serially `nets` (another name for each trainer's model) sees the training",
)

case(
    "wb-own-key-list-sort-via-subscript",
    "safe",
    """
groups = {"a": [3, 1, 2], "b": [9, 7], "c": []}
""",
    """
for k in groups:
    groups[k].sort()
    groups[k].append(len(groups[k]))
""",
    note="each key's own list changed in place through the dict",
)

case(
    "wb-sk-fit-filtered-items",
    "safe",
    SK
    + """
models = [LogisticRegression(C=c) for c in (0.1, 1.0, 10.0, 100.0)]
for m in models[::2]:
    m.enabled = True
""",
    """
for m in filter(lambda m: getattr(m, "enabled", False), models):
    m.fit(X_tr, y_tr)
fitted = [hasattr(m, "coef_") for m in models]
""",
)

case(
    "wb-sk-fit-sorted-items",
    "safe",
    SK
    + """
models = [Ridge(alpha=a) for a in (10.0, 0.1, 1.0)]
""",
    """
for m in sorted(models, key=lambda m: m.alpha):
    m.fit(X_tr, y_tr)
    m.rank_ = len(str(m.alpha))
""",
)

case(
    "wb-np-slice-of-list-items",
    "safe",
    ARRAYS,
    """
for a in arrays[1:3]:
    a[:] = 0.0
""",
)

# ---------------------------------------------------------------- fifth batch

case(
    "wb-fx-logging-filter-counts",
    "safe",
    """
import logging
class CountFilter(logging.Filter):
    def __init__(self):
        super().__init__()
        self.n = 0
    def filter(self, record):
        self.n += 1
        return True
counter = CountFilter()
jlog = logging.getLogger("nb.jobs")
jlog.setLevel(logging.INFO)
jlog.addFilter(counter)
""",
    """
for job in ["a", "b", "c", "d"]:
    jlog.info("job %s", job)
n_seen = counter.n
jlog.removeFilter(counter)
""",
    note="a filter object on a notebook logger counts the records it sees",
)

case(
    "wb-torch-init-own-item-unseeded",
    "safe",
    """
import torch
from torch import nn
torch.manual_seed(0)
layers = [nn.Linear(3, 3) for _ in range(3)]
""",
    """
for lyr in layers:
    nn.init.normal_(lyr.weight, std=0.02)
    nn.init.zeros_(lyr.bias)
""",
    kind="random",
    note="own items re-initialised from torch's global generator",
)

case(
    "wb-torch-init-own-item-seeded",
    "safe",
    """
import torch
from torch import nn
torch.manual_seed(0)
layers = [nn.Linear(3, 3) for _ in range(3)]
""",
    """
for lyr in layers:
    nn.init.normal_(lyr.weight, std=0.02)
""",
    kind="seeded",
)

case(
    "wb-form-enumerate-items-own-key",
    "safe",
    """
prices = {"tea": 2.5, "cake": 4.0, "pie": 3.25}
""",
    """
for rank, (item, p) in enumerate(prices.items()):
    prices[item] = round(p * (1 + rank / 10), 2)
""",
)

# ------------------------------------------ own items by index, key, nested loop (H1)

ACCS = """
class Acc:
    def __init__(self, name):
        self.name, self.n, self.seen = name, 0, []
    def grow(self, k=1):
        self.n += k
        self.seen.append(k)
"""

case(
    "wb-own-index-objects-grow",
    "safe",
    ACCS
    + """
accs = [Acc(c) for c in "abcd"]
first = accs[0]
""",
    """
for i in range(len(accs)):
    accs[i].grow(i + 1)
    accs[i].name = accs[i].name.upper()
same = first is accs[0]
""",
)

case(
    "wb-own-index-torch-nets-train",
    "safe",
    TORCH
    + """
torch.manual_seed(21)
nets = [nn.Linear(4, 1) for _ in range(3)]
w0 = nets[0].weight
""",
    """
for i in range(len(nets)):
    nets[i].train()
    opt = torch.optim.SGD(nets[i].parameters(), lr=0.05)
    for xb, yb in batches:
        opt.zero_grad()
        loss_fn(nets[i](xb), yb).backward()
        opt.step()
    nets[i].eval()
same = w0 is nets[0].weight
""",
)

case(
    "wb-u-own-index-reads-previous",
    "unsafe",
    ACCS
    + """
accs = [Acc(c) for c in "abc"]
""",
    """
for i in range(len(accs)):
    accs[i].grow(accs[i - 1].n + 1)
""",
    note="iteration i reads the element iteration i-1 changed (a chain)",
)

case(
    "wb-u-own-index-one-object-thrice",
    "unsafe",
    ACCS
    + """
accs = [Acc("x")] * 3
""",
    """
for i in range(len(accs)):
    accs[i].grow(accs[i].n + 1)
""",
    note="the three elements are one object: serially each sees the last change",
)

case(
    "wb-u-own-index-container-reversed",
    "unsafe",
    """
rows = [[3, 1], [2, 9, 4], [8]]
""",
    """
for i in range(len(rows)):
    rows[i].append(i)
    rows.reverse()
""",
    note="the body changes the container: `rows[i]` is another element each time",
)

case(
    "wb-own-key-dict-of-lists-extend",
    "safe",
    """
buckets = {"b": [3, 1], "a": [2], "c": []}
alias = buckets["b"]
""",
    """
for k in buckets:
    buckets[k].extend([len(k), 0])
    buckets[k].sort(reverse=True)
""",
)

case(
    "wb-own-key-sk-fit-by-name",
    "safe",
    SK
    + """
ests = {"lr": LogisticRegression(max_iter=200), "tree": DecisionTreeClassifier(random_state=0), "knn": KNeighborsClassifier(3)}
""",
    """
scores = {}
for name in ests.keys():
    est = ests[name]
    est.fit(X_tr, y_tr)
    scores[name] = round(est.score(X_te, y_te), 4)
""",
)

case(
    "wb-own-key-other-dict-by-items-key",
    "safe",
    """
counts = {"x": {"n": 0}, "y": {"n": 5}}
weights = {"x": 2, "y": 3}
""",
    """
for name, w in weights.items():
    counts[name]["n"] += w
    counts[name]["last"] = name
""",
)

case(
    "wb-u-own-key-one-list-two-keys",
    "unsafe",
    """
shared = []
groups = {"a": shared, "b": shared, "c": [0]}
""",
    """
for k in groups:
    groups[k].append(len(groups[k]))
""",
    note="two keys hold one list: serially the second append sees the first",
)

case(
    "wb-u-own-key-reachable-from-input",
    "unsafe",
    """
books = {"x": [1], "y": [2]}
index = {"first": books["x"]}
""",
    """
for k in books:
    books[k].append(len(index["first"]))
""",
    note="the item of key x is also an input's value, which the y iteration reads",
)

case(
    "wb-u-own-key-other-key-read",
    "unsafe",
    """
d = {"a": [1], "b": [2], "c": [3]}
""",
    """
for k in d:
    d[k].append(sum(d["a"]))
""",
    note="every iteration reads d['a'], which the first one changed",
)

case(
    "wb-own-nested-dict-values-sorted",
    "safe",
    """
records = [{"xs": [3, 1, 2], "ys": [9, 7]}, {"xs": [5, 4], "ys": []}]
""",
    """
for rec in records:
    for vals in rec.values():
        vals.sort()
""",
)

case(
    "wb-own-nested-torch-bias-frozen",
    "safe",
    TORCH
    + """
torch.manual_seed(22)
nets = [nn.Sequential(nn.Linear(4, 3), nn.ReLU(), nn.Linear(3, 1)) for _ in range(3)]
""",
    """
for net in nets:
    for name, p in net.named_parameters():
        if name.endswith("bias"):
            p.requires_grad_(False)
    for layer in net.children():
        layer.eval()
frozen = [[p.requires_grad for p in n.parameters()] for n in nets]
""",
)

case(
    "wb-u-own-nested-shared-layer",
    "unsafe",
    TORCH
    + """
torch.manual_seed(23)
shared = nn.Linear(4, 4)
nets = [nn.Sequential(shared, nn.Linear(4, 1)) for _ in range(2)]
""",
    """
for net in nets:
    for p in net[0].parameters():
        with torch.no_grad():
            p.mul_(2.0)
""",
    note="the layer is every net's: serially scaled twice",
)

case(
    "wb-u-own-nested-data-unseen",
    "unsafe",
    TORCH
    + """
torch.manual_seed(25)
nets = [nn.Linear(4, 1) for _ in range(2)]
""",
    """
for net in nets:
    for p in net.parameters():
        p.data.mul_(0.5)
""",
    note="a change through `.data` bumps no version counter: unseen by the item check",
)

case(
    "wb-u-own-nested-other-input",
    "unsafe",
    TORCH
    + """
torch.manual_seed(24)
base = nn.Linear(4, 1)
nets = [nn.Linear(4, 1) for _ in range(2)]
""",
    """
for net in nets:
    with torch.no_grad():
        for p in base.parameters():
            p.add_(1.0)
        net.weight.copy_(base.weight)
""",
    note="the nested loop changes an input, not the item: serially twice",
)

case(
    "wb-form-enumerate-dict-own-key-ranked",
    "safe",
    """
weights = {"w1": 1.5, "w2": -0.5, "w3": 2.0}
""",
    """
for r, k in enumerate(weights):
    weights[k] = weights[k] * (r + 1)
""",
)

case(
    "wb-u-form-enumerate-list-repeated-keys",
    "unsafe",
    """
keys = [0, 1, 0]
vals = [10, 20]
""",
    """
for r, k in enumerate(keys):
    vals[k] = vals[k] + r + 1
""",
    note="key 0 twice: serially the second write reads the first",
)

case(
    "wb-u-fx-notebook-catch-warnings-restores-nothing",
    "unsafe",
    """
import contextlib, warnings
def catch_warnings():
    return contextlib.nullcontext()
seen = []
""",
    """
for i in range(3):
    with catch_warnings():
        warnings.filterwarnings("ignore", message=f"own-cw-{i}")
    seen.append(i)
kept = [f for f in warnings.filters if "own-cw" in str(f[1])]
n_filters = len(kept)
warnings.filters[:] = [f for f in warnings.filters if f not in kept]
""",
    note="the notebook's own catch_warnings restores nothing: the filters stay (serially 3)",
)

case(
    "wb-u-own-item-given-an-input",
    "unsafe",
    ACCS
    + """
shared = Acc("shared")
accs = [Acc(c) for c in "abc"]
""",
    """
for a in accs:
    a.partner = shared
    a.partner.grow()
""",
    note="each item is given the notebook's `shared`, grown through it: serially 3 times",
)

case(
    "wb-u-own-helper-steps-through-data",
    "unsafe",
    TORCH
    + """
torch.manual_seed(26)
nets = [nn.Linear(4, 1) for _ in range(3)]
def sgd_step(net, lr=0.05):
    for p in net.parameters():
        p.data -= lr * p.grad
""",
    """
for net in nets:
    for xb, yb in batches:
        net.zero_grad()
        loss_fn(net(xb), yb).backward()
        sgd_step(net)
""",
    note="the helper's `.data` steps move no version counter: unseen, lost",
)

case(
    "wb-own-iterators-advanced-in-steps",
    "safe",
    """
rows = [[1, 2, 3, 4], [5], []]
its = [iter(rows[0]), reversed(rows[0]), iter(range(3)), iter(rows[1]), iter(rows[2]), iter("xyz")]
""",
    """
firsts = []
for it in its:
    firsts.append(next(it, None))
    firsts.append(next(it, None))
left = [list(it) for it in its]
""",
)

case(
    "wb-u-own-iterators-one-iterator-twice",
    "unsafe",
    """
it = iter([1, 2, 3, 4, 5])
its = [it, it]
""",
    """
heads = []
for x in its:
    heads.append(next(x))
""",
    note="one iterator twice: serially the second iteration takes the next value",
)

case(
    "wb-u-own-iterators-generator-items",
    "unsafe",
    """
def count_from(n):
    while True:
        yield n
        n += 1
gens = [count_from(0), count_from(10)]
""",
    """
heads = [next(g) for g in gens]
for g in gens:
    heads.append(next(g))
""",
    note="a generator's position cannot be set: refused, named",
)

case(
    "wb-u-generator-side-effects-interleave",
    "unsafe",
    """
events = []
def produce(n):
    for x in range(n):
        events.append(f"made {x}")
        yield x
""",
    """
for x in produce(3):
    events.append(f"used {x}")
""",
    note="serially the generator's and the body's appends interleave",
)

# ---------------------------------------------------------------- sinks (issue 28 §3): running bests kept with what goes with them

case(
    "wb-sink-argmax-ge-keeps-last-tie",
    "safe",
    """
accs = [0.71, 0.83, 0.79, 0.83, 0.6, 0.83, 0.8, 0.5]
""",
    """
best_acc = -1.0
best_i = best_tag = None
for i, a in enumerate(accs):
    if a >= best_acc:
        best_acc = a
        best_i, best_tag = i, f"run{i}"
""",
    note="`>=`: the last of equal scores, as serially; two payloads",
)

case(
    "wb-sink-argmin-none-first-params",
    "safe",
    """
import copy
grid = [{"lr": lr, "wd": wd} for lr in (0.1, 0.01, 0.001) for wd in (0.0, 1e-4, 1e-3)]
def val_loss(p):
    return round((p["lr"] - 0.01) ** 2 * 1e4 + p["wd"] * 100, 6)
""",
    """
best = None
for params in grid:
    loss = val_loss(params)
    if best is None or loss < best:
        best = loss
        best_params = copy.deepcopy(params)
""",
    note="`best is None or ...`: the first score taken; a payload copied",
)

case(
    "wb-sink-argmax-best-on-left-nested",
    "safe",
    """
import numpy as np
_r = np.random.default_rng(3)
scores = _r.integers(0, 5, size=(6, 4)).astype(float)
""",
    """
top = float("-inf")
for row in range(scores.shape[0]):
    for col in range(scores.shape[1]):
        s = scores[row, col]
        if top < s:
            top = s
            where = (row, col)
""",
    note="`best < score` (best written on the left), from a nested loop; ties: the first",
)

case(
    "wb-sink-argmin-model-state-torch",
    "safe",
    TORCH
    + """
torch.manual_seed(8)
net = nn.Linear(4, 1)
lrs = [0.3, 0.1, 0.03, 0.01, 0.003]
""",
    """
best_loss = float("inf")
for lr in lrs:
    m = nn.Linear(4, 1)
    m.load_state_dict(net.state_dict())
    opt = torch.optim.SGD(m.parameters(), lr=lr)
    for xb, yb in batches:
        opt.zero_grad()
        loss_fn(m(xb), yb).backward()
        opt.step()
    vl = loss_fn(m(X), Y).item()
    if vl < best_loss:
        best_loss = vl
        best_lr = lr
        best_state = {k: v.clone() for k, v in m.state_dict().items()}
""",
    note="the common model-selection cell: a new model per setting, the best's weights kept",
)

case(
    "wb-u-sink-early-stopping-patience",
    "unsafe",
    """
val_losses = [0.9, 0.8, 0.85, 0.86, 0.7, 0.72, 0.73, 0.74]
""",
    """
best, wait, stopped_at = float("inf"), 0, None
for epoch, vl in enumerate(val_losses):
    if vl < best:
        best = vl
        wait = 0
    else:
        wait += 1
    if wait >= 2 and stopped_at is None:
        stopped_at = epoch
""",
    note="patience counts the epochs since the running best: order-dependent",
)

case(
    "wb-u-sink-running-best-read-in-body",
    "unsafe",
    """
val_losses = [0.9, 0.8, 0.85, 0.6, 0.7, 0.65, 0.5, 0.55]
""",
    """
best = float("inf")
trace = []
for epoch, vl in enumerate(val_losses):
    if vl < best:
        best = vl
        best_epoch = epoch
    trace.append(best)
""",
    note="each iteration's running best gathered: serially it sees every earlier epoch",
)

case(
    "wb-u-sink-running-best-min-delta",
    "unsafe",
    """
val_losses = [1.0, 0.995, 0.985, 0.984, 0.975, 0.97, 0.969, 0.96]
""",
    """
best = float("inf")
for epoch, vl in enumerate(val_losses):
    if vl < best - 0.01:
        best = vl
        best_epoch = epoch
""",
    note="a tolerance makes the pick depend on where the fold starts",
)

case(
    "wb-u-sink-running-best-prints",
    "unsafe",
    """
val_losses = [0.9, 0.8, 0.85, 0.6, 0.7, 0.65, 0.5, 0.55]
""",
    """
best = float("inf")
for epoch, vl in enumerate(val_losses):
    if vl < best:
        best = vl
        best_epoch = epoch
        print("new best", epoch)
""",
    note="serially only the cell's improvements print",
)

# ---------------------------------------------------------------- sinks: keyed running max / min

case(
    "wb-sink-keyed-min-not-in-or",
    "safe",
    DF,
    """
cheapest = {}
for store, price in zip(df["store"], df["price"]):
    if store not in cheapest or price < cheapest[store]:
        cheapest[store] = price
""",
    note="`k not in d or v < d[k]`: the key's first value, then a running minimum",
)

case(
    "wb-sink-keyed-max-direct-existing",
    "safe",
    TEXT,
    """
longest = {w[0].lower(): 0 for d in docs for w in d.split()}
for d in docs:
    for w in d.split():
        k = w[0].lower()
        longest[k] = max(longest[k], len(w))
""",
    note="`d[k] = max(d[k], v)` on keys made before the loop, from a nested loop",
)

case(
    "wb-sink-keyed-min-get-inf-itertuples",
    "safe",
    DF,
    """
low = {}
for row in df.itertuples():
    low[row.store] = min(low.get(row.store, float("inf")), row.units)
""",
)

case(
    "wb-u-sink-keyed-max-read-in-body",
    "unsafe",
    DF,
    """
top = {}
new_high = []
for _, row in df.iterrows():
    top[row["store"]] = max(top.get(row["store"], 0.0), row["price"])
    new_high.append(top[row["store"]] == row["price"])
""",
    note="each iteration reads the running max so far: order-dependent",
)

case(
    "wb-u-sink-keyed-max-ge-replaces",
    "unsafe",
    """
seen = [("a", 1), ("b", 2.0), ("a", 1.0), ("b", 2), ("a", 0)]
""",
    """
top = {}
for k, v in seen:
    if k not in top or v >= top[k]:
        top[k] = v
""",
    note="`>=` replaces an equal value: which one (int or float) stays depends on the order",
)

# ---------------------------------------------------------------- sinks: a ufunc's `.at` into an array from before the loop

case(
    "wb-sink-np-add-at-weighted-float",
    "safe",
    """
import numpy as np
_r = np.random.default_rng(4)
batches_idx = [_r.integers(0, 6, size=7) for _ in range(6)]
batches_w = [_r.normal(size=7) * 1e3 for _ in range(6)]
totals = np.zeros(6)
counts = np.zeros(6, dtype=np.int64)
""",
    """
for idx, w in zip(batches_idx, batches_w):
    np.add.at(totals, idx, w)
    np.add.at(counts, idx, 1)
means = totals / np.maximum(counts, 1)
""",
    note="a float sum per bin, bit for bit the serial one (the calls replayed in order)",
)

case(
    "wb-sink-np-maximum-at-2d",
    "safe",
    """
import numpy as np
_r = np.random.default_rng(6)
events = [(_r.integers(0, 3, size=4), _r.integers(0, 2, size=4), _r.normal(size=4)) for _ in range(5)]
peak = np.full((3, 2), -np.inf)
""",
    """
for rows, cols, vals in events:
    np.maximum.at(peak, (rows, cols), vals)
""",
    note="`np.maximum.at` with a tuple of index arrays",
)

case(
    "wb-u-sink-np-add-at-read-back",
    "unsafe",
    """
import numpy as np
groups = [np.array([0, 1, 1]), np.array([2, 2]), np.array([0]), np.array([1])]
hist = np.zeros(3)
""",
    """
shares = []
for g in groups:
    np.add.at(hist, g, 1.0)
    shares.append(hist[0] / hist.sum())
""",
    note="each iteration reads the histogram so far",
)

# ---------------------------------------------------------------- sinks: a frame's own row, read back

case(
    "wb-sink-df-at-rmw-iterrows",
    "safe",
    DF,
    """
df["net"] = 0.0
for idx, row in df.iterrows():
    df.at[idx, "net"] = row["units"] * row["price"]
    df.at[idx, "net"] -= 0.1 * df.at[idx, "net"]
    df.at[idx, "units"] = df.at[idx, "units"] + 1
    if df.at[idx, "net"] > 40:
        df.at[idx, "net"] = round(df.at[idx, "net"], 1)
""",
    note="several read-modify-write statements on one own row, through .at",
)

case(
    "wb-sink-df-loc-own-row-new-str-column",
    "safe",
    DF,
    """
for i in df.index:
    df.loc[i, "label"] = df.loc[i, "store"] + "-" + str(df.loc[i, "units"])
    df.loc[i, "short"] = df.loc[i, "label"][:3]
""",
    note="a new string column written, then read back for another",
)

case(
    "wb-u-sink-df-loc-reads-previous-row",
    "unsafe",
    DF,
    """
df["cum"] = 0
df.loc[0, "cum"] = df.loc[0, "units"]
for i in range(1, len(df)):
    df.loc[i, "cum"] = df.loc[i - 1, "cum"] + df.loc[i, "units"]
""",
    note="a running total down the rows: each row reads the previous iteration's write",
)

case(
    "wb-sink-argmax-best-model-is-the-item",
    "safe",
    """
class Model:
    def __init__(self, depth):
        self.depth = depth
    def score(self):
        return [0.61, 0.74, 0.74, 0.7, 0.52][self.depth % 5]
models = [Model(d) for d in range(7)]
""",
    """
best_score, best_model = -1.0, None
for m in models:
    s = m.score()
    if s > best_score:
        best_score, best_model = s, m
same_object = best_model is models[1]
""",
    note="the kept payload is the loop's own item: the kernel's object, as serially",
)

# ---------------------------------------------------------------- sinks: own columns, own slices, several writes to one own row

case(
    "wb-sink-own-columns-fillna",
    "safe",
    """
import numpy as np
import pandas as pd
_r = np.random.default_rng(12)
num = pd.DataFrame(_r.normal(size=(8, 3)), columns=["a", "b", "c"])
num.iloc[::3, 0] = np.nan
num.iloc[1::4, 2] = np.nan
""",
    """
for c in num.columns:
    num[c] = num[c].fillna(num[c].median())
""",
    note="each column filled from its own median",
)

case(
    "wb-sink-own-slice-method-mean",
    "safe",
    """
import numpy as np
_r = np.random.default_rng(13)
img = _r.normal(size=(3, 2, 4, 4))
""",
    """
for b in range(img.shape[0]):
    for c in range(img.shape[1]):
        img[b, c] = img[b, c] - img[b, c].mean()
""",
    note="a method call on the iteration's own slice (per-channel centring)",
)

case(
    "wb-sink-own-row-several-rmw",
    "safe",
    """
rows = [[1.0, 2.0, 0.0], [3.0, 1.0, 0.0], [0.5, 0.5, 0.0]]
""",
    """
for i in range(len(rows)):
    rows[i][0] = rows[i][0] * 2
    rows[i][1] += rows[i][0]
    rows[i][2] = rows[i][0] + rows[i][1]
    rows[i][0] -= 1
""",
    note="several read-modify-write statements on one own row",
)
