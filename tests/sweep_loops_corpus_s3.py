# ruff: noqa: E501  (the cells are notebook code, as tutorials write it)
"""A third held-in corpus of notebook loops, for tests/test_sweep_loops_s3.py:
scikit-learn cross-validation and grid forms, pandas group / row / column
loops, numpy and scipy per-parameter loops, torch sweeps and evaluation,
control-flow forms, and side effects (files, logging, heaps, counters),
written the way tutorials, docs, Kaggle and course notebooks write them,
each safe spelling beside an unsafe twin.

Same shape as tests/sweep_loops_corpus.py (its ``Case``; see its docstring
for verdicts, kinds and ``@TMP@``).  The ids start with ``s3-`` and must not
clash with the other two corpora's.
"""

from __future__ import annotations

import textwrap

from sweep_loops_corpus import CASES as _FIRST_CASES
from sweep_loops_corpus import Case
from sweep_loops_corpus_writeback import CASES as _WB_CASES

CASES: list[Case] = []


def case(id, verdict, setup, cell, kind="plain", note=""):
    """As sweep_loops_corpus.case, into this corpus's own list."""
    assert verdict in ("safe", "unsafe") and kind in ("plain", "seeded", "random")
    assert id.startswith("s3-"), id
    assert all(c.id != id for c in CASES + _FIRST_CASES + _WB_CASES), id
    CASES.append(
        Case(id, verdict, textwrap.dedent(setup), textwrap.dedent(cell), kind, note)
    )


# ---------------------------------------------------------------- shared setups

SK = """
import itertools
import numpy as np
import pandas as pd
from sklearn.base import clone
from sklearn.datasets import make_classification, make_regression
from sklearn.model_selection import KFold, StratifiedKFold, cross_val_score, train_test_split
from sklearn.linear_model import LogisticRegression, Ridge
from sklearn.tree import DecisionTreeClassifier
from sklearn.neighbors import KNeighborsClassifier
from sklearn.preprocessing import StandardScaler
from sklearn.pipeline import make_pipeline
X, y = make_classification(n_samples=90, n_features=5, n_informative=3, random_state=0)
X_tr, X_te, y_tr, y_te = train_test_split(X, y, test_size=0.3, random_state=0)
Xr, yr = make_regression(n_samples=60, n_features=4, noise=5.0, random_state=1)
"""

DF = """
import numpy as np
import pandas as pd
_r = np.random.default_rng(3)
df = pd.DataFrame({"store": _r.choice(["A", "B", "C", "D"], size=16),
                   "band": _r.choice(["lo", "hi"], size=16),
                   "units": _r.integers(1, 20, size=16),
                   "price": _r.uniform(2, 9, size=16).round(2)})
"""

NP = """
import numpy as np
_r = np.random.default_rng(21)
x = np.linspace(-2, 2, 9)
series = [_r.normal(size=12).cumsum() for _ in range(5)]
mats = [_r.normal(size=(3, 3)) + 3 * np.eye(3) for _ in range(5)]
b = np.array([1.0, 2.0, 3.0])
"""

TORCH = """
import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset
torch.manual_seed(0)
X = torch.randn(40, 4)
Y = X @ torch.tensor([[1.0], [-2.0], [0.5], [3.0]]) + 0.1 * torch.randn(40, 1)
labels = (Y.squeeze(1) > 0).long()
batches = list(zip(X.split(10), Y.split(10)))
loss_fn = nn.MSELoss()
"""

TEXT = """
docs = ["the quick brown fox", "jumps over the lazy dog", "The Dog sleeps",
        "a fox and a dog", "quick quick slow", "lazy afternoon fox"]
raw = ["3.5", "x", "7", "", "2e3", "nan?", "-4"]
"""


# ================================================================ scikit-learn

case(
    "s3-sk-stratified-kfold-split-header",
    "safe",
    SK,
    """
skf = StratifiedKFold(n_splits=5, shuffle=True, random_state=42)
scores = []
for fold, (train_idx, val_idx) in enumerate(skf.split(X, y)):
    clf = LogisticRegression(max_iter=500)
    clf.fit(X[train_idx], y[train_idx])
    acc = clf.score(X[val_idx], y[val_idx])
    scores.append(acc)
    print(f"Fold {fold}: {acc:.3f}")
print("mean", np.mean(scores))
""",
)

case(
    "s3-sk-cross-val-score-per-model-dict",
    "safe",
    SK,
    """
models = {
    "logreg": LogisticRegression(max_iter=500),
    "tree": DecisionTreeClassifier(max_depth=3, random_state=0),
    "knn": KNeighborsClassifier(n_neighbors=5),
    "scaled_knn": make_pipeline(StandardScaler(), KNeighborsClassifier()),
}
results = {}
for name, model in models.items():
    cv = cross_val_score(model, X, y, cv=3, scoring="accuracy")
    results[name] = (cv.mean(), cv.std())
    log.info("%s: %.3f +/- %.3f", name, cv.mean(), cv.std())
best_name = max(results, key=lambda k: results[k][0])
""",
)

case(
    "s3-sk-manual-grid-product-rows-frame",
    "safe",
    SK,
    """
rows = []
for depth, leaf in itertools.product([2, 3, 5], [1, 4]):
    tree = DecisionTreeClassifier(max_depth=depth, min_samples_leaf=leaf, random_state=0)
    tree.fit(X_tr, y_tr)
    rows.append({"max_depth": depth, "min_samples_leaf": leaf,
                 "train": tree.score(X_tr, y_tr), "test": tree.score(X_te, y_te)})
grid_df = pd.DataFrame(rows).sort_values("test", ascending=False)
""",
)

