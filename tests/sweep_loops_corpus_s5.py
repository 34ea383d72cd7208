# ruff: noqa: E501  (the cells are notebook code, as tutorials write it)
"""A fifth held-in corpus of notebook loops, for tests/test_sweep_loops_s5.py,
by the categories the held-out suites test, each with its traps: state
changed behind a call (a global, a memo cache, a closure's ``nonlocal``, a
class attribute, a mutable default, a namespace's attribute,
``functools.lru_cache``); objects as sinks and own items written back
(objects with ``__slots__``, records, ``df.at``/``df.loc`` per row, rows of
preallocated arrays and tensors, nested lists, writes to another item);
torch evaluation and per-config training; scikit-learn cross-validation and
model comparisons; running values and early exits; iterables with state;
printing, logging, progress bars and wall-clock times; files.

Same shape as tests/sweep_loops_corpus.py (its ``Case``; see its docstring
for verdicts, kinds and ``@TMP@``).  The ids start with ``s5-`` and must not
clash with the other corpora's.

Wall-clock times (``time.time()``, ``perf_counter``) are never equal between
two runs, serial or not: the harness compares floats to 1e-9, so the timing
cases keep what a rerun reproduces (which items were timed, that each time
is a non-negative number) and delete the raw times in the cell's epilogue;
a log line that carries a time carries it rounded to what a rerun gives.
"""

from __future__ import annotations

import textwrap

from sweep_loops_corpus import CASES as _FIRST_CASES
from sweep_loops_corpus import Case
from sweep_loops_corpus_s3 import CASES as _S3_CASES
from sweep_loops_corpus_s4 import CASES as _S4_CASES
from sweep_loops_corpus_writeback import CASES as _WB_CASES

CASES: list[Case] = []


def case(id, verdict, setup, cell, kind="plain", note=""):
    """As sweep_loops_corpus.case, into this corpus's own list."""
    assert verdict in ("safe", "unsafe") and kind in ("plain", "seeded", "random")
    assert id.startswith("s5-"), id
    others = CASES + _FIRST_CASES + _WB_CASES + _S3_CASES + _S4_CASES
    assert all(c.id != id for c in others), id
    CASES.append(
        Case(id, verdict, textwrap.dedent(setup), textwrap.dedent(cell), kind, note)
    )


# ---------------------------------------------------------------- shared setups

PY = """
words = ["alpha", "beta", "gamma", "delta", "beta", "alpha", "omega"]
nums = [3, 8, 1, 9, 4, 7, 2, 6]
"""

NP = """
import numpy as np
_r = np.random.default_rng(55)
data = _r.normal(size=(7, 4))
series = [_r.normal(size=12).cumsum() for _ in range(5)]
"""

DF = """
import numpy as np
import pandas as pd
_r = np.random.default_rng(5)
df = pd.DataFrame({"city": ["Oslo", "Rome", "Lima", "Pune", "Kyiv", "Baku"],
                   "temp": _r.normal(15, 8, size=6).round(1),
                   "rain": _r.integers(0, 40, size=6)})
"""

TORCH = """
import copy
import torch
from torch import nn
torch.manual_seed(5)
X = torch.randn(40, 4)
Y = (X[:, 0] - X[:, 2] > 0).long()
loader = list(zip(X.split(10), Y.split(10)))

class MLP(nn.Module):
    def __init__(self, hidden=8):
        super().__init__()
        self.net = nn.Sequential(nn.Linear(4, hidden), nn.ReLU(), nn.Linear(hidden, 2))

    def forward(self, x):
        return self.net(x)

model = MLP()
"""

SK = """
import numpy as np
from sklearn.datasets import make_classification
from sklearn.model_selection import KFold, StratifiedKFold, cross_val_score
from sklearn.linear_model import LogisticRegression
from sklearn.tree import DecisionTreeClassifier
from sklearn.neighbors import KNeighborsClassifier
X, y = make_classification(n_samples=60, n_features=5, n_informative=3, random_state=5)
"""

FILES = """
import os, json, shutil
D = @TMP@
shutil.rmtree(D, ignore_errors=True)
os.makedirs(os.path.join(D, "cfg"))
for k in range(5):
    with open(os.path.join(D, "cfg", f"exp{k}.json"), "w") as fh:
        json.dump({"name": f"exp{k}", "lr": 10.0 ** -k, "layers": k % 3 + 1}, fh)
cfg_paths = sorted(os.path.join(D, "cfg", f) for f in os.listdir(os.path.join(D, "cfg")))
"""


# ================================================================ 1. hidden state behind calls

case(
    "s5-hs-u-global-call-counter",
    "unsafe",
    PY
    + """
n_calls = 0
def featurize(w):
    global n_calls
    n_calls += 1
    return len(w), w[0]
""",
    """
feats = {}
for w in words:
    feats[w] = featurize(w)
""",
)

case(
    "s5-hs-u-memo-cache-dict",
    "unsafe",
    PY
    + """
cache = {}
def slow_square(n):
    if n not in cache:
        cache[n] = n * n
    return cache[n]
""",
    """
squares = []
for n in nums:
    squares.append(slow_square(n))
""",
    note="serially the cache holds every n after the cell",
)

case(
    "s5-hs-u-registry-decorator-in-body",
    "unsafe",
    PY
    + """
REGISTRY = {}
def register(name):
    def deco(fn):
        REGISTRY[name] = fn
        return fn
    return deco
""",
    """
for w in sorted(set(words)):
    register(w)(len)
n_registered = len(REGISTRY)
""",
)

case(
    "s5-hs-u-closure-nonlocal-id",
    "unsafe",
    PY
    + """
def make_counter():
    c = 0
    def next_id():
        nonlocal c
        c += 1
        return c
    return next_id
next_id = make_counter()
""",
    """
ids = {}
for w in words:
    if w not in ids:
        ids[w] = next_id()
""",
    note="the ids depend on how many came before",
)

case(
    "s5-hs-u-class-attr-instance-ids",
    "unsafe",
    """
class Run:
    count = 0
    def __init__(self, lr):
        Run.count += 1
        self.id = Run.count
        self.lr = lr
""",
    """
runs = []
for lr in [0.1, 0.03, 0.01, 0.003]:
    runs.append(Run(lr))
ids = [r.id for r in runs]
""",
)

case(
    "s5-hs-u-class-attr-seen-set",
    "unsafe",
    """
class Tokenizer:
    vocab = set()
    def __call__(self, s):
        toks = s.lower().split()
        Tokenizer.vocab.update(toks)
        return toks
tok = Tokenizer()
texts = ["A b c", "b C d", "e a"]
""",
    """
lens = []
for t in texts:
    lens.append(len(tok(t)))
vocab_size = len(Tokenizer.vocab)
""",
)

case(
    "s5-hs-u-mutable-default-history",
    "unsafe",
    PY
    + """
def normalise(w, _history=[]):
    _history.append(w)
    return w.upper(), len(_history)
""",
    """
out = []
for w in words:
    out.append(normalise(w))
""",
)

case(
    "s5-hs-mutable-default-never-changed",
    "safe",
    PY
    + """
def pad(w, fill=["*"], width=7):
    return w + "".join(fill) * (width - len(w))
""",
    """
padded = [pad(w) for w in words]
""",
    note="a mutable default only read",
)

case(
    "s5-hs-u-namespace-config-counter",
    "unsafe",
    PY
    + """
from types import SimpleNamespace
config = SimpleNamespace(seen=0, scale=2)
def scaled(x):
    config.seen += 1
    return x * config.scale
""",
    """
vals = []
for n in nums:
    vals.append(scaled(n))
seen = config.seen
""",
)

