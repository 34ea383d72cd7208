# ruff: noqa: E501  (the cells are notebook code, as tutorials write it)
"""A fourth held-in corpus of notebook loops, for tests/test_sweep_loops_s4.py:
first, the forms gpucell newly runs (a name rebound by a concatenation of
itself: ``x = np.append(x, e)``, ``np.vstack/hstack/concatenate``,
``torch.cat``, ``pd.concat``; statements that only change a container from
before the loop, replayed on the kernel: ``d.setdefault(k, set()).add(v)``,
``d[k].add(v)``, ``counter.subtract``, ``dq.appendleft``,
``heapq.heappush``, ``bisect.insort``, ``d[a][b] += v``) with their traps
(the name read elsewhere, in the same statement, as the iterable; pieces
changed after they were appended; dtype chains; empty and ``None`` starts;
look-alike methods of other objects); then other loops from tutorials,
docs, Kaggle and course notebooks not in the other corpora (groupby
iterators, parameter grids, scipy per item, seed sequences, ``match``,
results held by an object, rows appended by ``loc[len(df)]``, files).

Same shape as tests/sweep_loops_corpus.py (its ``Case``; see its docstring
for verdicts, kinds and ``@TMP@``).  The ids start with ``s4-`` and must not
clash with the other corpora's.
"""

from __future__ import annotations

import textwrap

from sweep_loops_corpus import CASES as _FIRST_CASES
from sweep_loops_corpus import Case
from sweep_loops_corpus_s3 import CASES as _S3_CASES
from sweep_loops_corpus_writeback import CASES as _WB_CASES

CASES: list[Case] = []


def case(id, verdict, setup, cell, kind="plain", note=""):
    """As sweep_loops_corpus.case, into this corpus's own list."""
    assert verdict in ("safe", "unsafe") and kind in ("plain", "seeded", "random")
    assert id.startswith("s4-"), id
    others = CASES + _FIRST_CASES + _WB_CASES + _S3_CASES
    assert all(c.id != id for c in others), id
    CASES.append(
        Case(id, verdict, textwrap.dedent(setup), textwrap.dedent(cell), kind, note)
    )


# ---------------------------------------------------------------- shared setups

NP = """
import numpy as np
_r = np.random.default_rng(44)
signals = [_r.normal(size=16).cumsum() for _ in range(6)]
batches = [_r.normal(size=(5, 3)) for _ in range(4)]
W = _r.normal(size=(3, 2))
lrs = [0.3, 0.1, 0.03, 0.01, 0.003]
"""

DF = """
import numpy as np
import pandas as pd
_r = np.random.default_rng(7)
df = pd.DataFrame({"store": _r.choice(["A", "B", "C"], size=18),
                   "band": _r.choice(["lo", "hi"], size=18),
                   "units": _r.integers(1, 30, size=18),
                   "price": _r.uniform(1, 9, size=18).round(2)})
"""

TORCH = """
import torch
from torch import nn
torch.manual_seed(4)
X = torch.randn(30, 4)
Y = (X @ torch.tensor([1.0, -1.0, 0.5, 2.0]) > 0).long()
model = nn.Sequential(nn.Linear(4, 8), nn.ReLU(), nn.Linear(8, 2))
loader = list(zip(X.split(8), Y.split(8)))
"""

TEXT = """
docs = ["the cat sat on the mat", "the dog chased the cat", "a bird sang",
        "dog and cat and bird", "the mat was red", "sang the bird again"]
edges = [("a", "b"), ("b", "c"), ("a", "c"), ("c", "d"), ("d", "a"), ("b", "a")]
"""

SK = """
import numpy as np
import pandas as pd
from sklearn.base import clone
from sklearn.datasets import make_classification
from sklearn.linear_model import LogisticRegression, Ridge
from sklearn.tree import DecisionTreeClassifier
from sklearn.model_selection import cross_validate, ParameterGrid
X, y = make_classification(n_samples=80, n_features=5, n_informative=3, random_state=2)
"""

FILES = """
import os, glob, shutil
D = @TMP@
shutil.rmtree(D, ignore_errors=True)
os.makedirs(D)
for k in range(6):
    with open(os.path.join(D, f"run{k}.log"), "w") as fh:
        fh.write("\\n".join(f"step {j} loss {1 / (j + k + 1):.4f}" for j in range(k + 2)) + "\\n")
paths = sorted(glob.glob(os.path.join(D, "*.log")))
"""


# ================================================================ concatenation rebinds

case(
    "s4-cat-np-append-score-per-lr",
    "safe",
    NP,
    """
losses = np.array([])
for lr in lrs:
    w = np.zeros(3)
    for b in batches:
        w -= lr * b.T @ (b @ w - 1.0) / len(b)
    losses = np.append(losses, np.mean((batches[0] @ w - 1.0) ** 2))
best_lr = lrs[int(np.argmin(losses))]
""",
)

case(
    "s4-cat-np-append-axis0-points",
    "safe",
    NP,
    """
pts = np.empty((0, 2))
for s in signals:
    pts = np.append(pts, [[s.argmax(), s.max()]], axis=0)
""",
)

case(
    "s4-cat-np-hstack-indices-int",
    "safe",
    NP,
    """
picked = np.array([], dtype=int)
for i, s in enumerate(signals):
    picked = np.hstack([picked, np.flatnonzero(s > 1.0) + 100 * i])
""",
)

case(
    "s4-cat-np-concatenate-embeddings-axis0",
    "safe",
    NP,
    """
emb = np.zeros((0, 2))
for b in batches:
    emb = np.concatenate([emb, np.tanh(b @ W)], axis=0)
""",
)

case(
    "s4-cat-np-concatenate-prepend",
    "safe",
    NP,
    """
stack = np.array([0.0])
for s in signals:
    stack = np.concatenate([s[:2], stack])
""",
    note="each piece goes before x: the serial result is in reverse order",
)

case(
    "s4-cat-np-append-float-start-int-pieces",
    "safe",
    NP,
    """
ids = np.array([])
for i, s in enumerate(signals):
    ids = np.append(ids, np.arange(i, i + 2))
""",
    note="np.array([]) is float64: int pieces become floats",
)

case(
    "s4-cat-np-dtype-promotion-chain",
    "safe",
    "import numpy as np\npieces = [np.array([200], dtype=np.uint8), np.array([1.5], dtype=np.float16), np.array([-3], dtype=np.int8)]\n",
    """
acc = np.array([-1], dtype=np.int8)
for p in pieces:
    acc = np.append(acc, p)
""",
    note="int8+uint8 -> int16, then +float16 -> float32; one concatenation of all would be float16",
)

