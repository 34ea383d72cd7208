# ruff: noqa: E501  (the cells are notebook code, as tutorials write it)
"""A held-in corpus of notebook loops, written the way tutorials and docs
write them, for tests/test_sweep_loops.py.

Each case: an id, the verdict expected from the first law ("safe": a
serially equivalent parallel run is possible; "unsafe": iterations depend on
each other or have an effect that cannot be reproduced), a setup cell, the
cell ``%%gpu_parallel`` runs, and its kind:

- "plain": compared with the unseeded serial run;
- "seeded": run with ``--seed 0`` and compared with the serial cell seeded
  before each iteration as the engines seed it;
- "random": unseeded draws from a global generator; the magic must refuse or
  warn (docs/ARCHITECTURE.md §1, random numbers) or give the serial values.

``@TMP@`` in a setup is replaced by a folder of the test's own (the same
string in the serial and the parallel run).  Every setup also gets the
notebook's logging header (``log``, writing to a file the test compares).
"""

from __future__ import annotations

import dataclasses
import textwrap


@dataclasses.dataclass(frozen=True)
class Case:
    id: str
    verdict: str  # "safe" | "unsafe"
    setup: str
    cell: str
    kind: str = "plain"  # "plain" | "seeded" | "random"
    note: str = ""


CASES: list[Case] = []


def case(id, verdict, setup, cell, kind="plain", note=""):
    assert verdict in ("safe", "unsafe") and kind in ("plain", "seeded", "random")
    assert all(c.id != id for c in CASES), id
    CASES.append(
        Case(id, verdict, textwrap.dedent(setup), textwrap.dedent(cell), kind, note)
    )


# ---------------------------------------------------------------- shared setups

TEXT = """
docs = ["The cat sat on the mat", "A dog ran far away", "the cat and the dog",
        "Zebras run fast", "a quiet night", "The end of the story"]
words = ["level", "apple", "noon", "Banana", "racecar", "kiwi", "apple",
         "civic", "zebra", "noon", "Mango"]
emails = ["ann@example.com", "bob@test.org", "cy@example.com", "dee@mail.net",
          "eve@test.org"]
raw = ["  Hello ", "WORLD  ", " Foo", "bar ", "  ", "Baz\\t"]
"""

NP = """
import numpy as np
_r = np.random.default_rng(0)
M = _r.normal(size=(10, 5))
vectors = [_r.normal(size=4) for _ in range(9)]
signal = np.sin(np.linspace(0, 6, 40)) + 0.1 * _r.normal(size=40)
images = [_r.random((6, 6)) for _ in range(7)]
points = _r.random((8, 2))
"""

DF = """
import numpy as np
import pandas as pd
_r = np.random.default_rng(1)
sales = pd.DataFrame({
    "region": _r.choice(["north", "south", "east", "west"], size=40),
    "product": _r.choice(["a", "b", "c"], size=40),
    "qty": _r.integers(1, 10, size=40),
    "price": _r.uniform(1, 20, size=40).round(2),
})
ts = pd.DataFrame({"t": np.arange(30), "y": np.cumsum(_r.normal(size=30)),
                   "x": _r.normal(size=30)})
"""

SK = """
import numpy as np
from sklearn.datasets import make_classification
from sklearn.model_selection import train_test_split
X, y = make_classification(n_samples=120, n_features=6, n_informative=4,
                           random_state=0)
X_tr, X_te, y_tr, y_te = train_test_split(X, y, test_size=0.3, random_state=0)
"""

TORCH = """
import torch
from torch import nn
import torch.nn.functional as F
torch.manual_seed(0)
X = torch.randn(48, 4)
Y = (X @ torch.tensor([1.0, -2.0, 0.5, 3.0])).unsqueeze(1) + 0.1 * torch.randn(48, 1)
batches = list(zip(X.split(12), Y.split(12)))
loss_fn = nn.MSELoss()
"""

IMG = """
import os
import numpy as np
from PIL import Image, ImageFilter, ImageOps
_r = np.random.default_rng(3)
pics = [Image.fromarray(_r.integers(0, 256, size=(10 + 2 * k, 12, 3), dtype=np.uint8), "RGB")
        for k in range(6)]
names = [f"pic{k}" for k in range(6)]
"""

FILES = """
import os, json, glob, shutil
D = @TMP@
shutil.rmtree(D, ignore_errors=True)
os.makedirs(os.path.join(D, "in"))
os.makedirs(os.path.join(D, "out"))
for k in range(6):
    with open(os.path.join(D, "in", f"part{k}.csv"), "w") as fh:
        fh.write("id,value\\n")
        for j in range(k + 2):
            fh.write(f"{j},{(j * 7 + k) % 11}\\n")
    with open(os.path.join(D, "in", f"note{k}.txt"), "w") as fh:
        fh.write("\\n".join(f"line {j} of note {k}" for j in range(k + 1)) + "\\n")
    with open(os.path.join(D, "in", f"rec{k}.json"), "w") as fh:
        fh.write("{bad json" if k == 3 else json.dumps({"id": k, "value": k * k}))
csv_paths = sorted(glob.glob(os.path.join(D, "in", "*.csv")))
txt_paths = sorted(glob.glob(os.path.join(D, "in", "*.txt")))
json_paths = sorted(glob.glob(os.path.join(D, "in", "*.json")))
"""

# ================================================================ SAFE
# ---------------------------------------------------------------- strings

case(
    "str-word-lengths",
    "safe",
    TEXT,
    """
lengths = {}
for i, doc in enumerate(docs):
    tokens = doc.split()
    lengths[i] = len(tokens)
""",
)

case(
    "str-clean-comprehension",
    "safe",
    TEXT,
    """
clean = [s.strip().lower() for s in raw]
""",
)

case(
    "str-domains-setcomp",
    "safe",
    TEXT,
    """
domains = {e.split("@")[1] for e in emails}
""",
)

case(
    "str-name-lengths-dictcomp",
    "safe",
    TEXT,
    """
lookup = {w: len(w) for w in words}
""",
)

case(
    "str-palindromes-filter",
    "safe",
    TEXT,
    """
pals = [w for w in words if w.lower() == w.lower()[::-1]]
""",
)

case(
    "str-config-parse-continue",
    "safe",
    """
text = '''
# settings
lr = 0.01
batch_size=32

name = resnet
lr = 0.001
'''
""",
    """
config = {}
for line in text.splitlines():
    line = line.strip()
    if not line or line.startswith("#"):
        continue
    key, _, val = line.partition("=")
    config[key.strip()] = val.strip()
""",
)

case(
    "str-regex-extract",
    "safe",
    """
import re
lines = ["2024-01-03 ERROR disk full", "2024-01-03 INFO ok",
         "2024-01-04 ERROR timeout after 30s", "garbage", "2024-01-05 WARN slow"]
pat = re.compile(r"^(\\d{4}-\\d{2}-\\d{2}) (ERROR|WARN) (.*)$")
""",
    """
hits = []
for s in lines:
    m = pat.match(s)
    if m is None:
        continue
    date, level, msg = m.groups()
    hits.append({"date": date, "level": level, "msg": msg})
    log.info("matched %s %s", level, date)
""",
)

case(
    "str-caesar-helper",
    "safe",
    """
def caesar(s, k):
    out = []
    for ch in s:
        if ch.isalpha():
            base = ord("a") if ch.islower() else ord("A")
            out.append(chr((ord(ch) - base + k) % 26 + base))
        else:
            out.append(ch)
    return "".join(out)
messages = ["Hello World", "attack at dawn", "Python3 rocks"]
""",
    """
encoded = []
for k, msg in enumerate(messages, start=1):
    enc = caesar(msg, k)
    encoded.append((msg, enc))
    print(f"{k}: {enc}")
""",
)

case(
    "str-char-freq-defaultdict",
    "safe",
    TEXT
    + """
from collections import defaultdict
freq = defaultdict(int)
""",
    """
for w in words:
    for ch in w.lower():
        freq[ch] += 1
""",
)

case(
    "str-word-counts-get",
    "safe",
    TEXT,
    """
counts = {}
for doc in docs:
    for w in doc.lower().split():
        counts[w] = counts.get(w, 0) + 1
""",
    note="keyed reduction written as D[k] = D.get(k, 0) + 1",
)

case(
    "str-counter-update",
    "safe",
    TEXT + "from collections import Counter\n",
    """
c = Counter()
for doc in docs:
    c.update(doc.lower().split())
top = c.most_common(3)
""",
    note="borderline: Counter.update is a reduction through a method",
)

case(
    "str-concat-reduction",
    "safe",
    TEXT,
    """
text = ""
for w in words:
    text += w.upper() + " "
""",
)

case(
    "str-text-features-frame",
    "safe",
    TEXT + "import pandas as pd\n",
    """
rows = []
for t in docs:
    rows.append({
        "text": t,
        "n_chars": len(t),
        "n_words": len(t.split()),
        "has_the": "the" in t.lower().split(),
        "upper_ratio": sum(c.isupper() for c in t) / len(t),
    })
features = pd.DataFrame(rows)
""",
)

case(
    "str-enumerate-zip-diffs",
    "safe",
    """
xs = [3, 8, 1, 9, 4]
ys = [2, 8, 5, 1, 0]
""",
    """
diffs = []
for idx, (a, b) in enumerate(zip(xs, ys)):
    diffs.append((idx, a - b))
""",
)

case(
    "str-title-case-own-element",
    "safe",
    TEXT,
    """
names = [w for w in words]
for i in range(len(names)):
    names[i] = names[i].title()
""",
    note="names is built by the prelude comprehension",
)

case(
    "str-startswith-buckets",
    "safe",
    TEXT,
    """
buckets = {"vowel": [], "consonant": []}
for w in words:
    key = "vowel" if w[0].lower() in "aeiou" else "consonant"
    buckets[key].append(w)
""",
)

case(
    "str-group-by-length-defaultdict-list",
    "safe",
    TEXT
    + """
from collections import defaultdict
by_len = defaultdict(list)
""",
    """
for w in words:
    by_len[len(w)].append(w)
""",
)

case(
    "str-setdefault-index",
    "safe",
    TEXT,
    """
index = {}
for i, doc in enumerate(docs):
    for w in sorted(set(doc.lower().split())):
        index.setdefault(w, []).append(i)
""",
    note="keyed gather through setdefault",
)

case(
    "str-ranking-sorted-items",
    "safe",
    """
scores = {"ann": 88, "bob": 72, "cy": 95, "dee": 60}
""",
    """
ranking = []
for pos, (name, score) in enumerate(sorted(scores.items(), key=lambda kv: -kv[1])):
    ranking.append(f"{pos + 1}. {name} ({score})")
report = "\\n".join(ranking)
""",
)

case(
    "str-sum-generator",
    "safe",
    TEXT,
    """
total_chars = sum(len(w) for w in words)
""",
)

case(
    "str-max-generator",
    "safe",
    TEXT,
    """
longest = max((len(d), d) for d in docs)
""",
)

case(
    "str-sorted-generator",
    "safe",
    TEXT,
    """
ordered = sorted(w.lower() for w in words)
""",
)

case(
    "str-walrus-listcomp",
    "safe",
    TEXT,
    """
long_words = [u for w in words if len(u := w.strip().upper()) > 4]
""",
    note="the walrus leaks `u` (last value) into the namespace",
)

case(
    "str-date-weekdays",
    "safe",
    """
from datetime import datetime
date_strs = ["2024-01-01", "2024-02-29", "2023-12-25", "2024-07-04"]
""",
    """
weekdays = []
for s in date_strs:
    d = datetime.strptime(s, "%Y-%m-%d")
    weekdays.append(d.strftime("%A"))
""",
)

case(
    "str-try-except-int",
    "safe",
    """
tokens = ["12", "x7", "40", "", "3.5", "-2"]
""",
    """
parsed = []
bad = []
for tok in tokens:
    try:
        v = int(tok)
    except ValueError:
        bad.append(tok)
        continue
    parsed.append(v)
""",
)

case(
    "str-star-unpack",
    "safe",
    """
rows = [("a", 1, 2, 3), ("b", 4, 5), ("c", 6)]
""",
    """
heads, tails = [], []
for first, *rest in rows:
    heads.append(first)
    tails.append(sum(rest))
""",
)

case(
    "str-for-else",
    "safe",
    TEXT,
    """
shouted = []
for w in words:
    shouted.append(w.upper() + "!")
else:
    done = True
""",
)

case(
    "str-neighbor-read-input",
    "safe",
    """
seq = [1, 1, 2, 3, 3, 3, 4, 1, 1]
""",
    """
dups = []
for i, x in enumerate(seq):
    if i > 0 and x == seq[i - 1]:
        dups.append(i)
""",
    note="reads the previous element of an input that nothing changes",
)

# ---------------------------------------------------------------- dicts

case(
    "dict-price-conversion",
    "safe",
    """
prices = {"apple": 1.2, "bread": 2.5, "milk": 0.99, "cheese": 7.25}
rate = 0.92
""",
    """
prices_eur = {}
for k, v in prices.items():
    prices_eur[k] = round(v * rate, 2)
""",
)

case(
    "dict-grade-stats",
    "safe",
    """
grades = {"ann": [90, 85, 77], "bob": [60, 70], "cy": [100, 95, 98, 91]}
""",
    """
stats = {}
for name, scores in grades.items():
    stats[name] = {"mean": sum(scores) / len(scores), "max": max(scores),
                   "n": len(scores)}
""",
)

case(
    "dict-filter-comprehension",
    "safe",
    """
scores = {"ann": 88, "bob": 52, "cy": 95, "dee": 60, "eve": 59}
""",
    """
passed = {n: s for n, s in scores.items() if s >= 60}
""",
)

case(
    "dict-records-to-frame",
    "safe",
    """
import pandas as pd
users = {"u1": {"age": 31, "city": "Oslo"}, "u2": {"age": 25, "city": "Rome"},
         "u3": {"age": 47, "city": "Lima"}}
""",
    """
records = []
for user, info in users.items():
    rec = dict(info)
    rec["user"] = user
    rec["senior"] = info["age"] > 40
    records.append(rec)
people = pd.DataFrame(records).set_index("user")
""",
)

case(
    "dict-own-key-uppercase",
    "safe",
    """
settings = {"mode": "train", "device": "cpu", "opt": "adam"}
""",
    """
for k in settings:
    settings[k] = settings[k].upper()
""",
)

