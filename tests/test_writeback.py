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