case(
    "s4-cat-np-vstack-none-start",
    "safe",
    NP,
    """
X_all = None
for b in batches:
    f = np.c_[b, b ** 2]
    X_all = f if X_all is None else np.vstack([X_all, f])
""",
    note="the StackOverflow idiom: the None test reads x in the same statement",
)

case(
    "s4-cat-np-piece-mutated-after",
    "safe",
    NP,
    """
row = np.zeros(3)
table = np.empty((0, 3))
for j, s in enumerate(signals):
    row[:] = [j, s.min(), s.max()]
    table = np.vstack([table, row])
    row *= 0
""",
    note="one buffer reused for every piece: vstack copies it at the call",
)

case(
    "s4-cat-np-two-names-conditional",
    "safe",
    NP,
    """
ups, downs = np.array([]), np.array([])
for s in signals:
    d = s[-1] - s[0]
    if d > 0:
        ups = np.append(ups, d)
    else:
        downs = np.append(downs, d)
""",
)

case(
    "s4-cat-np-iterates-over-x",
    "safe",
    "import numpy as np\nvals = np.array([1.0, 2.0, 4.0])\n",
    """
for v in vals:
    vals = np.append(vals, v / 10)
""",
    note="the loop iterates over the array before the loop; the rebinds make new ones",
)

case(
    "s4-cat-np-u-append-reads-last",
    "unsafe",
    "import numpy as np\nincrements = [0.5, 1.5, -0.25, 2.0, 1.0]\n",
    """
path = np.array([0.0])
for inc in increments:
    path = np.append(path, path[-1] + inc)
""",
)

case(
    "s4-cat-np-u-append-len-printed",
    "unsafe",
    NP,
    """
vals = np.array([])
for s in signals:
    vals = np.append(vals, s.max())
    print(f"{len(vals)} collected, mean so far {vals.mean():.3f}")
""",
)

case(
    "s4-cat-np-u-vstack-read-for-piece",
    "unsafe",
    NP,
    """
hist = np.zeros((1, 3))
for b in batches:
    hist = np.vstack([hist, hist[-1] + b.mean(0)])
""",
)

case(
    "s4-cat-np-local-piece-mutated-after",
    "safe",
    NP,
    """
table = np.empty((0, 3))
for s in signals:
    piece = s[:3].copy()
    table = np.vstack([table, piece])
    piece[:] = -1
""",
    note="the piece changes after the call: vstack copied it",
)

case(
    "s4-cat-np-if-none-else-vstack",
    "safe",
    NP,
    """
feats = None
for b in batches:
    f = b @ W
    if feats is None:
        feats = f
    else:
        feats = np.vstack((feats, f))
""",
    note="the if/else spelling of the None start",
)

case(
    "s4-cat-np-u-append-reads-same-stmt",
    "unsafe",
    "import numpy as np\n",
    """
x = np.array([1.0])
for i in range(6):
    x = np.append(x, x[-1] * 1.5 + i)
""",
)

case(
    "s4-cat-torch-cat-empty-start-preds",
    "safe",
    TORCH,
    """
all_logits = torch.tensor([])
with torch.no_grad():
    for xb, yb in loader:
        all_logits = torch.cat([all_logits, model(xb)])
pred = all_logits.argmax(1)
""",
    note="torch.cat skips a 1-D empty tensor beside 2-D ones",
)

case(
    "s4-cat-torch-cat-dim1-features",
    "safe",
    TORCH,
    """
feats = torch.empty(X.shape[0], 0)
for k in range(1, 4):
    feats = torch.cat([feats, X[:, :1] ** k], dim=1)
""",
)

case(
    "s4-cat-torch-cat-labels-long",
    "safe",
    TORCH,
    """
ys = torch.tensor([], dtype=torch.long)
for xb, yb in loader:
    ys = torch.cat((ys, yb[yb == 1]))
""",
)

case(
    "s4-cat-pd-concat-one-row-frame",
    "safe",
    DF,
    """
log_df = pd.DataFrame(columns=["store", "mean_price"])
for store, g in df.groupby("store"):
    row = {"store": store, "mean_price": round(g.price.mean(), 3)}
    log_df = pd.concat([log_df, pd.DataFrame([row])], ignore_index=True)
""",
    note="what replaced the removed DataFrame.append in every tutorial",
)

case(
    "s4-cat-pd-concat-prepend-frames",
    "safe",
    DF,
    """
newest_first = pd.DataFrame()
for band in ["lo", "hi"]:
    newest_first = pd.concat([df[df.band == band].head(3), newest_first])
""",
)

case(
    "s4-cat-np-append-inner-loop",
    "safe",
    NP,
    """
flat = np.array([])
for s in signals:
    for v in s[:3]:
        if v > -1:
            flat = np.append(flat, round(float(v), 3))
""",
    note="several calls per iteration, some skipped",
)

case(
    "s4-cat-np-r-underscore",
    "safe",
    NP,
    """
mx = np.array([])
for s in signals:
    mx = np.r_[mx, s.max()]
""",
)

case(
    "s4-cat-torch-dtype-chain-int-start",
    "safe",
    "import torch\npieces = [torch.tensor([0.5], dtype=torch.float32), torch.tensor([0.25], dtype=torch.float64)]\n",
    """
acc = torch.tensor([2**25 + 1], dtype=torch.int64)
for p in pieces:
    acc = torch.cat([acc, p])
""",
    note="int64 + float32 -> float32 rounds 2**25 + 1; one float64 concatenation of all would not",
)

case(
    "s4-cat-torch-piece-zeroed-after",
    "safe",
    TORCH,
    """
centroids = torch.empty(0, 4)
for xb, yb in loader:
    c = xb.mean(0)
    centroids = torch.cat([centroids, c[None]])
    c.zero_()
""",
    note="`c[None]` is a view of `c`; torch.cat copied it before the zero_",
)

case(
    "s4-cat-torch-u-cat-read-for-stat",
    "unsafe",
    TORCH,
    """
seen = torch.empty(0, 4)
means = []
for xb, yb in loader:
    seen = torch.cat([seen, xb])
    means.append(seen.mean().item())
""",
)

case(
    "s4-cat-pd-concat-ignore-index-groups",
    "safe",
    DF,
    """
summary = pd.DataFrame()
for store, g in df.groupby("store"):
    part = g.groupby("band")["units"].sum().reset_index().assign(store=store)
    summary = pd.concat([summary, part], ignore_index=True)
""",
)

