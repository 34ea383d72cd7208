"""Merge: all-or-nothing, iteration order, identity of mutated objects."""

from __future__ import annotations

import copy
import sys
from collections import Counter, defaultdict
from pathlib import Path
from typing import Any

import pytest

from gpucell.core.analysis import analyse, make_chunker
from gpucell.core.merge import merge, prepare
from gpucell.engine.chunk import ChunkResult, run_chunk
from gpucell.errors import NotParallelizable

sys.path.insert(0, str(Path(__file__).parent))
from cellgen import run_parallel_local, run_serial  # noqa: E402

np = pytest.importorskip("numpy")


def chunks(src: str, ns: dict[str, Any], bounds: list[tuple[int, int]]) -> tuple:
    plan = analyse(src, known_names=ns.keys())
    assert plan.iter_space is not None
    vals = [eval(e, dict(ns)) for e in plan.iter_space.leaves]
    ch = make_chunker(plan.iter_space, vals)
    inputs = {n: ns[n] for n in plan.inputs}
    prog = plan.engine_program()
    return plan, [run_chunk(prog, inputs, ch.chunk(a, b), a) for a, b in bounds]


def test_failing_prepare_leaves_everything_untouched() -> None:
    src = (
        "for i in range(6):\n"
        "    out.append(i)\n"
        "    acc += i\n"
        "    arr += i\n"
        "    s.add(i)\n"
        "    d[i] = i\n"
        "    w[i] = i\n"  # w has 4 items: index 4 and 5 fail
        "    last = i\n"
    )
    out, arr, s, d, w = [9], np.zeros(3), {99}, {}, [0, 0, 0, 0]
    ns = {"out": out, "acc": 1, "arr": arr, "s": s, "d": d, "w": w}
    before = copy.deepcopy(ns)
    plan, results = chunks(src, ns, [(0, 3), (3, 6)])
    with pytest.raises(IndexError):
        merge(plan, results, ns)
    assert ns.keys() == before.keys() and "last" not in ns
    assert ns["out"] is out and out == [9]
    assert ns["arr"] is arr and (arr == 0).all()
    assert s == {99} and d == {} and w == [0, 0, 0, 0] and ns["acc"] == 1


def test_failing_array_write_validation_is_atomic() -> None:
    src = "for i in range(4):\n    out.append(i)\n    a[i] = vals[i]\n"
    a = np.zeros(4)
    ns = {"a": a, "out": [], "vals": [1.0, 2.0, "x", 4.0]}
    plan, results = chunks(src, ns, [(0, 2), (2, 4)])
    with pytest.raises(ValueError):
        merge(plan, results, ns)
    assert (a == 0).all() and ns["out"] == []


def test_failing_inplace_dtype_is_atomic() -> None:
    src = "for i in range(4):\n    out.append(i)\n    a += 0.5\n"
    a = np.zeros(2, dtype=np.int64)
    ns = {"a": a, "out": []}
    plan, results = chunks(src, ns, [(0, 4)])
    with pytest.raises(TypeError, match="dtype"):
        merge(plan, results, ns)
    assert ns["out"] == [] and (a == 0).all()
    with pytest.raises(TypeError):  # serially it fails too (UFuncTypeError)
        run_serial(src, {"a": np.zeros(2, dtype=np.int64), "out": []})


def test_chunk_order_is_restored_and_writes_last_wins() -> None:
    src = "for i in range(10):\n    out.append(i)\n    d[i % 3] = i\n    e = i\n"
    ns = {"out": ["x"], "d": {}}
    plan, results = chunks(src, ns, [(0, 4), (4, 7), (7, 10)])
    merge(plan, list(reversed(results)), ns)
    assert ns["out"] == ["x", *range(10)]
    assert ns["d"] == {0: 9, 1: 7, 2: 8} and list(ns["d"]) == [0, 1, 2]
    assert ns["e"] == 9


def test_gather_keeps_list_identity() -> None:
    out = [1]
    ns = {"out": out}
    plan, results = chunks("for i in range(3):\n    out += [i]\n", ns, [(0, 1), (1, 3)])
    merge(plan, results, ns)
    assert ns["out"] is out and out == [1, 0, 1, 2]


def test_inplace_numpy_reduction_mutates_original_and_alias_sees_it() -> None:
    src = "alias = acc\nfor v in rows:\n    acc += v\n"
    rows = np.arange(12.0).reshape(4, 3)
    ns_s = {"acc": np.zeros(3), "rows": rows}
    ns_p = {"acc": np.zeros(3), "rows": rows}
    acc_p = ns_p["acc"]
    run_serial(src, ns_s)
    run_parallel_local(src, ns_p, (0.3, 0.6))
    assert ns_p["acc"] is acc_p and ns_p["alias"] is acc_p
    assert np.allclose(ns_p["acc"], ns_s["acc"])


