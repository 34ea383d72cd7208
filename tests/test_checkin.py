"""Inputs are read-only to iterations, checked on real engines (engine/checkin.py).

Each unsafe loop here passes static analysis (the change happens inside a call),
so only the engines' check-in/check-out stands between it and a silently different
namespace: it must fail atomically (nothing merged, the cluster usable) naming the
input.  Each safe loop beside it must still give the serial namespace.
"""

from __future__ import annotations

import cloudpickle
import numpy as np
import pytest
import torch

from gpucell.engine import checkin
from gpucell.errors import InputChanged

pytestmark = pytest.mark.cluster

NOTEBOOK = """
import numpy as np, torch

class Est:
    def __init__(self):
        self.coef = 0.0
    def fit(self, x):
        self.coef = self.coef + x
        return self
    def score(self, x):
        return self.coef * x

def step(params, lr):
    for p in params:
        p -= lr * p

def record(x):
    log.append(x)
    return x

log = []
"""


@pytest.fixture
def nb(ip, private_cluster):
    """The shell with a fresh 'notebook' defined in it (functions in __main__)."""
    for k in ("est", "models", "w", "b", "model", "batches", "xs", "scores", "out"):
        ip.user_ns.pop(k, None)
    ip.run_cell(NOTEBOOK)
    return ip


def _fails_atomically(ip, cell: str, names: list[str], match: str) -> InputChanged:
    before = {n: cloudpickle.dumps(ip.user_ns[n]) for n in names if n in ip.user_ns}
    with pytest.raises(InputChanged, match=match) as info:
        ip.run_cell_magic("gpu_parallel", "--quiet", cell)
    for n, data in before.items():
        assert cloudpickle.dumps(ip.user_ns[n]) == data, f"{n} changed in the kernel"
    # the cluster is usable: a safe cell right after gives the serial result
    ip.run_cell_magic(
        "gpu_parallel", "--quiet", "out = []\nfor i in range(6):\n    out.append(i)\n"
    )
    assert ip.user_ns["out"] == list(range(6))
    return info.value


def test_a_method_call_that_changes_an_input_fails_naming_it(nb):
    nb.user_ns["est"] = nb.user_ns["Est"]()
    err = _fails_atomically(
        nb,
        "scores = []\nfor x in range(8):\n"
        "    est.fit(x)\n    scores.append(est.score(x))\n",
        ["est"],
        r"`est` changed in place \(by a call on lines 4, 5\)",
    )
    assert "Nothing was merged" in str(err)


def test_fitting_the_items_of_an_input_list_writes_them_back(nb):
    # each iteration changes only its own item: written back in place (28 §1)
    nb.run_cell("models = [Est() for _ in range(6)]\nfirst = models[0]")
    nb.run_cell_magic("gpu_parallel", "--quiet", "for m in models:\n    m.fit(2)\n")
    assert [m.coef for m in nb.user_ns["models"]] == [2.0] * 6
    assert nb.user_ns["first"] is nb.user_ns["models"][0]


def test_an_item_that_cannot_be_written_back_fails_naming_its_line(nb):
    # (containers inside an item are written back two levels down; one
    # changed in place deeper than that is not followed)
    nb.run_cell(
        "rows = [[[[[1]]]], [[[[2]]]], [[[[3]]]]]\n"
        "def grow(r):\n    r[0][0][0].append(0)\n    return r"
    )
    _fails_atomically(
        nb,
        "n = []\nfor r in rows:\n    n.append(len(grow(r)))\n",
        ["rows"],
        r"an item of `rows` \(the loop's data\) changed in place \(by a call on "
        r"line 4\)",
    )


def test_a_helper_that_changes_tensors_in_place_fails(nb):
    nb.run_cell("w = torch.ones(3)\nb = torch.zeros(3)")
    _fails_atomically(
        nb,
        "for i in range(4):\n    step([w, b], 0.1)\n",
        ["w", "b"],
        r"`w` changed in place .*it was changed in place",
    )


def test_a_numpy_input_written_in_place_fails_at_its_line(nb):
    nb.run_cell("w = np.ones(3)\nb = np.zeros(3)")
    with pytest.raises(ValueError, match="read-only") as info:
        nb.run_cell_magic(
            "gpu_parallel", "--quiet", "for i in range(4):\n    step([w, b], 0.1)\n"
        )
    notes = "\n".join(getattr(info.value, "__notes__", []))
    assert "inputs are read-only to iterations" in notes
    assert np.array_equal(nb.user_ns["w"], np.ones(3))