case(
    "dict-keyed-assign-reduction",
    "safe",
    """
xs = [3, 1, 4, 1, 5, 9, 2, 6]
""",
    """
totals = {"sum": 0, "sq": 0}
for x in xs:
    totals["sum"] = totals["sum"] + x
    totals["sq"] += x * x
""",
    note="D[k] = D[k] + e is a keyed reduction",
)

case(
    "dict-delete-own-key",
    "safe",
    """
balances = {"a": 10, "b": -3, "c": 0, "d": -1, "e": 4}
""",
    """
for k in list(balances):
    if balances[k] < 0:
        del balances[k]
""",
    note="each iteration deletes only its own key",
)

case(
    "dict-nested-loop-pairs",
    "safe",
    """
import math
pts = [(0, 0), (1, 1), (5, 5), (1.5, 1), (6, 5)]
""",
    """
close = []
for i in range(len(pts)):
    for j in range(i + 1, len(pts)):
        if math.dist(pts[i], pts[j]) < 1.5:
            close.append((i, j))
""",
)

case(
    "dict-one-hot",
    "safe",
    """
colors = ["red", "green", "blue", "green", "red"]
vocab = sorted(set(colors))
""",
    """
onehot = []
for c in colors:
    onehot.append({v: int(v == c) for v in vocab})
""",
)

case(
    "dict-dataclass-records",
    "safe",
    """
from dataclasses import dataclass
@dataclass
class Item:
    name: str
    price: float
    qty: int
raw_items = [("pen", 1.5, 10), ("book", 12.0, 2), ("bag", 30.0, 1)]
""",
    """
items = []
total_value = 0.0
for name, price, qty in raw_items:
    it = Item(name, price, qty)
    items.append(it)
    total_value += it.price * it.qty
""",
)

case(
    "dict-class-instances-own-method",
    "safe",
    """
class Account:
    def __init__(self, owner, balance=0):
        self.owner = owner
        self.balance = balance
        self.history = []
    def deposit(self, amount):
        self.balance += amount
        self.history.append(amount)
accounts = [Account("ann", 5), Account("bob"), Account("cy", 100)]
""",
    """
for acct in accounts:
    acct.deposit(10)
    acct.deposit(len(acct.owner))
""",
    note="each iteration changes its own item (write-back)",
)

case(
    "dict-lambdas-late-binding",
    "safe",
    "",
    """
fns = []
for i in range(4):
    fns.append(lambda: i * 10)
res = [f() for f in fns]
""",
)

case(
    "dict-def-in-body-default",
    "safe",
    "",
    """
scalers = {}
for k in [2, 3, 5]:
    def scale(x, k=k):
        return x * k
    scalers[k] = scale
vals = {k: fn(7) for k, fn in scalers.items()}
""",
)

case(
    "dict-helper-function-defaults",
    "safe",
    """
def featurize(x, scale=2.0, shift=1.0):
    return {"x": x, "scaled": x * scale + shift, "sq": x * x}
raw_vals = [0.5, 1.5, -2.0, 3.25]
""",
    """
feats = []
for v in raw_vals:
    feats.append(featurize(v))
    feats.append(featurize(v, scale=0.5))
""",
)

case(
    "dict-lru-cache-helper",
    "safe",
    """
import functools
@functools.lru_cache(maxsize=None)
def collatz_len(n):
    steps = 0
    while n != 1:
        n = n // 2 if n % 2 == 0 else 3 * n + 1
        steps += 1
    return steps
""",
    """
lengths = {}
for n in range(1, 30):
    lengths[n] = collatz_len(n)
""",
)

case(
    "dict-generator-iterable",
    "safe",
    """
def chunks(seq, n):
    for i in range(0, len(seq), n):
        yield seq[i:i + n]
data = list(range(23))
""",
    """
chunk_sums = []
for part in chunks(data, 5):
    chunk_sums.append(sum(part))
""",
)

case(
    "dict-try-except-zero",
    "safe",
    """
pairs = [(4, 2), (1, 0), (9, 3), (5, 0), (7, 7)]
""",
    """
ratios = []
for a, b in pairs:
    try:
        ratios.append(a / b)
    except ZeroDivisionError:
        ratios.append(float("nan"))
        log.warning("division by zero for %s/%s", a, b)
""",
)

case(
    "dict-set-union",
    "safe",
    TEXT,
    """
vocab = set()
for doc in docs:
    vocab.update(doc.lower().split())
    vocab.add(len(doc))
""",
)

case(
    "dict-list-of-lists-own-rows",
    "safe",
    "",
    """
n = 5
table = [[0] * n for _ in range(n)]
for i in range(n):
    for j in range(n):
        table[i][j] = (i + 1) * (j + 1)
""",
)

case(
    "dict-grid-from-copy",
    "safe",
    """
orig = [[1, 2], [3, 4], [5, 6]]
""",
    """
grid = [row[:] for row in orig]
for i in range(len(grid)):
    grid[i] = [v * 2 for v in orig[i - 1]]
""",
    note="reads a different row of an input nobody changes",
)

# ---------------------------------------------------------------- numpy

case(
    "np-row-normalise-into-empty",
    "safe",
    NP,
    """
out = np.empty_like(M)
for i in range(len(M)):
    out[i] = (M[i] - M[i].mean()) / M[i].std()
""",
)

case(
    "np-norms-comprehension",
    "safe",
    NP,
    """
norms = [float(np.linalg.norm(v)) for v in vectors]
""",
)

case(
    "np-moving-average",
    "safe",
    NP,
    """
w = 5
ma = []
for i in range(len(signal) - w + 1):
    ma.append(signal[i:i + w].mean())
ma = np.array(ma)
""",
)

case(
    "np-matrix-powers-dictcomp",
    "safe",
    """
import numpy as np
A = np.array([[1, 1], [1, 0]])
""",
    """
powers = {k: np.linalg.matrix_power(A, k) for k in range(1, 8)}
""",
)

case(
    "np-sum-squares-reduction",
    "safe",
    NP,
    """
total = 0.0
for v in vectors:
    total += float(v @ v)
""",
)

case(
    "np-running-max-reduction",
    "safe",
    NP,
    """
best = -np.inf
for v in vectors:
    best = max(best, v.max())
""",
)

case(
    "np-masks-comprehension",
    "safe",
    NP,
    """
masks = [(im > im.mean()).astype(np.uint8) for im in images]
""",
)

case(
    "np-histograms-rows",
    "safe",
    NP,
    """
hists = np.zeros((len(images), 5), dtype=np.int64)
for i, im in enumerate(images):
    hists[i] = np.histogram(im, bins=5, range=(0, 1))[0]
""",
)

case(
    "np-distance-matrix-nested",
    "safe",
    NP,
    """
n = len(points)
Dm = np.zeros((n, n))
for i in range(n):
    for j in range(n):
        Dm[i, j] = np.linalg.norm(points[i] - points[j])
""",
)

case(
    "np-array-accumulate-inplace-add",
    "safe",
    NP,
    """
grand = np.zeros(4)
for v in vectors:
    grand += v
""",
    note="ndarray += is a sum reduction",
)

case(
    "np-default-rng-per-iteration",
    "safe",
    """
import numpy as np
n_walks = 8
""",
    """
finals = []
for s in range(n_walks):
    rng = np.random.default_rng(s)
    steps = rng.choice([-1, 1], size=50)
    finals.append(int(steps.cumsum()[-1]))
spread = float(np.std(finals))
""",
)

case(
    "np-errstate-log",
    "safe",
    """
import numpy as np
vals = [np.array([1.0, 0.0, 2.0]), np.array([0.0, 3.0]), np.array([5.0])]
""",
    """
logs = []
with np.errstate(divide="ignore"):
    for v in vals:
        logs.append(np.log(v))
""",
)

case(
    "np-polyfit-per-series",
    "safe",
    """
import numpy as np
t = np.linspace(0, 1, 15)
series = {"a": 2 * t ** 2 + 1, "b": -t + 0.5, "c": np.cos(t)}
""",
    """
coefs = {}
for name, yv in series.items():
    coefs[name] = np.polyfit(t, yv, 2)
    log.info("%s leading=%.4f", name, coefs[name][0])
""",
)

case(
    "np-row-sums-into-zeros",
    "safe",
    NP,
    """
row_sums = np.zeros(len(M))
for i, row in enumerate(M):
    row_sums[i] = row.sum()
""",
)

case(
    "np-normalise-rows-in-place-item",
    "safe",
    """
import numpy as np
P = np.arange(1.0, 13.0).reshape(4, 3)
""",
    """
for row in P:
    row /= row.sum()
""",
    note="each iteration changes its own row (a view of P) in place",
)

case(
    "np-own-element-scale",
    "safe",
    NP,
    """
scaled = signal.copy()
for i in range(len(scaled)):
    scaled[i] = scaled[i] * 2 + 1
""",
)

case(
    "np-clip-and-stack",
    "safe",
    NP,
    """
clipped = []
for im in images:
    c = np.clip(im, 0.2, 0.8)
    clipped.append(c)
stack = np.stack(clipped)
""",
)

case(
    "np-argmax-per-row-dict",
    "safe",
    NP,
    """
winner = {}
for i, row in enumerate(M):
    winner[i] = int(np.argmax(row))
""",
)

case(
    "np-matmul-chain-reduction",
    "safe",
    """
import numpy as np
rots = [np.array([[np.cos(a), -np.sin(a)], [np.sin(a), np.cos(a)]])
        for a in np.linspace(0.1, 0.7, 6)]
""",
    """
R = np.eye(2)
for m in rots:
    R = R @ m
""",
)

case(
    "np-digitize-columns",
    "safe",
    NP,
    """
edges = np.array([-1.0, 0.0, 1.0])
binned = {}
for j in range(M.shape[1]):
    binned[f"c{j}"] = np.digitize(M[:, j], edges)
""",
)

case(
    "np-argmin-running-best",
    "safe",
    NP,
    """
best_i, best_d = -1, np.inf
for i, v in enumerate(vectors):
    d = float(np.linalg.norm(v))
    if d < best_d:
        best_i, best_d = i, d
""",
    note="running argmin (a reduction the docs advise rewriting)",
)

case(
    "np-vectors-zip-dot",
    "safe",
    NP,
    """
dots = []
for a, b in zip(vectors[:-1], vectors[1:]):
    dots.append(float(a @ b))
""",
)

# ---------------------------------------------------------------- pandas

case(
    "pd-groupby-revenue-rows",
    "safe",
    DF,
    """
rows = []
for region, g in sales.groupby("region"):
    revenue = float((g["qty"] * g["price"]).sum())
    rows.append({"region": region, "orders": len(g), "revenue": round(revenue, 2)})
    log.info("%s revenue=%.2f", region, revenue)
by_region = pd.DataFrame(rows).set_index("region")
""",
)

case(
    "pd-iterrows-append",
    "safe",
    DF,
    """
totals = []
for idx, row in sales.iterrows():
    totals.append(row["qty"] * row["price"])
""",
)

case(
    "pd-iterrows-at-own-row",
    "safe",
    DF,
    """
sales["total"] = 0.0
for idx, row in sales.iterrows():
    sales.at[idx, "total"] = row["qty"] * row["price"]
""",
)

case(
    "pd-describe-per-column",
    "safe",
    DF,
    """
summary = {}
for col in ["qty", "price"]:
    summary[col] = sales[col].describe()
""",
)

case(
    "pd-fillna-own-columns",
    "safe",
    """
import numpy as np
import pandas as pd
df = pd.DataFrame({"a": [1.0, np.nan, 3.0, np.nan], "b": [np.nan, 2.0, 4.0, 8.0],
                   "c": ["x", "y", None, "z"]})
""",
    """
for c in ["a", "b"]:
    df[c] = df[c].fillna(df[c].median())
""",
)

case(
    "pd-rolling-features",
    "safe",
    DF,
    """
for w in [2, 3, 5]:
    ts[f"roll_{w}"] = ts["y"].rolling(w).mean()
""",
    note="new columns keyed by the loop value",
)

case(
    "pd-lag-features",
    "safe",
    DF,
    """
for lag in range(1, 4):
    ts[f"lag_{lag}"] = ts["y"].shift(lag)
""",
)

case(
    "pd-itertuples-labels",
    "safe",
    DF,
    """
labels = {}
for r in sales.itertuples():
    labels[r.Index] = "big" if r.qty * r.price > 50 else "small"
""",
)

case(
    "pd-groupby-two-keys",
    "safe",
    DF,
    """
means = {}
for (region, product), g in sales.groupby(["region", "product"]):
    means[(region, product)] = g["price"].mean()
""",
)

case(
    "pd-pivot-per-region-dictcomp",
    "safe",
    DF,
    """
tables = {r: g.pivot_table(index="product", values="qty", aggfunc="sum")
          for r, g in sales.groupby("region")}
""",
)

case(
    "pd-value-counts-per-column",
    "safe",
    DF,
    """
vc = {}
for col in ["region", "product"]:
    vc[col] = sales[col].value_counts().sort_index().to_dict()
""",
)

case(
    "pd-str-normalise-columns",
    "safe",
    """
import pandas as pd
people = pd.DataFrame({"first": [" Ann", "BOB ", "cy"], "last": ["Lee ", " KIM", "Ng"],
                       "age": [30, 41, 25]})
""",
    """
for col in ["first", "last"]:
    people[col] = people[col].str.strip().str.title()
""",
)

case(
    "pd-boolean-mask-disjoint-rows",
    "safe",
    DF,
    """
sales["region_mean_price"] = np.nan
for reg in sorted(sales["region"].unique()):
    mask = sales["region"] == reg
    sales.loc[mask, "region_mean_price"] = sales.loc[mask, "price"].mean()
""",
    note="each iteration writes a disjoint set of rows",
)

case(
    "pd-rank-by-sorted-index",
    "safe",
    DF,
    """
sales["rank"] = 0
for pos, idx in enumerate(sales.sort_values("price").index):
    sales.at[idx, "rank"] = pos
""",
    note="each label written once, order from a sorted copy",
)

case(
    "pd-read-csvs-concat",
    "safe",
    FILES + "import pandas as pd\n",
    """
frames = []
for p in csv_paths:
    part = pd.read_csv(p)
    part["source"] = os.path.basename(p)
    frames.append(part)
combined = pd.concat(frames, ignore_index=True)
""",
)

case(
    "pd-corr-per-pair",
    "safe",
    DF,
    """
cols = ["y", "x", "t"]
corrs = {}
for i, a in enumerate(cols):
    for b in cols[i + 1:]:
        corrs[(a, b)] = float(ts[a].corr(ts[b]))
""",
)