def test_plain_reduction_rebinds_new_object() -> None:
    acc = np.zeros(2)
    ns = {"acc": acc}
    plan, results = chunks("for i in range(3):\n    acc = acc + i\n", ns, [(0, 3)])
    merge(plan, results, ns)
    assert ns["acc"] is not acc and (acc == 0).all() and (ns["acc"] == 3).all()


def test_matmul_keeps_chunk_order() -> None:
    rng = np.random.default_rng(0)
    mats = [rng.standard_normal((3, 3)) for _ in range(7)]
    src = "for m in mats:\n    acc = acc @ m\n"
    ns_s = {"acc": np.eye(3), "mats": mats}
    ns_p = {"acc": np.eye(3), "mats": mats}
    run_serial(src, ns_s)
    run_parallel_local(src, ns_p, (0.2, 0.5, 0.9))
    assert np.allclose(ns_s["acc"], ns_p["acc"])


def test_minus_equals_subtracts_the_total() -> None:
    ns = {"acc": 100}
    plan, results = chunks("for i in range(5):\n    acc -= i\n", ns, [(0, 2), (2, 5)])
    merge(plan, results, ns)
    assert ns["acc"] == 90


def test_max_min_and_no_contribution_leaves_value() -> None:
    src = (
        "for i in range(6):\n    if i > 100:\n        mx = max(mx, i)\n"
        "    mn = min(mn, i)\n"
    )
    ns = {"mx": -1, "mn": 3}
    plan, results = chunks(src, ns, [(0, 3), (3, 6)])
    merge(plan, results, ns)
    assert (ns["mx"], ns["mn"]) == (-1, 0)


def test_keyed_reduction_defaultdict_counter_and_missing_key() -> None:
    src = "for w in words:\n    dd[w] += 1\n    c[w] += 2\n"
    words = ["a", "b", "a", "c", "a"]
    dd, c = defaultdict(int), Counter()
    ns = {"dd": dd, "c": c, "words": words}
    plan, results = chunks(src, ns, [(0, 2), (2, 5)])
    merge(plan, results, ns)
    assert (
        ns["dd"] is dd
        and dd == {"a": 3, "b": 1, "c": 1}
        and list(dd) == ["a", "b", "c"]
    )
    assert c == Counter({"a": 6, "b": 2, "c": 2})
    plain: dict[str, int] = {"a": 0}
    ns2 = {"dd": {"a": 0, "b": 0, "c": 0}, "c": plain, "words": words}
    plan, results = chunks(src, ns2, [(0, 5)])
    with pytest.raises(KeyError):
        merge(plan, results, ns2)
    assert plain == {"a": 0} and ns2["dd"] == {"a": 0, "b": 0, "c": 0}


def test_keyed_reduction_on_list_values_mutates_them() -> None:
    inner = [0]
    ns = {"d": {"k": inner}}
    plan, results = chunks(
        "for i in range(3):\n    d['k'] += [i]\n", ns, [(0, 1), (1, 3)]
    )
    merge(plan, results, ns)
    assert ns["d"]["k"] is inner and inner == [0, 0, 1, 2]


def test_union_on_set_and_dict_update_replay() -> None:
    s: set[int] = {100}
    d = {"z": 0}
    src = (
        "for i in range(4):\n    s.add(i % 2)\n    s.update([i])\n"
        "    d.update({i % 2: i})\n"
    )
    ns = {"s": s, "d": d}
    plan, results = chunks(src, ns, [(0, 2), (2, 4)])
    merge(plan, results, ns)
    assert ns["s"] is s and s == {100, 0, 1, 2, 3}
    assert ns["d"] is d and d == {"z": 0, 0: 2, 1: 3}


def test_same_object_under_two_names_refused() -> None:
    shared: list[int] = []
    ns = {"a": shared, "b": shared}
    plan, results = chunks(
        "for i in range(3):\n    a.append(i)\n    b.append(-i)\n", ns, [(0, 3)]
    )
    with pytest.raises(NotParallelizable, match="same object"):
        merge(plan, results, ns)
    assert shared == []


def test_local_deleted_in_last_iteration_is_deleted() -> None:
    src = "for i in range(4):\n    t = i\n    if i == 3:\n        del t\n"
    ns_s: dict[str, Any] = {"t": "old"}
    ns_p: dict[str, Any] = {"t": "old"}
    run_serial(src, ns_s)
    run_parallel_local(src, ns_p, (0.5,))
    assert "t" not in ns_s and "t" not in ns_p


def test_module_local_comes_back_as_module() -> None:
    ns: dict[str, Any] = {}
    run_parallel_local("for i in range(2):\n    import json as js\n", ns)
    import json

    assert ns["js"] is json


def test_empty_loop_changes_nothing_but_listcomp_result() -> None:
    ns: dict[str, Any] = {"out": [], "acc": 5}
    run_parallel_local("for i in range(0):\n    out.append(i)\n    acc += i\n", ns)
    assert ns == {"out": [], "acc": 5} or ns.keys() - {"__builtins__"} == {"out", "acc"}
    ns2: dict[str, Any] = {}
    run_parallel_local("r = [i for i in range(0)]\n", ns2)
    assert ns2["r"] == []