case(
    "s5-hs-u-module-object-attr",
    "unsafe",
    PY
    + """
import types
settings = types.ModuleType("settings")
settings.calls = 0
def work(x):
    settings.calls += 1
    return -x
""",
    """
neg = [work(n) for n in nums]
calls = settings.calls
""",
)

case(
    "s5-hs-lru-cache-pure",
    "safe",
    PY
    + """
import functools
@functools.lru_cache(maxsize=None)
def syllables(w):
    return sum(ch in "aeiou" for ch in w)
""",
    """
counts = {}
for w in words:
    counts[w] = syllables(w)
""",
    note="the cache only saves work: the results are the serial ones",
)

case(
    "s5-hs-u-lru-cache-info-read-after",
    "unsafe",
    PY
    + """
import functools
@functools.lru_cache(maxsize=None)
def syllables(w):
    return sum(ch in "aeiou" for ch in w)
""",
    """
counts = []
for w in words:
    counts.append(syllables(w))
hits = syllables.cache_info().hits
misses = syllables.cache_info().misses
""",
    note="the cache's state is read after the loop",
)

case(
    "s5-hs-u-helper-chain-appends-global",
    "unsafe",
    PY
    + """
audit = []
def _record(kind, x):
    audit.append((kind, x))
def check(x):
    if x % 2:
        _record("odd", x)
    return x % 2 == 0
""",
    """
evens = []
for n in nums:
    if check(n):
        evens.append(n)
""",
)

case(
    "s5-hs-u-global-best-in-helper",
    "unsafe",
    PY
    + """
best = None
def consider(x):
    global best
    if best is None or x > best:
        best = x
    return x - (best or 0)
""",
    """
gaps = []
for n in nums:
    gaps.append(consider(n))
""",
)

case(
    "s5-hs-u-itertools-count-ids",
    "unsafe",
    PY
    + """
import itertools
_ids = itertools.count(100)
def new_id():
    return next(_ids)
""",
    """
tagged = []
for w in words:
    tagged.append((new_id(), w))
""",
)

case(
    "s5-hs-u-classmethod-cache",
    "unsafe",
    """
class Encoder:
    _cache = {}
    @classmethod
    def encode(cls, s):
        if s not in cls._cache:
            cls._cache[s] = len(cls._cache)
        return cls._cache[s]
labels = ["cat", "dog", "cat", "bird", "dog", "fish"]
""",
    """
codes = []
for lab in labels:
    codes.append(Encoder.encode(lab))
""",
)

case(
    "s5-hs-helper-changes-own-item",
    "safe",
    """
records = [{"name": " Ann ", "age": "31"}, {"name": "bo", "age": "x"},
           {"name": "Cy ", "age": "45"}]
def clean_in_place(rec):
    rec["name"] = rec["name"].strip().title()
    rec["age"] = int(rec["age"]) if rec["age"].isdigit() else None
""",
    """
for r in records:
    clean_in_place(r)
""",
    note="the helper changes only the iteration's own item",
)

case(
    "s5-hs-u-random-module-in-helper",
    "unsafe",
    PY
    + """
import random
random.seed(1)
def jitter(x):
    return x + random.random()
""",
    """
noisy = []
for n in nums:
    noisy.append(jitter(n))
""",
    kind="random",
)

# ================================================================ 2. objects as sinks, own items

case(
    "s5-obj-dataclass-particles-step",
    "safe",
    """
from dataclasses import dataclass
@dataclass
class Particle:
    x: float
    vx: float
    hits: int = 0
particles = [Particle(float(i), 0.5 * (-1) ** i) for i in range(6)]
""",
    """
for p in particles:
    for _ in range(4):
        p.x += p.vx
        if abs(p.x) > 4:
            p.vx = -p.vx
            p.hits += 1
""",
)

case(
    "s5-obj-plain-class-method-step",
    "safe",
    """
class Account:
    def __init__(self, owner, balance):
        self.owner = owner
        self.balance = balance
        self.history = []
    def apply_interest(self, rate):
        gain = round(self.balance * rate, 2)
        self.balance += gain
        self.history.append(gain)
accounts = [Account("ann", 100.0), Account("bo", 250.0), Account("cy", 80.0)]
""",
    """
for acct in accounts:
    for month in range(3):
        acct.apply_interest(0.01)
""",
)

case(
    "s5-obj-slots-counters-scale",
    "safe",
    """
class Cell:
    __slots__ = ("value", "label")
    def __init__(self, value, label):
        self.value = value
        self.label = label
cells = [Cell(v, f"c{v}") for v in range(5)]
""",
    """
for c in cells:
    c.value = c.value * 2 + 1
    c.label = c.label.upper()
""",
)

case(
    "s5-obj-u-same-particle-twice",
    "unsafe",
    """
class P:
    def __init__(self, x):
        self.x = x
a, b = P(0.0), P(10.0)
particles = [a, b, a]
""",
    """
for p in particles:
    p.x = p.x * 2 + 1
xs = [p.x for p in particles]
""",
    note="one object is two items: the second update reads the first",
)

case(
    "s5-obj-records-score-key",
    "safe",
    """
records = [{"name": "ann", "math": 71, "art": 88}, {"name": "bo", "math": 92, "art": 64},
           {"name": "cy", "math": 55, "art": 79}, {"name": "di", "math": 83, "art": 90}]
def score(d):
    return round(0.6 * d["math"] + 0.4 * d["art"], 1)
""",
    """
for d in records:
    d["score"] = score(d)
    d["passed"] = d["score"] >= 70
""",
)

case(
    "s5-obj-df-at-iterrows-conditional",
    "safe",
    DF + 'df["label"] = ""\n',
    """
for i, row in df.iterrows():
    if row["temp"] > 15:
        df.at[i, "label"] = "warm"
    else:
        df.at[i, "label"] = "cold"
""",
)

case(
    "s5-obj-df-loc-range-len",
    "safe",
    DF,
    """
df["rain_mm_per_deg"] = 0.0
for i in range(len(df)):
    df.loc[i, "rain_mm_per_deg"] = df.loc[i, "rain"] / max(abs(df.loc[i, "temp"]), 1.0)
""",
)

case(
    "s5-obj-u-df-loc-reads-previous-row",
    "unsafe",
    DF,
    """
df["cum_rain"] = 0
df.loc[0, "cum_rain"] = df.loc[0, "rain"]
for i in range(1, len(df)):
    df.loc[i, "cum_rain"] = df.loc[i - 1, "cum_rain"] + df.loc[i, "rain"]
""",
)

case(
    "s5-obj-list-own-element-strip",
    "safe",
    """
lines = ["  id: 1 ", "name:  x", " tags : a,b ", "end"]
""",
    """
for i in range(len(lines)):
    lines[i] = lines[i].replace(" ", "").lower()
""",
)

case(
    "s5-obj-np-rows-prealloc",
    "safe",
    NP,
    """
stats = np.zeros((len(series), 3))
for i, s in enumerate(series):
    stats[i, :] = [s.mean(), s.std(), s.max() - s.min()]
""",
)

case(
    "s5-obj-np-own-row-standardise",
    "safe",
    NP,
    """
Z = data.copy()
for i in range(Z.shape[0]):
    Z[i] = (Z[i] - Z[i].mean()) / Z[i].std()
""",
)