case(
    "s3-sk-learning-curve-train-sizes",
    "safe",
    SK,
    """
train_sizes = [15, 25, 35, 45, 55, 63]
train_err, test_err = [], []
for n in train_sizes:
    model = LogisticRegression(max_iter=500).fit(X_tr[:n], y_tr[:n])
    train_err.append(1 - model.score(X_tr[:n], y_tr[:n]))
    test_err.append(1 - model.score(X_te, y_te))
""",
)

case(
    "s3-sk-drop-one-column-importance",
    "safe",
    SK,
    """
base = LogisticRegression(max_iter=500).fit(X_tr, y_tr).score(X_te, y_te)
drop_importance = {}
for col in range(X_tr.shape[1]):
    X_tr_d = np.delete(X_tr, col, axis=1)
    X_te_d = np.delete(X_te, col, axis=1)
    score = LogisticRegression(max_iter=500).fit(X_tr_d, y_tr).score(X_te_d, y_te)
    drop_importance[f"f{col}"] = base - score
""",
)

case(
    "s3-sk-clone-per-fold-models-list",
    "safe",
    SK,
    """
base_model = make_pipeline(StandardScaler(), LogisticRegression(C=0.5, max_iter=500))
kf = KFold(n_splits=4, shuffle=True, random_state=0)
fold_models, fold_scores = [], []
for tr, va in kf.split(X):
    est = clone(base_model)
    est.fit(X[tr], y[tr])
    fold_models.append(est)
    fold_scores.append(est.score(X[va], y[va]))
coefs = np.vstack([m[-1].coef_ for m in fold_models])
""",
)

case(
    "s3-sk-oof-predictions-fancy-index",
    "safe",
    SK,
    """
kf = KFold(n_splits=5, shuffle=True, random_state=1)
oof = np.zeros(len(y))
for tr, va in kf.split(X):
    m = LogisticRegression(max_iter=500).fit(X[tr], y[tr])
    oof[va] = m.predict_proba(X[va])[:, 1]
oof_auc_like = float(np.mean((oof > 0.5) == y))
""",
    note="Kaggle's out-of-fold pattern: each fold writes its own (disjoint) rows",
)

case(
    "s3-sk-u-oof-accumulate-overlapping",
    "unsafe",
    SK,
    """
from sklearn.model_selection import ShuffleSplit
ss = ShuffleSplit(n_splits=4, test_size=0.4, random_state=0)
votes = np.zeros(len(y))
for tr, va in ss.split(X):
    m = DecisionTreeClassifier(max_depth=2, random_state=0).fit(X[tr], y[tr])
    votes[va] = votes[va] + m.predict(X[va])
""",
    note="validation sets overlap: a read-modify-write of rows another iteration writes",
)

case(
    "s3-sk-gridsearch-per-model",
    "safe",
    SK,
    """
from sklearn.model_selection import GridSearchCV
spaces = {
    "logreg": (LogisticRegression(max_iter=500), {"C": [0.1, 1.0, 10.0]}),
    "knn": (KNeighborsClassifier(), {"n_neighbors": [3, 5, 9]}),
    "tree": (DecisionTreeClassifier(random_state=0), {"max_depth": [2, 4]}),
}
best_params, best_scores = {}, {}
for name, (est, grid) in spaces.items():
    gs = GridSearchCV(est, grid, cv=3)
    gs.fit(X_tr, y_tr)
    best_params[name] = gs.best_params_
    best_scores[name] = gs.best_score_
del gs  # (its cv_results_ hold fit times: no two runs agree)
""",
)

case(
    "s3-sk-ridge-alphas-coef-path",
    "safe",
    SK,
    """
alphas = np.logspace(-2, 3, 8)
coef_path = np.zeros((len(alphas), Xr.shape[1]))
for i, alpha in enumerate(alphas):
    coef_path[i] = Ridge(alpha=alpha).fit(Xr, yr).coef_
""",
)

case(
    "s3-sk-u-greedy-forward-selection",
    "unsafe",
    SK,
    """
selected, remaining = [], list(range(X_tr.shape[1]))
history = []
for step in range(3):
    scores = {j: LogisticRegression(max_iter=500).fit(X_tr[:, selected + [j]], y_tr).score(X_te[:, selected + [j]], y_te)
              for j in remaining}
    j_best = max(scores, key=scores.get)
    selected.append(j_best)
    remaining.remove(j_best)
    history.append(scores[j_best])
""",
    note="each step reads what the previous one selected",
)

case(
    "s3-sk-u-same-estimator-appended-per-fold",
    "unsafe",
    SK,
    """
kf = KFold(n_splits=4)
est = LogisticRegression(max_iter=500)
fitted = []
for tr, va in kf.split(X):
    est.fit(X[tr], y[tr])
    fitted.append(est)
same = all(m is est for m in fitted)
last_coef = est.coef_.copy()
""",
    note="forgot clone(): one estimator refit each fold, the list holds it four times",
)

case(
    "s3-sk-u-kfold-shared-randomstate",
    "unsafe",
    SK,
    """
rs = np.random.RandomState(0)
split_sizes = []
for rep in range(4):
    kf = KFold(n_splits=3, shuffle=True, random_state=rs)
    tr, va = next(iter(kf.split(X)))
    split_sizes.append(int(va[:5].sum()))
""",
    note="a RandomState object passed on: each KFold draws from the shared stream",
)

case(
    "s3-sk-u-feature-added-each-iteration",
    "unsafe",
    SK,
    """
X_cur = X_tr.copy()
scores = []
for k in range(4):
    X_cur = np.hstack([X_cur, X_cur[:, :1] * X_cur[:, k:k + 1]])
    scores.append(Ridge().fit(X_cur, y_tr).score(X_cur, y_tr))
""",
)


# ================================================================ pandas

case(
    "s3-pd-groupby-name-g-stats-dict",
    "safe",
    DF,
    """
store_stats = {}
for name, g in df.groupby("store"):
    store_stats[name] = {"n": len(g), "units": int(g["units"].sum()),
                         "avg_price": g["price"].mean()}
    log.info("store %s: %d rows", name, len(g))
stats_df = pd.DataFrame(store_stats).T
""",
)

