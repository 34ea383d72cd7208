"""An iteration's own item reached through its container (``models[i]``,
``groups[k]``), a name for a part of an item, a nested loop over its parts,
an iterator's position, and the restoring ``with`` trusted only where its
function is its library's: the analysis's decisions and the pure write-back,
without a cluster (tests/test_sweep_loops_writeback.py runs them)."""

from __future__ import annotations

import contextlib
import pickle
import warnings

import pytest

from gpucell.core import writeback
from gpucell.core.analysis import analyse
from gpucell.core.lastitem import LAST_ITEM, data_writes, process_state_calls
from gpucell.engine import checkout
from gpucell.errors import NotParallelizable

KNOWN = {"models", "X", "y", "groups", "d", "opts", "nets", "base", "n", "obj"}


def own_names(src: str) -> tuple[str, ...]:
    """The hidden names of the own elements the loop runs with (none: as written)."""
    p = analyse(src, known_names=KNOWN)
    return tuple(h for h in p.hidden if h.startswith("__gpucell_own_"))


@pytest.mark.parametrize(
    "src",
    [
        "for i in range(len(models)):\n    models[i].fit(X, y)\n",
        "for k in groups:\n    groups[k].sort()\n",
        "for k in groups.keys():\n    g = groups[k]\n    g.append(k)\n",
        "for name, m in models.items():\n    opts[name].zero_grad()\n",
        "for i, m in enumerate(models):\n    nets[i].load(m)\n",
        "for i in range(n):\n    models[i].coef = None\n",
        # a call: the kernel evaluates the iterable once (iterspace.with_own_items)
        "for i, m in enumerate(make()):\n    models[i].fit(X, y)\n",
    ],
)
def test_an_element_the_iteration_owns_is_its_item(src: str) -> None:
    assert own_names(src)


@pytest.mark.parametrize(
    "src",
    [
        # read only: runs as written (nothing to write back)
        "out = []\nfor i in range(len(X)):\n    out.append(X[i].sum())\n",
        "out = []\nfor i in range(len(X)):\n    x = X[i]\n    out.append(x * 2)\n",
    ],
)
def test_a_loop_that_needs_no_own_element_runs_as_written(src: str) -> None:
    assert not own_names(src)


@pytest.mark.parametrize(
    "src",
    [
        "for i in range(len(models)):\n    models[i + 1].grow()\n    models[i].x = 1\n",
        "for i in range(len(models)):\n    models[i].grow()\n    models.reverse()\n",
        "for k in d:\n    d[k].append(len(d['a']))\n",
        "for i in range(n):\n    models[i][0] = obj\n    models[i][0].grow()\n",
        "for i in range(len(models)):\n    i = i + 1\n    models[i].grow()\n",
    ],
)
def test_an_element_not_surely_the_iterations_own_keeps_the_loop_as_written(
    src: str,
) -> None:
    """Another index, the container changed, an outer object stored in the
    element, the index rebound: refused as written, or watched (the engines'
    input check stops it), never run with its own elements."""
    try:
        assert not own_names(src)
    except NotParallelizable:
        pass


def test_a_name_for_a_part_and_a_nested_loops_variable_are_the_items() -> None:
    p = analyse(
        "for m in nets:\n    enc = m.encoder\n    enc.reset()\n"
        "    for p in m.backbone.parameters():\n        p.requires_grad = False\n",
        known_names=KNOWN,
    )
    assert p.ok and {3, 5} <= set(p.watch_items)
    with pytest.raises(NotParallelizable, match="`p`"):  # another input's
        analyse(
            "for m in nets:\n    for p in base.parameters():\n"
            "        p.requires_grad = False\n",
            known_names=KNOWN,
        )
    with pytest.raises(NotParallelizable, match=r"through a tensor's `\.data`"):
        analyse(
            "for m in nets:\n    for p in m.parameters():\n        p.data.mul_(2)\n",
            known_names=KNOWN,
        )


def test_the_loop_variable_is_the_items_first_part() -> None:
    p = analyse("for k in groups:\n    groups[k].sort()\n", known_names=KNOWN)
    key = ("a", 1)
    ns = {LAST_ITEM: (key, [1, 2])}
    exec(p.facts.last_item, ns)
    assert ns["k"] is key


def test_an_own_key_under_enumerate_is_checked_as_the_enumerated_items() -> None:
    p = analyse("for r, k in enumerate(d):\n    d[k] = d[k] * r\n", known_names=KNOWN)
    assert p.ok and "d" in p.writes


def _written_back(make) -> list:
    """An iterator item advanced on a copy (as on an engine), its position
    written into the original (as the kernel does)."""
    kernel = make()
    engine = pickle.loads(pickle.dumps(kernel))
    was = checkout.before([engine], 0)
    next(engine)
    ups, cannot = checkout.changes(was, [engine], 0)
    assert not cannot
    writeback.apply(writeback.resolve(ups, lambda _i: kernel, {}, 1))
    return list(kernel)