case(
    "s5-obj-torch-out-prealloc-model",
    "safe",
    TORCH,
    """
model.eval()
out = torch.zeros(len(loader), 10, 2)
with torch.no_grad():
    for i, (xb, yb) in enumerate(loader):
        out[i] = model(xb)
""",
)

case(
    "s5-obj-nested-grid-lists",
    "safe",
    """
n, m = 4, 5
grid = [[0] * m for _ in range(n)]
""",
    """
for i in range(n):
    for j in range(m):
        grid[i][j] = (i + 1) * (j + 1) % 7
""",
)

case(
    "s5-obj-u-grid-rows-one-object",
    "unsafe",
    """
n, m = 4, 3
grid = [[0] * m] * n
""",
    """
for i in range(n):
    for j in range(m):
        grid[i][j] = i * 10 + j
""",
    note="the rows are one list: every row ends as the last",
)

case(
    "s5-obj-u-write-next-element",
    "unsafe",
    """
a = [1, 0, 0, 0, 0, 0]
""",
    """
for i in range(len(a) - 1):
    a[i + 1] = a[i] * 2 + 1
""",
)

case(
    "s5-obj-u-np-reads-previous-element",
    "unsafe",
    NP,
    """
x = data[:, 0].copy()
for i in range(1, len(x)):
    x[i] = 0.5 * x[i - 1] + x[i]
""",
)

case(
    "s5-obj-u-torch-rows-recurrence",
    "unsafe",
    TORCH,
    """
h = torch.zeros(6, 4)
h[0] = X[0]
for t in range(1, 6):
    h[t] = torch.tanh(h[t - 1] + X[t])
""",
)

case(
    "s5-obj-u-row-written-through-other-key",
    "unsafe",
    """
scores = {"a": 1, "b": 2, "c": 3}
order = ["a", "b", "c"]
""",
    """
for k_prev, k in zip(order, order[1:]):
    scores[k] = scores[k] + scores[k_prev]
""",
)

# ================================================================ 3. torch

case(
    "s5-torch-eval-correct-total",
    "safe",
    TORCH,
    """
model.eval()
correct, total = 0, 0
with torch.no_grad():
    for xb, yb in loader:
        pred = model(xb).argmax(dim=1)
        correct += (pred == yb).sum().item()
        total += yb.size(0)
acc = correct / total
""",
)

case(
    "s5-torch-per-config-train-results-dict",
    "safe",
    TORCH,
    """
results = {}
for hidden, lr in [(4, 0.1), (8, 0.1), (8, 0.01)]:
    torch.manual_seed(0)
    net = MLP(hidden)
    opt = torch.optim.SGD(net.parameters(), lr=lr)
    for epoch in range(2):
        for xb, yb in loader:
            opt.zero_grad()
            loss = nn.functional.cross_entropy(net(xb), yb)
            loss.backward()
            opt.step()
    results[(hidden, lr)] = round(loss.item(), 6)
""",
)

case(
    "s5-torch-best-state-deepcopy",
    "safe",
    TORCH,
    """
best_acc, best_state, best_lr = -1.0, None, None
for lr in [0.3, 0.1, 0.03]:
    torch.manual_seed(1)
    net = MLP()
    opt = torch.optim.Adam(net.parameters(), lr=lr)
    for xb, yb in loader:
        opt.zero_grad()
        nn.functional.cross_entropy(net(xb), yb).backward()
        opt.step()
    with torch.no_grad():
        acc = (net(X).argmax(1) == Y).float().mean().item()
    if acc > best_acc:
        best_acc, best_lr = acc, lr
        best_state = copy.deepcopy(net.state_dict())
""",
)

case(
    "s5-torch-losses-per-config-append",
    "safe",
    TORCH,
    """
curves = {}
for wd in [0.0, 1e-3, 1e-1]:
    torch.manual_seed(2)
    net = MLP(6)
    opt = torch.optim.SGD(net.parameters(), lr=0.1, weight_decay=wd)
    losses = []
    for epoch in range(2):
        for xb, yb in loader:
            opt.zero_grad()
            loss = nn.functional.cross_entropy(net(xb), yb)
            loss.backward()
            opt.step()
            losses.append(loss.item())
    curves[wd] = losses
""",
)

case(
    "s5-torch-u-shared-model-trained-per-epoch",
    "unsafe",
    TORCH,
    """
opt = torch.optim.SGD(model.parameters(), lr=0.1)
epoch_loss = []
for epoch in range(4):
    total = 0.0
    for xb, yb in loader:
        opt.zero_grad()
        loss = nn.functional.cross_entropy(model(xb), yb)
        loss.backward()
        opt.step()
        total += loss.item()
    epoch_loss.append(total)
""",
)

case(
    "s5-torch-manual-seed-i-in-body",
    "safe",
    TORCH,
    """
draws = {}
for i in range(5):
    torch.manual_seed(i)
    draws[i] = torch.randn(3).sum().item()
""",
)

case(
    "s5-torch-u-unseeded-init-per-config",
    "unsafe",
    TORCH,
    """
outs = {}
for hidden in [2, 4, 8]:
    net = MLP(hidden)
    with torch.no_grad():
        outs[hidden] = net(X[:3]).sum().item()
""",
    kind="random",
)

case(
    "s5-torch-inner-early-stop-per-config",
    "safe",
    TORCH,
    """
stopped_at = {}
for lr in [0.5, 0.05]:
    torch.manual_seed(4)
    net = MLP(4)
    opt = torch.optim.SGD(net.parameters(), lr=lr)
    best, bad = float("inf"), 0
    for epoch in range(8):
        opt.zero_grad()
        loss = nn.functional.cross_entropy(net(X), Y)
        loss.backward()
        opt.step()
        if loss.item() < best - 1e-3:
            best, bad = loss.item(), 0
        else:
            bad += 1
        if bad >= 2:
            break
    stopped_at[lr] = epoch
""",
)

case(
    "s5-torch-load-state-into-shared-model",
    "safe",
    TORCH
    + """
ckpts = {}
for k in range(3):
    torch.manual_seed(10 + k)
    ckpts[f"ck{k}"] = MLP().state_dict()
""",
    """
scores = {}
with torch.no_grad():
    for name, state in ckpts.items():
        model.load_state_dict(state)
        scores[name] = model(X).argmax(1).eq(Y).sum().item()
""",
    note="load_state_dict overwrites every parameter before the read: each iteration's score depends only on its own checkpoint; serially the model ends holding the last one",
)

case(
    "s5-torch-eval-train-mode-dropout-unseeded",
    "unsafe",
    """
import torch
from torch import nn
torch.manual_seed(0)
X = torch.randn(20, 4)
net = nn.Sequential(nn.Linear(4, 8), nn.Dropout(0.5), nn.Linear(8, 1))
""",
    """
outs = []
with torch.no_grad():
    for xb in X.split(5):
        outs.append(net(xb).sum().item())
""",
    kind="random",
    note="the net is left in train mode: dropout draws",
)

# ================================================================ 4. scikit-learn

case(
    "s5-sk-manual-kfold-split",
    "safe",
    SK,
    """
kf = KFold(n_splits=4, shuffle=True, random_state=0)
fold_acc = []
for train_idx, test_idx in kf.split(X):
    clf = LogisticRegression(max_iter=200)
    clf.fit(X[train_idx], y[train_idx])
    fold_acc.append(clf.score(X[test_idx], y[test_idx]))
mean_acc = float(np.mean(fold_acc))
""",
)

