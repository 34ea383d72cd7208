"""An own item whose state is not all in its attributes is never written back
by its attributes (``engine/checkout.py``): a ``random.Random`` (its state in
its C base: written back by that state), a notebook subclass of ``dict`` or
``list`` (its elements: written back with them, unless it overrides a store),
or a change to what every instance of a notebook class shares (a class-level
list appended to through ``self``, ``type(self).count += 1``). Each was
silently lost (found by tests/test_sweep_loops_writeback.py); now the chunk
fails, naming the item, and the input check sees the class's change.

The classes are made in a ``__main__``-like namespace, as a notebook's are.
"""

from __future__ import annotations

import random
import types
from typing import Any

import pytest

from gpucell.engine import checkin, checkout


def _notebook(src: str) -> dict[str, Any]:
    ns: dict[str, Any] = {"__name__": "__main__"}
    exec(compile(src, "<cell>", "exec"), ns)
    return ns


def _run(items: list[Any], step) -> tuple[list, list[str], bool]:
    """checkout's updates and refusals, and whether the input check saw the
    items change, for ``step`` applied to each item."""
    tok = checkin.snapshot({}, [], lambda: items)
    was = checkout.before(items, 0)
    for x in items:
        step(x)
    seen = [n for n, _ in checkin.changes(tok, {}, lambda: items)] == [""]
    updates, cannot = checkout.changes(was, items, 0)
    return updates, cannot, seen


def test_a_random_instance_is_written_back_by_its_state_not_its_attributes():
    """(Its attributes are ``gauss_next`` only; tests/test_writeback_kinds.py
    applies the state and draws on.)"""
    items = [random.Random(1), random.Random(2)]
    updates, cannot, seen = _run(items, random.Random.random)
    assert seen and not cannot
    assert [u[2] for u in updates] == [("random", g.getstate()) for g in items]


@pytest.mark.parametrize(
    "src, step",
    [
        (
            "class Row(dict):\n    pass\nitems = [Row(a=1), Row(a=2)]\n",
            lambda r: r.update(b=1),
        ),
        (
            "class Stack(list):\n    pass\nitems = [Stack([1]), Stack()]\n",
            lambda s: s.append(9),
        ),
    ],
    ids=["dict-subclass", "list-subclass"],
)
def test_notebook_container_subclasses_are_written_back_elements_and_all(src, step):
    """Their elements as a dict's or list's, their attributes as an object's
    (``("dict", keys, elements, attributes)``); a subclass that overrides a
    store is not (the kernel's refill would run it again)."""
    items = _notebook(src)["items"]
    items[0].tag = "t"
    updates, cannot, seen = _run(items, step)
    assert seen and not cannot and len(updates) == 2
    assert [u[2][0] for u in updates] == [type(items[0]).__mro__[1].__name__] * 2
    assert updates[0][2][3][0] == {}  # (attributes: none changed)
    loud = _notebook(
        src.replace("    pass\n", "    def __setitem__(self, k, v):\n        pass\n")
    )["items"]
    updates, cannot, seen = _run(loud, step)
    assert seen and not updates and len(cannot) == 2


@pytest.mark.parametrize(
    "src",
    [
        "class Bag:\n    contents = []\n"
        "    def step(self):\n        self.contents.append(1)\n",
        "class Job:\n    done = 0\n    def step(self):\n        type(self).done += 1\n",
        "class Base:\n    seen = []\nclass Job(Base):\n"
        "    def step(self):\n        self.seen.append(1)\n        self.ok = True\n",
    ],
    ids=["class-list", "class-counter", "base-class-list"],
)
def test_a_change_to_a_notebook_class_through_an_item_fails_the_chunk(src):
    ns = _notebook(src)
    cls = [v for k, v in ns.items() if isinstance(v, type) and k != "Base"][0]
    updates, cannot, seen = _run([cls(), cls()], lambda x: x.step())
    assert seen, "the input check must see the class's change"
    assert not updates and cannot
    assert f"an attribute of its class `{cls.__qualname__}` changed" in cannot[0]


def test_plain_objects_namespaces_and_estimators_are_still_written_back():
    ns = _notebook(
        "class P:\n    kind = 'p'\n    def __init__(self):\n        self.x = 1\n"
    )
    items = [ns["P"](), types.SimpleNamespace(x=1)]
    updates, cannot, _ = _run(items, lambda o: setattr(o, "x", o.x + 1))
    assert not cannot and [u[2][0] for u in updates] == ["attrs", "attrs"]
    sklearn = pytest.importorskip("sklearn.linear_model")
    est = [sklearn.LinearRegression(), sklearn.LinearRegression()]
    updates, cannot, _ = _run(est, lambda m: m.fit([[0.0], [1.0]], [0.0, 2.0]))
    assert not cannot and len(updates) == 2


def test_an_unpicklable_class_attribute_is_left_out_of_the_class_state():
    """(Else the whole items' token would prove nothing, hiding every change.)"""
    import threading

    ns = _notebook("class P:\n    n = 0\n")
    ns["P"].lock = threading.Lock()
    state = checkin.class_state(ns["P"])
    assert not checkin._unchecked(state) and [p[1] for p in state[1]] == ["n"]


def test_an_optimizer_only_with_its_module_and_a_holder_of_a_model_never():
    """Written back by attributes, an optimizer would hold the engine's copies
    of the parameters (its ``state`` keys, its ``param_groups``): the kernel's
    would step tensors no model has.  By its ``state_dict`` (parameters by
    position) it can be, where the item holds the module it steps (else the
    steps would be lost).  A trainer's ``model`` never."""
    torch = pytest.importorskip("torch")
    nets = [torch.nn.Linear(2, 1) for _ in range(2)]
    items = [(n, torch.optim.Adam(n.parameters(), lr=0.1)) for n in nets]

    def step(pair):
        net, opt = pair
        opt.zero_grad()
        net(torch.ones(3, 2)).sum().backward()
        opt.step()

    updates, cannot, seen = _run(items, step)
    # with its own module in the item: by its state_dict (parameters by position)
    assert seen and not cannot
    kinds = sorted((u[1], u[2][0]) for u in updates)
    assert kinds == [((0,), "module")] * 2 + [((1,), "torchstate")] * 2
    alone = [torch.optim.Adam(n.parameters(), lr=0.1) for n in nets]
    _, cannot, _ = _run(alone, lambda o: step((nets[alone.index(o)], o)))
    assert len(cannot) == 2 and "parameters of no module in the same item" in cannot[0]
    ns = _notebook(
        "class Trainer:\n    def __init__(self, m):\n        self.model = m\n"
    )
    trainers = [ns["Trainer"](torch.nn.Linear(2, 1)) for _ in range(2)]
    _, cannot, _ = _run(trainers, lambda t: setattr(t, "model", torch.nn.Linear(2, 1)))
    assert len(cannot) == 2 and "attribute `model`" in cannot[0]