case(
    "pd-resample-like-bins",
    "safe",
    DF,
    """
bin_means = []
for start in range(0, len(ts), 10):
    window = ts.iloc[start:start + 10]
    bin_means.append({"start": start, "y_mean": window["y"].mean(),
                      "x_max": window["x"].max()})
bins = pd.DataFrame(bin_means)
""",
)

case(
    "pd-series-list-comp",
    "safe",
    DF,
    """
zscores = [(ts[c] - ts[c].mean()) / ts[c].std() for c in ["y", "x"]]
""",
)

case(
    "pd-apply-per-group-with-log",
    "safe",
    DF,
    """
top_products = {}
for region, g in sales.groupby("region"):
    best = g.groupby("product")["qty"].sum().idxmax()
    top_products[region] = best
    log.info("region %s top %s", region, best)
""",
)

# ---------------------------------------------------------------- sklearn

case(
    "sk-fit-models-in-dict",
    "safe",
    SK
    + """
from sklearn.linear_model import LogisticRegression
from sklearn.tree import DecisionTreeClassifier
from sklearn.neighbors import KNeighborsClassifier
models = {"logreg": LogisticRegression(max_iter=500),
          "tree": DecisionTreeClassifier(max_depth=3, random_state=0),
          "knn": KNeighborsClassifier(5)}
""",
    """
scores = {}
for name, est in models.items():
    est.fit(X_tr, y_tr)
    scores[name] = est.score(X_te, y_te)
    log.info("%s acc=%.3f", name, scores[name])
""",
    note="each iteration fits its own item",
)

case(
    "sk-kfold-cv",
    "safe",
    SK
    + """
from sklearn.model_selection import KFold
from sklearn.linear_model import LogisticRegression
kf = KFold(n_splits=4, shuffle=True, random_state=0)
""",
    """
fold_scores = []
for fold, (tr, te) in enumerate(kf.split(X)):
    m = LogisticRegression(max_iter=300).fit(X[tr], y[tr])
    fold_scores.append(m.score(X[te], y[te]))
    log.info("fold %d acc=%.3f", fold, fold_scores[-1])
mean_acc = float(np.mean(fold_scores))
""",
)

case(
    "sk-grid-svc-frame",
    "safe",
    SK
    + """
import pandas as pd
from sklearn.svm import SVC
""",
    """
results = []
for C in [0.01, 0.1, 1, 10]:
    for kernel in ["linear", "rbf"]:
        clf = SVC(C=C, kernel=kernel).fit(X_tr, y_tr)
        results.append({"C": C, "kernel": kernel, "acc": clf.score(X_te, y_te)})
grid = pd.DataFrame(results)
best_row = grid.loc[grid["acc"].idxmax()]
""",
)

case(
    "sk-knn-error-comprehension",
    "safe",
    SK
    + """
from sklearn.neighbors import KNeighborsClassifier
""",
    """
errors = [1 - KNeighborsClassifier(k).fit(X_tr, y_tr).score(X_te, y_te) for k in range(1, 9)]
""",
)

case(
    "sk-kmeans-elbow",
    "safe",
    SK
    + """
from sklearn.cluster import KMeans
""",
    """
inertias = {}
for k in range(1, 6):
    km = KMeans(n_clusters=k, n_init=3, random_state=0).fit(X)
    inertias[k] = km.inertia_
""",
)

case(
    "sk-select-kbest",
    "safe",
    SK
    + """
from sklearn.feature_selection import SelectKBest, f_classif
""",
    """
chosen = {}
for k in [2, 4, 6]:
    sel = SelectKBest(f_classif, k=k).fit(X, y)
    chosen[k] = [int(i) for i in np.flatnonzero(sel.get_support())]
""",
)

case(
    "sk-fit-pipelines-items",
    "safe",
    SK
    + """
from sklearn.pipeline import make_pipeline
from sklearn.preprocessing import StandardScaler, MinMaxScaler
from sklearn.linear_model import LogisticRegression
pipes = [make_pipeline(StandardScaler(), LogisticRegression(C=c, max_iter=300))
         for c in (0.1, 1.0)] + [make_pipeline(MinMaxScaler(), LogisticRegression())]
""",
    """
accs = []
for pipe in pipes:
    pipe.fit(X_tr, y_tr)
    accs.append(pipe.score(X_te, y_te))
""",
    note="each pipeline fits its nested steps in place",
)

case(
    "sk-random-forest-sizes",
    "safe",
    SK
    + """
from sklearn.ensemble import RandomForestClassifier
""",
    """
oob = {}
for n in [10, 20, 40]:
    rf = RandomForestClassifier(n_estimators=n, oob_score=True, random_state=0)
    rf.fit(X, y)
    oob[n] = rf.oob_score_
last_rf = rf
""",
)

case(
    "sk-cross-val-dictcomp",
    "safe",
    SK
    + """
from sklearn.model_selection import cross_val_score
from sklearn.linear_model import LogisticRegression, RidgeClassifier
from sklearn.naive_bayes import GaussianNB
cands = {"lr": LogisticRegression(max_iter=300), "ridge": RidgeClassifier(), "nb": GaussianNB()}
""",
    """
cv_means = {name: cross_val_score(est, X, y, cv=3).mean() for name, est in cands.items()}
""",
)

case(
    "sk-thresholds-f1",
    "safe",
    SK
    + """
from sklearn.linear_model import LogisticRegression
from sklearn.metrics import f1_score, precision_score
proba = LogisticRegression(max_iter=300).fit(X_tr, y_tr).predict_proba(X_te)[:, 1]
""",
    """
rows = []
for t in np.linspace(0.1, 0.9, 9):
    pred = (proba >= t).astype(int)
    rows.append({"t": round(float(t), 2), "f1": f1_score(y_te, pred),
                 "precision": precision_score(y_te, pred, zero_division=0)})
""",
)

case(
    "sk-confusion-matrices",
    "safe",
    SK
    + """
from sklearn.metrics import confusion_matrix
from sklearn.tree import DecisionTreeClassifier
""",
    """
cms = {}
for depth in [1, 2, 4, None]:
    tree = DecisionTreeClassifier(max_depth=depth, random_state=0).fit(X_tr, y_tr)
    cms[str(depth)] = confusion_matrix(y_te, tree.predict(X_te))
""",
)

case(
    "sk-per-feature-scaler-fresh",
    "safe",
    SK
    + """
from sklearn.preprocessing import StandardScaler
""",
    """
scaled_cols = {}
for j in range(X.shape[1]):
    sc = StandardScaler()
    scaled_cols[j] = sc.fit_transform(X[:, [j]]).ravel()
""",
)

case(
    "sk-regression-alphas",
    "safe",
    """
import numpy as np
from sklearn.datasets import make_regression
from sklearn.linear_model import Ridge, Lasso
from sklearn.metrics import mean_squared_error
Xr, yr = make_regression(n_samples=80, n_features=5, noise=3.0, random_state=1)
""",
    """
mse = {}
coefs = {}
for alpha in [0.01, 0.1, 1.0, 10.0]:
    for Est in (Ridge, Lasso):
        m = Est(alpha=alpha).fit(Xr, yr)
        mse[(Est.__name__, alpha)] = mean_squared_error(yr, m.predict(Xr))
        coefs[(Est.__name__, alpha)] = m.coef_
""",
)

case(
    "sk-running-best-model",
    "safe",
    SK
    + """
from sklearn.tree import DecisionTreeClassifier
""",
    """
best_score, best_depth = -1.0, None
for depth in range(1, 7):
    s = DecisionTreeClassifier(max_depth=depth, random_state=0).fit(X_tr, y_tr).score(X_te, y_te)
    if s > best_score:
        best_score = s
        best_depth = depth
""",
    note="running best (a reduction the docs advise rewriting)",
)

# ---------------------------------------------------------------- torch

case(
    "torch-lr-sweep-logreg",
    "safe",
    TORCH
    + """
Xc = torch.randn(60, 3)
yc = (Xc[:, 0] - Xc[:, 1] > 0).float().unsqueeze(1)
""",
    """
final_loss = {}
weights = {}
for lr in [0.5, 0.1, 0.01]:
    torch.manual_seed(0)
    clf = nn.Linear(3, 1)
    opt = torch.optim.SGD(clf.parameters(), lr=lr)
    for step in range(20):
        opt.zero_grad()
        loss = F.binary_cross_entropy_with_logits(clf(Xc), yc)
        loss.backward()
        opt.step()
    final_loss[lr] = loss.item()
    weights[lr] = clf.weight.detach().clone()
    log.info("lr=%s loss=%.5f", lr, final_loss[lr])
""",
)

case(
    "torch-inference-no-grad",
    "safe",
    TORCH
    + """
torch.manual_seed(1)
model = nn.Sequential(nn.Linear(4, 8), nn.ReLU(), nn.Linear(8, 3))
model.eval()
""",
    """
preds = []
with torch.no_grad():
    for xb, _ in batches:
        preds.append(model(xb).argmax(1))
all_preds = torch.cat(preds)
""",
)

case(
    "torch-train-own-nets-zip",
    "safe",
    TORCH
    + """
torch.manual_seed(2)
nets = [nn.Linear(4, 1) for _ in range(3)]
""",
    """
for net, (xb, yb) in zip(nets, batches):
    opt = torch.optim.SGD(net.parameters(), lr=0.05)
    for _ in range(5):
        opt.zero_grad()
        loss_fn(net(xb), yb).backward()
        opt.step()
""",
    note="each iteration trains its own item",
)

case(
    "torch-means-listcomp",
    "safe",
    TORCH,
    """
means = [xb.mean(0) for xb, _ in batches]
""",
)

case(
    "torch-per-sample-grad",
    "safe",
    TORCH,
    """
grads = []
for x in X[:6]:
    x = x.clone().requires_grad_(True)
    out = (x ** 3).sum()
    out.backward()
    grads.append(x.grad)
""",
)

case(
    "torch-seeded-init-per-seed",
    "safe",
    TORCH,
    """
finals = {}
for seed in range(3):
    torch.manual_seed(seed)
    net = nn.Sequential(nn.Linear(4, 6), nn.Tanh(), nn.Linear(6, 1))
    opt = torch.optim.Adam(net.parameters(), lr=0.01)
    for epoch in range(4):
        for xb, yb in batches:
            opt.zero_grad()
            loss = loss_fn(net(xb), yb)
            loss.backward()
            opt.step()
    finals[seed] = loss.item()
""",
)

case(
    "torch-ensemble-softmax",
    "safe",
    TORCH
    + """
torch.manual_seed(3)
members = [nn.Linear(4, 3).eval() for _ in range(4)]
""",
    """
probs = [torch.softmax(m(X), dim=1).detach() for m in members]
""",
)

case(
    "torch-conv-filters",
    "safe",
    """
import torch
import torch.nn.functional as F
torch.manual_seed(4)
img = torch.rand(1, 1, 8, 8)
kernels = {"blur": torch.full((1, 1, 3, 3), 1 / 9),
           "edge": torch.tensor([[[[0., 1., 0.], [1., -4., 1.], [0., 1., 0.]]]]),
           "ident": torch.tensor([[[[0., 0., 0.], [0., 1., 0.], [0., 0., 0.]]]])}
""",
    """
filtered = {}
for name, k in kernels.items():
    filtered[name] = F.conv2d(img, k, padding=1)
""",
)

case(
    "torch-sum-reduction-rebind",
    "safe",
    TORCH,
    """
total = torch.zeros(4)
for xb, _ in batches:
    total = total + xb.sum(0)
""",
)

case(
    "torch-cosine-to-query",
    "safe",
    TORCH,
    """
query = X[0]
sims = {}
for i in range(1, 10):
    sims[i] = F.cosine_similarity(query, X[i], dim=0).item()
nearest = max(sims, key=sims.get)
""",
)

case(
    "torch-save-state-dicts",
    "safe",
    TORCH
    + """
import os, shutil
D = @TMP@
shutil.rmtree(D, ignore_errors=True)
os.makedirs(D)
torch.manual_seed(5)
zoo = {f"m{i}": nn.Linear(4, 2) for i in range(3)}
""",
    """
for name, m in zoo.items():
    torch.save(m.state_dict(), os.path.join(D, name + ".pt"))
saved = sorted(os.listdir(D))
reloaded = {n: torch.load(os.path.join(D, n)) for n in saved}
""",
)

case(
    "torch-eval-models-metrics-frame",
    "safe",
    TORCH
    + """
import pandas as pd
torch.manual_seed(6)
candidates = {"small": nn.Linear(4, 1), "deep": nn.Sequential(nn.Linear(4, 4), nn.ReLU(), nn.Linear(4, 1))}
""",
    """
rows = []
for name, m in candidates.items():
    with torch.no_grad():
        mse_val = loss_fn(m(X), Y).item()
        mae = (m(X) - Y).abs().mean().item()
    rows.append({"model": name, "mse": mse_val, "mae": mae,
                 "params": sum(p.numel() for p in m.parameters())})
metrics = pd.DataFrame(rows)
""",
)

case(
    "torch-with-no-grad-topk",
    "safe",
    TORCH,
    """
top = {}
with torch.no_grad():
    for i, (xb, yb) in enumerate(batches):
        vals, idx = yb.squeeze(1).topk(3)
        top[i] = idx.tolist()
""",
)

case(
    "torch-dataloader-items",
    "safe",
    TORCH
    + """
from torch.utils.data import DataLoader, TensorDataset
loader = DataLoader(TensorDataset(X, Y), batch_size=16)
""",
    """
batch_stats = []
for xb, yb in loader:
    batch_stats.append((xb.shape[0], float(yb.mean())))
""",
)

case(
    "torch-closed-form-per-subset",
    "safe",
    TORCH,
    """
solutions = []
for xb, yb in batches:
    sol = torch.linalg.lstsq(xb, yb).solution
    solutions.append(sol.squeeze(1))
W = torch.stack(solutions)
""",
)

# ---------------------------------------------------------------- PIL

case(
    "pil-gray-thumb-stats",
    "safe",
    IMG,
    """
stats = {}
for name, im in zip(names, pics):
    g = ImageOps.grayscale(im).resize((8, 8))
    arr = np.asarray(g, dtype=np.float64)
    stats[name] = {"mean": float(arr.mean()), "size": im.size}
""",
)