case(
    "s3-pd-groupby-tuple-keys-unpacked",
    "safe",
    DF,
    """
revenue = {}
for (store, band), grp in df.groupby(["store", "band"]):
    revenue[store, band] = float((grp.units * grp.price).sum())
""",
)

case(
    "s3-pd-thresholds-rows-then-frame",
    "safe",
    DF,
    """
rows = []
for t in [2.5, 4, 5.5, 7]:
    sub = df[df["price"] > t]
    rows.append({"threshold": t, "n": len(sub), "units": sub["units"].sum()})
summary = pd.DataFrame(rows).set_index("threshold")
""",
)

case(
    "s3-pd-parts-appended-then-concat",
    "safe",
    DF,
    """
parts = []
for store in sorted(df["store"].unique()):
    part = df[df["store"] == store].copy()
    part["share"] = part["units"] / part["units"].sum()
    part["rank"] = part["units"].rank(ascending=False)
    parts.append(part)
result = pd.concat(parts).sort_index()
""",
)

case(
    "s3-pd-loc-over-index-new-str-column",
    "safe",
    DF,
    """
for i in df.index:
    if df.loc[i, "price"] * df.loc[i, "units"] > 50:
        df.loc[i, "tier"] = "big"
    else:
        df.loc[i, "tier"] = "small"
""",
)

case(
    "s3-pd-u-loc-over-index-reads-previous",
    "unsafe",
    DF,
    """
df["smooth"] = 0.0
df.loc[0, "smooth"] = df.loc[0, "units"]
for i in df.index[1:]:
    df.loc[i, "smooth"] = 0.7 * df.loc[i - 1, "smooth"] + 0.3 * df.loc[i, "units"]
""",
    note="an exponential smoothing written with .loc: row i reads row i-1's new value",
)

case(
    "s3-pd-columns-lower-object-dtype",
    "safe",
    DF,
    """
for col in df.columns:
    if df[col].dtype == object or pd.api.types.is_string_dtype(df[col]):
        df[col] = df[col].str.lower()
""",
)

case(
    "s3-pd-u-columns-minus-row-mean",
    "unsafe",
    DF,
    """
num = ["units", "price"]
df[num] = df[num].astype(float)
for c in num:
    df[c] = df[c] - df[num].mean(axis=1)
""",
    note="the row mean reads the column the previous iteration rewrote",
)

case(
    "s3-pd-value-counts-normalized-dict",
    "safe",
    DF,
    """
dists = {}
for col in ["store", "band"]:
    dists[col] = df[col].value_counts(normalize=True).sort_index().to_dict()
n_levels = {c: len(v) for c, v in dists.items()}
""",
)

case(
    "s3-pd-groupby-loc-write-group-index",
    "safe",
    DF,
    """
df["store_share"] = np.nan
for name, g in df.groupby("store"):
    df.loc[g.index, "store_share"] = g["units"] / g["units"].sum()
""",
    note="each group writes its own rows (the groups partition the index)",
)

case(
    "s3-pd-u-groupby-writes-whole-column",
    "unsafe",
    DF,
    """
df["units"] = df["units"].astype(float)
for name, g in df.groupby("store"):
    df.loc[df["store"] == name, "units"] = g["units"] / df["units"].max()
""",
    note="each group divides by the column's max, which the previous groups changed",
)

case(
    "s3-pd-u-filter-rebinds-frame",
    "unsafe",
    DF,
    """
sizes = []
for t in [3, 4, 5]:
    df = df[df["price"] > t]
    sizes.append(len(df))
""",
)

case(
    "s3-pd-u-drop-rows-inplace-over-index",
    "unsafe",
    DF,
    """
for i in df.index:
    if df.loc[i, "units"] < 8:
        df.drop(i, inplace=True)
kept = len(df)
""",
)

case(
    "s3-pd-itertuples-setdefault-lists",
    "safe",
    DF,
    """
by_band = {}
for row in df.itertuples(index=False):
    by_band.setdefault(row.band, []).append(round(row.price * row.units, 2))
totals = {k: sum(v) for k, v in by_band.items()}
""",
)

case(
    "s3-pd-agg-series-list-concat-axis1",
    "safe",
    DF,
    """
cols = []
for stat in ["mean", "median", "max", "std"]:
    s = df.groupby("store")["price"].agg(stat)
    s.name = stat
    cols.append(s)
table = pd.concat(cols, axis=1)
""",
)


# ================================================================ numpy / scipy

case(
    "s3-sp-minimize-per-start",
    "safe",
    NP,
    """
from scipy.optimize import minimize, rosen
starts = [np.array([-1.2, 1.0]), np.array([0.0, 0.0]), np.array([2.0, 2.0]), np.array([-0.5, 1.5])]
results = []
for x0 in starts:
    res = minimize(rosen, x0, method="Nelder-Mead", options={"xatol": 1e-8, "fatol": 1e-8})
    results.append((res.x, res.fun, res.nit))
best_x = min(results, key=lambda r: r[1])[0]
""",
)

case(
    "s3-sp-curve-fit-per-series",
    "safe",
    NP,
    """
from scipy.optimize import curve_fit
def line(t, a, b):
    return a * t + b
t = np.arange(12)
params = {}
for k, s in enumerate(series):
    popt, pcov = curve_fit(line, t, s)
    params[k] = popt
slopes = np.array([p[0] for p in params.values()])
""",
)

case(
    "s3-sp-quad-lambda-per-alpha",
    "safe",
    NP,
    """
from scipy import integrate
alphas = np.linspace(0.5, 3.0, 6)
areas = np.empty_like(alphas)
for k, a in enumerate(alphas):
    val, err = integrate.quad(lambda t: np.exp(-a * t ** 2), 0, np.inf)
    areas[k] = val
""",
    note="the lambda reads the loop variable, called inside the same iteration",
)