case(
    "s4-cat-pd-concat-axis1-ranks",
    "safe",
    DF,
    """
wide = pd.DataFrame(index=df.index)
for col in ["units", "price"]:
    wide = pd.concat([wide, df[col].rank().rename(f"{col}_rank")], axis=1)
""",
)

case(
    "s4-cat-pd-concat-ragged-columns",
    "safe",
    DF,
    """
out = pd.DataFrame()
for i, band in enumerate(["lo", "hi", "lo"]):
    part = df[df.band == band].head(2)[["store", "units"]].copy()
    if i == 1:
        part["flag"] = True
    out = pd.concat([out, part])
""",
    note="the pieces' columns differ: the missing ones fill with NaN in order",
)

case(
    "s4-cat-pd-concat-part-changed-after",
    "safe",
    DF,
    """
res = pd.DataFrame()
for store in ["A", "B", "C"]:
    part = df[df.store == store].describe().loc[["mean"]]
    res = pd.concat([res, part])
    part.loc["mean", "units"] = -1
""",
)

case(
    "s4-cat-pd-u-concat-shape-in-body",
    "unsafe",
    DF,
    """
acc = pd.DataFrame()
for store in ["A", "B", "C"]:
    part = df[df.store == store].assign(batch=len(acc))
    acc = pd.concat([acc, part])
""",
)

# ================================================================ replayed container changes

case(
    "s4-rp-setdefault-set-bigram-index",
    "safe",
    TEXT,
    """
bigram_docs = {}
for i, d in enumerate(docs):
    w = d.split()
    for a, b in zip(w, w[1:]):
        bigram_docs.setdefault((a, b), set()).add(i)
""",
)

case(
    "s4-rp-defaultdict-set-adjacency",
    "safe",
    TEXT + "from collections import defaultdict\n",
    """
neighbors = defaultdict(set)
for a, b in edges:
    neighbors[a].add(b)
    neighbors[b].add(a)
degree = {k: len(v) for k, v in neighbors.items()}
""",
    note="the classic graph adjacency; keys repeat across iterations",
)

case(
    "s4-rp-defaultdict-set-discard",
    "safe",
    "from collections import defaultdict\nactive = defaultdict(set, {'u1': {'a', 'b', 'c'}, 'u2': {'b'}, 'u3': {'c', 'd'}})\n"
    "churn = [('u1', 'a'), ('u2', 'b'), ('u1', 'c'), ('u3', 'x'), ('u4', 'a')]\n",
    """
for user, item in churn:
    active[user].discard(item)
""",
    note="'u4' is new: the defaultdict makes its empty set",
)

case(
    "s4-rp-counter-subtract-and-update-mixed",
    "safe",
    "from collections import Counter\nstock = Counter(apples=10, pears=4, kiwis=7)\n"
    "orders = [{'sold': ['apples', 'apples', 'kiwis'], 'returned': ['pears']},\n"
    "          {'sold': ['pears'] * 3, 'returned': []},\n"
    "          {'sold': ['kiwis', 'figs'], 'returned': ['apples']}]\n",
    """
for o in orders:
    stock.subtract(o["sold"])
    stock.update(o["returned"])
""",
)

case(
    "s4-rp-counter-subtract-mapping",
    "safe",
    "from collections import Counter\nbudget = Counter(cpu=64, gpu=8, ram=512)\n"
    "jobs = [{'cpu': 8, 'gpu': 1}, {'cpu': 16, 'ram': 128}, {'gpu': 2, 'ram': 64}]\n",
    """
for j in jobs:
    budget.subtract(j)
""",
)

case(
    "s4-rp-deque-appendleft-maxlen",
    "safe",
    "from collections import deque\nevents = ['login', 'view', 'cart', 'view', 'pay', 'logout']\n",
    """
recent = deque(maxlen=3)
for e in events:
    recent.appendleft(e.upper())
""",
    note="maxlen drops from the right: the kept three depend on the order",
)

case(
    "s4-rp-deque-extendleft-chunks",
    "safe",
    "from collections import deque\nchunks = [[1, 2], [3], [4, 5, 6]]\n",
    """
dq = deque([0])
for c in chunks:
    dq.extendleft(x * 10 for x in c)
""",
)

case(
    "s4-rp-heappush-tuple-ties",
    "safe",
    "import heapq\ntasks = [('write', 2), ('test', 1), ('lint', 2), ('ship', 3), ('docs', 1), ('fmt', 2)]\n",
    """
pq = []
for name, prio in tasks:
    heapq.heappush(pq, (prio, name))
order = [heapq.heappop(pq)[1] for _ in range(len(pq))]
""",
    note="equal priorities: the names break the ties, the pushes' order shapes the list",
)

case(
    "s4-rp-heappush-counter-tiebreak",
    "safe",
    "import heapq\nitems = [{'id': 'x', 'p': 2}, {'id': 'y', 'p': 1}, {'id': 'z', 'p': 2}, {'id': 'w', 'p': 1}]\n",
    """
heap = []
for i, it in enumerate(items):
    heapq.heappush(heap, (it["p"], i, it["id"]))
""",
)

case(
    "s4-rp-heappush-from-import",
    "safe",
    "from heapq import heappush\nimport math\npoints = [(3, 4), (1, 1), (0, 2), (5, 0), (1, 1)]\n",
    """
closest = []
for x, y in points:
    heappush(closest, (math.hypot(x, y), x, y))
""",
)

case(
    "s4-rp-insort-latencies",
    "safe",
    "import bisect\nlatencies = [12.5, 3.1, 8.8, 3.1, 20.0, 0.4]\n",
    """
sorted_ms = []
for t in latencies:
    bisect.insort(sorted_ms, round(t))
p50 = sorted_ms[len(sorted_ms) // 2]
""",
)

case(
    "s4-rp-insort-into-prefilled",
    "safe",
    "import bisect\nbreaks = [0, 10, 20]\nnew_points = [15, 5, 25, 10]\n",
    """
for p in new_points:
    bisect.insort_left(breaks, p)
""",
)

case(
    "s4-rp-nested-defaultdict-lists",
    "safe",
    DF + "from collections import defaultdict\n",
    """
tree = defaultdict(lambda: defaultdict(list))
for r in df.itertuples():
    tree[r.store][r.band].append(r.units)
n_leaves = sum(len(v) for v in tree.values())
""",
)

case(
    "s4-rp-pivot-nested-add-assign",
    "safe",
    DF,
    """
pivot = {s: {"lo": 0, "hi": 0} for s in "ABC"}
for r in df.itertuples(index=False):
    if r.price > 2:
        pivot[r.store][r.band] += r.units
""",
)