case(
    "pil-save-per-item-files",
    "safe",
    IMG
    + """
import shutil
OUT = @TMP@
shutil.rmtree(OUT, ignore_errors=True)
os.makedirs(OUT)
""",
    """
written = []
for i, im in enumerate(pics):
    dest = os.path.join(OUT, f"thumb_{i}.png")
    small = im.copy()
    small.thumbnail((6, 6))
    small.save(dest)
    written.append(dest)
contents = {os.path.basename(p): open(p, "rb").read() for p in sorted(written)}
""",
)

case(
    "pil-histograms",
    "safe",
    IMG,
    """
hists = {}
for name, im in zip(names, pics):
    hists[name] = im.convert("L").histogram()
""",
)

case(
    "pil-rotate-sizes",
    "safe",
    IMG,
    """
rotated = []
for angle, im in zip(range(0, 360, 60), pics):
    r = im.rotate(angle, expand=True)
    rotated.append(r)
sizes = [r.size for r in rotated]
""",
)

case(
    "pil-crop-tiles-comprehension",
    "safe",
    IMG,
    """
big = pics[-1]
tiles = [big.crop((x, 0, x + 4, 4)) for x in range(0, 12, 4)]
""",
)

case(
    "pil-filters-dict",
    "safe",
    IMG,
    """
base = pics[0]
variants = {}
for fname in ["BLUR", "CONTOUR", "SHARPEN", "SMOOTH"]:
    variants[fname] = base.filter(getattr(ImageFilter, fname))
""",
)

case(
    "pil-to-arrays-normalise",
    "safe",
    IMG,
    """
arrays = []
for im in pics:
    a = np.asarray(im.resize((4, 4)), dtype=np.float32) / 255.0
    arrays.append(a)
batch = np.stack(arrays)
""",
)

# ---------------------------------------------------------------- files

case(
    "file-csv-summaries",
    "safe",
    FILES + "import csv\n",
    """
summaries = {}
for p in csv_paths:
    with open(p, newline="") as fh:
        rows = list(csv.DictReader(fh))
    vals = [int(r["value"]) for r in rows]
    summaries[os.path.basename(p)] = {"n": len(vals), "sum": sum(vals)}
""",
)

case(
    "file-line-counts",
    "safe",
    FILES,
    """
line_counts = {}
for p in txt_paths:
    with open(p) as fh:
        line_counts[os.path.basename(p)] = sum(1 for _ in fh)
""",
)

case(
    "file-json-try-except",
    "safe",
    FILES,
    """
good, bad = {}, []
for p in json_paths:
    try:
        with open(p) as fh:
            data = json.load(fh)
    except json.JSONDecodeError as err:
        bad.append(os.path.basename(p))
        log.warning("skipping %s: %s", os.path.basename(p), err.msg)
        continue
    good[data["id"]] = data["value"]
""",
)

case(
    "file-write-json-per-record",
    "safe",
    FILES,
    """
records = [{"id": i, "sq": i * i} for i in range(5)]
for rec in records:
    with open(os.path.join(D, "out", f"rec_{rec['id']}.json"), "w") as fh:
        json.dump(rec, fh)
back = {}
for name in sorted(os.listdir(os.path.join(D, "out"))):
    with open(os.path.join(D, "out", name)) as fh:
        back[name] = json.load(fh)
""",
    note="records is built by the prelude comprehension",
)

case(
    "file-sizes-dictcomp",
    "safe",
    FILES,
    """
sizes = {os.path.basename(p): os.path.getsize(p) for p in txt_paths}
""",
)

case(
    "file-remove-own-file",
    "safe",
    FILES,
    """
for p in txt_paths:
    if p.endswith(("1.txt", "3.txt")):
        os.remove(p)
left = sorted(os.listdir(os.path.join(D, "in")))
""",
)

case(
    "file-upper-copy-per-file",
    "safe",
    FILES,
    """
for p in txt_paths:
    with open(p) as src:
        body = src.read()
    with open(os.path.join(D, "out", os.path.basename(p)), "w") as dst:
        dst.write(body.upper())
copied = {n: open(os.path.join(D, "out", n)).read() for n in sorted(os.listdir(os.path.join(D, "out")))}
""",
)

case(
    "file-first-lines-pathlib",
    "safe",
    FILES + "from pathlib import Path\n",
    """
firsts = {}
for path in sorted(Path(D, "in").glob("note*.txt")):
    firsts[path.stem] = path.read_text().splitlines()[0]
""",
)

# ---------------------------------------------------------------- simulation

case(
    "sim-sir-per-beta",
    "safe",
    """
import numpy as np
betas = [0.2, 0.3, 0.5]
gamma = 0.1
""",
    """
peaks = {}
curves = {}
for beta in betas:
    S, I, R = 0.99, 0.01, 0.0
    hist = []
    for day in range(60):
        new_inf = beta * S * I
        new_rec = gamma * I
        S, I, R = S - new_inf, I + new_inf - new_rec, R + new_rec
        hist.append(I)
    peaks[beta] = max(hist)
    curves[beta] = np.array(hist)
""",
)

case(
    "sim-logistic-map-per-r",
    "safe",
    """
rs = [2.5, 3.2, 3.5, 3.9]
""",
    """
finals = {}
for r in rs:
    x = 0.5
    for _ in range(200):
        x = r * x * (1 - x)
    finals[r] = round(x, 12)
""",
)

case(
    "sim-life-per-board",
    "safe",
    """
import numpy as np
def step(b):
    n = sum(np.roll(np.roll(b, i, 0), j, 1) for i in (-1, 0, 1) for j in (-1, 0, 1)
            if (i, j) != (0, 0))
    return ((n == 3) | ((b == 1) & (n == 2))).astype(int)
boards = [np.random.default_rng(s).integers(0, 2, (8, 8)) for s in range(5)]
""",
    """
alive = []
for b in boards:
    for _ in range(6):
        b = step(b)
    alive.append(int(b.sum()))
""",
)

case(
    "sim-queue-local-random",
    "safe",
    """
import random
""",
    """
waits = {}
for seed in range(6):
    r = random.Random(seed)
    t, busy_until, total_wait = 0.0, 0.0, 0.0
    for _ in range(50):
        t += r.expovariate(1.0)
        start = max(t, busy_until)
        total_wait += start - t
        busy_until = start + r.expovariate(1.2)
    waits[seed] = total_wait / 50
""",
)

case(
    "sim-mc-pi-default-rng",
    "safe",
    """
import numpy as np
""",
    """
est = []
hits = 0
for trial in range(10):
    g = np.random.default_rng(100 + trial)
    p = g.random((500, 2))
    inside = int((np.hypot(p[:, 0], p[:, 1]) <= 1).sum())
    hits += inside
    est.append(4 * inside / 500)
pi_hat = 4 * hits / 5000
""",
)

case(
    "sim-seeded-bootstrap-np",
    "safe",
    """
import numpy as np
sample = np.random.default_rng(7).exponential(2.0, size=60)
""",
    """
boot_medians = []
for b in range(12):
    resample = np.random.choice(sample, size=len(sample), replace=True)
    boot_medians.append(float(np.median(resample)))
""",
    kind="seeded",
)

case(
    "sim-seeded-random-gauss",
    "safe",
    """
import random
""",
    """
walks = []
for w in range(8):
    pos = 0.0
    for _ in range(20):
        pos += random.gauss(0, 1)
    walks.append(pos)
""",
    kind="seeded",
)

case(
    "sim-seeded-torch-randn",
    "safe",
    """
import torch
""",
    """
norms = []
for i in range(6):
    z = torch.randn(10)
    norms.append(z.norm().item())
""",
    kind="seeded",
)

case(
    "sim-seeded-dice",
    "safe",
    """
import random
from collections import Counter
""",
    """
rolls = []
for i in range(10):
    rolls.append(random.randint(1, 6) + random.randint(1, 6))
hist = Counter(rolls)
""",
    kind="seeded",
)

case(
    "sim-projectile-per-angle",
    "safe",
    """
import math
g = 9.81
""",
    """
ranges = {}
for deg in range(15, 90, 15):
    th = math.radians(deg)
    vx, vy = 20 * math.cos(th), 20 * math.sin(th)
    x = y = 0.0
    dt = 0.01
    while y >= 0:
        x += vx * dt
        vy -= g * dt
        y += vy * dt
    ranges[deg] = round(x, 6)
""",
)

case(
    "sim-heat-equation-per-alpha",
    "safe",
    """
import numpy as np
u0 = np.zeros(20)
u0[8:12] = 1.0
""",
    """
profiles = {}
for alpha in [0.05, 0.1, 0.2]:
    u = u0.copy()
    for _ in range(30):
        u[1:-1] = u[1:-1] + alpha * (u[2:] - 2 * u[1:-1] + u[:-2])
    profiles[alpha] = u
""",
)

case(
    "sim-print-progress",
    "safe",
    """
import math
""",
    """
results = []
for n in range(1, 7):
    approx = sum(1 / math.factorial(k) for k in range(n))
    results.append(approx)
    print(f"n={n} e~{approx:.6f} err={abs(math.e - approx):.2e}")
""",
)

case(
    "sim-matrix-entry-own-rows",
    "safe",
    "",
    """
n = 4
A = [[i + j for j in range(n)] for i in range(n)]
B = [[i * j for j in range(n)] for i in range(n)]
C = [[0] * n for _ in range(n)]
for i in range(n):
    for j in range(n):
        for k in range(n):
            C[i][j] += A[i][k] * B[k][j]
""",
)

# ================================================================ UNSAFE

case(
    "u-prev-carried",
    "unsafe",
    """
seq = [3, 5, 4, 9, 12, 10]
""",
    """
prev = None
changes = []
for x in seq:
    if prev is not None:
        changes.append(x - prev)
    prev = x
""",
)

case(
    "u-break-on-found",
    "unsafe",
    TEXT,
    """
found = None
for w in words:
    if w.startswith("z"):
        found = w
        break
""",
)

case(
    "u-pop-from-outer-queue",
    "unsafe",
    """
queue = ["job1", "job2", "job3", "job4"]
""",
    """
done = []
for i in range(3):
    job = queue.pop(0)
    done.append(job.upper())
""",
)

case(
    "u-seen-set-dedupe",
    "unsafe",
    TEXT,
    """
seen = set()
unique = []
for w in words:
    if w not in seen:
        unique.append(w)
        seen.add(w)
""",
)

case(
    "u-counter-in-label",
    "unsafe",
    TEXT,
    """
n = 0
labeled = []
for w in words:
    n += 1
    labeled.append(f"{n}:{w}")
""",
)

case(
    "u-fibonacci-dict",
    "unsafe",
    "",
    """
fib = {0: 0, 1: 1}
for k in range(2, 15):
    fib[k] = fib[k - 1] + fib[k - 2]
""",
)

case(
    "u-list-grows-from-last",
    "unsafe",
    "",
    """
xs = [1]
for i in range(6):
    xs.append(xs[-1] * 2)
""",
)

case(
    "u-len-of-gathered-list",
    "unsafe",
    "",
    """
results = []
flags = []
for x in range(8):
    results.append(x * x)
    flags.append(len(results) > 3)
""",
)

case(
    "u-cumsum-numpy-inplace",
    "unsafe",
    """
import numpy as np
a = np.arange(1, 9)
""",
    """
for i in range(1, len(a)):
    a[i] += a[i - 1]
""",
)

case(
    "u-prefix-sum-list",
    "unsafe",
    """
vals = [2, 4, 1, 7, 3]
""",
    """
for i in range(1, len(vals)):
    vals[i] = vals[i] + vals[i - 1]
""",
)

case(
    "u-grid-reads-previous-row",
    "unsafe",
    """
grid = [[1, 2], [3, 4], [5, 6]]
""",
    """
for i in range(1, len(grid)):
    grid[i] = [v * 2 for v in grid[i - 1]]
""",
)

case(
    "u-sum-after-write",
    "unsafe",
    """
import numpy as np
arr = np.ones(5)
""",
    """
partials = []
for i in range(len(arr)):
    arr[i] = arr[i] * 3
    partials.append(float(arr.sum()))
""",
)

case(
    "u-config-decay-carried",
    "unsafe",
    """
config = {"lr": 1.0}
""",
    """
lrs = []
for epoch in range(4):
    config["lr"] *= 0.5
    lrs.append(config["lr"])
""",
)

case(
    "u-logistic-carried-x",
    "unsafe",
    "",
    """
x = 0.4
traj = []
for step in range(10):
    x = 3.7 * x * (1 - x)
    traj.append(x)
""",
)

case(
    "u-running-total-list",
    "unsafe",
    """
deposits = [10, -5, 20, -15, 30]
""",
    """
balance = 0
history = []
for d in deposits:
    balance += d
    history.append(balance)
""",
)

case(
    "u-early-stopping",
    "unsafe",
    """
val_losses = [0.9, 0.7, 0.65, 0.66, 0.67, 0.68, 0.5]
""",
    """
best = float("inf")
patience = 0
stopped_at = None
for epoch, v in enumerate(val_losses):
    if v < best:
        best = v
        patience = 0
    else:
        patience += 1
    if patience >= 2:
        stopped_at = epoch
        break
""",
)

case(
    "u-epoch-loop-outer-model",
    "unsafe",
    TORCH
    + """
torch.manual_seed(0)
model = nn.Linear(4, 1)
opt = torch.optim.SGD(model.parameters(), lr=0.05)
""",
    """
history = []
for epoch in range(5):
    opt.zero_grad()
    loss = loss_fn(model(X), Y)
    loss.backward()
    opt.step()
    history.append(loss.item())
""",
)

case(
    "u-batches-outer-model",
    "unsafe",
    TORCH
    + """
torch.manual_seed(0)
model = nn.Linear(4, 1)
opt = torch.optim.SGD(model.parameters(), lr=0.05)
""",
    """
batch_losses = []
for xb, yb in batches:
    opt.zero_grad()
    loss = loss_fn(model(xb), yb)
    loss.backward()
    opt.step()
    batch_losses.append(loss.item())
""",
)

case(
    "u-train-helper-outer-model",
    "unsafe",
    TORCH
    + """
torch.manual_seed(0)
model = nn.Linear(4, 1)
opt = torch.optim.SGD(model.parameters(), lr=0.05)
def train_step(xb, yb):
    opt.zero_grad()
    loss = loss_fn(model(xb), yb)
    loss.backward()
    opt.step()
    return loss.item()
""",
    """
step_losses = []
for xb, yb in batches:
    step_losses.append(train_step(xb, yb))
""",
)

