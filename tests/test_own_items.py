"""An iteration's own item, written back in place (issue 28 §1).

Serially ``for m in models: m.fit(X, y)`` leaves every model in the list fitted,
and every other name for one of them sees it.  Each test runs a notebook's
setup and the cell serially in a real shell, then again through
``%%gpu_parallel`` on a real cluster, and compares what the notebook holds
(and that the kernel's objects kept their identity).
"""

from __future__ import annotations

import cloudpickle
import pytest
import torch

from gpucell.errors import NotParallelizable

pytestmark = pytest.mark.cluster

SETUP = """
import numpy as np, torch
from torch import nn
from sklearn.linear_model import Ridge
from sklearn.preprocessing import StandardScaler

rng = np.random.default_rng(0)
X = rng.normal(size=(40, 3))
y = X @ np.array([1.0, 2.0, 3.0]) + 0.1 * rng.normal(size=40)

class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(3, 1)
        self.norm = nn.BatchNorm1d(3)
    def forward(self, x):
        return self.fc(self.norm(x))

class Counter:
    def __init__(self, name):
        self.name = name
        self.seen = 0
    def feed(self, xs):
        self.seen += len(xs)
        self.last = xs[-1]
        return self

torch.manual_seed(0)
T = torch.randn(16, 3)
Ty = torch.randn(16, 1)

def train(net, steps=4, lr=0.1):
    opt = torch.optim.SGD(net.parameters(), lr=lr)
    net.train()
    for _ in range(steps):
        opt.zero_grad()
        loss = ((net(T) - Ty) ** 2).mean()
        loss.backward()
        opt.step()
    net.eval()
    return loss.item()
"""


def _clear(ip) -> None:
    for k in list(ip.user_ns):
        if not k.startswith("_") and k not in (
            "In",
            "Out",
            "exit",
            "quit",
            "get_ipython",
        ):
            ip.user_ns.pop(k)


def _both(ip, setup: str, cell: str, probe):
    """``probe(ns)`` after the serial cell and after the magic's."""
    _clear(ip)
    ip.run_cell(SETUP + setup).raise_error()
    ip.run_cell(cell).raise_error()
    serial = probe(ip.user_ns)
    _clear(ip)
    ip.run_cell(SETUP + setup).raise_error()
    before = {k: id(v) for k, v in ip.user_ns.items() if not k.startswith("_")}
    ip.run_cell_magic("gpu_parallel", "--quiet --chunksize 1", cell)
    par = probe(ip.user_ns)
    for k, i in before.items():
        if k in ip.user_ns and k not in cell.split("=")[0]:
            assert id(ip.user_ns[k]) == i, f"{k} was replaced, not changed in place"
    return serial, par


def _net_state(net):
    return (
        {k: v.clone() for k, v in net.state_dict().items()},
        {
            n: None if p.grad is None else p.grad.clone()
            for n, p in net.named_parameters()
        },
        [m.training for m in net.modules()],
    )


def _equal_nets(a, b) -> bool:
    (sa, ga, ta), (sb, gb, tb) = a, b
    return (
        sa.keys() == sb.keys()
        and all(torch.allclose(sa[k].float(), sb[k].float(), atol=1e-6) for k in sa)
        and all((ga[n] is None) == (gb[n] is None) for n in ga)
        and all(ga[n] is None or torch.allclose(ga[n], gb[n], atol=1e-6) for n in ga)
        and ta == tb
    )


def test_estimators_in_a_list_are_fitted_in_place(ip, cluster):
    setup = (
        "models = [Ridge(alpha=a) for a in (0.1, 1.0, 10.0, 100.0)]\n"
        "first = models[0]\n"
    )
    cell = (
        "scores = []\n"
        "for m in models:\n"
        "    m.fit(X, y)\n"
        "    scores.append(m.score(X, y))\n"
    )

    def probe(ns):
        return (
            [m.coef_.tolist() for m in ns["models"]],
            ns["scores"],
            ns["first"] is ns["models"][0] and hasattr(ns["first"], "coef_"),
            ns["m"] is ns["models"][-1],
        )

    serial, par = _both(ip, setup, cell, probe)
    assert par == serial