@pytest.mark.parametrize(
    "make, left",
    [
        (lambda: iter([1, 2, 3]), [2, 3]),
        (lambda: reversed([1, 2, 3]), [2, 1]),
        (lambda: iter(range(5, 8)), [6, 7]),
        (lambda: iter("xyz"), ["y", "z"]),
        (lambda: iter((7,)), []),
    ],
)
def test_a_sequence_iterators_position_is_written_back(make, left) -> None:
    assert _written_back(make) == left


def catch_warnings() -> contextlib.AbstractContextManager[None]:
    """A notebook's own function named as the library's: restores nothing."""
    return contextlib.nullcontext()


def test_a_restoring_with_counts_only_where_its_function_is_the_librarys() -> None:
    src = (
        "for i in range(3):\n    with catch_warnings():\n"
        "        warnings.simplefilter('ignore')\n"
    )
    resolve_own = {"catch_warnings": catch_warnings, "warnings": warnings}.get
    resolve_lib = {"catch_warnings": warnings.catch_warnings}.get
    assert process_state_calls(src, 1, resolve_own) == [(3, "warnings.simplefilter")]
    assert process_state_calls(src, 1, resolve_lib) == []
    # the cell's own import says where the name comes from
    imported = "from warnings import catch_warnings\n" + src
    assert process_state_calls(imported, 2, resolve_own) == []


def test_a_helpers_changes_through_data_are_found() -> None:
    """``.data`` moves no version counter: the engines could not see it."""
    src = (
        "def sgd(m, lr):\n    for p in m.parameters():\n"
        "        p.data -= lr * p.grad\n        p.data.clamp_(-1, 1)\n"
        "        p.data[0] = 0\n        p.data = p.data * 2\n"
        "        q = p.data.clone()\n"
    )
    assert data_writes(src) == [
        (3, "p.data"),
        (4, "p.data.clamp_"),
        (5, "p.data[0]"),
    ]


def test_an_iterator_of_keys_is_read_once_and_the_elements_are_the_kernels() -> None:
    """``for k in it: C[k].sort()`` with ``it`` an iterator: the kernel draws
    the keys once and reads ``C[k]`` for each (the rewritten loop read the
    iterable twice and stopped with a bare zip length error)."""
    from gpucell.core.analysis import make_chunker
    from gpucell.protocol.chunks import chunk_items, item_refs

    p = analyse("for k in it:\n    C[k].sort()\n", known_names={"C", "it"})
    assert p.iter_space is not None and p.iter_space.leaves == ("it", "C")
    C = {"a": [3, 1], "b": [2, 0], "c": [1]}
    it = iter(["b", "c", "a"])
    chunker = make_chunker(p.iter_space, [it, C])
    assert next(it, None) is None  # drawn once, whole
    items = list(chunk_items(chunker.chunk(0, chunker.count)))
    assert [k for k, _ in items] == ["b", "c", "a"]
    assert all(e is C[k] for k, e in items)
    # the engines name each own element by its place in the zip's own part
    refs = item_refs(chunker.chunk(1, 3), 1)
    assert refs[id(C["c"])] == (1, 1) and refs[id(C["a"])] == (2, 1)
    q = analyse(
        "for i, (k, v) in enumerate(d.items()):\n    d[k].sort()\n", known_names={"d"}
    )
    assert q.iter_space is not None
    chunker = make_chunker(q.iter_space, [C.items(), C])
    assert [e for _, e in chunk_items(chunker.chunk(0, 3))] == list(C.values())


def test_the_dry_run_spells_an_own_element_as_the_user_wrote_it() -> None:
    from gpucell.core.analysis.report import format_plan

    p = analyse(
        "for i in range(len(models)):\n    models[i].fit(X, y)\n", known_names=KNOWN
    )
    text = format_plan(p)
    assert "__gpucell_" not in text
    assert "own item `models[i]`" in text and "range `range(len(models))`" in text


def test_an_iterators_keys_are_each_followed_by_their_element() -> None:
    """A generator of keys that replaces an element while drawing: ``C[k]``
    is read right after ``k`` is drawn, as serially (never after every
    draw); an iterator inside ``enumerate`` is refused before it is drawn,
    naming the rewrite."""
    from gpucell.core.analysis import make_chunker
    from gpucell.protocol.chunks import chunk_items

    C: dict[str, list[int]] = {"a": [2, 1], "b": [4, 3]}
    old_a = C["a"]

    def keys():  # noqa: ANN202 - a generator
        yield "a"
        C["a"] = [9]  # after `a` was drawn: serially iteration 0 had old_a
        yield "b"

    p = analyse("for k in it:\n    C[k].sort()\n", known_names={"C", "it"})
    assert p.iter_space is not None
    chunker = make_chunker(p.iter_space, [keys(), C])
    got = [e for _, e in chunk_items(chunker.chunk(0, chunker.count))]
    assert got[0] is old_a and got[1] is C["b"]
    q = analyse(
        "for i, k in enumerate(it):\n    C[k].sort()\n", known_names={"C", "it"}
    )
    assert q.iter_space is not None
    it = iter(["a", "b"])
    with pytest.raises(NotParallelizable, match=r"`C\[k\]`.*items = list"):
        make_chunker(q.iter_space, [it, C])
    assert next(it) == "a"  # not drawn