case(
    "u-grad-accumulates-outer",
    "unsafe",
    """
import torch
w = torch.ones(3, requires_grad=True)
xs = [torch.tensor([1.0, 2.0, 3.0]) * k for k in range(4)]
""",
    """
outs = []
for x in xs:
    out = (w * x).sum()
    out.backward()
    outs.append(out.item())
""",
)

case(
    "u-tensor-add-inplace",
    "unsafe",
    TORCH,
    """
acc = torch.zeros(4)
for xb, _ in batches:
    acc.add_(xb.sum(0))
""",
    note="a sum, but through an in-place method",
)

case(
    "u-torch-randn-unseeded",
    "unsafe",
    """
import torch
""",
    """
noise = []
for i in range(6):
    noise.append(torch.randn(3) * i)
""",
    kind="random",
)

case(
    "u-dropout-train-mode",
    "unsafe",
    """
import torch
from torch import nn
torch.manual_seed(0)
net = nn.Sequential(nn.Linear(4, 8), nn.Dropout(0.5), nn.Linear(8, 1))
xs = [torch.ones(1, 4) * k for k in range(5)]
""",
    """
outs = []
with torch.no_grad():
    for x in xs:
        outs.append(net(x).item())
""",
    kind="random",
)

case(
    "u-random-randint-unseeded",
    "unsafe",
    """
import random
""",
    """
rolls = []
for i in range(10):
    rolls.append(random.randint(1, 6))
""",
    kind="random",
)

case(
    "u-np-random-seeded-in-prelude",
    "unsafe",
    """
import numpy as np
""",
    """
np.random.seed(42)
draws = []
for i in range(8):
    draws.append(float(np.random.rand()))
""",
    kind="random",
)

case(
    "u-outer-rng-generator",
    "unsafe",
    """
import numpy as np
rng = np.random.default_rng(0)
""",
    """
samples = []
for i in range(6):
    samples.append(float(rng.normal(size=3).mean()))
""",
)

case(
    "u-outer-random-instance",
    "unsafe",
    """
import random
r = random.Random(0)
""",
    """
picks = []
for i in range(6):
    picks.append(r.choice("abcdef"))
""",
)

case(
    "u-np-shuffle-outer",
    "unsafe",
    """
import numpy as np
idx = np.arange(10)
""",
    """
firsts = []
for epoch in range(4):
    np.random.shuffle(idx)
    firsts.append(int(idx[0]))
""",
    kind="random",
)

case(
    "u-random-shuffle-list",
    "unsafe",
    """
import random
deck = list(range(10))
""",
    """
tops = []
for i in range(5):
    random.seed(i)
    random.shuffle(deck)
    tops.append(deck[0])
""",
)

case(
    "u-estimator-refit-outer",
    "unsafe",
    SK
    + """
from sklearn.linear_model import LogisticRegression
clf = LogisticRegression(max_iter=300)
""",
    """
accs = {}
for C in [0.01, 0.1, 1.0]:
    clf.set_params(C=C)
    clf.fit(X_tr, y_tr)
    accs[C] = clf.score(X_te, y_te)
""",
)

case(
    "u-partial-fit-outer",
    "unsafe",
    SK
    + """
from sklearn.linear_model import SGDClassifier
sgd = SGDClassifier(random_state=0)
chunks = [(X[i:i + 30], y[i:i + 30]) for i in range(0, 120, 30)]
""",
    """
seen_acc = []
for xb, yb in chunks:
    sgd.partial_fit(xb, yb, classes=[0, 1])
    seen_acc.append(sgd.score(X, y))
""",
)

case(
    "u-scaler-fit-outer-per-col",
    "unsafe",
    SK
    + """
from sklearn.preprocessing import StandardScaler
scaler = StandardScaler()
""",
    """
scaled = {}
for j in range(X.shape[1]):
    scaler.fit(X[:, [j]])
    scaled[j] = scaler.transform(X[:, [j]]).ravel()
""",
)

case(
    "u-helper-appends-global",
    "unsafe",
    """
seen_log = []
def process(x):
    seen_log.append(x)
    return x * 2
""",
    """
doubled = []
for x in range(6):
    doubled.append(process(x))
""",
)

case(
    "u-memo-cache-global",
    "unsafe",
    """
cache = {}
def fib(n):
    if n < 2:
        return n
    if n not in cache:
        cache[n] = fib(n - 1) + fib(n - 2)
    return cache[n]
""",
    """
fibs = []
for i in range(20):
    fibs.append(fib(i))
""",
)

case(
    "u-global-counter-in-helper",
    "unsafe",
    """
calls = 0
def bump(x):
    global calls
    calls += 1
    return x + calls
""",
    """
bumped = []
for x in [10, 20, 30, 40]:
    bumped.append(bump(x))
""",
)

case(
    "u-os-environ-set",
    "unsafe",
    """
import os
settings = {"MODE": "fast", "LEVEL": "3"}
for k in settings:
    os.environ.pop("SWEEP_APP_" + k, None)
""",
    """
for k, v in settings.items():
    os.environ["SWEEP_APP_" + k] = v
env_seen = {k: os.environ.get("SWEEP_APP_" + k) for k in settings}
""",
    note="changes process state (the environment) the epilogue reads",
)

case(
    "u-sort-outer-list",
    "unsafe",
    """
items = [5, 3, 9, 1]
""",
    """
mins = []
for k in range(3):
    items.sort(reverse=(k % 2 == 1))
    mins.append(items[0])
""",
)

case(
    "u-remove-from-outer",
    "unsafe",
    """
pool = ["a", "b", "c", "d", "e"]
""",
    """
for x in ["b", "d"]:
    pool.remove(x)
""",
)

case(
    "u-shared-file-append",
    "unsafe",
    FILES,
    """
logfile = os.path.join(D, "out", "run.log")
for i in range(6):
    with open(logfile, "a") as fh:
        fh.write(f"step {i}\\n")
with open(logfile) as fh:
    log_lines = fh.read().splitlines()
""",
)

case(
    "u-shared-json-rewrite",
    "unsafe",
    FILES,
    """
results = {}
path = os.path.join(D, "out", "results.json")
for k in range(5):
    results[k] = k * k
    with open(path, "w") as fh:
        json.dump(results, fh)
with open(path) as fh:
    saved = json.load(fh)
""",
    note="each iteration rewrites one shared file with the dict so far",
)

case(
    "u-file-chain",
    "unsafe",
    FILES,
    """
with open(os.path.join(D, "out", "step0.txt"), "w") as fh:
    fh.write("x")
for i in range(1, 5):
    with open(os.path.join(D, "out", f"step{i - 1}.txt")) as fh:
        prev_text = fh.read()
    with open(os.path.join(D, "out", f"step{i}.txt"), "w") as fh:
        fh.write(prev_text + "x")
final_text = open(os.path.join(D, "out", "step4.txt")).read()
""",
    note="iteration i reads the file iteration i-1 wrote",
)

case(
    "u-open-file-around-loop",
    "unsafe",
    FILES,
    """
with open(os.path.join(D, "out", "squares.txt"), "w") as fh:
    for i in range(5):
        fh.write(f"{i * i}\\n")
squares = open(os.path.join(D, "out", "squares.txt")).read().split()
""",
)

case(
    "u-pil-paste-canvas",
    "unsafe",
    IMG,
    """
canvas = Image.new("RGB", (72, 22))
for k, im in enumerate(pics):
    canvas.paste(im, (12 * k, 0))
""",
    note="each paste changes the outer canvas (disjoint regions)",
)

case(
    "u-pil-draw-outer",
    "unsafe",
    IMG
    + """
from PIL import ImageDraw
board = Image.new("L", (20, 20))
pen = ImageDraw.Draw(board)
""",
    """
for k in range(5):
    pen.rectangle((k * 4, 0, k * 4 + 2, 19), fill=40 * k + 50)
""",
)

case(
    "u-pandas-loc-cumulative",
    "unsafe",
    """
import pandas as pd
df = pd.DataFrame({"x": [1.0, 2.0, 3.0, 4.0, 5.0]})
df["cum"] = 0.0
df.loc[0, "cum"] = df.loc[0, "x"]
""",
    """
for i in range(1, len(df)):
    df.loc[i, "cum"] = df.loc[i - 1, "cum"] + df.loc[i, "x"]
""",
)

case(
    "u-pandas-concat-grow",
    "unsafe",
    """
import pandas as pd
base = pd.DataFrame({"k": [0], "v": [0.0]})
""",
    """
df = base
for k in range(1, 5):
    df = pd.concat([df, pd.DataFrame({"k": [k], "v": [df["v"].iloc[-1] + k]})], ignore_index=True)
""",
)

case(
    "u-pandas-inplace-dropna-outer",
    "unsafe",
    """
import numpy as np
import pandas as pd
frames = {"a": pd.DataFrame({"x": [1.0, np.nan]}), "b": pd.DataFrame({"x": [np.nan, 2.0, 3.0]})}
counts_after = {}
""",
    """
for name in frames:
    frames[name].dropna(inplace=True)
    counts_after[name] = len(frames[name])
""",
    note="borderline: each iteration changes its own frame in place",
)

case(
    "u-same-object-items",
    "unsafe",
    """
class Counter1:
    def __init__(self):
        self.n = 0
    def hit(self):
        self.n += 1
c = Counter1()
counters = [c, c, c]
""",
    """
for ctr in counters:
    ctr.hit()
""",
)

case(
    "u-item-held-by-input",
    "unsafe",
    """
class Box:
    def __init__(self, v):
        self.v = v
boxes = [Box(1), Box(2), Box(3)]
first = boxes[0]
""",
    """
seen_first = []
for b in boxes:
    b.v *= 10
    seen_first.append(first.v)
""",
)

case(
    "u-alias-view-of-output",
    "unsafe",
    """
import numpy as np
out = np.zeros(6)
view = out[1:]
""",
    """
snaps = []
for i in range(6):
    out[i] = i + 1
    snaps.append(float(view.sum()))
""",
)

case(
    "u-list-alias-input",
    "unsafe",
    "",
    """
acc = []
same_acc = acc
sizes = []
for i in range(5):
    acc.append(i)
    sizes.append(len(same_acc))
""",
)

case(
    "u-dict-update-carried",
    "unsafe",
    """
state = {"pos": 0, "vel": 1}
""",
    """
positions = []
for t in range(6):
    state["pos"] = state["pos"] + state["vel"]
    state["vel"] += 1
    positions.append(state["pos"])
""",
)

case(
    "u-class-attr-counter",
    "unsafe",
    """
class Particle:
    count = 0
    def __init__(self, x):
        Particle.count += 1
        self.id = Particle.count
        self.x = x
""",
    """
particles = []
for x in [0.1, 0.5, 0.9, 1.3]:
    particles.append(Particle(x))
ids = [p.id for p in particles]
""",
)

case(
    "u-itertools-count-outer",
    "unsafe",
    """
import itertools
ticket = itertools.count(100)
""",
    """
assigned = {}
for name in ["ann", "bob", "cy", "dee"]:
    assigned[name] = next(ticket)
""",
)

case(
    "u-iterator-consumed",
    "unsafe",
    """
stream = iter(range(100))
""",
    """
pairs = []
for k in range(4):
    a = next(stream)
    b = next(stream)
    pairs.append((a, b))
""",
)

case(
    "u-set-order-in-body",
    "unsafe",
    TEXT,
    """
token_lists = []
for doc in docs:
    token_lists.append(list(set(doc.lower().split())))
""",
    kind="random",  # (warned, as draws are: the order follows each process's hash seed)
    note="a list made from a set of str: order follows the process's hash seed",
)

case(
    "u-heapq-outer",
    "unsafe",
    """
import heapq
heap = [5, 1, 8, 3, 2]
heapq.heapify(heap)
""",
    """
smallest = []
for k in range(3):
    smallest.append(heapq.heappop(heap))
""",
)

case(
    "u-deque-rotate",
    "unsafe",
    """
from collections import deque
ring = deque([1, 2, 3, 4, 5])
""",
    """
fronts = []
for k in range(4):
    ring.rotate(1)
    fronts.append(ring[0])
""",
)

case(
    "u-insert-sorted-outer",
    "unsafe",
    """
import bisect
ordered = []
""",
    """
positions = []
for v in [5, 1, 4, 2, 3]:
    pos = bisect.bisect(ordered, v)
    ordered.insert(pos, v)
    positions.append(pos)
""",
)

case(
    "u-attribute-on-outer",
    "unsafe",
    """
class Stats:
    def __init__(self):
        self.n = 0
        self.total = 0.0
stats = Stats()
""",
    """
for v in [1.5, 2.5, 3.0]:
    stats.n = stats.n + 1
    stats.total = stats.total + v
mean = stats.total / stats.n
""",
)

case(
    "u-model-eval-changes-outer-bn",
    "unsafe",
    """
import torch
from torch import nn
torch.manual_seed(0)
bnnet = nn.Sequential(nn.Linear(3, 4), nn.BatchNorm1d(4))
xs = [torch.randn(5, 3) for _ in range(4)]
""",
    """
outs = []
for x in xs:
    outs.append(bnnet(x).detach())
""",
    note="training-mode BatchNorm updates running stats of an outer model",
)

case(
    "u-logging-handler-list-state",
    "unsafe",
    """
import logging
class ListHandler(logging.Handler):
    def __init__(self):
        super().__init__()
        self.records = []
    def emit(self, record):
        self.records.append(record.getMessage())
mylog = logging.getLogger("sweep.list")
mylog.setLevel(logging.INFO)
mylog.propagate = False
mylog.handlers[:] = [ListHandler()]
""",
    """
for i in range(4):
    mylog.info("item %d", i)
msgs = list(mylog.handlers[0].records)
""",
    note="unsafe by shape (a handler holds state) but the docs promise records reach the notebook's handlers",
)

case(
    "u-numpy-view-modify-input",
    "unsafe",
    """
import numpy as np
base = np.arange(12.0).reshape(3, 4)
""",
    """
col_means = []
for j in range(4):
    col = base[:, j]
    col -= col.mean()
    col_means.append(float(base.mean()))
""",
)

case(
    "u-append-to-item-list",
    "unsafe",
    """
groups = [[1], [2], [3]]
""",
    """
for g in groups:
    g.append(sum(g) * 10)
total = sum(len(g) for g in groups)
""",
    note="borderline: each iteration appends to its own item",
)

case(
    "u-while-shared-budget",
    "unsafe",
    """
jobs = [3, 5, 2, 7, 1]
""",
    """
budget = 10
accepted = []
for cost in jobs:
    if cost <= budget:
        accepted.append(cost)
        budget -= cost
""",
)