case(
    "s3-sp-solve-ivp-per-rate",
    "safe",
    NP,
    """
from scipy.integrate import solve_ivp
finals = {}
for r in [0.2, 0.5, 1.0, 1.5]:
    sol = solve_ivp(lambda t, u: r * u * (1 - u), (0, 5), [0.1], t_eval=[5.0])
    finals[r] = float(sol.y[0, -1])
""",
)

case(
    "s3-sp-ttest-per-pair-rows",
    "safe",
    NP,
    """
from scipy import stats
rows = []
for i in range(len(series)):
    for j in range(i + 1, len(series)):
        t_stat, p = stats.ttest_ind(series[i], series[j])
        rows.append((i, j, round(float(t_stat), 6), float(p)))
""",
)

case(
    "s3-np-prealloc-out-enumerate",
    "safe",
    NP,
    """
out = np.zeros_like(x)
for i, xi in enumerate(x):
    out[i] = xi ** 2 if xi > 0 else np.exp(xi) - 1
""",
)

case(
    "s3-np-loss-landscape-nested-grid",
    "safe",
    NP,
    """
w0s = np.linspace(-1, 1, 5)
w1s = np.linspace(-2, 2, 4)
t = np.linspace(0, 1, 20)
target = 0.3 * t - 1.1
def mse(w0, w1):
    return float(np.mean((w0 * t + w1 - target) ** 2))
landscape = np.zeros((len(w0s), len(w1s)))
for i in range(len(w0s)):
    for j in range(len(w1s)):
        landscape[i, j] = mse(w0s[i], w1s[j])
i_min, j_min = np.unravel_index(landscape.argmin(), landscape.shape)
""",
)

case(
    "s3-np-solve-per-matrix-rows",
    "safe",
    NP,
    """
sols = np.empty((len(mats), 3))
conds = []
for k, A in enumerate(mats):
    sols[k, :] = np.linalg.solve(A, b)
    conds.append(np.linalg.cond(A))
""",
)

case(
    "s3-np-batches-slice-writes-range-step",
    "safe",
    NP,
    """
data = np.arange(23, dtype=float)
bs = 5
scaled = np.empty_like(data)
for start in range(0, len(data), bs):
    batch = data[start:start + bs]
    scaled[start:start + bs] = (batch - batch.mean()) / (batch.std() + 1e-9)
""",
    note="a batched transform: each iteration writes its own slice",
)

case(
    "s3-np-array-split-enumerate-dict",
    "safe",
    NP,
    """
chunks = np.array_split(np.arange(30) ** 0.5, 4)
chunk_means = {}
for k, chunk in enumerate(chunks):
    chunk_means[k] = float(chunk.mean())
""",
)

case(
    "s3-np-mc-default-rng-seed-inside-pi",
    "safe",
    NP,
    """
pis = []
for seed in range(6):
    rng = np.random.default_rng(seed)
    pts = rng.random((500, 2))
    pis.append(4 * np.mean((pts ** 2).sum(axis=1) <= 1))
pi_hat = float(np.mean(pis))
""",
)

case(
    "s3-np-u-bootstrap-generator-in-helper",
    "unsafe",
    NP,
    """
rng = np.random.default_rng(2024)
data = series[0]
def boot_mean(a):
    return rng.choice(a, size=len(a), replace=True).mean()
boot = []
for b_i in range(8):
    boot.append(boot_mean(data))
ci = np.percentile(boot, [5, 95])
""",
    note="one Generator made before the loop, drawn from through a helper",
)

case(
    "s3-np-u-generator-passed-as-argument",
    "unsafe",
    NP,
    """
rng = np.random.default_rng(7)
def noisy(v, gen):
    return v + gen.normal(scale=0.1, size=v.shape)
noisy_series = []
for s in series:
    noisy_series.append(noisy(s, rng))
""",
)

case(
    "s3-np-u-recurrence-two-back",
    "unsafe",
    NP,
    """
n = 10
u = np.zeros(n)
u[1] = 0.1
h = 0.1
for i in range(2, n):
    u[i] = 2 * u[i - 1] - u[i - 2] - h * h * u[i - 1]
""",
)

case(
    "s3-np-float-total-cancellation",
    "safe",
    "",
    """
values = [1e16, 1.0, 1.0, 1.0, 1.0, 1.0, 1.0, 1.0, 1.0, -1e16]
total = 0.0
for v in values:
    total += v
""",
    note="float additions are not associative: serially each 1.0 is lost against 1e16 (total 0.0)",
)

case(
    "s3-np-float32-total-order",
    "safe",
    "import numpy as np\n",
    """
vals = np.float32([16777216.0, 1.0, 1.0, 1.0, 1.0, 1.0, 1.0, 1.0])
acc = np.float32(0.0)
for v in vals:
    acc += v
""",
    note="float32: 2**24 + 1 rounds back to 2**24; sums of the ones in a chunk do not",
)

case(
    "s3-np-float-sse-total",
    "safe",
    NP,
    """
sse = 0.0
for s in series:
    resid = s - s.mean()
    sse += float((resid ** 2).sum())
rmse = (sse / sum(len(s) for s in series)) ** 0.5
""",
)

case(
    "s3-np-u-online-mean-welford",
    "unsafe",
    NP,
    """
mean, m2, count = 0.0, 0.0, 0
for v in series[1]:
    count += 1
    delta = v - mean
    mean += delta / count
    m2 += delta * (v - mean)
var = m2 / (count - 1)
""",
)

case(
    "s3-np-u-gradient-descent-inplace",
    "unsafe",
    NP,
    """
A = mats[0]
w = np.zeros(3)
lr = 0.05
for step in range(10):
    grad = A.T @ (A @ w - b)
    w -= lr * grad
""",
)