def test_torch_modules_in_a_dict_are_trained_in_place(ip, cluster):
    setup = (
        "torch.manual_seed(1)\n"
        "nets = {f'n{i}': Net() for i in range(4)}\n"
        "keep = nets['n2']\n"
    )
    cell = (
        "losses = {}\nfor name, net in nets.items():\n    losses[name] = train(net)\n"
    )

    def probe(ns):
        w = ns["nets"]["n0"].fc.weight
        return (
            {k: _net_state(v) for k, v in ns["nets"].items()},
            ns["losses"],
            ns["keep"] is ns["nets"]["n2"],
            w,
        )

    serial, par = _both(ip, setup, cell, probe)
    # BatchNorm's batch statistics are reduced in another order with the
    # engines' fewer threads: equal to rounding, as the kernel with 1 thread
    assert par[1] == pytest.approx(serial[1], rel=1e-6)
    for k in serial[0]:
        assert _equal_nets(serial[0][k], par[0][k]), k
    assert par[2]


def test_plain_objects_with_enumerate_get_their_attributes(ip, cluster):
    setup = (
        "counters = [Counter(c) for c in 'abcde']\n"
        "batches = [list(range(i + 1)) for i in range(5)]\n"
    )
    cell = (
        "total = 0\n"
        "for i, c in enumerate(counters):\n"
        "    total += c.feed(batches[i]).seen\n"
    )

    def probe(ns):
        return [vars(c) for c in ns["counters"]], ns["total"]

    serial, par = _both(ip, setup, cell, probe)
    assert par == serial


def test_a_scaler_fitted_per_item_and_zip(ip, cluster):
    setup = (
        "scalers = [StandardScaler() for _ in range(3)]\n"
        "parts = [X[:10], X[10:25], X[25:]]\n"
    )
    cell = (
        "means = []\n"
        "for s, part in zip(scalers, parts):\n"
        "    s.fit(part)\n"
        "    means.append(s.mean_.sum())\n"
    )

    def probe(ns):
        return [s.mean_.tolist() for s in ns["scalers"]], ns["means"]

    serial, par = _both(ip, setup, cell, probe)
    assert par == serial


@pytest.mark.parametrize(
    ("setup", "cell", "error", "match"),
    [
        (
            "m = Ridge()\nmodels = [m] * 3\n",
            "for m in models:\n    m.fit(X, y)\n",
            NotParallelizable,
            "are one object",
        ),
        (
            "models = [Ridge() for _ in range(3)]\nregistry = {'best': models[1]}\n",
            "out = []\nfor m in models:\n    m.fit(X, y)\n"
            "    out.append(len(registry))\n",
            NotParallelizable,
            "`registry` holds it",
        ),
        (
            "shared = []\nclass Keep:\n    def __init__(self):\n"
            "        self.log = shared\n"
            "    def push(self, x):\n        self.log.append(x)\n"
            "keepers = [Keep() for _ in range(3)]\n",
            "for k in keepers:\n    k.push(1)\n",
            NotParallelizable,
            "attribute `log`, which",
        ),
        (
            "d = {}\nrows = [d, d]\n",
            "seen = []\nfor i, row in enumerate(rows):\n    if i == 0:\n"
            "        row['x'] = 1\n    seen.append(row.get('x'))\n",
            NotParallelizable,
            "are one object",
        ),
        (
            "inner = []\nlists = [[inner, 1], [inner, 2]]\n",
            "for xs in lists:\n    xs[0].append(xs[1])\n",
            NotParallelizable,
            "iterations 0 and 1 hold one object",
        ),
        (
            "base = np.arange(12.0)\nlists = [base[:6], base[6:]]\nother = base[3:9]\n",
            "out = []\nfor a in lists:\n    a *= 2\n    out.append(other.sum())\n",
            NotParallelizable,
            "shares its memory",
        ),
    ],
    ids=[
        "items are one object",
        "an input holds an item",
        "a shared attribute",
        "one dict twice, changed by the first only",
        "nested lists sharing a child",
        "a view of a changed item in another input",
    ],
)
def test_what_cannot_be_written_back_fails_atomically(
    ip, cluster, setup, cell, error, match
):
    _clear(ip)
    ip.run_cell(SETUP + setup).raise_error()

    before = {
        k: cloudpickle.dumps(v)
        for k, v in ip.user_ns.items()
        if k in ("models", "keepers", "lists", "shared")
    }
    with pytest.raises(error, match=match):
        ip.run_cell_magic("gpu_parallel", "--quiet --chunksize 1", cell)
    for k, data in before.items():
        assert cloudpickle.dumps(ip.user_ns[k]) == data, (
            f"{k} changed: nothing may be merged"
        )