case(
    "u-sys-path-append",
    "unsafe",
    FILES
    + """
import sys
sys.path[:] = [p for p in sys.path if not p.startswith(D)]
""",
    """
for sub in ["in", "out"]:
    sys.path.append(os.path.join(D, sub))
has_in = os.path.join(D, "in") in sys.path
""",
)

case(
    "u-nonlocal-like-closure-state",
    "unsafe",
    """
def make_counter():
    state = {"n": 0}
    def tick():
        state["n"] += 1
        return state["n"]
    return tick
tick = make_counter()
""",
    """
ticks = []
for i in range(5):
    ticks.append(tick())
""",
)

case(
    "u-default-mutable-arg",
    "unsafe",
    """
def collect(x, bucket=[]):
    bucket.append(x)
    return len(bucket)
""",
    """
sizes = []
for x in "abcde":
    sizes.append(collect(x))
""",
)

case(
    "u-iterrows-write-next-row",
    "unsafe",
    """
import pandas as pd
df = pd.DataFrame({"v": [1, 2, 3, 4]})
df["prev_plus"] = 0
""",
    """
for idx, row in df.iterrows():
    if idx + 1 < len(df):
        df.at[idx + 1, "prev_plus"] = row["v"] + df.at[idx, "prev_plus"]
""",
)

case(
    "u-ema-carried",
    "unsafe",
    DF,
    """
ema = None
emas = []
for v in ts["y"]:
    ema = v if ema is None else 0.3 * v + 0.7 * ema
    emas.append(ema)
""",
)

case(
    "u-swap-neighbours",
    "unsafe",
    """
arr = [5, 1, 4, 2, 8, 0]
""",
    """
for i in range(len(arr) - 1):
    if arr[i] > arr[i + 1]:
        arr[i], arr[i + 1] = arr[i + 1], arr[i]
""",
    note="one bubble-sort pass",
)

# ================================================================ second batch:
# shapes near the edges of the contract (names' last values, items changed in
# place, hidden random draws, identity, process state)

PEOPLE = """
class Person:
    def __init__(self, name, age):
        self.name = name
        self.age = age
people = [Person("ann", 34), Person("bob", 19), Person("cy", 52), Person("dee", 27)]
"""

case(
    "edge-conditional-local-never-assigned",
    "safe",
    """
last_big = "none yet"
xs = [3, 8, 1, 9]
""",
    """
for x in xs:
    if x > 100:
        last_big = x
    half = x / 2
""",
)

case(
    "edge-empty-iterable",
    "safe",
    """
pending = []
""",
    """
handled = []
for job in pending:
    handled.append(job.upper())
""",
)

case(
    "edge-del-local-in-body",
    "safe",
    "",
    """
out = []
for i in range(5):
    tmp = i * i
    out.append(tmp + 1)
    del tmp
""",
)

case(
    "edge-continue-on-even",
    "safe",
    "",
    """
odds = []
for i, x in enumerate(range(10, 20)):
    if i % 2 == 0:
        continue
    odds.append(x)
    last_odd = x
""",
)

case(
    "edge-u-helper-in-dict-reads-loop-var-global",
    "unsafe",
    """
factor = 100
def scaled(v):
    return v * factor
ops = {"scale": scaled}
""",
    """
out = []
for factor in [1, 2, 3]:
    out.append(ops["scale"](10))
""",
    note="a notebook function held in a dict reads the loop variable as a global",
)

case(
    "edge-u-helper-in-transformer-reads-body-global",
    "unsafe",
    """
import numpy as np
from sklearn.preprocessing import FunctionTransformer
shift = 0.0
def add_shift(a):
    return a + shift
tr = FunctionTransformer(add_shift)
X = np.arange(6.0).reshape(3, 2)
""",
    """
outs = []
for k in range(3):
    shift = float(k)
    outs.append(tr.fit_transform(X).sum())
""",
    note="a library object holds a notebook function that reads a name the body assigns",
)

case(
    "edge-helper-reads-loop-var-global",
    "safe",
    """
def scaled(v):
    return v * factor
""",
    """
out = []
for factor in [1, 2, 3]:
    out.append(scaled(10))
""",
    note="a notebook function reads the loop variable as a global",
)

case(
    "edge-helper-reads-body-assigned-global",
    "safe",
    """
def label(x):
    return f"{prefix}-{x}"
""",
    """
labels = []
for i in range(4):
    prefix = "even" if i % 2 == 0 else "odd"
    labels.append(label(i))
""",
    note="a notebook function reads a name the body assigns (a global in a notebook)",
)

case(
    "edge-helper-chain-reads-loop-var-global",
    "safe",
    """
def rate():
    return base * 2
def priced(qty):
    return round(qty * rate(), 2)
""",
    """
table = {}
for base in [0.5, 1.25, 3.0]:
    note = f"base {base}"
    table[base] = (note, priced(4))
""",
    note="a notebook function reads the loop variable through another one",
)

case(
    "edge-helper-reads-global-named-like-comprehension-var",
    "safe",
    """
i = 100
def plus_i(x):
    return x + i
""",
    """
vals = [plus_i(i) for i in range(5)]
""",
    note="the function reads the notebook's `i`, never the comprehension's",
)

case(
    "edge-helper-reads-global-assigned-after-call",
    "unsafe",
    """
def tag(x):
    return f"{last}-{x}"
last = "start"
""",
    """
tags = []
for i in range(5):
    tags.append(tag(i))
    last = str(i * i)
""",
    note="each call reads what the iteration before it left in `last`",
)

case(
    "edge-helper-reads-sometimes-assigned-global",
    "unsafe",
    """
def label(x):
    return f"{group}:{x}"
group = "none"
""",
    """
labels = []
for i in range(6):
    if i % 3 == 0:
        group = f"g{i}"
    labels.append(label(i))
""",
    note="an iteration that skips the assignment reads an earlier iteration's `group`",
)

case(
    "edge-numpy-int-reduction-type",
    "safe",
    """
import numpy as np
arr = np.arange(1, 8)
""",
    """
s = 0
for v in arr:
    s += v
""",
    note="serially s ends a numpy int64",
)

case(
    "edge-min-max-tuple-reduction",
    "safe",
    """
xs = [4.5, -2.0, 7.25, 0.5, 3.0]
""",
    """
lo, hi = float("inf"), float("-inf")
for x in xs:
    lo, hi = min(lo, x), max(hi, x)
""",
)

case(
    "edge-bool-count-reduction",
    "safe",
    """
xs = [4, -2, 7, 0, -3, 9]
""",
    """
n_pos = 0
for x in xs:
    n_pos += x > 0
""",
)

case(
    "edge-list-concat-reduction",
    "safe",
    "",
    """
acc = []
for i in range(5):
    acc = acc + [i, -i]
""",
)

case(
    "edge-dict-union-reduction",
    "safe",
    """
parts = [{"a": 1}, {"b": 2, "a": 3}, {"c": 4}, {"b": 5}]
""",
    """
merged = {}
for d in parts:
    merged |= d
""",
    note="dict |= is an associative, last-wins reduction",
)

case(
    "edge-dict-comp-repeated-keys",
    "safe",
    TEXT,
    """
last_by_len = {len(w): w for w in words}
""",
)

case(
    "edge-dict-builtin-generator",
    "safe",
    TEXT,
    """
pairs = dict((w, w[::-1]) for w in words)
""",
)

case(
    "edge-any-generator",
    "safe",
    """
xs = [3, 5, -1, 8, 0]
""",
    """
has_neg = any(x < 0 for x in xs)
""",
)

case(
    "edge-nested-comprehension",
    "safe",
    "",
    """
pairs = [(i, j) for i in range(5) for j in range(i)]
""",
)

case(
    "edge-reversed-iterable",
    "safe",
    "",
    """
xs = list(range(7))
rev = []
for x in reversed(xs):
    rev.append(x * 10)
""",
)

case(
    "edge-itertools-product-grid",
    "safe",
    """
import itertools
lrs = [0.1, 0.01]
bss = [16, 32, 64]
""",
    """
grid = {}
for lr, bs in itertools.product(lrs, bss):
    grid[(lr, bs)] = round(lr * bs, 6)
""",
)

case(
    "edge-last-write-wins-repeated-key",
    "safe",
    DF,
    """
last_price = {}
for idx, row in sales.iterrows():
    last_price[row["region"]] = row["price"]
""",
)

case(
    "edge-own-element-from-item",
    "safe",
    """
xs = [1, 2, 3, 4]
""",
    """
for i, x in enumerate(xs):
    xs[i] = x * 2
""",
)

case(
    "edge-own-row-normalise-lists",
    "safe",
    """
matrix = [[1, 3], [2, 2], [5, 5]]
""",
    """
for i, row in enumerate(matrix):
    matrix[i] = [v / sum(row) for v in row]
""",
)

case(
    "edge-identity-through-loop-var",
    "safe",
    PEOPLE,
    """
adults = []
for p in people:
    if p.age >= 21:
        adults.append(p)
for a in adults:
    a.flag = True
flagged = [p.name for p in people if getattr(p, "flag", False)]
""",
    note="the epilogue changes the gathered items: serially they are people's",
)

case(
    "edge-identity-through-index",
    "safe",
    PEOPLE,
    """
adults = []
for i in range(len(people)):
    if people[i].age >= 21:
        adults.append(people[i])
for a in adults:
    a.flag = True
flagged = [p.name for p in people if getattr(p, "flag", False)]
""",
    note="docs: an input's element reached another way comes back an equal copy",
)

case(
    "edge-seed-in-body-random",
    "safe",
    """
import random
""",
    """
vals = []
for i in range(5):
    random.seed(i)
    vals.append(random.random())
""",
    note="docs: a seed at the top of the body gives the serial numbers",
)

case(
    "edge-seed-in-helper",
    "safe",
    """
import numpy as np
def sample(i):
    np.random.seed(i)
    return np.random.rand(3)
""",
    """
samples = []
for i in range(5):
    samples.append(sample(i))
""",
)

case(
    "edge-seed-then-draw-after-loop",
    "unsafe",
    """
import random
""",
    """
vals = []
for i in range(4):
    random.seed(i)
    vals.append(random.random())
extra = random.random()
""",
    kind="random",
    note="docs: warned, the kernel's generator is not where the loop left it",
)

case(
    "edge-draw-before-seed",
    "unsafe",
    """
import numpy as np
""",
    """
firsts = []
for i in range(4):
    a = float(np.random.rand())
    np.random.seed(i)
    firsts.append((a, float(np.random.rand())))
""",
    kind="random",
)

case(
    "edge-shuffled-loader-as-iterable",
    "safe",
    TORCH
    + """
from torch.utils.data import DataLoader, TensorDataset
torch.manual_seed(0)
""",
    """
firsts = []
for xb, yb in DataLoader(TensorDataset(X, Y), batch_size=8, shuffle=True):
    firsts.append(xb[0])
""",
    note="the iterable (and its shuffle) is drawn once, in the kernel",
)

case(
    "edge-shuffled-loader-in-body",
    "unsafe",
    TORCH
    + """
from torch.utils.data import DataLoader, TensorDataset
torch.manual_seed(0)
train_loader = DataLoader(TensorDataset(X, Y), batch_size=8, shuffle=True)
""",
    """
final = {}
for lr in [0.1, 0.03, 0.01]:
    model = nn.Linear(4, 1)
    with torch.no_grad():
        model.weight.fill_(0.0)
        model.bias.fill_(0.0)
    opt = torch.optim.SGD(model.parameters(), lr=lr)
    for xb, yb in train_loader:
        opt.zero_grad()
        loss = loss_fn(model(xb), yb)
        loss.backward()
        opt.step()
    final[lr] = loss.item()
""",
    kind="random",
    note="the loader's shuffle draws from torch's global generator, hidden in the loader",
)

case(
    "edge-unseeded-model-init",
    "unsafe",
    TORCH
    + """
torch.manual_seed(0)
""",
    """
init_norms = {}
for width in [4, 8, 16]:
    net = nn.Sequential(nn.Linear(4, width), nn.ReLU(), nn.Linear(width, 1))
    init_norms[width] = sum(p.norm().item() for p in net.parameters())
""",
    kind="random",
    note="nn.Linear's init draws from torch's global generator",
)

case(
    "edge-unseeded-sklearn-forest",
    "unsafe",
    SK
    + """
from sklearn.ensemble import RandomForestClassifier
np.random.seed(0)
""",
    """
accs = {}
for n in [5, 10, 20]:
    rf = RandomForestClassifier(n_estimators=n, max_depth=3)
    rf.fit(X_tr, y_tr)
    accs[n] = rf.score(X_te, y_te)
""",
    kind="random",
    note="random_state=None draws from numpy's global generator",
)

case(
    "edge-unseeded-train-test-split",
    "unsafe",
    SK
    + """
from sklearn.linear_model import LogisticRegression
np.random.seed(0)
""",
    """
split_scores = []
for rep in range(4):
    a_tr, a_te, b_tr, b_te = train_test_split(X, y, test_size=0.25)
    split_scores.append(LogisticRegression(max_iter=300).fit(a_tr, b_tr).score(a_te, b_te))
""",
    kind="random",
    note="train_test_split without random_state",
)

case(
    "edge-dict-items-mutated",
    "safe",
    """
rows = [{"a": 1, "b": 2}, {"a": 5, "b": -1}, {"a": 0, "b": 0}]
""",
    """
for row in rows:
    row["total"] = row["a"] + row["b"]
""",
    note="each iteration adds a key to its own item (a dict)",
)

case(
    "edge-records-title-names",
    "safe",
    """
users = [{"name": "ann lee"}, {"name": "BOB KIM"}, {"name": "cy ng"}]
""",
    """
for user in users:
    user["name"] = user["name"].title()
""",
)

case(
    "edge-group-lists-sorted-in-place",
    "safe",
    """
groups = {"a": [3, 1, 2], "b": [9, 7], "c": [5, 6, 4]}
""",
    """
for k, lst in groups.items():
    lst.sort()
""",
    note="each iteration sorts its own item (a list) in place",
)

case(
    "edge-list-rows-first-upper",
    "safe",
    """
table = [["ann", 1], ["bob", 2], ["cy", 3]]
""",
    """
for row in table:
    row[0] = row[0].upper()
""",
)