case(
    "s3-np-append-rebind",
    "safe",
    NP,
    """
collected = np.array([])
for s in series:
    collected = np.append(collected, s[s > 0])
""",
)

case(
    "s3-np-vstack-rows-rebind",
    "safe",
    NP,
    """
feats = np.empty((0, 3))
for s in series:
    feats = np.vstack([feats, [s.mean(), s.std(), s.max()]])
""",
)

case(
    "s3-np-arange-keys-dict",
    "safe",
    NP,
    """
powers = {}
for k in np.arange(1, 6):
    powers[k] = np.linalg.matrix_power(mats[1], int(k)).trace()
""",
)


# ================================================================ torch

case(
    "s3-torch-lr-sweep-model-inside-last-kept",
    "safe",
    TORCH,
    """
history = {}
for lr in [0.001, 0.01, 0.05, 0.1]:
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(4, 8), nn.Tanh(), nn.Linear(8, 1))
    optimizer = torch.optim.Adam(model.parameters(), lr=lr)
    for epoch in range(3):
        for xb, yb in batches:
            optimizer.zero_grad()
            loss = loss_fn(model(xb), yb)
            loss.backward()
            optimizer.step()
    history[lr] = loss.item()
    print(f"lr={lr}: final loss {loss.item():.4f}")
""",
    note="model, optimizer and loss stay bound to the last learning rate's",
)

case(
    "s3-torch-eval-loader-no-grad-correct",
    "safe",
    TORCH,
    """
torch.manual_seed(1)
clf = nn.Linear(4, 2)
clf.eval()
loader = DataLoader(TensorDataset(X, labels), batch_size=8, shuffle=False)
correct, seen = 0, 0
preds = []
for xb, yb in loader:
    with torch.no_grad():
        out = clf(xb)
    pred = out.argmax(dim=1)
    preds.append(pred)
    correct += (pred == yb).sum().item()
    seen += yb.size(0)
accuracy = correct / seen
preds = torch.cat(preds)
""",
)

case(
    "s3-torch-u-train-over-loader-model-in-prelude",
    "unsafe",
    TORCH,
    """
torch.manual_seed(2)
model = nn.Linear(4, 1)
opt = torch.optim.SGD(model.parameters(), lr=0.05)
loader = DataLoader(TensorDataset(X, Y), batch_size=10, shuffle=False)
running = []
for xb, yb in loader:
    opt.zero_grad()
    loss = loss_fn(model(xb), yb)
    loss.backward()
    opt.step()
    running.append(loss.item())
""",
)

case(
    "s3-torch-manual-seed-in-body-dropout",
    "safe",
    TORCH,
    """
drop = nn.Dropout(p=0.5)
drop.train()
masks = []
for i in range(5):
    torch.manual_seed(i)
    masks.append(drop(torch.ones(6)))
after = torch.rand(2)
""",
    kind="random",
    note="the draw after the loop follows the last iteration's seed (documented: warned)",
)

case(
    "s3-torch-local-generator-per-iteration",
    "safe",
    TORCH,
    """
inits = []
for seed in range(5):
    g = torch.Generator().manual_seed(seed)
    inits.append(torch.randn(3, generator=g))
last_state = g.get_state()
del g  # (a Generator's pickle differs between runs whose states are equal)
""",
)

case(
    "s3-torch-u-shared-generator-object",
    "unsafe",
    TORCH,
    """
def make_noise(seed):
    gen = torch.Generator().manual_seed(seed)
    def draw(n):
        return torch.randn(n, generator=gen)
    return draw
draw = make_noise(0)
noise = []
for i in range(6):
    noise.append(draw(2))
""",
    note="one Generator drawn from by every iteration, held in a closure (a "
    "Generator itself in the namespace pickles differently from run to run, "
    "equal states or not: the sweep's comparison could not judge it)",
)

case(
    "s3-torch-named-parameters-stats",
    "safe",
    TORCH,
    """
torch.manual_seed(3)
net = nn.Sequential(nn.Linear(4, 6), nn.ReLU(), nn.Linear(6, 1))
param_stats = {}
for name, p in net.named_parameters():
    param_stats[name] = (tuple(p.shape), p.abs().mean().item())
n_params = sum(p.numel() for p in net.parameters())
""",
)

case(
    "s3-torch-u-register-forward-hooks",
    "unsafe",
    TORCH,
    """
torch.manual_seed(4)
net = nn.Sequential(nn.Linear(4, 6), nn.ReLU(), nn.Linear(6, 1))
activations = {}
def save_to(name):
    def hook(module, inp, out):
        activations[name] = out.detach()
    return hook
handles = []
for name, layer in net.named_children():
    handles.append(layer.register_forward_hook(save_to(name)))
net(X[:3])
hooked = sorted(activations)
""",
    note="hooks registered on the outer model; they fill a kernel dict later",
)

case(
    "s3-torch-no-grad-decorated-evaluate",
    "safe",
    TORCH,
    """
@torch.no_grad()
def evaluate(m, xs, ys):
    return loss_fn(m(xs), ys).item()
torch.manual_seed(5)
candidates = {f"h{h}": nn.Sequential(nn.Linear(4, h), nn.ReLU(), nn.Linear(h, 1)) for h in (2, 4, 8)}
val_loss = {}
for name, m in candidates.items():
    val_loss[name] = evaluate(m, X, Y)
""",
)

case(
    "s3-torch-cat-accumulate-rebind",
    "safe",
    TORCH,
    """
torch.manual_seed(6)
enc = nn.Linear(4, 2)
embeddings = torch.empty(0, 2)
with torch.no_grad():
    for xb, _ in batches:
        embeddings = torch.cat([embeddings, enc(xb)], dim=0)
""",
)