def test_backward_filling_an_input_model_s_grads_fails(nb):
    nb.run_cell(
        "torch.manual_seed(0)\nmodel = torch.nn.Linear(4, 2)\n"
        "batches = [torch.randn(3, 4) for _ in range(6)]"
    )
    err = _fails_atomically(
        nb,
        "losses = []\nfor x in batches:\n    loss = model(x).sum()\n"
        "    loss.backward()\n    losses.append(loss.item())\n",
        ["model"],
        r"`model` changed in place",
    )
    assert ".grad of its parameters" in str(err)
    assert nb.user_ns["model"].weight.grad is None


def test_a_notebook_function_that_changes_a_global_fails(nb):
    err = _fails_atomically(
        nb,
        "ys = []\nfor x in range(5):\n    ys.append(record(x))\n",
        ["log"],
        r"`record` changed in place",
    )
    assert "`log`" in str(err)
    assert nb.user_ns["log"] == []


def test_a_user_print_that_records_fails(nb):
    nb.run_cell("seen = []\ndef print(*a):\n    seen.append(a)\n")
    try:
        _fails_atomically(
            nb, "for i in range(4):\n    print(i)\n", ["seen"], r"`print` changed"
        )
    finally:
        nb.user_ns.pop("print", None)


def test_safe_calls_on_inputs_still_give_the_serial_result(nb):
    nb.run_cell(
        "torch.manual_seed(0)\nmodel = torch.nn.Linear(4, 2)\nmodel.eval()\n"
        "batches = [torch.randn(3, 4) for _ in range(6)]\n"
        "est = Est().fit(3.0)\nX = np.arange(12.0).reshape(4, 3)\n"
    )
    cell = (
        "outs = []\nscores = []\nwith_grad = []\n"
        "for x in batches:\n"
        "    with torch.no_grad():\n        outs.append(model(x))\n"
        "    scores.append(est.score(float(x.sum())))\n"
        "    with_grad.append(float(np.dot(X[0], X[1])) + len(log))\n"
    )
    ns = nb.user_ns
    serial: dict = {}
    exec(
        cell,
        {
            "model": ns["model"],
            "batches": ns["batches"],
            "est": ns["est"],
            "X": ns["X"],
            "np": np,
            "torch": torch,
            "log": ns["log"],
        },
        serial,
    )
    nb.run_cell_magic("gpu_parallel", "--quiet", cell)
    assert all(
        torch.equal(a, b) for a, b in zip(serial["outs"], ns["outs"], strict=True)
    )
    assert serial["scores"] == ns["scores"]
    assert serial["with_grad"] == ns["with_grad"]


def test_global_random_draws_without_seed_get_one_warning(nb, capsys):
    nb.run_cell_magic(
        "gpu_parallel",
        "",
        "vals = []\nfor i in range(4):\n    vals.append(float(torch.randn(1)))\n",
    )
    out = capsys.readouterr().out
    assert "`torch.randn` (line 4)" in out and "--seed S" in out
    nb.run_cell_magic(
        "gpu_parallel",
        "--seed 1",
        "vals = []\nfor i in range(4):\n    vals.append(float(torch.randn(1)))\n",
    )
    assert "--seed S" not in capsys.readouterr().out


def test_tokens_see_in_place_changes_and_ignore_fresh_views() -> None:
    a = np.arange(6.0).reshape(3, 2)
    rows = lambda: iter(a)  # noqa: E731 - each call makes new views
    before = checkin.snapshot({}, [], rows)
    assert not a.flags.writeable or True
    assert checkin.changes(before, {}, rows) == []
    t = torch.zeros(3)
    d = {"t": t, "xs": [1, 2], "s": "x"}
    before = checkin.snapshot({"d": d}, ["d"], None)
    assert checkin.changes(before, {"d": d}, None) == []
    t.add_(1)
    assert [n for n, _ in checkin.changes(before, {"d": d}, None)] == ["d"]
    before = checkin.snapshot({"d": d}, ["d"], None)
    d["xs"][0] = 5
    assert [n for n, _ in checkin.changes(before, {"d": d}, None)] == ["d"]