case(
    "s5-sk-model-comparison-dict",
    "safe",
    SK,
    """
models = {"logreg": LogisticRegression(max_iter=200),
          "tree": DecisionTreeClassifier(max_depth=4, random_state=0),
          "knn": KNeighborsClassifier(n_neighbors=5)}
scores = {}
for name, m in models.items():
    scores[name] = cross_val_score(m, X, y, cv=3).mean()
best_name = max(scores, key=scores.get)
""",
)

case(
    "s5-sk-clf-before-loop-refit-per-fold",
    "safe",
    SK,
    """
clf = LogisticRegression(max_iter=200)
accs = []
for tr, te in KFold(n_splits=3).split(X):
    clf.fit(X[tr], y[tr])
    accs.append(clf.score(X[te], y[te]))
""",
    note="fit() starts from scratch (no warm_start): each iteration depends only on its fold, and serially clf ends as the last fold's fit; a serially equivalent run is possible (the last iteration's estimator comes back)",
)

case(
    "s5-sk-u-warm-start-clf-before-loop",
    "unsafe",
    SK + "from sklearn.linear_model import SGDClassifier\n",
    """
sgd = SGDClassifier(warm_start=True, max_iter=5, tol=None, random_state=0)
coef_norms = []
for tr, te in KFold(n_splits=3).split(X):
    sgd.fit(X[tr], y[tr])
    coef_norms.append(float(np.linalg.norm(sgd.coef_)))
""",
    note="warm_start: each fit starts from the last",
)

case(
    "s5-sk-fit-models-in-list-own-items",
    "safe",
    SK,
    """
estimators = [LogisticRegression(max_iter=200), DecisionTreeClassifier(random_state=1),
              KNeighborsClassifier(3)]
train_acc = []
for est in estimators:
    est.fit(X, y)
    train_acc.append(est.score(X, y))
""",
)

case(
    "s5-sk-u-feature-scaler-fit-outer-partial",
    "unsafe",
    SK + "from sklearn.preprocessing import StandardScaler\n",
    """
scaler = StandardScaler()
means = []
for part in np.array_split(X, 4):
    scaler.partial_fit(part)
    means.append(scaler.mean_.copy())
""",
)

case(
    "s5-sk-oof-predictions-own-positions",
    "safe",
    SK,
    """
oof = np.zeros(len(y))
for tr, te in KFold(n_splits=4, shuffle=True, random_state=3).split(X):
    m = LogisticRegression(max_iter=200).fit(X[tr], y[tr])
    oof[te] = m.predict_proba(X[te])[:, 1]
""",
)

case(
    "s5-sk-oof-plus-equals-repeated",
    "safe",
    SK,
    """
from sklearn.model_selection import RepeatedKFold
oof_sum = np.zeros(len(y))
for tr, te in RepeatedKFold(n_splits=3, n_repeats=2, random_state=0).split(X):
    m = LogisticRegression(max_iter=200).fit(X[tr], y[tr])
    oof_sum[te] += m.predict_proba(X[te])[:, 1]
oof_mean = oof_sum / 2
""",
    note="a keyed float reduction: agrees to rounding (documented)",
)

# ================================================================ 5. running values, early exits

case(
    "s5-run-best-and-index-tuple",
    "safe",
    PY,
    """
best, best_i = float("-inf"), -1
for i, x in enumerate(nums):
    if x > best:
        best, best_i = x, i
""",
)

case(
    "s5-run-argmin-with-params-payload",
    "safe",
    NP,
    """
best_loss, best_params = np.inf, None
for a in [0.1, 0.5, 1.0]:
    for b in [-1.0, 0.0, 1.0]:
        loss = float(np.mean((data[:, 0] * a + b - data[:, 1]) ** 2))
        if loss < best_loss:
            best_loss = loss
            best_params = {"a": a, "b": b}
""",
    note="the running best is in a nested loop: not at the body's top level",
)

case(
    "s5-run-argmin-top-level-dict-payload",
    "safe",
    NP,
    """
best_loss, best_params = np.inf, None
for a, b in [(0.1, -1.0), (0.5, 0.0), (1.0, 1.0), (0.5, 1.0)]:
    loss = float(np.mean((data[:, 0] * a + b - data[:, 1]) ** 2))
    if loss < best_loss:
        best_loss = loss
        best_params = {"a": a, "b": b}
""",
)

case(
    "s5-run-u-for-else-break-first-match",
    "unsafe",
    PY,
    """
for i, n in enumerate(nums):
    if n > 8:
        found = (i, n)
        break
else:
    found = None
""",
)

case(
    "s5-run-u-break-after-first-failure",
    "unsafe",
    PY,
    """
ok = []
for w in words:
    if w.startswith("o"):
        break
    ok.append(w)
""",
)

case(
    "s5-run-try-except-records-failures",
    "safe",
    """
raw = ["1.5", "2", "x", "3e2", "", "-4", "nan?"]
""",
    """
parsed, failures = [], []
for s in raw:
    try:
        parsed.append(float(s))
    except ValueError as e:
        failures.append((s, str(e)))
        continue
""",
)

case(
    "s5-run-string-accumulation",
    "safe",
    PY,
    """
out = ""
for i, w in enumerate(words):
    out += f"{i}:{w[:3]};"
""",
)

case(
    "s5-run-float-total-rebind",
    "safe",
    """
xs = [0.1] * 7 + [1e16, 1.0, -1e16, 0.3]
""",
    """
total = 0.0
for x in xs:
    total = total + x
""",
    note="float addition in order: the serial sum bit for bit",
)

case(
    "s5-run-min-seen-builtin",
    "safe",
    NP,
    """
min_seen = float("inf")
max_seen = -float("inf")
for s in series:
    v = float(s.min())
    min_seen = min(min_seen, v)
    max_seen = max(max_seen, float(s.max()))
""",
)

case(
    "s5-run-u-best-read-in-body",
    "unsafe",
    PY,
    """
best = 0
improvements = []
for n in nums:
    if n > best:
        improvements.append(n - best)
        best = n
""",
)

case(
    "s5-run-u-patience-counter",
    "unsafe",
    """
val_losses = [0.9, 0.7, 0.72, 0.69, 0.71, 0.73, 0.74, 0.6]
""",
    """
best, wait, stop_epoch = float("inf"), 0, None
for epoch, vl in enumerate(val_losses):
    if vl < best:
        best, wait = vl, 0
    else:
        wait += 1
    if wait == 2 and stop_epoch is None:
        stop_epoch = epoch
""",
)

case(
    "s5-run-u-prev-value-diff",
    "unsafe",
    PY,
    """
prev = None
diffs = []
for n in nums:
    if prev is not None:
        diffs.append(n - prev)
    prev = n
""",
)

# ================================================================ 6. iterables with state

case(
    "s5-it-generator-before-loop",
    "safe",
    PY,
    """
gen = (n * n for n in nums if n % 2)
odd_sq = []
for v in gen:
    odd_sq.append(v + 1)
""",
)

case(
    "s5-it-zip-two-iterators",
    "safe",
    PY,
    """
it_a = iter(nums)
it_b = iter(words)
pairs = {}
for n, w in zip(it_a, it_b):
    pairs[w] = pairs.get(w, 0) + n
rest_a = list(it_a)
""",
    note="zip draws from it_a first: it_a ends one item further than it_b's length",
)

case(
    "s5-it-zip-longer-iterator-left-partly-drawn",
    "safe",
    "stream = iter(range(100, 110))\nlabels = ['x', 'y', 'z']\n",
    """
tagged = []
for v, lab in zip(stream, labels):
    tagged.append(f"{lab}{v}")
rest = list(stream)
""",
    note="serially zip draws 4 items of stream (the 4th before labels runs out): 6 are left",
)