case(
    "s4-rp-nested-store-last-wins",
    "safe",
    "visits = [('ann', 'home', 1), ('bob', 'cart', 2), ('ann', 'cart', 3), ('ann', 'home', 4), ('bob', 'cart', 5)]\n",
    """
last_seen = {"ann": {}, "bob": {}}
for user, page, t in visits:
    last_seen[user][page] = t
""",
)

case(
    "s4-rp-setdefault-list-and-set-two-containers",
    "safe",
    TEXT,
    """
positions = {}
vocab_docs = {}
for i, d in enumerate(docs):
    for j, w in enumerate(d.split()):
        positions.setdefault(w, []).append((i, j))
        vocab_docs.setdefault(w, set()).add(i)
""",
)

case(
    "s4-rp-bound-method-alias",
    "safe",
    TEXT,
    """
seen_words = set()
remember = seen_words.add
for d in docs:
    for w in d.split():
        remember(w)
""",
    note="the set changes through a bound method named before the loop",
)

case(
    "s4-rp-counter-subtract-generator",
    "safe",
    TEXT
    + "from collections import Counter\nallowance = Counter({w: 3 for w in ' '.join(docs).split()})\n",
    """
for d in docs:
    allowance.subtract(w for w in d.split() if len(w) > 2)
""",
)

case(
    "s4-rp-list-append-alias",
    "safe",
    TEXT,
    """
lengths = []
emit = lengths.append
for d in docs:
    for w in d.split():
        emit(len(w))
""",
    note="the micro-optimised spelling: a list's bound append named before the loop",
)

case(
    "s4-rp-deque-append-alias",
    "safe",
    "from collections import deque\nevents = ['a', 'b', 'c', 'd', 'e']\n",
    """
recent = deque(maxlen=3)
push = recent.appendleft
for e in events:
    push(e * 2)
""",
)

case(
    "s4-rp-heapq-docs-entry-marked-removed",
    "safe",
    "import heapq\njobs = [('build', 3), ('test', 1), ('lint', 2), ('deploy', 4)]\nREMOVED = '<removed>'\n",
    """
pq, entry_finder = [], {}
for name, prio in jobs:
    entry = [prio, name]
    entry_finder[name] = entry
    heapq.heappush(pq, entry)
    if name == "lint":
        entry[-1] = REMOVED
""",
    note="the heapq docs' priority queue: a pushed entry is changed afterwards (marked removed)",
)

case(
    "s4-rp-appendleft-record-changed-after",
    "safe",
    "from collections import deque\nevents = [('a', 3), ('b', 1), ('c', 4)]\n",
    """
feed = deque()
for name, n in events:
    rec = {"name": name}
    feed.appendleft(rec)
    rec["n"] = n * 10
""",
    note="the deque holds the dict itself: its later key is in the serial feed",
)

case(
    "s4-rp-setdefault-list-record-changed-after",
    "safe",
    DF,
    """
by_store = {}
for r in df.head(8).itertuples():
    rec = {"units": r.units}
    by_store.setdefault(r.store, []).append(rec)
    rec["revenue"] = round(r.units * r.price, 2)
""",
)

case(
    "s4-rp-insort-list-entry-changed-after",
    "safe",
    "import bisect\nruns = [(0.3, 'r1'), (0.1, 'r2'), (0.2, 'r3')]\n",
    """
leaderboard = []
for loss, name in runs:
    entry = [loss, name, None]
    bisect.insort(leaderboard, entry)
    entry[2] = f"{name}@{loss}"
""",
)

case(
    "s4-rp-heappush-dict-changed-after",
    "safe",
    "import heapq\njobs = [('build', 3), ('test', 1), ('lint', 3)]\n",
    """
pq = []
for i, (name, prio) in enumerate(jobs):
    job = {"name": name}
    heapq.heappush(pq, (prio, i, job))
    job["queued"] = True
""",
)

case(
    "s4-rp-nested-store-record-changed-after",
    "safe",
    "visits = [('ann', 'home', 1), ('bob', 'cart', 2), ('ann', 'home', 4)]\n",
    """
latest = {"ann": {}, "bob": {}}
for user, page, t in visits:
    rec = {"t": t}
    latest[user][page] = rec
    rec["late"] = t > 2
""",
)

case(
    "s4-rp-nested-defaultdict-int-add",
    "safe",
    DF + "from collections import defaultdict\n",
    """
counts = defaultdict(lambda: defaultdict(int))
for r in df.itertuples():
    counts[r.store][r.band] += 1
as_dict = {k: dict(v) for k, v in counts.items()}
""",
)

case(
    "s4-rp-nested-get-plus-one",
    "safe",
    TEXT,
    """
follows = {}
for d in docs:
    w = d.split()
    for a, b in zip(w, w[1:]):
        follows.setdefault(a, {})
        follows[a][b] = follows[a].get(b, 0) + 1
""",
    note="the bigram model of every NLP course",
)

case(
    "s4-rp-setdefault-counter-update",
    "safe",
    TEXT + "from collections import Counter\n",
    """
by_first = {}
for d in docs:
    by_first.setdefault(d[0], Counter()).update(d.split())
""",
)

case(
    "s4-rp-iterates-over-key-copy",
    "safe",
    "index = {'Cat': {1}, 'dog': {2}, 'Bird': {3}}\n",
    """
for k in list(index):
    index.setdefault(k.lower(), set()).add(len(k))
""",
    note="the loop iterates over a copy of the keys of the dict it grows",
)

case(
    "s4-rp-map-bound-add",
    "safe",
    TEXT,
    """
vocab = set()
for d in docs:
    any(map(vocab.add, d.lower().split()))
""",
    note="the set's bound method is passed as a value, never called as `vocab.add(...)`",
)

case(
    "s4-rp-default-arg-bound-append",
    "safe",
    NP,
    """
metrics = []
def log_metric(name, value, sink=metrics.append):
    sink((name, round(float(value), 6)))
for i, s in enumerate(signals):
    log_metric(f"max{i}", s.max())
""",
)

case(
    "s4-rp-u-seen-add-alias-dedupe",
    "unsafe",
    TEXT,
    """
seen = set()
seen_add = seen.add
unique_words = []
for d in docs:
    for w in d.split():
        if w in seen:
            continue
        seen_add(w)
        unique_words.append(w)
""",
    note="the order-keeping dedupe recipe, spelled as a loop: each iteration reads what earlier ones added",
)