def test_a_generator_that_reads_what_the_body_changes_is_refused(nb):
    from gpucell.errors import NotParallelizable

    nb.run_cell("def sizes(n):\n    for _ in range(n):\n        yield len(out)\n")
    nb.user_ns["out"] = []
    with pytest.raises(
        NotParallelizable, match=r"generator `sizes`, which reads `out`"
    ):
        nb.run_cell_magic(
            "gpu_parallel", "--quiet", "for k in sizes(5):\n    out.append(k)\n"
        )
    assert nb.user_ns["out"] == []
    # serially the items interleave with the body: [0, 1, 2, 3, 4]
    nb.run_cell("for k in sizes(5):\n    out.append(k)\n")
    assert nb.user_ns["out"] == [0, 1, 2, 3, 4]
    # a generator that reads nothing the body changes runs
    nb.run_cell("def squares(n):\n    for i in range(n):\n        yield i * i\n")
    nb.user_ns["out"] = []
    nb.run_cell_magic(
        "gpu_parallel", "--quiet", "for k in squares(5):\n    out.append(k)\n"
    )
    assert nb.user_ns["out"] == [0, 1, 4, 9, 16]


def test_moving_an_input_to_another_device_is_not_a_change():
    """``model.cuda()`` on a GPU engine moves the engine's copy: its placement,
    not a change of the kernel's model (here the meta device stands in)."""
    model = torch.nn.Linear(3, 2)
    before = checkin.snapshot({"model": model}, ["model"], None)
    model.to("meta")
    assert checkin.changes(before, {"model": model}, None) == []
    # a change that is not a move is still one
    other = torch.nn.Linear(3, 2)
    before = checkin.snapshot({"m": other}, ["m"], None)
    other.double()  # new dtype on the same device
    assert [n for n, _ in checkin.changes(before, {"m": other}, None)] == ["m"]
    t = torch.zeros(3)
    before = checkin.snapshot({"t": t}, ["t"], None)
    t.add_(1)
    assert [n for n, _ in checkin.changes(before, {"t": t}, None)] == ["t"]


# -- classes are inputs like functions, never taken for instances ------------------

CLASSES = """
import dataclasses
from torch import nn

class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(3, 1)
    def forward(self, x):
        return self.fc(x)

@dataclasses.dataclass
class Config:
    lr: float
    epochs: int = 2

class Ridge:
    alpha = 1.0
    def __init__(self, alpha=None):
        self.alpha = self.alpha if alpha is None else alpha
    def fit(self, x):
        self.coef_ = float(x) / (1 + self.alpha)
        return self
"""


def test_tokens_of_classes_are_taken_as_classes(ip) -> None:
    ip.run_cell(CLASSES)
    for name in ("Net", "Config", "Ridge"):
        cls = ip.user_ns[name]
        assert checkin.token(cls)[0] == "class", name
        assert checkin.changes({"c": checkin.token(cls)}, {"c": cls}, None) == []
    for cls in (torch.Tensor, torch.nn.Parameter, torch.nn.Linear, np.ndarray):
        assert checkin.token(cls) == checkin.token(cls)  # no call of an unbound method


def test_a_notebook_module_class_built_in_the_loop_runs_as_serially(nb):
    nb.run_cell(CLASSES)
    nb.run_cell("X = torch.randn(8, 3)\nY = torch.randn(8, 1)")
    cell = (
        "losses = {}\nfor lr in [0.01, 0.1, 0.3]:\n"
        "    torch.manual_seed(0)\n    model = Net()\n"
        "    opt = torch.optim.SGD(model.parameters(), lr=lr)\n"
        "    for _ in range(5):\n        opt.zero_grad()\n"
        "        loss = ((model(X) - Y) ** 2).mean()\n"
        "        loss.backward()\n        opt.step()\n"
        "    losses[lr] = loss.item()\n"
    )
    nb.run_cell(cell)
    serial = dict(nb.user_ns["losses"])
    nb.user_ns.pop("losses")
    nb.run_cell_magic("gpu_parallel", "--quiet", cell)
    assert nb.user_ns["losses"] == serial