case(
    "s3-torch-u-ema-of-weights",
    "unsafe",
    TORCH,
    """
torch.manual_seed(7)
student = nn.Linear(4, 1)
teacher = nn.Linear(4, 1)
teacher.load_state_dict(student.state_dict())
for step, (xb, yb) in enumerate(batches):
    with torch.no_grad():
        student.weight.add_(0.1 * xb.mean(0))
        for pt, ps in zip(teacher.parameters(), student.parameters()):
            pt.mul_(0.9).add_(0.1 * ps)
""",
)


# ================================================================ control flow and forms

case(
    "s3-form-break-first-threshold",
    "unsafe",
    SK,
    """
model = LogisticRegression(max_iter=500).fit(X_tr, y_tr)
proba = model.predict_proba(X_te)[:, 1]
chosen = None
for thr in np.arange(0.1, 0.95, 0.1):
    if ((proba >= thr) == y_te).mean() >= 0.8:
        chosen = round(float(thr), 2)
        break
""",
    note="a search: the first threshold that reaches the target",
)

case(
    "s3-form-continue-skip-empty",
    "safe",
    TEXT,
    """
lengths = {}
for d in docs:
    if "fox" not in d:
        continue
    lengths[d] = len(d.split())
""",
)

case(
    "s3-form-try-except-failures-logged",
    "safe",
    TEXT,
    """
parsed, failures = [], []
for s in raw:
    try:
        parsed.append(float(s))
    except ValueError as exc:
        failures.append((s, str(exc)))
        log.warning("could not parse %r", s)
""",
)

case(
    "s3-form-tqdm-auto-enumerate",
    "safe",
    TEXT,
    """
from tqdm.auto import tqdm
token_counts = []
for i, d in enumerate(tqdm(docs, desc="tokenize", disable=True)):
    token_counts.append((i, len(d.split())))
""",
)

case(
    "s3-form-zip-strict",
    "safe",
    NP,
    """
names = [f"s{k}" for k in range(len(series))]
peaks = {}
for name, s, A in zip(names, series, mats, strict=True):
    peaks[name] = float(s.max() * np.trace(A))
""",
)

case(
    "s3-form-reversed-enumerate-list",
    "safe",
    TEXT,
    """
tail_first = []
for i, d in reversed(list(enumerate(docs))):
    tail_first.append(f"{i}:{d[:5]}")
""",
)

case(
    "s3-form-sorted-items-by-value",
    "safe",
    "scores = {'ann': 0.71, 'bob': 0.93, 'cy': 0.65, 'dee': 0.88, 'eve': 0.93}\n",
    """
leaderboard = []
for rank, (name, score) in enumerate(sorted(scores.items(), key=lambda kv: -kv[1]), start=1):
    leaderboard.append(f"{rank}. {name} ({score:.2f})")
""",
)

case(
    "s3-form-u-while-newton",
    "unsafe",
    "",
    """
x_n = 3.0
it = 0
while abs(x_n * x_n - 2) > 1e-12 and it < 50:
    x_n = x_n - (x_n * x_n - 2) / (2 * x_n)
    it += 1
""",
    note="a while loop: must be refused, clearly",
)

case(
    "s3-form-comprehension-then-loop",
    "safe",
    TEXT,
    """
cleaned = [d.lower().split() for d in docs]
vocab_sizes = []
for toks in cleaned:
    vocab_sizes.append(len(set(toks)))
""",
)

case(
    "s3-form-def-closure-late-binding",
    "safe",
    "",
    """
handlers = {}
for k in range(1, 5):
    def handler(v):
        return v * k
    handlers[f"x{k}"] = handler
applied = {n: h(10) for n, h in handlers.items()}
""",
    note="late binding: every handler reads the global k at call time (4)",
)

case(
    "s3-form-lambda-late-binding-kept-in-list",
    "safe",
    "",
    """
powers = []
for p in range(4):
    powers.append(lambda v: v ** p)
p = 10
table = [f(2) for f in powers]
""",
    note="the lambdas read p when called: after the loop p is rebound to 10",
)

case(
    "s3-form-closure-factory",
    "safe",
    "",
    """
def make_scaler(k):
    return lambda v: v * k
scalers = []
for k in (2, 3, 5, 7):
    scalers.append(make_scaler(k))
scaled = [f(3) for f in scalers]
""",
)

case(
    "s3-form-functools-partial-per-item",
    "safe",
    "",
    """
import functools
def clip(v, lo, hi):
    return max(lo, min(hi, v))
clippers = {}
for hi in [1, 5, 10]:
    clippers[hi] = functools.partial(clip, lo=0, hi=hi)
clipped = {hi: f(7) for hi, f in clippers.items()}
""",
)

case(
    "s3-form-islice-generator-header",
    "safe",
    "",
    """
import itertools
def squares():
    n = 0
    while True:
        yield n * n
        n += 1
first = []
for sq in itertools.islice(squares(), 2, 9):
    first.append(sq % 7)
""",
)

case(
    "s3-form-zip-star-columns",
    "safe",
    "matrix = [[1, 2, 3, 4], [5, 6, 7, 8], [9, 10, 11, 12]]\n",
    """
col_sums = []
for col in zip(*matrix):
    col_sums.append(sum(col))
""",
)

case(
    "s3-form-map-strip-header",
    "safe",
    TEXT,
    """
first_words = []
for line in map(str.strip, docs):
    first_words.append(line.split()[0].capitalize())
""",
)

case(
    "s3-form-set-iteration-order",
    "safe",
    TEXT,
    """
vocab = set(" ".join(docs).lower().split())
lens = []
for w in vocab:
    lens.append((w, len(w)))
""",
    note="iterates a set: the order is the kernel's",
)

case(
    "s3-form-u-list-insert-front",
    "unsafe",
    TEXT,
    """
stack = []
for d in docs:
    stack.insert(0, d.upper())
""",
    note="prepends: the final order is reversed (equal to serial is fine)",
)


# ================================================================ side effects and sinks