case(
    "s4-rp-u-index-size-read",
    "unsafe",
    TEXT,
    """
index = {}
growth = []
for i, d in enumerate(docs):
    for w in d.split():
        index.setdefault(w, set()).add(i)
    growth.append(len(index))
""",
)

case(
    "s4-rp-u-counter-read-after-subtract",
    "unsafe",
    "from collections import Counter\nstock = Counter(a=3, b=1)\nrequests = ['a', 'b', 'a', 'b', 'a', 'a']\n",
    """
filled = []
for r in requests:
    stock.subtract([r])
    filled.append(stock[r] >= 0)
""",
)

case(
    "s4-rp-u-heap-topk-pop",
    "unsafe",
    "import heapq\nscores = [5, 1, 9, 3, 7, 8, 2]\n",
    """
top = []
for s in scores:
    heapq.heappush(top, s)
    if len(top) > 3:
        heapq.heappop(top)
""",
)

case(
    "s4-rp-u-nested-add-then-share",
    "unsafe",
    DF,
    """
pivot = {s: {"lo": 0, "hi": 0} for s in "ABC"}
shares = []
for r in df.itertuples():
    pivot[r.store][r.band] += r.units
    shares.append(pivot[r.store][r.band] / r.units)
""",
)

case(
    "s4-rp-u-insort-own-iterable",
    "unsafe",
    "import bisect\nxs = [2.0, 4.0, 8.0, 16.0]\n",
    """
for i, v in enumerate(xs):
    if i >= 4:
        break
    bisect.insort(xs, v / 4)
""",
    note="inserting before the cursor makes the loop see values again",
)

case(
    "s4-rp-u-user-class-add-vocab",
    "unsafe",
    TEXT,
    """
class Vocab:
    def __init__(self):
        self.ids = {}
    def add(self, tok):
        return self.ids.setdefault(tok, len(self.ids))
vocab = Vocab()
for d in docs:
    for w in d.split():
        vocab.add(w)
""",
    note="an `add` whose ids depend on what was added before",
)

case(
    "s4-rp-u-user-class-update-subtract",
    "unsafe",
    "",
    """
class Wallet:
    def __init__(self, cash):
        self.cash, self.log = cash, []
    def subtract(self, x):
        take = min(x, self.cash)
        self.cash -= take
        self.log.append(take)
    def update(self, x):
        self.cash += x
w = Wallet(10)
for spend, earn in [(4, 1), (9, 0), (3, 5), (6, 2)]:
    w.subtract(spend)
    w.update(earn)
""",
)

case(
    "s4-rp-tqdm-manual-update",
    "safe",
    "import io\nfrom tqdm import tqdm\nitems = list(range(7))\n"
    "bar = tqdm(total=len(items), file=io.StringIO(), mininterval=3600)\nsquares = []\n",
    """
for it in items:
    squares.append(it * it)
    bar.update(1)
done = bar.n
bar.close()
del bar
""",
    note="a manual bar counts the items: `update` of a tqdm, not of a set "
    "(the bar is made in the setup, with nothing before the loop: two bars' start times differ)",
)

case(
    "s4-rp-os-remove-stale-logs",
    "safe",
    FILES,
    """
for p in paths:
    with open(p) as fh:
        n = sum(1 for _ in fh)
    if n < 4:
        os.remove(p)
kept = sorted(os.path.basename(p) for p in glob.glob(os.path.join(D, "*.log")))
""",
)

case(
    "s4-rp-own-keys-set-add",
    "safe",
    "tags = {'py': {'lang'}, 'np': {'lib'}, 'pd': set()}\n",
    """
for k in tags:
    tags[k].add(f"len{len(k)}")
""",
    note="the loop iterates over the dict whose values it changes (each its own)",
)

# ================================================================ strings and text

case(
    "s4-str-bytes-payload-concat",
    "safe",
    TEXT,
    """
payload = b""
for d in docs:
    payload += d.encode() + b"\\x00"
""",
)

case(
    "s4-str-markdown-report-fstring",
    "safe",
    DF,
    """
report = "| store | units | revenue |\\n|---|---|---|\\n"
for store, g in df.groupby("store"):
    report += f"| {store} | {g.units.sum()} | {(g.units * g.price).sum():.2f} |\\n"
""",
)

case(
    "s4-str-parts-join-after",
    "safe",
    TEXT,
    """
parts = []
for d in docs:
    if "cat" not in d:
        continue
    parts.append(d.title())
summary = "; ".join(parts)
""",
)

case(
    "s4-str-re-sub-normalise-dict",
    "safe",
    "import re\nraw = {'a': '  Hello,   World!! ', 'b': 'foo\\tbar', 'c': 'Numbers 123 and 4.5'}\n",
    """
clean = {}
for k, v in raw.items():
    v = re.sub(r"[^\\w\\s.]", "", v)
    clean[k] = re.sub(r"\\s+", " ", v).strip().lower()
""",
)

case(
    "s4-str-ngram-counter-per-doc",
    "safe",
    TEXT + "from collections import Counter\n",
    """
char3 = {}
for i, d in enumerate(docs):
    s = d.replace(" ", "_")
    char3[i] = Counter(s[j:j + 3] for j in range(len(s) - 2)).most_common(3)
""",
)

case(
    "s4-str-json-loads-fallback",
    "safe",
    "import json\nlines = ['{\"a\": 1}', 'not json', '{\"a\": [1, 2]}', '', '[3]']\n",
    """
parsed, bad = [], 0
for ln in lines:
    try:
        parsed.append(json.loads(ln))
    except json.JSONDecodeError:
        parsed.append(None)
        bad += 1
""",
)

case(
    "s4-str-match-statement-commands",
    "safe",
    "cmds = ['add 3 4', 'neg 5', 'mul 2 8', 'noop', 'add 1']\n",
    """
out = []
for c in cmds:
    match c.split():
        case ["add", a, b]:
            out.append(int(a) + int(b))
        case ["mul", a, b]:
            out.append(int(a) * int(b))
        case ["neg", a]:
            out.append(-int(a))
        case _:
            out.append(None)
""",
)

case(
    "s4-str-itertools-groupby-runs",
    "safe",
    TEXT + "import itertools\n",
    """
by_len = {}
for n, grp in itertools.groupby(sorted(" ".join(docs).split(), key=len), key=len):
    by_len[n] = sorted(set(grp))
""",
    note="groupby's groups are views of one iterator: a group is empty once the next is taken",
)