case(
    "edge-numpy-items-in-place",
    "safe",
    """
import numpy as np
arrays = [np.arange(1.0, 5.0) * k for k in range(1, 4)]
""",
    """
for a in arrays:
    a[:] = a / a.max()
""",
    note="each iteration rescales its own item (an array) in place",
)

case(
    "edge-frames-new-column",
    "safe",
    """
import pandas as pd
frames = [pd.DataFrame({"x": [1, 2, 3]}), pd.DataFrame({"x": [4, 5]})]
""",
    """
for df in frames:
    df["x2"] = df["x"] * 2
""",
    note="each iteration adds a column to its own item (a DataFrame)",
)

case(
    "edge-models-in-dict-values",
    "safe",
    SK
    + """
from sklearn.linear_model import LogisticRegression
from sklearn.naive_bayes import GaussianNB
models = {"lr": LogisticRegression(max_iter=300), "nb": GaussianNB()}
""",
    """
for m in models.values():
    m.fit(X_tr, y_tr)
""",
)

case(
    "edge-torch-items-mul-inplace",
    "safe",
    """
import torch
tensors = [torch.arange(3.0) + k for k in range(4)]
""",
    """
for t in tensors:
    t.mul_(2)
""",
)

case(
    "edge-torch-items-eval",
    "safe",
    """
import torch
from torch import nn
torch.manual_seed(0)
nets = [nn.Sequential(nn.Linear(3, 3), nn.Dropout(0.2)) for _ in range(3)]
""",
    """
for net in nets:
    net.eval()
""",
)

case(
    "edge-torch-items-freeze",
    "safe",
    """
import torch
from torch import nn
torch.manual_seed(0)
backbones = [nn.Linear(3, 3) for _ in range(3)]
""",
    """
for bb in backbones:
    bb.requires_grad_(False)
frozen = [all(not p.requires_grad for p in bb.parameters()) for bb in backbones]
""",
    note="requires_grad of each item's parameters",
)

case(
    "edge-torch-item-custom-attr",
    "safe",
    TORCH
    + """
torch.manual_seed(1)
nets = [nn.Linear(4, 1) for _ in range(3)]
""",
    """
for net, (xb, yb) in zip(nets, batches):
    with torch.no_grad():
        net.val_loss = loss_fn(net(xb), yb).item()
losses_seen = [n.val_loss for n in nets]
""",
    note="a plain attribute set on each item (a torch module)",
)

case(
    "edge-torch-params-of-outer-model",
    "safe",
    """
import torch
from torch import nn
torch.manual_seed(0)
model = nn.Sequential(nn.Linear(3, 4), nn.Linear(4, 2))
""",
    """
with torch.no_grad():
    for p in model.parameters():
        p.mul_(0.5)
""",
    note="each iteration scales its own item, a parameter of an outer model",
)

case(
    "edge-pil-thumbnail-items",
    "safe",
    IMG,
    """
for im in pics:
    im.thumbnail((6, 6))
sizes = [im.size for im in pics]
""",
    note="each iteration shrinks its own item (a PIL image) in place",
)

case(
    "edge-slots-items",
    "safe",
    """
class Pt:
    __slots__ = ("x", "y")
    def __init__(self, x, y):
        self.x, self.y = x, y
pts = [Pt(1, 2), Pt(3, 4), Pt(5, 6)]
""",
    """
for p in pts:
    p.x += 10
coords = [(p.x, p.y) for p in pts]
""",
)

case(
    "edge-normalise-view-via-helper",
    "safe",
    """
import numpy as np
data = np.arange(12.0).reshape(3, 4)
def center_(row):
    row -= row.mean()
""",
    """
for i in range(len(data)):
    center_(data[i])
""",
    note="each iteration centres its own row through a function",
)

case(
    "edge-helper-changes-next-row",
    "unsafe",
    """
import numpy as np
grid = np.ones((5, 3))
def carry_(src, dst):
    dst += src * 0.5
""",
    """
for i in range(len(grid) - 1):
    carry_(grid[i], grid[i + 1])
""",
    note="a helper changes the next iteration's row, which that iteration reads",
)

case(
    "edge-helper-scales-own-row-by-keyword",
    "safe",
    """
import numpy as np
W = np.arange(12.0).reshape(4, 3)
def scale_(row, by):
    row *= by
""",
    """
for i in range(len(W)):
    scale_(row=W[i], by=i + 1)
""",
    note="a helper changes the iteration's own row, handed as a keyword",
)

case(
    "edge-helper-clamps-own-tensor-row",
    "safe",
    """
import torch
T = torch.linspace(-2, 2, 12).reshape(3, 4)
def clamp_row_(r, lim):
    r.clamp_(-lim, lim)
""",
    """
for i in range(T.shape[0]):
    clamp_row_(T[i], 0.5 * (i + 1))
""",
    note="a helper changes the iteration's own tensor row in place",
)

case(
    "edge-helper-changes-first-row",
    "unsafe",
    """
import numpy as np
W = np.ones((4, 3))
def bump_(row, by):
    row += by
""",
    """
for i in range(len(W)):
    bump_(W[0], i)
""",
    note="every iteration changes row 0 through a helper",
)

case(
    "edge-helper-reads-own-row",
    "safe",
    """
import numpy as np
data = np.arange(12.0).reshape(3, 4) ** 1.5
def spread(row):
    return float(row.max() - row.min())
""",
    """
spreads = []
for i in range(len(data)):
    spreads.append(spread(data[i]))
""",
    note="a helper only reads the iteration's own row",
)

case(
    "edge-log-exception",
    "safe",
    """
tokens = ["1", "two", "3", "4.5"]
""",
    """
nums = []
for tok in tokens:
    try:
        nums.append(int(tok))
    except ValueError:
        log.exception("cannot parse %r", tok)
""",
    note="log lines compared without the traceback's frame lines",
)

# ---------------------------------------------------------------- unsafe, second batch

case(
    "u-helper-writes-shared-file",
    "unsafe",
    FILES
    + """
progress = os.path.join(D, "out", "progress.txt")
def note(msg):
    with open(progress, "a") as fh:
        fh.write(msg + "\\n")
""",
    """
for p in csv_paths:
    note(os.path.basename(p))
with open(progress) as fh:
    noted = fh.read().splitlines()
""",
)

case(
    "u-pandas-to-csv-append",
    "unsafe",
    FILES + "import time\nimport pandas as pd\n",
    """
out_csv = os.path.join(D, "out", "all.csv")
for k, p in enumerate(csv_paths):
    time.sleep(0.1 if k < 3 else 0)  # the first parts are slow
    part = pd.read_csv(p)
    part.assign(src=os.path.basename(p)).to_csv(out_csv, mode="a", header=False, index=False)
merged_text = open(out_csv).read().splitlines()
""",
    note="appends to one shared file through pandas, not open()",
)

case(
    "u-np-save-same-path",
    "unsafe",
    FILES + "import numpy as np\n",
    """
import time
latest = os.path.join(D, "out", "latest.npy")
for k in range(6):
    time.sleep(0.1 if k < 5 else 0)  # the last one is quick
    np.save(latest, np.full(3, k))
kept = np.load(latest)
""",
    note="every iteration overwrites one file: serially the last one wins",
)

case(
    "u-sqlite-insert",
    "unsafe",
    FILES
    + """
import sqlite3
con = sqlite3.connect(os.path.join(D, "out", "db.sqlite"))
con.execute("CREATE TABLE t (k INTEGER, v INTEGER)")
""",
    """
for k in range(5):
    con.execute("INSERT INTO t VALUES (?, ?)", (k, k * k))
con.commit()
rows_in_db = con.execute("SELECT k, v FROM t ORDER BY k").fetchall()
""",
)

case(
    "u-registry-classmethod",
    "unsafe",
    """
class Registry:
    items = {}
    @classmethod
    def register(cls, name, value):
        cls.items[name] = value
""",
    """
for name in ["relu", "tanh", "gelu"]:
    Registry.register(name, len(name))
registered = dict(Registry.items)
""",
)

case(
    "u-helper-appends-to-attr",
    "unsafe",
    """
class Tracker:
    def __init__(self):
        self.seen = []
tracker = Tracker()
def record(x):
    tracker.seen.append(x)
    return x + 1
""",
    """
nexts = []
for x in [5, 6, 7]:
    nexts.append(record(x))
seen_copy = list(tracker.seen)
""",
)

case(
    "u-chdir-in-body",
    "unsafe",
    FILES
    + """
os.chdir(D)
""",
    """
counts = []
for sub in ["in", "out"]:
    os.chdir(os.path.join(D, sub))
    counts.append(len(os.listdir(".")))
where = os.path.basename(os.getcwd())
""",
    note="changes the kernel's working directory serially",
)

case(
    "u-pd-set-option",
    "unsafe",
    """
import pandas as pd
pd.reset_option("display.max_rows")
pd.reset_option("display.precision")
""",
    """
for opt, val in [("display.max_rows", 17), ("display.precision", 3)]:
    pd.set_option(opt, val)
opts = (pd.get_option("display.max_rows"), pd.get_option("display.precision"))
pd.reset_option("display.max_rows")
pd.reset_option("display.precision")
""",
    note="changes a library's global options",
)

case(
    "u-np-seterr-in-body",
    "unsafe",
    """
import numpy as np
np.seterr(divide="warn")
""",
    """
for mode in ["ignore", "raise"]:
    np.seterr(divide=mode)
state = np.geterr()["divide"]
np.seterr(divide="warn")
""",
    note="changes numpy's process-wide error state",
)

case(
    "u-torch-set-default-dtype",
    "unsafe",
    """
import torch
torch.set_default_dtype(torch.float32)
""",
    """
made = []
for dt in [torch.float64, torch.float32, torch.float64]:
    torch.set_default_dtype(dt)
    made.append(torch.zeros(1).dtype)
after_dtype = torch.zeros(1).dtype
torch.set_default_dtype(torch.float32)
""",
    note="process-wide torch default dtype; the cell restores it at the end",
)

case(
    "u-counter-attr-on-function",
    "unsafe",
    """
def step(x):
    step.calls += 1
    return x * 2
step.calls = 0
""",
    """
ys = []
for x in range(5):
    ys.append(step(x))
n_calls = step.calls
""",
)

case(
    "u-list-of-same-dict-items",
    "unsafe",
    """
proto = {"n": 0}
slots = [proto, proto, proto]
""",
    """
for s in slots:
    s["n"] += 1
""",
)

case(
    "u-iter-over-dict-and-add-key",
    "unsafe",
    """
graph = {"a": ["b"], "b": ["c"], "c": []}
""",
    """
for node in list(graph):
    for nb in graph[node]:
        graph.setdefault(nb + "_rev", []).append(node)
""",
)

case(
    "u-bfs-frontier",
    "unsafe",
    """
edges = {1: [2, 3], 2: [4], 3: [4, 5], 4: [6], 5: [6], 6: []}
""",
    """
visited = {1}
order = [1]
for node in order:
    for nxt in edges[node]:
        if nxt not in visited:
            visited.add(nxt)
            order.append(nxt)
""",
    note="iterates over a list the body grows",
)

case(
    "u-generator-reads-changed-name",
    "unsafe",
    "",
    """
limit = 3
def upto():
    k = 0
    while k < limit:
        yield k
        k += 1
got = []
for v in upto():
    got.append(v)
    limit = 5
""",
)


# ------------------------------------------- own items changed in the loop's text
# (issue 28 §3: each iteration changes only its own item; the kernel writes
# the new state back into its own object, in place, in iteration order)

case(
    "own-accounts-interest",
    "safe",
    """
accounts = [{"id": 1, "balance": 100.0}, {"id": 2, "balance": 250.5},
            {"id": 3, "balance": 0.0}]
by_id = {a["id"]: a for a in accounts}
""",
    """
for acct in accounts:
    acct["balance"] *= 1.05
    acct["tier"] = "gold" if acct["balance"] > 200 else "basic"
""",
    note="by_id names the same dicts: it sees the change, as serially",
)

case(
    "own-queues-reversed",
    "safe",
    """
queues = [[1, 2, 3], ["a", "b"], [], [[0], [1]]]
inner = queues[3][0]
""",
    """
for q in queues:
    q.reverse()
    q.append(len(q))
still_there = any(x is inner for x in queues[3])
""",
    note="an element moved by reverse() keeps its identity",
)

case(
    "own-images-clipped-out",
    "safe",
    """
import numpy as np
_r = np.random.default_rng(3)
frames = [_r.normal(size=(3, 4)) for _ in range(5)]
""",
    """
for img in frames:
    np.clip(img, -0.5, 0.5, out=img)
    img *= 2
""",
)

case(
    "own-series-fillna-inplace",
    "safe",
    """
import numpy as np
import pandas as pd
cols = [pd.Series([1.0, np.nan, 3.0]), pd.Series([np.nan, np.nan]), pd.Series([5.0])]
""",
    """
for s in cols:
    s.fillna(s.mean() if s.notna().any() else 0.0, inplace=True)
""",
)

case(
    "own-records-dataclass-score",
    "safe",
    """
from dataclasses import dataclass, field
@dataclass
class Doc:
    text: str
    tags: list = field(default_factory=list)
docs = [Doc("a b c"), Doc("hello"), Doc("x y")]
""",
    """
for d in docs:
    d.n_words = len(d.text.split())
    d.tags = d.tags + ["short" if d.n_words < 3 else "long"]
""",
)

case(
    "own-configs-setdefault",
    "safe",
    """
configs = {"small": {"lr": 0.01}, "big": {"layers": 4}, "tiny": {}}
""",
    """
for name, cfg in configs.items():
    cfg.setdefault("lr", 0.1)
    cfg["name"] = name.upper()
""",
)

case(
    "own-torch-weights-clamped",
    "safe",
    """
import torch
torch.manual_seed(2)
weights = [torch.randn(3, 2) * 3 for _ in range(4)]
""",
    """
for w in weights:
    w.clamp_(-1.0, 1.0)
""",
)

case(
    "own-torch-layers-zero-bias",
    "safe",
    """
import torch
from torch import nn
torch.manual_seed(4)
layers = [nn.Linear(3, 2) for _ in range(3)]
""",
    """
for layer in layers:
    nn.init.zeros_(layer.bias)
    layer.tag = "zeroed"
""",
)

case(
    "own-matrix-rows-standardised",
    "safe",
    """
import numpy as np
G = np.arange(1.0, 21.0).reshape(5, 4) ** 1.5
""",
    """
for r in G:
    r -= r.mean()
    r /= r.std()
""",
    note="each row, a view of G, changed in place: G changes as serially",
)