case(
    "s5-it-zip-same-iterator-pairs",
    "safe",
    PY,
    """
it = iter(nums)
products = []
for a, b in zip(it, it):
    products.append(a * b)
""",
    note="the pairs idiom: one iterator twice in a zip",
)

case(
    "s5-it-zip-star-grouper",
    "safe",
    PY,
    """
triples = []
for t in zip(*[iter(words)] * 3):
    triples.append("-".join(t))
""",
    note="itertools' grouper recipe, spelled with zip",
)

case(
    "s5-it-zip-file-head-then-rest",
    "safe",
    """
import os, shutil
D = @TMP@
shutil.rmtree(D, ignore_errors=True)
os.makedirs(D)
p = os.path.join(D, "log.txt")
with open(p, "w") as fh:
    fh.write("".join(f"line {k}\\n" for k in range(8)))
""",
    """
head = []
with open(p) as fh:
    for line, k in zip(fh, range(2)):
        head.append((k, line.strip()))
    rest = fh.read().splitlines()
""",
    note="serially zip reads 3 lines (the 3rd before range runs out): 5 are left",
)

case(
    "s5-it-u-next-inside-body",
    "unsafe",
    PY,
    """
it = iter(nums)
pairs = []
for a in it:
    b = next(it, None)
    pairs.append((a, b))
""",
)

case(
    "s5-it-u-next-on-other-iterator-in-body",
    "unsafe",
    PY,
    """
labels = iter(["x", "y", "z", "w", "v", "u", "t"])
tagged = []
for w in words:
    tagged.append((next(labels), w))
""",
)

case(
    "s5-it-enumerate-start-one",
    "safe",
    PY,
    """
numbered = {}
for k, w in enumerate(words, start=1):
    numbered[k] = f"{k}. {w}"
""",
)

case(
    "s5-it-product-grid",
    "safe",
    NP + "import itertools\n",
    """
grid = {}
for alpha, beta in itertools.product([0.1, 1.0], [2, 3, 4]):
    grid[alpha, beta] = float(np.sum(np.abs(data) ** beta) * alpha)
""",
)

case(
    "s5-it-combinations-pairs",
    "safe",
    NP + "import itertools\n",
    """
corr = {}
for i, j in itertools.combinations(range(len(series)), 2):
    corr[i, j] = float(np.corrcoef(series[i], series[j])[0, 1])
""",
)

case(
    "s5-it-islice-of-count",
    "safe",
    "import itertools\ncounter = itertools.count(10, 5)\n",
    """
firsts = []
for v in itertools.islice(counter, 4):
    firsts.append(v * 2)
after = next(counter)
""",
)

case(
    "s5-it-file-lines",
    "safe",
    """
import os, shutil
D = @TMP@
shutil.rmtree(D, ignore_errors=True)
os.makedirs(D)
p = os.path.join(D, "data.txt")
with open(p, "w") as fh:
    fh.write("# header\\n3 4\\n5 12\\n\\n8 15\\n")
""",
    """
hyp = []
with open(p) as fh:
    for line in fh:
        line = line.strip()
        if not line or line.startswith("#"):
            continue
        a, b = map(int, line.split())
        hyp.append((a * a + b * b) ** 0.5)
""",
)

case(
    "s5-it-u-file-next-line-in-body",
    "unsafe",
    """
import os, shutil
D = @TMP@
shutil.rmtree(D, ignore_errors=True)
os.makedirs(D)
p = os.path.join(D, "pairs.txt")
with open(p, "w") as fh:
    fh.write(">a\\nACGT\\n>b\\nGGC\\n>c\\nTTAA\\n")
""",
    """
seqs = {}
fh = open(p)
for header in fh:
    seqs[header.strip()[1:]] = next(fh).strip()
fh.close()
""",
    note="FASTA pairs: the body reads the next line from the iterated file",
)

case(
    "s5-it-zip-endless-cycle",
    "safe",
    "import itertools\nwords = ['a', 'bb', 'ccc', 'dd', 'e']\ncolors = ['red', 'blue']\n",
    """
painted = []
for w, c in zip(words, itertools.cycle(colors)):
    painted.append(f"{w}:{c}")
""",
    note="an endless iterator zipped with a list: zip stops at the list's end",
)

case(
    "s5-it-zip-count-first",
    "safe",
    "import itertools\nxs = [3.5, 1.25, 8.0]\nticket = itertools.count(100)\n",
    """
numbered = {}
for n, x in zip(ticket, xs):
    numbered[n] = x * 2
after = next(ticket)
""",
    note="itertools.count first: serially it is drawn once past the list's end",
)

case(
    "s5-it-iter-sentinel-chunks",
    "safe",
    "import io\nbuf = io.BytesIO(bytes(range(23)))\n",
    """
chunk_sums = []
for chunk in iter(lambda: buf.read(5), b""):
    chunk_sums.append(sum(chunk))
""",
)

case(
    "s5-it-generator-with-global-side-effect-unread",
    "safe",
    PY
    + """
produced = 0
def stream(xs):
    global produced
    for x in xs:
        produced += 1
        yield x
""",
    """
doubled = []
for x in stream(nums):
    doubled.append(2 * x)
""",
    note="the generator's effect happens while its items are drawn; the body never reads produced",
)

case(
    "s5-it-u-generator-reads-body-state",
    "unsafe",
    PY
    + """
def batches(xs, state):
    for x in xs:
        yield x * state["scale"]
""",
    """
state = {"scale": 1}
got = []
for v in batches(nums, state):
    got.append(v)
    state["scale"] += 1
""",
)

# ================================================================ 7. printing, logging, progress, time

case(
    "s5-fx-print-every-kth",
    "safe",
    PY,
    """
acc = []
for i, n in enumerate(nums):
    acc.append(n ** 2)
    if i % 3 == 0:
        print(f"step {i}: {n ** 2}")
""",
)

case(
    "s5-fx-logging-info-every-kth",
    "safe",
    NP,
    """
means = []
for i, s in enumerate(series):
    means.append(float(s.mean()))
    if i % 2 == 0:
        log.info("series %d mean %.4f", i, means[-1])
""",
)

case(
    "s5-fx-logging-exception-traceback",
    "safe",
    "raw = ['4', 'zero', '2', '0']\n",
    """
inv = {}
for s in raw:
    try:
        inv[s] = 1 / int(s)
    except (ValueError, ZeroDivisionError):
        log.exception("bad value %r", s)
""",
)

case(
    "s5-fx-tqdm-bar-set-postfix-in-body",
    "safe",
    NP + "import io\nfrom tqdm import tqdm\n",
    """
pbar = tqdm(series, file=io.StringIO(), mininterval=3600)
peaks = []
for s in pbar:
    peaks.append(float(s.max()))
    pbar.set_postfix(peak=peaks[-1])
pbar.close()
del pbar
""",
    note="set_postfix changes only the display of a bar closed and deleted after the loop",
)

case(
    "s5-fx-time-per-item-durations",
    "safe",
    NP + "import time\n",
    """
durations = {}
for i, s in enumerate(series):
    t0 = time.time()
    np.sort(np.repeat(s, 50))
    durations[i] = time.time() - t0
timed = sorted(durations)
all_nonneg = all(d >= 0 for d in durations.values())
del durations, t0
""",
    note="times are never equal between runs: the cell keeps which items were timed",
)