case(
    "s3-fx-print-end-flush",
    "safe",
    TEXT,
    """
n_chars = 0
for d in docs:
    print(d[:3], end=" | ", flush=True)
    n_chars += len(d)
print()
""",
)

case(
    "s3-fx-logging-module-logger-levels",
    "safe",
    NP,
    """
import logging
logger = logging.getLogger(__name__)
logger.setLevel(logging.DEBUG)
maxima = []
for k, s in enumerate(series):
    logger.debug("series %d has %d points", k, len(s))
    if s.max() > 2:
        logger.warning("series %d peaks at %.3f", k, s.max())
    maxima.append(s.max())
""",
)

case(
    "s3-fx-one-csv-per-group",
    "safe",
    DF
    + """
import os
D = @TMP@
os.makedirs(D, exist_ok=True)
""",
    """
for store, g in df.groupby("store"):
    g.to_csv(os.path.join(D, f"store_{store}.csv"), index=False)
written = sorted(os.listdir(D))
sizes = [len(pd.read_csv(os.path.join(D, f))) for f in written]
""",
)

case(
    "s3-fx-np-save-per-series",
    "safe",
    NP
    + """
import os
D = @TMP@
os.makedirs(D, exist_ok=True)
""",
    """
paths = []
for k, s in enumerate(series):
    path = os.path.join(D, f"series_{k:02d}.npy")
    np.save(path, s)
    paths.append(path)
reloaded = np.stack([np.load(p) for p in paths])
""",
)

case(
    "s3-fx-u-append-lines-one-file",
    "unsafe",
    TEXT
    + """
import os
D = @TMP@
os.makedirs(D, exist_ok=True)
LOG_PATH = os.path.join(D, "tokens.txt")
""",
    """
for i, d in enumerate(docs):
    with open(LOG_PATH, "a") as fh:
        fh.write(f"{i}\\t{len(d.split())}\\n")
with open(LOG_PATH) as fh:
    lines = fh.read().splitlines()
""",
)

case(
    "s3-fx-u-csv-writer-from-prelude",
    "unsafe",
    TEXT
    + """
import csv, os
D = @TMP@
os.makedirs(D, exist_ok=True)
""",
    """
fh = open(os.path.join(D, "rows.csv"), "w", newline="")
writer = csv.writer(fh)
writer.writerow(["doc", "words"])
for i, d in enumerate(docs):
    writer.writerow([i, len(d.split())])
fh.close()
with open(os.path.join(D, "rows.csv")) as f:
    content = f.read()
""",
)

case(
    "s3-fx-counter-update-tokens",
    "safe",
    TEXT + "from collections import Counter\n",
    """
word_counts = Counter()
bigrams = Counter()
for d in docs:
    toks = d.lower().split()
    word_counts.update(toks)
    bigrams.update(zip(toks, toks[1:]))
top = word_counts.most_common(3)
""",
)

case(
    "s3-fx-counter-subtract",
    "safe",
    TEXT + "from collections import Counter\n",
    """
budget = Counter({"fox": 5, "dog": 5, "quick": 5, "lazy": 5})
for d in docs:
    budget.subtract(w for w in d.lower().split() if w in budget)
""",
)

case(
    "s3-fx-setdefault-set-index",
    "safe",
    TEXT,
    """
inverted = {}
for doc_id, d in enumerate(docs):
    for w in d.lower().split():
        inverted.setdefault(w, set()).add(doc_id)
postings = {w: sorted(ids) for w, ids in inverted.items()}
""",
)

case(
    "s3-fx-nested-defaultdict-counts",
    "safe",
    DF + "from collections import defaultdict\n",
    """
pivot = defaultdict(lambda: defaultdict(int))
for row in df.itertuples():
    pivot[row.store][row.band] += row.units
pivot_plain = {k: dict(v) for k, v in pivot.items()}
""",
)

case(
    "s3-fx-set-add-pairs",
    "safe",
    TEXT,
    """
pairs = set()
for d in docs:
    toks = sorted(set(d.lower().split()))
    for a in toks:
        if a.startswith(("f", "d", "q")):
            pairs.add((a, len(toks)))
""",
)

case(
    "s3-fx-heappush-build-heap",
    "safe",
    "scores = {'ann': 7, 'bob': 3, 'cy': 9, 'dee': 1, 'eve': 5, 'fay': 4, 'gus': 8}\nimport heapq\n",
    """
heap = []
for name, s in scores.items():
    heapq.heappush(heap, (s, name))
smallest_two = heapq.nsmallest(2, heap)
""",
    note="the heap's list layout depends on the order of the pushes",
)

case(
    "s3-fx-u-heappushpop-topk",
    "unsafe",
    "scores = {'ann': 7, 'bob': 3, 'cy': 9, 'dee': 1, 'eve': 5, 'fay': 4, 'gus': 8}\nimport heapq\n",
    """
top3 = []
for name, s in scores.items():
    if len(top3) < 3:
        heapq.heappush(top3, (s, name))
    else:
        heapq.heappushpop(top3, (s, name))
""",
)

case(
    "s3-fx-list-extend-and-dict-update",
    "safe",
    TEXT,
    """
all_tokens = []
first_seen = {}
for i, d in enumerate(docs):
    all_tokens.extend(d.split())
    first_seen.update({w: i for w in d.split() if w.islower()})
""",
    note="dict.update per iteration: the last writer of a key wins",
)

case(
    "s3-fx-u-random-seed-once-in-prelude-stdlib",
    "unsafe",
    "import random\n",
    """
random.seed(0)
picks = []
for i in range(6):
    picks.append(random.randint(1, 100))
""",
    kind="random",
    note="one seed for the whole loop: the draws follow each other",
)


# ================================================================ more probes