def test_a_dataclass_and_a_class_with_class_attributes_run_as_serially(nb):
    nb.run_cell(CLASSES)
    nb.run_cell("configs = [Config(0.1), Config(0.2, 3)]")
    nb.run_cell_magic(
        "gpu_parallel",
        "--quiet",
        "fits = []\nfor c in configs:\n"
        "    fits.append(Ridge(c.lr).fit(c.epochs).coef_)\n",
    )
    assert nb.user_ns["fits"] == [2 / 1.1, 3 / 1.2]
    assert nb.user_ns["Ridge"].alpha == 1.0


def test_a_class_attribute_the_loop_changes_fails_naming_it(nb):
    nb.run_cell(
        "class Counter:\n    n = 0\n    def __init__(self):\n"
        "        Counter.n += 1\n        self.id = Counter.n\n"
    )
    err = _fails_atomically(
        nb,
        "ids = []\nfor i in range(4):\n    ids.append(Counter().id)\n",
        ["Counter"],
        r"`Counter` changed in place",
    )
    assert "`n`" in str(err)


# -- writers that ignore read-only: the checksum sees them ---------------------------


def test_a_function_writing_an_input_array_through_ufunc_at_fails(nb):
    nb.run_cell(
        "counts = np.zeros(5, dtype=int)\n"
        "def count(c, i):\n    np.add.at(c, [i % 5], 1)\n    return i\n"
    )
    _fails_atomically(
        nb,
        "seen = []\nfor i in range(10):\n    seen.append(count(counts, i))\n",
        ["counts"],
        r"`counts` changed in place.*ignores read-only",
    )
    assert nb.user_ns["counts"].tolist() == [0] * 5


def test_a_function_writing_an_input_array_through_torch_from_numpy_fails(nb):
    nb.run_cell(
        "a = np.zeros(4)\n"
        "def bump(x, i):\n    torch.from_numpy(x).add_(1)\n    return i\n"
    )
    _fails_atomically(
        nb,
        "seen = []\nfor i in range(6):\n    seen.append(bump(a, i))\n",
        ["a"],
        r"`a` changed in place",
    )