case(
    "s5-fx-time-logged-rounded",
    "safe",
    NP + "import time\n",
    """
for i, s in enumerate(series):
    t0 = time.perf_counter()
    m = float(s.mean())
    log.info("item %d done in %d min", i, int((time.perf_counter() - t0) // 60))
del t0
""",
    note="the log line carries the time in whole minutes: 0 in any run of this size",
)

case(
    "s5-fx-u-child-logger-dedupe",
    "unsafe",
    PY + "import logging\nchild = logging.getLogger('nb.worker')\n",
    """
kept = []
for i, w in enumerate(words):
    if w in kept:
        child.info("duplicate %s at %d", w, i)
    else:
        kept.append(w)
""",
    note="`kept` is read in the body: loop-carried (a dedupe)",
)

# ================================================================ 8. files

case(
    "s5-io-np-save-per-item",
    "safe",
    NP
    + """
import os, shutil
D = @TMP@
shutil.rmtree(D, ignore_errors=True)
os.makedirs(D)
""",
    """
for i, s in enumerate(series):
    np.save(os.path.join(D, f"series_{i}.npy"), s * 2)
saved = sorted(os.listdir(D))
back = [np.load(os.path.join(D, f)) for f in saved]
""",
)

case(
    "s5-io-to-csv-per-group",
    "safe",
    DF
    + """
import os, shutil
D = @TMP@
shutil.rmtree(D, ignore_errors=True)
os.makedirs(D)
df["wet"] = df["rain"] > 20
""",
    """
for wet, part in df.groupby("wet"):
    part.to_csv(os.path.join(D, f"wet_{wet}.csv"), index=False)
files = sorted(os.listdir(D))
sizes = [len(pd.read_csv(os.path.join(D, f))) for f in files]
""",
)

case(
    "s5-io-torch-save-per-config",
    "safe",
    TORCH
    + """
import os, shutil
D = @TMP@
shutil.rmtree(D, ignore_errors=True)
os.makedirs(D)
""",
    """
for hidden in [2, 4, 6]:
    torch.manual_seed(hidden)
    net = MLP(hidden)
    torch.save(net.state_dict(), os.path.join(D, f"mlp_{hidden}.pt"))
loaded = {f: sum(t.numel() for t in torch.load(os.path.join(D, f)).values())
          for f in sorted(os.listdir(D))}
""",
)

case(
    "s5-io-pil-save-per-image",
    "safe",
    """
import os, shutil
import numpy as np
from PIL import Image
D = @TMP@
shutil.rmtree(D, ignore_errors=True)
os.makedirs(D)
_r = np.random.default_rng(9)
imgs = {f"im{k}": Image.fromarray(_r.integers(0, 256, (8, 8), dtype=np.uint8), "L") for k in range(4)}
""",
    """
for name, img in imgs.items():
    img.rotate(90).save(os.path.join(D, f"{name}.png"))
pixels = {f: int(np.asarray(Image.open(os.path.join(D, f))).sum()) for f in sorted(os.listdir(D))}
""",
)

case(
    "s5-io-makedirs-exist-ok-per-item",
    "safe",
    FILES,
    """
out_root = os.path.join(D, "out")
for p in cfg_paths:
    with open(p) as fh:
        cfg = json.load(fh)
    run_dir = os.path.join(out_root, "runs")
    os.makedirs(run_dir, exist_ok=True)
    with open(os.path.join(run_dir, cfg["name"] + ".txt"), "w") as fh:
        fh.write(f"{cfg['lr']:.0e} x{cfg['layers']}")
written = sorted(os.listdir(os.path.join(out_root, "runs")))
""",
)

case(
    "s5-io-u-append-to-one-file",
    "unsafe",
    FILES,
    """
summary = os.path.join(D, "summary.txt")
for p in cfg_paths:
    with open(p) as fh:
        cfg = json.load(fh)
    with open(summary, "a") as out:
        out.write(f"{cfg['name']},{cfg['lr']}\\n")
with open(summary) as fh:
    lines = fh.read().splitlines()
""",
    note="one file appended by every iteration: the order of its lines",
)

case(
    "s5-io-u-append-via-helper-path-param",
    "unsafe",
    FILES
    + """
def append_line(path, text):
    with open(path, "a") as fh:
        fh.write(text + "\\n")
""",
    """
target = os.path.join(D, "all.log")
for p in cfg_paths:
    append_line(target, os.path.basename(p))
with open(target) as fh:
    got = fh.read().splitlines()
""",
    note="the helper's path is its parameter: the text's check does not see one fixed file",
)

case(
    "s5-io-u-json-rewrite-shared-state-file",
    "unsafe",
    FILES,
    """
state_path = os.path.join(D, "state.json")
with open(state_path, "w") as fh:
    json.dump({"done": []}, fh)
for p in cfg_paths:
    with open(state_path) as fh:
        st = json.load(fh)
    st["done"].append(os.path.basename(p))
    with open(state_path, "w") as fh:
        json.dump(st, fh)
with open(state_path) as fh:
    final_state = json.load(fh)
""",
)

case(
    "s5-io-u-np-save-same-name-per-item",
    "unsafe",
    NP
    + """
import os, shutil
D = @TMP@
shutil.rmtree(D, ignore_errors=True)
os.makedirs(D)
""",
    """
for i, s in enumerate(series):
    np.save(os.path.join(D, "latest.npy"), s)
last = np.load(os.path.join(D, "latest.npy"))
""",
    note="one file written by every iteration: the last one stays",
)

case(
    "s5-io-u-checkpoint-chain-reads-previous",
    "unsafe",
    NP
    + """
import os, shutil
D = @TMP@
shutil.rmtree(D, ignore_errors=True)
os.makedirs(D)
np.save(os.path.join(D, "step0.npy"), np.zeros(4))
""",
    """
for k in range(1, 4):
    prev = np.load(os.path.join(D, f"step{k - 1}.npy"))
    np.save(os.path.join(D, f"step{k}.npy"), prev + data[k])
final = np.load(os.path.join(D, "step3.npy"))
""",
)


# ================================================================ traps, by category
# ---------------------------------------------------------------- 1. hidden state

case(
    "s5-hs-u-main-module-attr",
    "unsafe",
    PY
    + """
import __main__
__main__.n_seen = 0
def tally(w):
    __main__.n_seen += 1
    return w[::-1]
""",
    """
rev = [tally(w) for w in words]
""",
    note="the notebook's own module (`__main__`) changed behind a call",
)

USER_MODULE = """
import os, sys, shutil
M = os.path.join(@TMP@, "s5mods")
shutil.rmtree(M, ignore_errors=True)
os.makedirs(M)
with open(os.path.join(M, "s5_feats.py"), "w") as fh:
    fh.write("seen = 0\\nscale = 2\\ndef feat(x):\\n    return x * scale + 1\\n")
sys.path[:] = [p for p in sys.path if not p.endswith("s5mods")]
sys.modules.pop("s5_feats", None)
sys.path.insert(0, M)
import s5_feats
"""

case(
    "s5-hs-u-user-module-attr-from-notebook-helper",
    "unsafe",
    PY
    + USER_MODULE
    + """
def scaled(x):
    s5_feats.seen += 1
    return x * s5_feats.scale
""",
    """
vals = []
for n in nums:
    vals.append(scaled(n))
seen = s5_feats.seen
""",
    note="a user module (a file on a folder the notebook put on sys.path) changed by a notebook function",
)