case(
    "own-same-dict-repeated",
    "unsafe",
    """
tallies = [{}] * 3
""",
    """
for t in tallies:
    t["n"] = t.get("n", 0) + 1
""",
    note="one dict three times: serially n is 3",
)

case(
    "own-item-also-a-global-read",
    "unsafe",
    """
rows2 = [{"v": 1}, {"v": 2}, {"v": 3}]
head = rows2[0]
""",
    """
seen = []
for r in rows2:
    r["v"] *= 10
    seen.append(head["v"])
""",
    note="head is the first item: serially later iterations see it changed",
)

case(
    "own-rows-read-whole-matrix",
    "unsafe",
    """
import numpy as np
Q = np.arange(1.0, 13.0).reshape(4, 3)
""",
    """
for q in Q:
    q /= Q.sum()
""",
    note="the body reads Q, which earlier iterations changed",
)

case(
    "own-nested-shared-child",
    "unsafe",
    """
log = []
jobs = [{"name": "a", "log": log}, {"name": "b", "log": log}]
""",
    """
for job in jobs:
    job["log"].append(job["name"])
    job["n"] = len(job["log"])
""",
    note="both items hold one list: serially n is 1 then 2",
)

case(
    "own-overlapping-windows",
    "unsafe",
    """
import numpy as np
base = np.arange(10.0)
wins = [base[0:6], base[4:10]]
""",
    """
for w in wins:
    w += w.sum()
""",
    note="the windows share base[4:6]",
)


# ------------------------------------------- reductions and gathers spelled otherwise
# (issue 28 §3: `D.get(k, 0) + e`, `D.setdefault(k, []).append(e)`,
# `a, b = min(a, x), max(b, x)`, `D[k] = D[k] + e`)

case(
    "spell-histogram-buckets-get",
    "safe",
    """
ages = [23, 35, 41, 19, 67, 35, 52, 28, 30, 44, 71, 18]
""",
    """
hist = {}
for a in ages:
    b = a // 10 * 10
    hist[b] = hist.get(b, 0) + 1
""",
)

case(
    "spell-spend-per-person-prefilled",
    "safe",
    """
payments = [("ann", 12.5), ("bob", 3.0), ("ann", 7.25), ("cy", 1.0), ("bob", 4.5)]
spend = {"bob": 100.0}
""",
    """
for who, amount in payments:
    spend[who] = spend.get(who, 0.0) + amount
""",
    note="one key exists before the loop, the others start from get's default",
)

case(
    "spell-group-words-by-initial",
    "safe",
    TEXT,
    """
by_initial = {}
for w in words:
    by_initial.setdefault(w[0].lower(), []).append(w)
""",
)

case(
    "spell-temperature-range-and-sums",
    "safe",
    """
temps = [12.5, 9.0, 15.25, 7.5, 11.0, 14.0]
""",
    """
t_min, t_max = temps[0], temps[0]
n, s = 0, 0.0
for t in temps:
    t_min, t_max = min(t_min, t), max(t_max, t)
    n, s = n + 1, s + t
mean = s / n
""",
)

case(
    "spell-prefilled-totals-rebound",
    "safe",
    """
sales_rows = [("north", 3), ("south", 5), ("north", 2), ("east", 1)]
by_region = {"north": 0, "south": 10, "east": 0}
""",
    """
for region, qty in sales_rows:
    by_region[region] = by_region[region] + qty
""",
)

case(
    "spell-get-count-read-back",
    "unsafe",
    TEXT,
    """
counts = {}
firsts = []
for w in words:
    counts[w] = counts.get(w, 0) + 1
    if counts[w] == 1:
        firsts.append(w)
""",
    note="reads the running count: serially it depends on earlier iterations",
)

case(
    "spell-tuple-swap-carried",
    "unsafe",
    """
xs = [1, 2, 3, 4, 5]
""",
    """
a, b = 0, 1
for x in xs:
    a, b = b, a + x
""",
    note="each part reads the other target: no split, a carried dependency",
)

case(
    "spell-setdefault-shared-list",
    "unsafe",
    """
shared = []
idx = {"a": shared, "b": shared}
pairs = [("a", 1), ("b", 2), ("a", 3)]
""",
    """
for k, v in pairs:
    idx.setdefault(k, []).append(v)
""",
    note="two keys hold one list: serially the appends interleave on it",
)

case(
    "spell-get-and-augmented-mixed",
    "unsafe",
    """
ks = ["x", "y", "x"]
""",
    """
c = {}
for k in ks:
    c[k] = c.get(k, 0) + 1
    c[k] += 1
""",
    note="the += needs the key serially: not rewritten, refused",
)


# ------------------------------------------- the element just appended, read back
# (issue 28 §3: `S.append(e)` then `S[-1]` in the same iteration is `e`)

case(
    "readback-history-records",
    "safe",
    """
epochs = list(range(6))
""",
    """
history = []
for e in epochs:
    history.append({"epoch": e, "loss": 1.0 / (e + 1)})
    history[-1]["improved"] = history[-1]["loss"] < 0.5
    log.info("epoch %d loss %.3f", e, history[-1]["loss"])
""",
)

case(
    "readback-squares-printed",
    "safe",
    """
ns_ = [3, 1, 4, 1, 5]
""",
    """
sq = []
for n in ns_:
    sq.append(n * n)
    print(n, "->", sq[-1])
""",
)

case(
    "readback-previous-element",
    "unsafe",
    """
xs = [1, 2, 3, 4]
""",
    """
run = []
for x in xs:
    prev = run[-1] if run else 0
    run.append(prev + x)
""",
    note="reads the previous iteration's element before appending",
)

case(
    "readback-two-appends",
    "unsafe",
    """
xs = [1, 2, 3]
""",
    """
out = []
for x in xs:
    out.append(x)
    out.append(out[-1] + len(out))
""",
    note="len(out) counts every earlier iteration's elements",
)

case(
    "own-rows-centred-by-helper",
    "safe",
    """
import numpy as np
H = np.arange(1.0, 16.0).reshape(5, 3) ** 2
def centre(r):
    r -= r.mean()
""",
    """
for r in H:
    centre(r)
""",
    note="a notebook function changes the iteration's own row in place",
)

case(
    "own-rows-helper-reads-whole-matrix",
    "unsafe",
    """
import numpy as np
K = np.arange(1.0, 13.0).reshape(4, 3)
def shift(r):
    r -= K.mean()
""",
    """
for r in K:
    shift(r)
""",
    note="the helper reads K, whose rows earlier iterations changed",
)

case(
    "own-dicts-helper-reads-registry",
    "unsafe",
    """
items3 = [{"n": 1}, {"n": 2}, {"n": 3}]
registry = {"first": items3[0]}
def bump(d):
    d["n"] += registry["first"]["n"]
""",
    """
for d in items3:
    bump(d)
""",
    note="the helper reads the first item through a global dict",
)

case(
    "own-iterrows-row-changed",
    "safe",
    """
import pandas as pd
people = pd.DataFrame({"name": ["ann", "bob"], "age": [30, 40]})
""",
    """
for i, row in people.iterrows():
    row["age"] = row["age"] + 1
""",
    note="iterrows' rows are copies: serially only `row` (the last) keeps the "
    "change, here the kernel's own last row (the items are read once)",
)


# ------------------------------------------- iterating a copy of what the body changes
# (issue 28 §3: an iterable made by a copying method is made before the loop)

case(
    "copy-prices-raised-over-a-copy",
    "safe",
    """
prices = {"tea": 2.5, "cake": 3.75, "jam": 4.0}
""",
    """
for item in prices.copy():
    prices[item] = round(prices[item] * 1.1, 2)
""",
)

case(
    "copy-top-scores-marked",
    "safe",
    """
import pandas as pd
board = pd.DataFrame({"who": list("abcdef"), "pts": [5, 9, 1, 7, 3, 8]})
board["top"] = False
""",
    """
for idx in board.nlargest(3, "pts").index:
    board.at[idx, "top"] = True
""",
)

case(
    "copy-live-values-view",
    "unsafe",
    """
totals = {"a": 1, "b": 2, "c": 3}
""",
    """
seen_vals = []
for v in totals.values():
    seen_vals.append(v)
    totals["c"] = v * 10
""",
    note="values() is a live view: serially the last value read is the changed one",
)

# ---------------------------------------------------------------- issue 28 §3:
# a written frame or dict read at keys no iteration writes; running bests;
# deletes; masks (written as tutorials write them)

case(
    "feat-diff-features",
    "safe",
    DF,
    """
for k in (1, 2, 7):
    ts[f"diff_{k}"] = ts["y"].diff(k)
""",
)

case(
    "feat-ewm-spans",
    "safe",
    DF,
    """
for span in [3, 6, 12]:
    ts[f"ewm{span}"] = ts["y"].ewm(span=span, adjust=False).mean()
""",
)

case(
    "feat-pct-change-literal-columns",
    "safe",
    DF,
    """
for col in ["qty", "price"]:
    sales[col + "_pct"] = sales[col].pct_change()
""",
)

case(
    "feat-fill-then-flag",
    "safe",
    DF
    + """
sales.loc[[3, 8, 21], "price"] = np.nan
""",
    """
for col in ["qty", "price"]:
    sales[f"{col}_missing"] = sales[col].isna()
    sales[f"{col}_filled"] = sales[col].fillna(sales[col].median())
""",
)

case(
    "feat-zscore-by-mask",
    "safe",
    DF,
    """
sales["qty_z"] = 0.0
for prod in sorted(sales["product"].unique()):
    m = sales["product"] == prod
    grp = sales.loc[m, "qty"]
    sales.loc[m, "qty_z"] = (grp - grp.mean()) / grp.std(ddof=0)
""",
)

case(
    "feat-threshold-bands-overlap",
    "safe",
    DF,
    """
sales["band"] = "low"
for cut, name in [(5, "mid"), (10, "high"), (15, "top")]:
    sel = sales["price"] >= cut
    sales.loc[sel, "band"] = name
""",
    note="masks overlap: the last matching band wins, as serially",
)

case(
    "feat-dict-derived-stats",
    "safe",
    NP,
    """
stats = {"sig": signal, "row0": M[0]}
for name in ["sig", "row0"]:
    stats[name + "_mean"] = float(np.mean(stats[name]))
    stats[name + "_max"] = float(np.max(stats[name]))
""",
)

case(
    "feat-squared-columns",
    "safe",
    DF,
    """
for p in range(2, 5):
    ts["x_pow" + str(p)] = ts["x"] ** p
""",
)

case(
    "u-feat-lag-of-lag",
    "unsafe",
    DF
    + """
ts["lag_0"] = ts["y"]
""",
    """
for k in range(1, 4):
    ts[f"lag_{k}"] = ts[f"lag_{k - 1}"].shift(1)
""",
    note="each lag reads the one the previous iteration wrote",
)

case(
    "u-feat-prefix-collision",
    "unsafe",
    """
d = {"x1": 10}
""",
    """
for k in range(4):
    d[f"x{k}"] = d["x1"] + k
""",
    note="iteration 1 writes the key every later iteration reads",
)

case(
    "u-feat-literal-suffix-collision",
    "unsafe",
    DF
    + """
sales["qty_pct"] = 0.0
""",
    """
for col in ["qty", "qty_pct"]:
    sales[col + "_pct"] = sales[col] * 2
""",
    note="`qty_pct` is written by the first iteration and read by the second",
)

case(
    "u-feat-width-from-frame",
    "unsafe",
    DF,
    """
for w in [2, 3, 4]:
    ts[f"roll_{w}"] = ts["y"].rolling(w).mean() * len(ts.columns)
""",
    note="len(ts.columns) grows with every column added",
)

case(
    "u-feat-new-row-labels",
    "unsafe",
    DF,
    """
for lab in ["p", "q", "r"]:
    sales.loc[lab, "qty"] = sales["qty"].count()
""",
    note="each label adds a row; the next count sees it",
)

case(
    "u-feat-mask-from-written-column",
    "unsafe",
    DF,
    """
sales["flag"] = False
for t in [3, 6, 9]:
    m = sales["flag"] | (sales["qty"] > t)
    sales.loc[m, "flag"] = True
    sales.loc[m, "n_seen"] = int(m.sum())
""",
    note="the mask reads the column the previous iteration wrote",
)

case(
    "u-running-min-distance",
    "unsafe",
    NP,
    """
closest = None
best = np.inf
for j, p in enumerate(points):
    dist = float(np.hypot(*p))
    if dist < best:
        best = dist
        closest = j
""",
    note="a running minimum with its index (refused; the advice names min)",
)

case(
    "safe-best-by-min-builtin",
    "safe",
    NP,
    """
dists = []
for j, p in enumerate(points):
    dists.append((float(np.hypot(*p)), j))
best, closest = min(dists)
""",
    note="the running minimum rewritten as the advice says",
)

case(
    "edge-lazy-cache-property",
    "safe",
    """
class Data:
    def __init__(self, xs):
        self.xs = xs
        self._total = None
    @property
    def total(self):
        if self._total is None:
            self._total = sum(self.xs)
        return self._total
d = Data([1, 2, 3])
""",
    """
out = []
for i in range(4):
    out.append(d.total + i)
""",
    note="a property that caches on first read: serially the notebook's `d` keeps the cache",
)

# ------------------------------------------- a store of another dtype, by position

case(
    "np-int-array-half-steps",
    "safe",
    NP,
    """
counts = np.zeros(6, dtype=int)
for i in range(6):
    counts[i] += 0.5 * i
""",
    note="numpy casts each float back into the int array (1.5 -> 1)",
)

case(
    "np-uint8-brighten-pixels",
    "safe",
    NP,
    """
img = (np.arange(8) * 30).astype(np.uint8)
for i, gain in enumerate(np.linspace(0.5, 9.5, 8)):
    img[i] += gain
""",
    note="a float added to uint8 pixels: cast at each store, as serially",
)

case(
    "np-float32-weights-float64-updates",
    "safe",
    NP,
    """
w = np.ones(9, dtype=np.float32)
for j, v in enumerate(vectors):
    w[j] -= 0.1 * float(np.linalg.norm(v))
""",
    note="float64 updates into a float32 array keep float32",
)

case(
    "np-bool-mask-counts",
    "safe",
    NP,
    """
seen = np.zeros(9, dtype=bool)
for j, v in enumerate(vectors):
    seen[j] += int(v[0] > 0)
""",
    note="ints added into a bool mask store True/False",
)