def test_array_tokens_checksum_within_a_budget() -> None:
    a = np.zeros(10)
    before = checkin.token(a)
    np.add.at(a, [1], 1)  # ignores the read-only flag the token set
    assert not a.flags.writeable and a[1] == 1
    assert checkin.changes({"a": before}, {"a": a}, None)
    big = np.zeros((checkin.MAX_CONTENT_BYTES // 8) + 1)
    assert checkin.token(big)[2] is None  # beyond the budget: read-only only


def test_numpy_scalars_and_dtypes_are_values_not_arrays(nb):
    # a scalar's array interface points at a copy made anew: its address moved
    # whenever the loop kept arrays alive, and the input was reported changed
    nb.run_cell("labels = np.arange(7)\nn = labels.max()\ndt = np.dtype('f4')")
    for name in ("n", "dt"):
        v = nb.user_ns[name]
        assert checkin.token(v) == checkin.token(v)
    nb.run_cell_magic(
        "gpu_parallel",
        "--quiet",
        "keep = []\nfor i in range(12):\n"
        "    keep.append(np.zeros(3, dtype=dt) + int(np.minimum(n, i)))\n",
    )
    assert [int(k[0]) for k in nb.user_ns["keep"]] == [min(6, i) for i in range(12)]
    assert {k.dtype for k in nb.user_ns["keep"]} == {np.dtype("f4")}


def test_backward_reaching_an_input_no_call_names_fails(nb):
    # `w` is only multiplied (no call names it), but backward() fills its grad
    nb.run_cell(
        "w = torch.ones(3, requires_grad=True)\n"
        "xs = [torch.tensor([1.0, 2.0, 3.0]) * k for k in range(4)]"
    )
    err = _fails_atomically(
        nb,
        "outs = []\nfor x in xs:\n    out = (w * x).sum()\n    out.backward()\n"
        "    outs.append(out.item())\n",
        ["w"],
        r"`w` changed in place",
    )
    assert "grad" in str(err)
    assert nb.user_ns["w"].grad is None


def test_an_attribute_a_notebook_function_keeps_state_in_fails(nb):
    nb.run_cell("def step(x):\n    step.calls += 1\n    return x * 2\nstep.calls = 0")
    err = _fails_atomically(
        nb,
        "ys = []\nfor x in range(6):\n    ys.append(step(x))\n",
        ["step"],
        r"`step` changed in place",
    )
    assert "`calls`" in str(err)
    assert nb.user_ns["step"].calls == 0


# -- changes that bump no counter and change no byte --------------------------------


def test_hooks_on_an_input_module_or_its_tensors_are_a_change() -> None:
    """``register_forward_hook``, ``p.register_hook``... bump no version
    counter and set no public attribute: the tokens hold the hooks."""
    net = torch.nn.Sequential(torch.nn.Linear(2, 3), torch.nn.ReLU())
    for register in (
        lambda: net[1].register_forward_hook(lambda *a: None),
        lambda: net.register_forward_pre_hook(lambda *a: None),
        lambda: net[0].register_full_backward_hook(lambda *a: None),
        lambda: net.register_load_state_dict_post_hook(lambda *a: None),
        lambda: net[0].weight.register_hook(lambda g: g),
        lambda: net[0].bias.register_post_accumulate_grad_hook(lambda p: None),
    ):
        before = checkin.snapshot({"net": net}, ["net"], None)
        handle = register()
        [(name, what)] = checkin.changes(before, {"net": net}, None)
        assert name == "net" and "hooks were added" in what, what
        assert "register hooks before the loop" in what
        before = checkin.snapshot({"net": net}, ["net"], None)
        handle.remove()
        assert "hooks were removed" in checkin.changes(before, {"net": net}, None)[0][1]
    t = torch.zeros(2, requires_grad=True)
    before = checkin.snapshot({"t": t}, ["t"], None)
    t.register_hook(lambda g: g)
    assert "hooks were added" in checkin.changes(before, {"t": t}, None)[0][1]


def test_a_logger_s_configuration_is_its_token() -> None:
    """A logger pickles by name (the engine's copy is the engine's logger):
    its pickled state never changes, its configuration does."""
    import logging

    lg = logging.getLogger("test_checkin.configured")
    changes = (
        lambda: lg.setLevel(logging.WARNING),
        lambda: lg.addHandler(logging.NullHandler()),
        lambda: lg.addFilter(lambda r: True),
        lambda: setattr(lg, "disabled", True),
        lambda: setattr(lg, "propagate", False),
    )
    try:
        for change in changes:
            before = checkin.snapshot({"lg": lg}, ["lg"], None)
            lg.info("records change nothing")
            assert checkin.changes(before, {"lg": lg}, None) == []
            change()
            [(name, what)] = checkin.changes(before, {"lg": lg}, None)
            assert name == "lg" and "configure loggers before the loop" in what
    finally:
        lg.setLevel(logging.NOTSET)
        lg.handlers.clear()
        lg.filters.clear()
        lg.disabled, lg.propagate = False, True


def test_an_array_s_writeable_flag_is_part_of_its_token() -> None:
    """An input made read-only by the check is not changed by that; made
    writable again by the loop it is (beyond the checksum's budget too).
    An item's flag is its own: made read-only, it changed."""
    a = np.zeros(3)
    for _chunk in range(2):  # (the first chunk's freezing, then a later one's)
        before = checkin.snapshot({"a": a}, ["a"], None)
        assert checkin.changes(before, {"a": a}, None) == []
    a.flags.writeable = True
    [(_name, what)] = checkin.changes(before, {"a": a}, None)
    assert "made writable" in what
    arrays = [np.zeros(2), np.zeros(2)]
    before = checkin.snapshot({}, [], lambda: arrays)
    arrays[1].flags.writeable = False
    assert [n for n, _ in checkin.changes(before, {}, lambda: arrays)] == [""]


def test_a_helper_that_hooks_an_input_model_fails_naming_it(nb):
    nb.run_cell(
        "model = torch.nn.Linear(2, 1)\nseen = []\n"
        "def watched(m):\n"
        "    m.register_forward_hook(lambda *a: seen.append(1))\n"
        "    return m\n"
    )
    _fails_atomically(
        nb,
        "outs = []\nfor i in range(4):\n"
        "    outs.append(watched(model)(torch.ones(2)).item())\n",
        ["model"],
        r"`model` changed in place .*hooks were added",
    )
    assert not nb.user_ns["model"]._forward_hooks