case(
    "s5-hs-user-module-on-notebook-sys-path-pure",
    "safe",
    PY + USER_MODULE,
    """
feats = []
for n in nums:
    feats.append(s5_feats.feat(n))
""",
    note="a pure function of a user module found through a folder the notebook put on sys.path",
)

case(
    "s5-hs-u-functools-cache-len-read-after",
    "unsafe",
    PY
    + """
import functools
@functools.cache
def vowels(w):
    return sum(ch in "aeiou" for ch in w)
""",
    """
for w in words:
    v = vowels(w)
cached = vowels.cache_info().currsize
""",
)

case(
    "s5-hs-u-stdlib-module-attr",
    "unsafe",
    PY
    + """
import math
math.s5_calls = 0
def area(r):
    math.s5_calls += 1
    return round(math.pi * r * r, 3)
""",
    """
areas = {}
for n in nums:
    areas[n] = area(n)
calls = math.s5_calls
del math.s5_calls
""",
    note="an attribute of an installed module changed behind a call",
)

case(
    "s5-hs-u-helper-sets-environ",
    "unsafe",
    PY
    + """
import os
os.environ.pop("S5_LAST_WORD", None)
def remember(w):
    os.environ["S5_LAST_WORD"] = w
    return len(w)
""",
    """
lens = []
for w in words:
    lens.append(remember(w))
last = os.environ.pop("S5_LAST_WORD", None)
""",
    note="process-wide state changed behind a call (the body's own os.environ write is refused by line)",
)

case(
    "s5-hs-u-helper-sets-logger-level",
    "unsafe",
    PY
    + """
import logging
lg = logging.getLogger("nb.s5quiet")
lg.setLevel(logging.NOTSET)
def quiet_for(w):
    if w.startswith("o"):
        lg.setLevel(logging.ERROR)
    return w.title()
""",
    """
titled = []
for w in words:
    titled.append(quiet_for(w))
level = lg.level
lg.setLevel(logging.NOTSET)
""",
    note="a logger configured behind a call (the body's own setLevel is refused by line)",
)

case(
    "s5-hs-u-helper-sets-np-seterr",
    "unsafe",
    """
import numpy as np
np.seterr(divide="warn")
vals = [1.0, 0.0, 2.0, 0.0]
def safe_log(x):
    np.seterr(divide="ignore")
    return float(np.log(x))
""",
    """
logs = []
for v in vals:
    logs.append(safe_log(v))
mode = np.geterr()["divide"]
np.seterr(divide="warn")
""",
    note="process-wide numpy state changed behind a call (the body's own np.seterr is refused by line)",
)

case(
    "s5-hs-u-property-counts-reads",
    "unsafe",
    """
class Sensor:
    reads = 0
    def __init__(self, raw):
        self.raw = raw
    @property
    def reading(self):
        Sensor.reads += 1
        return self.raw * 0.5
sensors = [Sensor(r) for r in (4, 8, 15, 16)]
""",
    """
vals = []
for s in sensors:
    vals.append(s.reading)
n_reads = Sensor.reads
""",
    note="a property read (no call in the text) changes the class",
)

case(
    "s5-hs-u-dataset-getitem-caches",
    "unsafe",
    """
import numpy as np
class CachedDataset:
    def __init__(self, n):
        self.n = n
        self._cache = {}
    def __len__(self):
        return self.n
    def __getitem__(self, i):
        if i not in self._cache:
            self._cache[i] = np.full(3, float(i))
        return self._cache[i]
ds = CachedDataset(6)
""",
    """
sums = []
for i in range(len(ds)):
    sums.append(float(ds[i].sum()))
cached = len(ds._cache)
""",
    note="a dataset that caches the items it loads, read by subscript",
)

# ---------------------------------------------------------------- 2. sinks and own items

case(
    "s5-obj-df-loc-range-on-filtered-index",
    "safe",
    DF,
    """
wet = df[df["rain"] > 10].copy()
for i in range(len(wet)):
    wet.loc[i, "flag"] = i % 2
""",
    note="range(len) labels that the filtered frame lacks: serially .loc adds those rows",
)

case(
    "s5-obj-np-row-view-alias-normalise",
    "safe",
    NP,
    """
P = np.abs(data).copy()
for i in range(len(P)):
    r = P[i]
    r /= r.sum()
""",
    note="the iteration's own row changed through a view",
)

case(
    "s5-obj-u-mirror-other-element",
    "unsafe",
    """
a = [1, 2, 3, 4, 5, 6]
""",
    """
for i in range(len(a)):
    a[i] = a[-1 - i] * 10
""",
)

case(
    "s5-obj-torch-out-prealloc-with-grad",
    "safe",
    TORCH,
    """
out = torch.zeros(len(loader), 10, 2)
for i, (xb, yb) in enumerate(loader):
    out[i] = model(xb)
needs_grad = out.requires_grad
""",
    note="without no_grad the preallocated tensor ends with a graph (requires_grad True)",
)

case(
    "s5-obj-dict-values-kept-in-list",
    "safe",
    """
class Box:
    def __init__(self, v):
        self.v = v
boxes = {"a": Box(1), "b": Box(2), "c": Box(3)}
""",
    """
big = []
for b in boxes.values():
    b.v *= 10
    if b.v > 10:
        big.append(b)
same = [x is boxes[k] for x, k in zip(big, ["b", "c"])]
""",
)

case(
    "s5-obj-dict-items-unchanged-kept",
    "safe",
    """
class Box:
    def __init__(self, v):
        self.v = v
boxes = {"a": Box(1), "b": Box(2), "c": Box(3)}
""",
    """
chosen = {}
for k, b in boxes.items():
    if b.v >= 2:
        chosen[k] = b
same = [chosen[k] is boxes[k] for k in chosen]
""",
    note="the items are not changed: only kept",
)

case(
    "s5-obj-dict-values-particles-step",
    "safe",
    """
from dataclasses import dataclass
@dataclass
class Particle:
    x: float
    vx: float
swarm = {f"p{i}": Particle(float(i), 0.25 * i) for i in range(5)}
""",
    """
for p in swarm.values():
    for _ in range(3):
        p.x += p.vx
""",
)

case(
    "s5-obj-own-element-of-numpy-view",
    "safe",
    "import numpy as np\nbase = np.arange(10.0)\nevens = base[::2]\n",
    """
for i in range(len(evens)):
    evens[i] = evens[i] ** 2
""",
    note="the written array is a view: serially base changes too",
)

# ---------------------------------------------------------------- 3. torch

case(
    "s5-torch-model-eval-in-body",
    "safe",
    TORCH,
    """
model.train()
accs = []
for xb, yb in loader:
    model.eval()
    with torch.no_grad():
        accs.append((model(xb).argmax(1) == yb).float().mean().item())
""",
    note="eval() is idempotent: serially the model ends in eval mode",
)

case(
    "s5-torch-losses-append-tensor-not-item",
    "safe",
    TORCH,
    """
last_loss = {}
for lr in [0.1, 0.01]:
    torch.manual_seed(0)
    net = MLP(4)
    opt = torch.optim.SGD(net.parameters(), lr=lr)
    hist = []
    for xb, yb in loader:
        opt.zero_grad()
        loss = nn.functional.cross_entropy(net(xb), yb)
        loss.backward()
        opt.step()
        hist.append(loss)
    last_loss[lr] = hist[-1]
""",
    note="the tensors kept carry their graph (a common slip: no .item())",
)