case(
    "s4-str-groupby-itemgetter-records",
    "safe",
    "import itertools\nfrom operator import itemgetter\n"
    "sales = [{'day': 'mon', 'amount': 3}, {'day': 'mon', 'amount': 5}, {'day': 'tue', 'amount': 2},\n"
    "         {'day': 'wed', 'amount': 7}, {'day': 'wed', 'amount': 1}]\n",
    """
daily = {}
for day, grp in itertools.groupby(sales, key=itemgetter("day")):
    daily[day] = sum(r["amount"] for r in grp)
""",
    note="the docs' groupby recipe on records sorted by the key",
)

case(
    "s4-str-zip-longest-fill",
    "safe",
    "import itertools\nold = ['a', 'b', 'c', 'd']\nnew = ['a', 'B', 'c']\n",
    """
changes = []
for i, (o, n) in enumerate(itertools.zip_longest(old, new, fillvalue="<gone>")):
    if o != n:
        changes.append((i, o, n))
""",
)

case(
    "s4-str-u-vocab-ids-in-order",
    "unsafe",
    TEXT,
    """
word2id = {}
for d in docs:
    for w in d.split():
        if w not in word2id:
            word2id[w] = len(word2id)
""",
)

case(
    "s4-str-set-ior-vocab",
    "safe",
    TEXT,
    """
vocab = set()
for d in docs:
    vocab |= set(d.split())
""",
)

# ================================================================ pandas

case(
    "s4-pd-dict-of-frames-per-group",
    "safe",
    DF,
    """
frames = {}
for store, g in df.groupby("store"):
    frames[store] = g.sort_values("price", ascending=False).reset_index(drop=True)
""",
)

case(
    "s4-pd-records-dicts-then-frame",
    "safe",
    DF,
    """
rows = []
for (store, band), g in df.groupby(["store", "band"]):
    rows.append({"store": store, "band": band, **g[["units", "price"]].mean().round(3).to_dict()})
stats = pd.DataFrame(rows).set_index(["store", "band"])
""",
)

case(
    "s4-pd-loc-len-append-row",
    "safe",
    DF,
    """
out = pd.DataFrame(columns=["store", "n", "top_price"])
for store, g in df.groupby("store"):
    out.loc[len(out)] = [store, len(g), g.price.max()]
""",
    note="very common: each row at the next label; its length is read to place it",
)

case(
    "s4-pd-to-dict-records-loop",
    "safe",
    DF,
    """
labels = []
for rec in df.head(8).to_dict("records"):
    labels.append(f"{rec['store']}-{rec['band']}:{rec['units'] * rec['price']:.1f}")
""",
)

case(
    "s4-pd-pivot-table-per-band",
    "safe",
    DF,
    """
tables = {}
for band in df.band.unique():
    tables[band] = pd.pivot_table(df[df.band == band], index="store", values="units", aggfunc="sum")
""",
)

case(
    "s4-pd-merge-per-key",
    "safe",
    DF,
    """
targets = pd.DataFrame({"store": ["A", "B", "C"], "target": [100, 80, 60]})
merged = {}
for band in ["lo", "hi"]:
    agg = df[df.band == band].groupby("store", as_index=False)["units"].sum()
    merged[band] = agg.merge(targets, on="store", how="right").fillna(0)
""",
)

case(
    "s4-pd-resample-per-sensor",
    "safe",
    "import numpy as np\nimport pandas as pd\nidx = pd.date_range('2024-01-01', periods=48, freq='h')\n"
    "readings = {s: pd.Series(np.sin(np.arange(48) / (k + 2)), index=idx) for k, s in enumerate(['t1', 't2', 't3'])}\n",
    """
daily = {}
for name, ser in readings.items():
    daily[name] = ser.resample("D").agg(["mean", "max"])
""",
)

case(
    "s4-pd-dict-of-lists-columns",
    "safe",
    DF,
    """
cols = {"store": [], "revenue": [], "share_hi": []}
for store, g in df.groupby("store"):
    cols["store"].append(store)
    cols["revenue"].append(float((g.units * g.price).sum()))
    cols["share_hi"].append((g.band == "hi").mean())
per_store = pd.DataFrame(cols)
""",
)

case(
    "s4-pd-read-csv-stringio-per-text",
    "safe",
    "import io\nimport pandas as pd\ntexts = ['a,b\\n1,2\\n3,4\\n', 'a,b\\n5,x\\n', 'a;b\\n7;8\\n']\n",
    """
shapes = []
for t in texts:
    sep = ";" if ";" in t.splitlines()[0] else ","
    f = pd.read_csv(io.StringIO(t), sep=sep)
    shapes.append((f.shape, str(f.b.dtype)))
""",
)

case(
    "s4-pd-u-running-balance-at",
    "unsafe",
    DF,
    """
bal = 0.0
df["bal"] = 0.0
for i in df.index:
    bal = bal + df.at[i, "units"] - 10
    df.at[i, "bal"] = bal
""",
)

case(
    "s4-pd-u-loc-len-read-in-body",
    "unsafe",
    DF,
    """
log_df = pd.DataFrame(columns=["store", "rank"])
for store in ["A", "B", "C", "A"]:
    if (log_df.store == store).any():
        continue
    log_df.loc[len(log_df)] = [store, len(log_df) + 1]
""",
)

# ================================================================ numpy / scipy

case(
    "s4-np-fft-peak-per-signal",
    "safe",
    NP,
    """
peaks = {}
for i, s in enumerate(signals):
    spec = np.abs(np.fft.rfft(s - s.mean()))
    peaks[i] = (int(spec.argmax()), float(spec.max()))
""",
)

case(
    "s4-np-column-writes-prealloc",
    "safe",
    NP,
    """
grid = np.linspace(0, 15, 31)
resampled = np.empty((grid.size, len(signals)))
for j, s in enumerate(signals):
    resampled[:, j] = np.interp(grid, np.arange(s.size), s)
""",
)

case(
    "s4-np-symmetric-pairs-chained-assign",
    "safe",
    NP + "import itertools\n",
    """
n = len(signals)
C = np.eye(n)
for i, j in itertools.combinations(range(n), 2):
    C[i, j] = C[j, i] = np.corrcoef(signals[i], signals[j])[0, 1]
""",
)

case(
    "s4-np-eig-sorted-per-matrix",
    "safe",
    NP,
    """
spectra = []
for b in batches:
    cov = np.cov(b, rowvar=False)
    spectra.append(np.sort(np.linalg.eigvalsh(cov))[::-1])
""",
)

case(
    "s4-np-seedsequence-spawn",
    "safe",
    "import numpy as np\n",
    """
walks = {}
for k, child in enumerate(np.random.SeedSequence(2024).spawn(4)):
    rng = np.random.default_rng(child)
    walks[k] = rng.choice([-1, 1], size=20).cumsum()[-1]
""",
)