def test_an_attribute_rebound_from_a_shared_value_is_written_back(ip, cluster):
    setup = (
        "shared = [0]\nclass Keep:\n    def __init__(self):\n"
        "        self.log = shared\n"
        "    def push(self, x):\n        self.log = self.log + [x]\n"
        "keepers = [Keep() for _ in range(4)]\n"
    )
    cell = "for i, k in enumerate(keepers):\n    k.push(i)\n"

    def probe(ns):
        return [k.log for k in ns["keepers"]], ns["shared"]

    serial, par = _both(ip, setup, cell, probe)
    assert par == serial == ([[0, 0], [0, 1], [0, 2], [0, 3]], [0])


def test_containers_arrays_and_flags_written_back_in_place(ip, cluster):
    """Dicts, lists (elements keep their identity), arrays (a view's base
    sees it), torch tensors' requires_grad and a module's own attribute."""
    setup = (
        "rows = [{'a': i, 'keep': [i]} for i in range(4)]\n"
        "alias = rows[2]\n"
        "kept = rows[1]['keep']\n"
        "lists = [[[3], [1], [2]], [[9], [7]]]\n"
        "moved = lists[0][0]\n"
        "P = np.arange(1.0, 13.0).reshape(4, 3)\n"
        "nets = [nn.Linear(2, 2) for _ in range(3)]\n"
    )
    cell = (
        "for row in rows:\n    row['total'] = row['a'] * 2\n    del row['a']\n"
        "for xs in lists:\n    xs.sort()\n"
        "for r in P:\n    r /= r.sum()\n"
        "for net in nets:\n    net.requires_grad_(False)\n    net.note = 'frozen'\n"
    )
    # (only the last loop is parallel: the others run in its prelude)
    cell_par = cell.split("for net in nets")[0]

    def probe(ns):
        return (
            ns["rows"],
            ns["alias"] is ns["rows"][2],
            ns["kept"] is ns["rows"][1]["keep"],
            any(x is ns["moved"] for x in ns["lists"][0]),
            ns["lists"],
            ns["P"].round(12).tolist(),
        )

    for loop in cell_par.split("for ")[1:]:
        serial, par = _both(ip, setup, "for " + loop, probe)
        assert par == serial

    def flags(ns):
        return [([p.requires_grad for p in n.parameters()], n.note) for n in ns["nets"]]

    loop = "for net in nets:\n    net.requires_grad_(False)\n    net.note = 'frozen'\n"
    serial, par = _both(ip, setup, loop, flags)
    assert par == serial == [([False, False], "frozen")] * 3


def test_a_list_item_grown_by_a_function_is_written_back(ip, cluster):
    setup = "def grow(xs):\n    xs.append(0)\n    return xs\nlists = [[1], [2], [3]]\n"
    cell = "out = []\nfor xs in lists:\n    out.append(len(grow(xs)))\n"
    serial, par = _both(ip, setup, cell, lambda ns: (ns["lists"], ns["out"]))
    assert par == serial == ([[1, 0], [2, 0], [3, 0]], [2, 2, 2])