case(
    "s5-torch-best-state-dict-no-copy-new-net",
    "safe",
    TORCH,
    """
best_acc, best_state = -1.0, None
for seed in [0, 1, 2]:
    torch.manual_seed(seed)
    net = MLP(4)
    with torch.no_grad():
        acc = (net(X).argmax(1) == Y).float().mean().item()
    if acc > best_acc:
        best_acc = acc
        best_state = net.state_dict()
""",
    note="no deepcopy: each state dict is a fresh net's, never changed after",
)

case(
    "s5-torch-u-seeded-once-in-prelude-draws",
    "unsafe",
    TORCH,
    """
torch.manual_seed(123)
noise = {}
for k in range(4):
    noise[k] = torch.randn(2).sum().item()
""",
    kind="random",
    note="seeded once before the loop: the draws follow on from each other",
)

case(
    "s5-torch-u-forward-hook-collects-activations",
    "unsafe",
    TORCH
    + """
acts = []
model.net[0].register_forward_hook(lambda m, i, o: acts.append(tuple(o.shape)))
model.eval()
n_pos = {}
""",
    """
with torch.no_grad():
    for k, (xb, yb) in enumerate(loader):
        n_pos[k] = int((model(xb)[:, 1] > 0).sum())
n_acts = len(acts)
model.net[0]._forward_hooks.clear()
""",
    note="a forward hook registered before the loop appends to a notebook list at every call",
)

# ---------------------------------------------------------------- 4. scikit-learn

case(
    "s5-sk-pipeline-set-params-before-loop",
    "safe",
    SK
    + """
from sklearn.pipeline import make_pipeline
from sklearn.preprocessing import StandardScaler
pipe = make_pipeline(StandardScaler(), LogisticRegression(max_iter=200))
""",
    """
by_c = {}
for C in [0.01, 1.0, 100.0]:
    pipe.set_params(logisticregression__C=C)
    by_c[C] = cross_val_score(pipe, X, y, cv=3).mean()
""",
    note="set_params overwrites C before each use, and cross_val_score clones: each iteration depends only on its C; serially pipe ends with the last C",
)

case(
    "s5-sk-fitted-models-kept-in-dict",
    "safe",
    SK,
    """
models = {"lr": LogisticRegression(max_iter=200), "tree": DecisionTreeClassifier(max_depth=2, random_state=0)}
fitted = {}
for name, m in models.items():
    m.fit(X, y)
    fitted[name] = m
same = all(fitted[k] is models[k] for k in models)
""",
    note="the fitted own item is also stored: identity kept",
)

case(
    "s5-sk-u-function-transformer-counts-calls",
    "unsafe",
    SK
    + """
from sklearn.pipeline import make_pipeline
from sklearn.preprocessing import FunctionTransformer
seen_rows = []
def log_rows(Z):
    seen_rows.append(len(Z))
    return Z
""",
    """
scores = {}
for C in [0.1, 1.0]:
    pipe = make_pipeline(FunctionTransformer(log_rows), LogisticRegression(C=C, max_iter=200))
    scores[C] = cross_val_score(pipe, X, y, cv=3).mean()
n_calls = len(seen_rows)
""",
)

# ---------------------------------------------------------------- 5. running values

case(
    "s5-run-max-builtin-with-nan",
    "safe",
    """
vals = [float("nan"), 3.0, 1.0, 2.0, float("nan"), 7.0, 5.0, 6.0, float("nan"), 4.0]
""",
    """
best = float("-inf")
for v in vals:
    best = max(best, v)
""",
    note="serially max(best, nan) keeps best: a nan never wins when it comes second",
)

case(
    "s5-run-min-builtin-with-nan-first",
    "safe",
    """
import math
vals = [float("nan"), 3.0, float("nan"), 2.0, 8.0, float("nan"), 0.5, 6.0]
""",
    """
lo = math.inf
for v in vals:
    lo = min(lo, v)
""",
)

case(
    "s5-run-value-alone-if-greater",
    "safe",
    PY,
    """
longest = 0
for w in words:
    if len(w) > longest:
        longest = len(w)
""",
)

case(
    "s5-run-conditional-expression-best",
    "safe",
    PY,
    """
top = -1
for n in nums:
    top = n if n > top else top
""",
)

case(
    "s5-run-u-found-limit-continue",
    "unsafe",
    PY,
    """
found, picked = 0, []
for w in words:
    if found >= 3:
        continue
    if "a" in w:
        found += 1
        picked.append(w)
""",
)

case(
    "s5-run-string-prepend",
    "safe",
    PY,
    """
rev = ""
for w in words:
    rev = w[0] + rev
""",
)

# ---------------------------------------------------------------- 6. iterables with state

case(
    "s5-it-scandir-entries",
    "safe",
    FILES,
    """
sizes = {}
for entry in os.scandir(os.path.join(D, "cfg")):
    if entry.name.endswith(".json"):
        sizes[entry.name] = entry.stat().st_size
""",
)

case(
    "s5-it-nditer-readwrite-no-with",
    "safe",
    "import numpy as np\nb = np.linspace(0.0, 1.0, 6)\n",
    """
for v in np.nditer(b, op_flags=["readwrite"]):
    v[...] = v * v
""",
    note="the older spelling, without the context manager",
)

case(
    "s5-it-nditer-readwrite-docs",
    "safe",
    "import numpy as np\na = np.arange(6).reshape(2, 3)\n",
    """
with np.nditer(a, op_flags=["readwrite"]) as it:
    for x in it:
        x[...] = 2 * x
""",
    note="numpy's own iteration tutorial: each item is a view of one element of a",
)

# ---------------------------------------------------------------- 7. printing, logging, progress

case(
    "s5-fx-tqdm-bar-set-description",
    "safe",
    PY + "import io\nfrom tqdm import tqdm\n",
    """
pbar = tqdm(words, file=io.StringIO(), mininterval=3600)
caps = []
for w in pbar:
    pbar.set_description(f"word {w}")
    caps.append(w.capitalize())
pbar.close()
del pbar
""",
)

case(
    "s5-fx-tqdm-with-total-update",
    "safe",
    PY + "import io\nfrom tqdm import tqdm\n",
    """
lens = []
with tqdm(total=len(words), file=io.StringIO(), mininterval=3600) as pbar:
    for w in words:
        lens.append(len(w))
        pbar.update(1)
    n_done = pbar.n
del pbar
""",
)

# ---------------------------------------------------------------- 8. files

case(
    "s5-io-u-scratch-file-per-iteration",
    "unsafe",
    FILES,
    """
scratch = os.path.join(D, "scratch.txt")
echoed = []
for p in cfg_paths:
    with open(scratch, "w") as fh:
        fh.write(os.path.basename(p).upper())
    with open(scratch) as fh:
        echoed.append(fh.read())
""",
    note="one scratch file every iteration writes then reads back",
)

case(
    "s5-io-rewrite-own-config-file",
    "safe",
    FILES,
    """
for p in cfg_paths:
    with open(p) as fh:
        cfg = json.load(fh)
    cfg["lr"] = cfg["lr"] * 10
    with open(p, "w") as fh:
        json.dump(cfg, fh)
after = [json.load(open(p))["lr"] for p in cfg_paths]
""",
)

case(
    "s5-io-relative-paths-after-chdir",
    "safe",
    NP
    + """
import os, shutil
D = @TMP@
shutil.rmtree(D, ignore_errors=True)
os.makedirs(D)
os.chdir(D)
""",
    """
for i, s in enumerate(series):
    np.save(f"rel_{i}.npy", s)
saved = sorted(f for f in os.listdir(".") if f.startswith("rel_"))
""",
    note="the notebook changed its working folder in an earlier cell",
)