def test_prepare_does_not_touch_view_or_results() -> None:
    src = "for i in range(3):\n    out.append(i)\n    acc += i\n"
    ns = {"out": [7], "acc": np.zeros(1)}
    plan, results = chunks(src, ns, [(0, 3)])
    view = {n: ns[n] for n in plan.affected_names}
    up = prepare(plan, results, view)
    assert ns["out"] == [7] and (ns["acc"] == 0).all()
    assert [m.name for m in up.mutations] == ["out", "acc"]
    up.commit(ns)
    assert ns["out"] == [7, 0, 1, 2] and ns["acc"][0] == 3


def test_chunk_result_pickles() -> None:
    import pickle

    ns = {"out": [], "d": {}}
    plan, (r,) = chunks(
        "for i in range(3):\n    out.append(i)\n    d[i] = i\n", ns, [(0, 3)]
    )
    r2 = pickle.loads(pickle.dumps(r))
    assert isinstance(r2, ChunkResult) and r2 == r


def test_torch_inplace_reduction() -> None:
    torch = pytest.importorskip("torch")
    acc = torch.zeros(2)
    ns = {"acc": acc, "xs": torch.arange(8.0).reshape(4, 2)}
    run_parallel_local("for x in xs:\n    acc += x\n", ns, (0.5,))
    assert ns["acc"] is acc and acc.tolist() == [12.0, 16.0]


def test_keyed_gathers_into_one_list_under_two_keys_are_refused() -> None:
    shared: list[int] = []
    ns = {"xs": list(range(6)), "groups": {0: shared, 1: shared}}
    plan, results = chunks(
        "for x in xs:\n    groups[x % 2].append(x)\n", ns, [(0, 3), (3, 6)]
    )
    with pytest.raises(NotParallelizable, match="same list as another key's"):
        merge(plan, results, ns)
    assert shared == []


def test_a_set_gets_its_items_in_serial_insertion_order():
    """A set's iteration order follows its insertion history (table resizes
    included): ``list(vocab)`` after ``vocab.add(t)`` in the loop must list
    the items as the serial loop leaves them."""
    from gpucell.core.analysis import analyse
    from gpucell.core.merge import merge

    tokens = ("a b c d e f g a b c h i j " * 4).split()
    cell = "for t in tokens:\n    vocab.add(t)\n    vocab.add(t.upper())\n"
    serial: set = set()
    for t in tokens:
        serial.add(t)
        serial.add(t.upper())
    plan = analyse(cell, known_names=["tokens", "vocab"])
    ns = {"vocab": set(), "tokens": tokens}
    half = len(tokens) // 2
    from gpucell.engine.chunk import run_chunk

    prog = plan.engine_program()
    results = [
        run_chunk(prog, ns, ("seq", tokens[a:b]), a)
        for a, b in ((0, half), (half, len(tokens)))
    ]
    merge(plan, results, ns)
    assert list(ns["vocab"]) == list(serial)


def test_chunk_ranges_must_tile_the_iterations_exactly_once() -> None:
    from gpucell.core.merge import check_exactly_once

    def r(start: int, count: int) -> ChunkResult:
        return ChunkResult(start=start, count=count)

    check_exactly_once([r(4, 6), r(0, 4)], 10)
    check_exactly_once([], 0)
    with pytest.raises(RuntimeError, match="iterations 3-3 would be merged twice"):
        check_exactly_once([r(0, 4), r(3, 7)], 10)
    with pytest.raises(RuntimeError, match="iterations 4-4 would be merged never"):
        check_exactly_once([r(0, 4), r(5, 5)], 10)
    with pytest.raises(RuntimeError, match="end at iteration 8, the loop has 10"):
        check_exactly_once([r(0, 8)], 10)


def test_two_reductions_from_one_cached_number_are_not_one_object() -> None:
    """``acc += 0; neg -= 0`` from ``acc = neg = 0``: ``0 - 0 is 0`` (one
    cached int), but a number is never changed in place, so nothing is shared
    (the property test found this refused)."""
    src = "for i in range(4):\n    acc += i % 1\n    neg -= i % 1\n    big += [i]\n"
    ns = {"acc": 0, "neg": 0, "big": []}
    plan, results = chunks(src, ns, [(0, 2), (2, 4)])
    merge(plan, results, ns)
    assert ns["acc"] == 0 and ns["neg"] == 0 and ns["big"] == [0, 1, 2, 3]
    one: list[int] = []
    ns2 = {"acc": one, "neg": one}
    plan, results = chunks(
        "for i in range(2):\n    acc += [i]\n    neg += [i]\n", ns2, [(0, 2)]
    )
    with pytest.raises(NotParallelizable, match="same object"):
        merge(plan, results, ns2)