case(
    "s4-np-rng-seed-tuple-per-item",
    "safe",
    NP,
    """
boots = {}
for i, s in enumerate(signals):
    rng = np.random.default_rng([7, i])
    boots[i] = np.mean([rng.choice(s, s.size).mean() for _ in range(50)])
""",
)

case(
    "s4-np-u-roll-carried-state",
    "unsafe",
    "import numpy as np\nstate = np.arange(5)\n",
    """
snapshots = []
for t in range(4):
    state = np.roll(state, 1) * 2
    snapshots.append(state.copy())
""",
)

case(
    "s4-np-u-markov-chain",
    "unsafe",
    "import numpy as np\nP = np.array([[0.9, 0.1], [0.5, 0.5]])\nrng = np.random.default_rng(3)\n",
    """
s = 0
visits = [0, 0]
for t in range(30):
    s = rng.choice(2, p=P[s])
    visits[s] += 1
""",
)

case(
    "s4-sp-brentq-root-per-param",
    "safe",
    "import numpy as np\nfrom scipy.optimize import brentq\nks = [0.5, 1.0, 2.0, 4.0]\n",
    """
roots = {}
for k in ks:
    roots[k] = brentq(lambda x: np.exp(-k * x) - x, 0.0, 1.0)
""",
)

case(
    "s4-sp-least-squares-per-signal",
    "safe",
    NP + "from scipy.optimize import least_squares\n",
    """
fits = []
t = np.arange(16)
for s in signals:
    r = least_squares(lambda p: p[0] + p[1] * t - s, x0=[0.0, 0.0])
    fits.append(np.round(r.x, 6))
""",
)

case(
    "s4-sp-stats-fit-distributions",
    "safe",
    "import numpy as np\nfrom scipy import stats\ndata = np.random.default_rng(5).gamma(2.0, 1.5, size=60)\n",
    """
ll = {}
for name in ["norm", "expon", "gamma"]:
    dist = getattr(stats, name)
    params = dist.fit(data)
    ll[name] = round(float(dist.logpdf(data, *params).sum()), 4)
best = max(ll, key=ll.get)
""",
)

case(
    "s4-sp-butter-filtfilt-per-cutoff",
    "safe",
    NP + "from scipy.signal import butter, filtfilt\n",
    """
smooth = {}
x = np.concatenate(signals)
for fc in [0.05, 0.1, 0.2]:
    b_, a_ = butter(2, fc)
    smooth[fc] = filtfilt(b_, a_, x)
""",
)

# ================================================================ scikit-learn

case(
    "s4-sk-parametergrid-ridge",
    "safe",
    SK,
    """
grid = {"alpha": [0.1, 1.0, 10.0], "fit_intercept": [True, False]}
results = []
for params in ParameterGrid(grid):
    est = Ridge(**params).fit(X, y)
    results.append({**params, "r2": round(est.score(X, y), 6)})
results_df = pd.DataFrame(results)
""",
)

case(
    "s4-sk-product-dict-zip-grid",
    "safe",
    SK + "import itertools\n",
    """
grid = {"max_depth": [2, 4], "min_samples_leaf": [1, 5], "criterion": ["gini", "entropy"]}
scores = {}
for values in itertools.product(*grid.values()):
    params = dict(zip(grid, values))
    clf = DecisionTreeClassifier(random_state=0, **params).fit(X[:60], y[:60])
    scores[values] = clf.score(X[60:], y[60:])
""",
)

case(
    "s4-sk-cross-validate-multi-metric",
    "safe",
    SK,
    """
models = {"lr": LogisticRegression(max_iter=300), "tree": DecisionTreeClassifier(max_depth=3, random_state=0)}
res = {}
for name, est in models.items():
    cv_res = cross_validate(est, X, y, cv=3, scoring=["accuracy", "f1"])
    res[name] = {k: round(v.mean(), 6) for k, v in cv_res.items() if k.startswith("test_")}
del cv_res  # its fit_time/score_time differ from run to run
""",
)

case(
    "s4-sk-clone-per-c-value",
    "safe",
    SK,
    """
base = LogisticRegression(max_iter=300)
fitted = {}
for C in [0.01, 0.1, 1.0]:
    m = clone(base).set_params(C=C).fit(X, y)
    fitted[C] = m
coef_norms = {C: float(np.linalg.norm(m.coef_)) for C, m in fitted.items()}
""",
)

case(
    "s4-sk-resample-bootstrap-random-state",
    "safe",
    SK + "from sklearn.utils import resample\n",
    """
boot_acc = []
for b in range(5):
    Xb, yb = resample(X, y, random_state=b)
    boot_acc.append(DecisionTreeClassifier(max_depth=2, random_state=0).fit(Xb, yb).score(X, y))
""",
)

case(
    "s4-sk-u-warm-start-grows",
    "unsafe",
    SK + "from sklearn.ensemble import RandomForestClassifier\n",
    """
rf = RandomForestClassifier(n_estimators=2, warm_start=True, random_state=0)
acc = []
for n in [2, 4, 6]:
    rf.set_params(n_estimators=n)
    rf.fit(X, y)
    acc.append(rf.score(X, y))
""",
)

# ================================================================ torch

case(
    "s4-torch-topk-accuracy-per-k",
    "safe",
    TORCH,
    """
with torch.no_grad():
    logits = model(X)
topk = {}
for k in (1, 2):
    topk[k] = (logits.topk(k, dim=1).indices == Y[:, None]).any(1).float().mean().item()
""",
)

case(
    "s4-torch-temperature-softmax-entropy",
    "safe",
    TORCH,
    """
with torch.no_grad():
    logits = model(X)
entropy = {}
for T in [0.5, 1.0, 2.0, 4.0]:
    p = torch.softmax(logits / T, dim=1)
    entropy[T] = -(p * p.log()).sum(1).mean().item()
""",
)

case(
    "s4-torch-clone-then-inplace",
    "safe",
    TORCH,
    """
base = model[0].weight.detach()
norms = []
for s in [0.5, 1.0, 2.0]:
    w = base.clone()
    w.mul_(s).clamp_(-0.3, 0.3)
    norms.append(w.norm().item())
""",
)

case(
    "s4-torch-u-inplace-alias-of-outer",
    "unsafe",
    "import torch\nbase = torch.ones(3)\n",
    """
vals = []
for s in [2.0, 3.0, 0.5]:
    t = base
    t.mul_(s)
    vals.append(t.sum().item())
""",
)

