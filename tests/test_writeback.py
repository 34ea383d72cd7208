"""core/writeback.py without a cluster: where an iteration's changes to its
own item are refused (nothing written) and how they are applied in place."""

from __future__ import annotations

import numpy as np
import pytest

from gpucell.core import writeback as w
from gpucell.errors import NotParallelizable


def _refused(updates, items, inputs=None, match=""):
    with pytest.raises(NotParallelizable, match=match):
        w.resolve(updates, lambda i: items[i], inputs or {}, len(items))


def test_one_object_twice_even_if_only_the_first_changed_it() -> None:
    d: dict = {}
    _refused([(0, (), ("dict", [], [("x", "new", 1)]))], [d, d], match="one object")


def test_an_item_held_deep_in_an_input_or_another_item() -> None:
    a, b = {"n": 1}, {"n": 2}
    up = [(0, (), ("dict", ["n"], [("n", "new", 5)]))]
    _refused(up, [a, b], {"reg": [[{"k": a}]]}, match="`reg` holds it")
    _refused(up, [a, {"child": a}], match="one object|holds it")


def test_views_and_overlapping_windows() -> None:
    base = np.arange(10.0)
    wins = [base[0:6], base[4:10]]
    _refused([(0, (), ("array", wins[0] * 2))], wins, match="shares its memory")
    P = np.arange(12.0).reshape(4, 3)
    rows = [(i, (), ("array", P[i] / 2)) for i in range(4)]
    _refused(rows, list(P), {"P": P}, match="`P` shares")


def test_what_a_notebook_function_reads_counts_as_an_input() -> None:
    K = np.arange(12.0).reshape(4, 3)
    g = {"K": K, "__name__": "__main__"}
    exec("def shift(r):\n    r -= K.mean()\n", g)
    rows = [(i, (), ("array", K[i] - 1)) for i in range(4)]
    _refused(rows, list(K), {"shift": g["shift"]}, match="what `shift` reads")


def test_items_made_anew_on_each_read() -> None:
    class Box:
        def __init__(self) -> None:
            self.a = 1

    with pytest.raises(NotParallelizable, match="makes its items anew"):
        w.resolve([(0, (), ("attrs", {"a": 2}, [], []))], lambda i: Box(), {}, 1)


def test_containers_keep_their_elements_identity() -> None:
    inner = [3]
    lst = [[1], inner, [2]]
    rows = {"a": 1, "keep": inner}
    targets = w.resolve(
        [
            (
                0,
                (),
                ("list", 3, [(None, "old", 1), (None, "old", 0), (None, "old", 2)]),
            ),
            (1, (), ("dict", ["a", "keep"], [("keep", "old", 1), ("t", "new", 9)])),
        ],
        lambda i: [lst, rows][i],
        {},
        2,
    )
    w.apply(targets)
    assert lst == [[3], [1], [2]] and lst[0] is inner
    assert rows == {"keep": [3], "t": 9} and rows["keep"] is inner
    assert list(rows) == ["keep", "t"]


def test_rows_of_an_array_written_into_it() -> None:
    P = np.arange(1.0, 13.0).reshape(4, 3)
    rows = [(i, (), ("array", P[i] / P[i].sum())) for i in range(4)]
    w.apply(w.resolve(rows, lambda i: P[i], {}, 4))
    assert np.allclose(P.sum(axis=1), 1.0)


def _module_update(m) -> tuple:
    return (
        "module",
        {
            "params": {n: p.detach() * 2 for n, p in m.named_parameters()},
            "grads": {n: None for n, _p in m.named_parameters()},
            "buffers": {n: b for n, b in m.named_buffers() if b is not None},
            "training": {n: s.training for n, s in m.named_modules()},
            "attrs": ({}, [], []),
        },
    )


def test_modules_that_share_a_part_are_refused_by_its_name() -> None:
    """A shared encoder, a tied weight, an input that is a submodule: serially
    the one object takes every iteration's change; here the last engine's
    write-back would win (found by the write-back sweep, silently different)."""
    torch = pytest.importorskip("torch")
    nn = torch.nn
    enc = nn.Linear(2, 2)
    nets = [nn.Sequential(enc, nn.Linear(2, 1)) for _ in range(2)]
    ups = [(i, (), _module_update(n)) for i, n in enumerate(nets)]
    _refused(ups, nets, match=r"share one object \(its submodule `0`")
    tied = nn.Parameter(torch.ones(2))
    heads = [nn.Linear(2, 1) for _ in range(2)]
    for h in heads:
        h.weight = tied
    ups = [(i, (), _module_update(h)) for i, h in enumerate(heads)]
    _refused(ups, heads, match="parameter `weight`")
    # only the first changed: the second item still holds its part
    _refused(ups[:1], heads, match="the item of iteration 1 is or holds")
    own = [nn.Sequential(nn.Linear(2, 2), nn.Linear(2, 1)) for _ in range(2)]
    ups = [(i, (), _module_update(n)) for i, n in enumerate(own)]
    _refused(
        ups[:1],
        own,
        {"probe": own[0][0]},
        match="`probe` is or holds its submodule `0`",
    )
    # items with parts of their own are written back, each in place
    before = [p for n in own for p in n.parameters()]
    want = [u[1]["params"][k] for _i, _p, u in ups for k in u[1]["params"]]
    w.apply(w.resolve(ups, lambda i: own[i], {}, 2))
    after = [p for n in own for p in n.parameters()]
    assert all(a is b for a, b in zip(after, before, strict=True))
    assert all(torch.equal(a, x) for a, x in zip(after, want, strict=True))


def test_a_counter_item_is_refilled_as_a_dict_not_counted_again() -> None:
    from collections import Counter

    c = Counter("ab")
    targets = w.resolve(
        [(0, (), ("dict", ["a", "b"], [("a", "new", 2), ("b", "old", 1)]))],
        lambda i: [c][i],
        {},
        1,
    )
    w.apply(targets)
    assert c == Counter({"a": 2, "b": 1}) and type(c) is Counter