case(
    "s3-pd-concat-grow-rebind",
    "safe",
    DF,
    """
all_parts = pd.DataFrame()
for store in ["A", "B", "C", "D"]:
    part = df[df["store"] == store].assign(total=lambda d: d.units * d.price)
    all_parts = pd.concat([all_parts, part])
""",
    note="Kaggle's grow-a-frame idiom: an ordered concatenation",
)

case(
    "s3-torch-u-hooks-on-own-models",
    "unsafe",
    TORCH,
    """
torch.manual_seed(8)
models = {"small": nn.Linear(4, 1), "wide": nn.Sequential(nn.Linear(4, 16), nn.ReLU(), nn.Linear(16, 1))}
outputs = {}
def keep(name):
    def hook(module, inp, out):
        outputs[name] = out.detach().mean().item()
    return hook
for name, m in models.items():
    m.register_forward_hook(keep(name))
for m in models.values():
    m(X)
seen = sorted(outputs)
""",
    note="each model gets its own hook (own items), which fills a kernel dict later",
)

case(
    "s3-form-lambda-reads-body-local-late",
    "safe",
    "",
    """
fns = []
for k in range(5):
    factor = k * 2
    fns.append(lambda v: v * factor)
applied = [f(1) for f in fns]
""",
    note="late binding to a body-assigned global: every lambda sees the last factor (8)",
)

case(
    "s3-form-tqdm-bar-object-n",
    "safe",
    TEXT,
    """
import io
from tqdm import tqdm
sink = io.StringIO()
pbar = tqdm(docs, file=sink, mininterval=3600)
n_words = []
for d in pbar:
    n_words.append(len(d.split()))
n_done = pbar.n
pbar.close()
del pbar, sink
""",
)

case(
    "s3-torch-u-tensor-hooks-on-params",
    "unsafe",
    TORCH,
    """
torch.manual_seed(9)
net = nn.Linear(4, 1)
for p in net.parameters():
    p.register_hook(lambda grad: grad.clamp(-0.01, 0.01))
loss = loss_fn(net(X), Y)
loss.backward()
grad_max = max(p.grad.abs().max().item() for p in net.parameters())
""",
    note="gradient clipping by tensor hooks on a kernel model's parameters",
)

case(
    "s3-np-own-arrays-set-readonly",
    "safe",
    NP,
    """
frozen_in = [s.copy() for s in series]
for a in frozen_in:
    a.flags.writeable = False
flags = [a.flags.writeable for a in frozen_in]
""",
    note="each iteration freezes its own array (a flag, not the data)",
)

case(
    "s3-fx-u-logger-levels-per-item",
    "unsafe",
    "",
    """
import logging
app_loggers = [logging.getLogger(f"s3app.{n}") for n in ("db", "net", "ui")]
for lg in app_loggers:
    lg.setLevel(logging.WARNING)
levels = [lg.level for lg in app_loggers]
for lg in app_loggers:
    lg.setLevel(logging.NOTSET)
""",
    note="loggers travel by name: an engine's setLevel changes its own process",
)

case(
    "s3-np-float-sum-builtin-generator",
    "safe",
    "",
    """
values = [1e16, 1.0, 1.0, 1.0, 1.0, 1.0, 1.0, 1.0, 1.0, -1e16]
total = sum(v for v in values)
""",
    note="the builtin over a generator: gathered in order, summed once",
)

case(
    "s3-torch-loss-item-total",
    "safe",
    TORCH,
    """
torch.manual_seed(10)
probe = nn.Linear(4, 1)
running_loss = 0.0
with torch.no_grad():
    for xb, yb in batches:
        running_loss += loss_fn(probe(xb), yb).item() * xb.size(0)
epoch_loss = running_loss / len(X)
""",
    note="the usual epoch-loss sum: ordinary floats, agrees to rounding",
)

case(
    "s3-torch-prune-own-models",
    "safe",
    TORCH,
    """
from torch.nn.utils import prune
torch.manual_seed(11)
layers = [nn.Linear(4, 3) for _ in range(3)]
for layer in layers:
    prune.l1_unstructured(layer, name="weight", amount=0.5)
zeros = [int((layer.weight == 0).sum()) for layer in layers]
outs = [layer(X[:2]).detach() for layer in layers]
pre_hooks = [len(layer._forward_pre_hooks) for layer in layers]
""",
    note="pruning each layer of a list: a mask buffer, a weight_orig parameter and a forward pre-hook per layer",
)

case(
    "s3-np-own-arrays-reshape-attr",
    "safe",
    NP,
    """
grids = [np.arange(12.0) * k for k in range(4)]
for g_ in grids:
    g_.shape = (3, 4)
shapes = [g_.shape for g_ in grids]
""",
    note="assigning .shape reshapes each iteration's own array in place",
)

case(
    "s3-fx-u-np-set-printoptions-in-body",
    "unsafe",
    NP,
    """
shown = []
for prec in [2, 3, 4]:
    np.set_printoptions(precision=prec)
    shown.append(np.array2string(np.array([1 / 3])))
after_loop = np.array2string(np.array([2 / 3]))
np.set_printoptions(precision=8)
""",
    note="process-wide state set in the body; the epilogue reads it before putting it back",
)

case(
    "s3-fx-u-pd-options-attr-in-body",
    "unsafe",
    DF,
    """
shown = []
for prec in [1, 2, 3]:
    pd.options.display.precision = prec
    shown.append(repr(df[["price"]].head(2)))
after_loop = pd.get_option("display.precision")
pd.reset_option("display.precision")
""",
    note="pandas options by attribute (not set_option): process-wide state",
)

case(
    "s3-fx-u-torch-backends-flag-in-body",
    "unsafe",
    TORCH,
    """
import torch.backends.cudnn
flags_seen = []
for bench in [False, True]:
    torch.backends.cudnn.benchmark = bench
    flags_seen.append(torch.backends.cudnn.benchmark)
after_loop = torch.backends.cudnn.benchmark
torch.backends.cudnn.benchmark = False
""",
)