# ================================================================ objects, control flow, simulation

case(
    "s4-obj-results-attr-lists",
    "safe",
    NP,
    """
class Results:
    def __init__(self):
        self.scores = []
        self.best = {}
res = Results()
for i, s in enumerate(signals):
    res.scores.append(float(s.std()))
    res.best[i] = float(s.max())
""",
)

case(
    "s4-obj-simplenamespace-log",
    "safe",
    NP + "from types import SimpleNamespace\n",
    """
run = SimpleNamespace(name="sweep", log=[])
for lr in lrs:
    run.log.append((lr, round(lr * 1000) % 7))
""",
)

case(
    "s4-obj-dataclass-replace-configs",
    "safe",
    "import dataclasses\n@dataclasses.dataclass(frozen=True)\nclass Cfg:\n    lr: float = 0.1\n    depth: int = 2\nbase = Cfg()\n",
    """
cfgs = []
for lr in [0.1, 0.01]:
    for depth in [2, 3]:
        cfgs.append(dataclasses.replace(base, lr=lr, depth=depth))
""",
)

case(
    "s4-obj-tuples-sort-own-items",
    "safe",
    "buckets = {'x': [(3, 'c'), (1, 'a'), (2, 'b')], 'y': [(5, 'e'), (5, 'd')], 'z': []}\n",
    """
for key, items in buckets.items():
    items.sort(key=lambda t: (-t[0], t[1]))
""",
)

case(
    "s4-ctl-many-continues-counters",
    "safe",
    "records = [{'id': 1, 'v': 3}, {'id': 2}, {'id': 3, 'v': -1}, {'id': 4, 'v': 0}, {'id': 5, 'v': 8}, None]\n",
    """
kept, missing, negative = [], 0, 0
for r in records:
    if r is None:
        continue
    if "v" not in r:
        missing += 1
        continue
    if r["v"] < 0:
        negative += 1
        continue
    kept.append(r["id"])
""",
)

case(
    "s4-ctl-try-except-else-fallbacks",
    "safe",
    "prices = {'a': 10.0, 'b': 0.0, 'c': 4.0}\nqueries = [('a', 2), ('b', 3), ('z', 1), ('c', 0)]\n",
    """
ratios = {}
for k, q in queries:
    try:
        r = q / prices[k]
    except KeyError:
        r = float("nan")
    except ZeroDivisionError:
        r = float("inf")
    else:
        r = round(r, 3)
    ratios[k] = r
""",
)

case(
    "s4-ctl-collatz-inner-while",
    "safe",
    "",
    """
steps = {}
for n in range(1, 30):
    m, k = n, 0
    while m != 1:
        m = m // 2 if m % 2 == 0 else 3 * m + 1
        k += 1
    steps[n] = k
longest = max(steps, key=steps.get)
""",
)

case(
    "s4-ctl-dict-comprehension-of-funcs",
    "safe",
    NP,
    """
funcs = {"mean": np.mean, "std": np.std, "p90": lambda a: np.percentile(a, 90)}
stats = {}
for i, s in enumerate(signals):
    stats[i] = {name: round(float(fn(s)), 6) for name, fn in funcs.items()}
""",
)

case(
    "s4-ctl-u-budget-break",
    "unsafe",
    "costs = [3, 5, 2, 8, 1, 4]\n",
    """
spent, chosen = 0, []
for c in costs:
    if spent + c > 12:
        break
    spent += c
    chosen.append(c)
""",
)

case(
    "s4-sim-random-walkers-own-rng",
    "safe",
    "import numpy as np\n",
    """
finals = np.zeros(5)
for w in range(5):
    rng = np.random.default_rng(1000 + w)
    pos = 0.0
    for _ in range(50):
        pos += rng.normal()
    finals[w] = pos
""",
)

case(
    "s4-sim-euler-decay-per-rate",
    "safe",
    "import numpy as np\nrates = [0.1, 0.5, 1.0, 2.0]\n",
    """
half_life = {}
for k in rates:
    y, t, dt = 1.0, 0.0, 0.01
    while y > 0.5:
        y += -k * y * dt
        t += dt
    half_life[k] = round(t, 2)
""",
)

case(
    "s4-sim-u-automaton-rows",
    "unsafe",
    "import numpy as np\nrow0 = np.zeros(11, dtype=int)\nrow0[5] = 1\n",
    """
rows = [row0]
for t in range(5):
    prev = rows[-1]
    rows.append(np.roll(prev, 1) ^ np.roll(prev, -1))
""",
)

# ================================================================ files

case(
    "s4-io-csv-writer-per-item",
    "safe",
    FILES + "import csv\n",
    """
for p in paths:
    with open(p) as fh:
        losses = [float(ln.split()[-1]) for ln in fh]
    with open(p.replace(".log", ".csv"), "w", newline="") as out:
        w = csv.writer(out)
        w.writerow(["step", "loss"])
        w.writerows(enumerate(losses))
sizes = {os.path.basename(p): os.path.getsize(p) for p in sorted(glob.glob(os.path.join(D, "*.csv")))}
""",
)

case(
    "s4-io-pathlib-unlink-matching",
    "safe",
    FILES + "from pathlib import Path\n",
    """
for p in Path(D).glob("run*.log"):
    if p.read_text().count("\\n") > 5:
        p.unlink()
left = sorted(q.name for q in Path(D).iterdir())
""",
)

case(
    "s4-io-gzip-sizes",
    "safe",
    FILES + "import gzip\n",
    """
ratio = {}
for p in paths:
    raw = open(p, "rb").read()
    ratio[os.path.basename(p)] = round(len(gzip.compress(raw, mtime=0)) / len(raw), 4)
""",
)

case(
    "s4-io-u-csv-reader-line-num",
    "unsafe",
    "import csv, io\ntext = 'id,v\\n1,2\\n3,4\\n5,6\\n'\n",
    """
reader = csv.reader(io.StringIO(text))
by_line = {}
for row in reader:
    by_line[reader.line_num] = row
""",
    note="the body reads where the iterator is",
)

case(
    "s4-io-u-name-from-listdir-count",
    "unsafe",
    FILES,
    """
os.makedirs(os.path.join(D, "ckpt"))
for lr in [0.1, 0.01, 0.001]:
    n = len(os.listdir(os.path.join(D, "ckpt")))
    with open(os.path.join(D, "ckpt", f"ckpt_{n:03d}.txt"), "w") as fh:
        fh.write(str(lr))
names = sorted(os.listdir(os.path.join(D, "ckpt")))
""",
)
