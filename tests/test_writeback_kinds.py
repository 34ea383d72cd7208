"""Sets, deques, bytearrays and random generators as own items (issue 28
§1): what the engine's copy ended as (``engine/checkout.py``) is written
into the kernel's object (``core/writeback.py``), identity kept, so every
other name for it sees the change and later draws continue the engine's
stream, as serially.  Each test runs the step on a pickled copy (as an
engine does), sends the updates through pickle and applies them to the
originals; the serial run is the step applied to another copy."""

from __future__ import annotations

import collections
import copy
import random
from collections.abc import Callable
from typing import Any

import cloudpickle
import numpy as np
import pytest

from gpucell.core import writeback as w
from gpucell.engine import checkout, checkout_kinds
from gpucell.errors import NotParallelizable


def _engine(items: list[Any], step: Callable[[Any], Any]) -> tuple[list, list[str]]:
    """The updates an engine sends for ``step`` over copies of ``items``."""
    copies = cloudpickle.loads(cloudpickle.dumps(items))
    was = checkout.before(copies, 0)
    for x in copies:
        step(x)
    updates, cannot = checkout.changes(was, copies, 0)
    return cloudpickle.loads(cloudpickle.dumps(updates)), cannot


def _written(
    items: list[Any], step: Callable[[Any], Any], by_value: bool = True
) -> list[Any]:
    """The serial run's items, after writing the engine's changes back into
    ``items`` (asserted equal to it, ``by_value``; generators compare by
    their later draws)."""
    serial = copy.deepcopy(items)
    for x in serial:
        step(x)
    updates, cannot = _engine(items, step)
    assert not cannot
    kept = list(items)
    w.apply(w.resolve(updates, lambda i: items[i], {}, len(items)))
    assert all(a is b for a, b in zip(items, kept, strict=True))
    assert not by_value or items == serial
    return serial


def test_sets_keep_the_elements_they_kept() -> None:
    class Tag:  # hashed by identity: the kernel's own object must stay
        pass

    tag = Tag()
    sets = [{"a", tag}, set(), {"z", 3}]
    _written(sets, lambda s: (s.add("seen"), s.discard("z"), s.update({1, 2})), False)
    assert sets[0] - {tag} == {"a", "seen", 1, 2} and tag in sets[0]
    assert sets[1:] == [{"seen", 1, 2}, {"seen", 1, 2, 3}]
    # removing an element compared by identity: the kernel's is not the copy's
    with pytest.raises(NotParallelizable, match="not in the kernel's set by value"):
        tagged = [{tag, "a"}]
        updates, _ = _engine(tagged, lambda s: s.discard(next(iter(s - {"a"}))))
        w.resolve(updates, lambda i: tagged[i], {}, 1)


def test_a_set_element_changed_in_place_is_not_written_back() -> None:
    class Box:
        def __init__(self) -> None:
            self.n = 0

    _, cannot = _engine([{Box()}], lambda s: [setattr(b, "n", 1) for b in s])
    assert cannot and "changed in place" in cannot[0]


def test_deques_keep_maxlen_and_their_elements() -> None:
    inner = [1]
    rings = [collections.deque([inner, 2, 3], maxlen=3), collections.deque("ab")]
    _written(rings, lambda d: (d.rotate(1), d.appendleft(0), d.append("z")))
    assert rings[0].maxlen == 3 and any(x is inner for x in rings[0])


def test_bytearrays_written_into_and_resized_unless_a_view_holds_them() -> None:
    bufs = [bytearray(b"ab"), bytearray()]
    view = memoryview(bufs[0])
    _written(bufs, lambda b: b.__setitem__(slice(None), b.upper()))
    assert bytes(view) == b"AB"  # written in place: the view sees it
    updates, _ = _engine(bufs, lambda b: b.extend(b"!"))
    with pytest.raises(NotParallelizable, match="a view of it"):
        w.resolve(updates, lambda i: bufs[i], {}, 2)
    view.release()
    _written(bufs, lambda b: b.extend(b"!"))
    held = bytearray(b"abcd")
    arr = np.frombuffer(held, dtype=np.uint8)
    updates, _ = _engine([held], lambda b: b.__setitem__(0, 65))
    with pytest.raises(NotParallelizable, match="`arr` shares its memory"):
        w.resolve(updates, lambda i: [held][i], {"arr": arr}, 1)


def test_random_instances_continue_the_engines_stream() -> None:
    gens = [random.Random(1), random.Random(2)]
    serial = _written(gens, lambda g: (g.random(), g.gauss(0, 1)), False)
    # (gauss caches its pair's second draw: part of the state written back)
    assert [(g.gauss(0, 1), g.random()) for g in gens] == [
        (g.gauss(0, 1), g.random()) for g in serial
    ]


@pytest.mark.parametrize(
    "make",
    [
        lambda s: np.random.default_rng(s),
        lambda s: np.random.Generator(np.random.MT19937(s)),
        lambda s: np.random.RandomState(s),
    ],
    ids=["pcg64", "mt19937", "randomstate"],
)
def test_numpy_generators_continue_the_engines_stream(make) -> None:
    gens = [make(s) for s in range(3)]
    bits = [g.bit_generator if hasattr(g, "bit_generator") else g for g in gens]
    serial = _written(gens, lambda g: g.standard_normal(3), False)
    assert [g.standard_normal(3).tolist() for g in gens] == [
        g.standard_normal(3).tolist() for g in serial
    ]
    assert all(
        (g.bit_generator if hasattr(g, "bit_generator") else g) is b
        for g, b in zip(gens, bits, strict=True)
    )


def test_generators_sharing_a_bit_generator_are_refused() -> None:
    bg = np.random.PCG64(7)
    gens = [np.random.Generator(bg), np.random.Generator(np.random.PCG64(8))]
    updates, cannot = _engine(gens[1:], lambda g: g.random())
    updates = [(1, p, u) for _i, p, u in updates]
    assert not cannot
    # an input holding the item's bit generator, and another item sharing it
    with pytest.raises(NotParallelizable, match="`draw` is or holds its bit"):
        w.resolve(updates, lambda i: gens[i], {"draw": gens[1].bit_generator}, 2)
    twins = [np.random.Generator(bg), np.random.Generator(bg)]
    updates, _ = _engine(twins, lambda g: g.random())
    with pytest.raises(NotParallelizable, match="share one object"):
        w.resolve(updates, lambda i: twins[i], {}, 2)


def test_a_subclass_or_the_global_generator_is_not_written_back() -> None:
    class Dice(random.Random):
        pass

    _, cannot = _engine([Dice(1)], lambda g: g.random())
    assert cannot and "a Dice, changed in place" in cannot[0]
    kind_of = checkout_kinds.kind_of
    assert kind_of(random._inst) == kind_of(np.random.mtrand._rand) == ""


def test_containers_changed_in_place_inside_an_item_keep_their_identity() -> None:
    """``r["scores"].sort()`` on a dict item: the kernel's own list sorted."""
    recs = [
        {"name": "ana", "scores": [3, 9, 1], "tags": {"x"}},
        {"name": "ben", "scores": [5, 2], "tags": set()},
    ]
    scores, tags = recs[0]["scores"], recs[1]["tags"]

    def step(r: dict) -> None:
        r["scores"].sort(reverse=True)
        r["best"] = r["scores"][0]
        r["tags"].add(r["name"])

    _written(recs, step)
    assert recs[0]["scores"] is scores and scores == [9, 3, 1]
    assert recs[1]["tags"] is tags and tags == {"ben"}
    lists = [[[3, 1], [2]], [[9, 7]]]
    inner = lists[0][0]
    _written(lists, lambda xs: (xs[0].sort(), xs.reverse()))
    assert lists[0][1] is inner and inner == [1, 3]
    # two levels down, through a list of lists (followed element by element)
    grid = [{"rows": [[3, 1], [2]], "seen": {("a", 1)}}, {"rows": [], "seen": set()}]
    rows, row0 = grid[0]["rows"], grid[0]["rows"][0]

    def step2(g: dict) -> None:
        for r in g["rows"]:
            r.sort()
        g["rows"].append([0])
        g["seen"].add(("b", len(g["rows"])))

    _written(grid, step2)
    assert grid[0]["rows"] is rows and rows[0] is row0 and row0 == [1, 3]


def test_an_element_another_item_or_an_input_holds_is_refused() -> None:
    inner = [3, 1]
    twins = [{"s": inner}, {"s": inner}]
    updates, cannot = _engine(twins, lambda r: r["s"].sort())
    assert not cannot
    with pytest.raises(NotParallelizable, match="iterations 0 and 1 hold one"):
        w.resolve(updates, lambda i: twins[i], {}, 2)
    recs = [{"s": [3, 1]}, {"s": [2]}]
    updates, _ = _engine(recs, lambda r: r["s"].sort())
    with pytest.raises(NotParallelizable, match="an element .* and `index` holds"):
        w.resolve(updates, lambda i: recs[i], {"index": {"a": recs[0]["s"]}}, 2)

    class Box:
        n = 0

    _, cannot = _engine([{"o": Box()}], lambda r: setattr(r["o"], "n", 1))
    assert cannot and "only elements replaced" in cannot[0]


def test_a_container_subclass_is_written_back_with_its_attributes() -> None:
    """Its elements as a list's, its attributes as an object's; an attribute
    it changed in place that another item holds too is refused by name."""
    ns: dict[str, Any] = {"__name__": "__main__"}
    exec("class Batch(list):\n    pass\n", ns)
    log: list = []
    batches = [ns["Batch"]([1, 2]), ns["Batch"]([3])]
    for b in batches:
        b.seen = 0
    _written(batches, lambda b: (b.append(len(b)), setattr(b, "seen", b.seen + 1)))
    assert [(list(b), b.seen) for b in batches] == [([1, 2, 2], 1), ([3, 1], 1)]
    for b in batches:
        b.log = log
    updates, cannot = _engine(batches, lambda b: b.log.append(len(b)))
    assert not cannot
    with pytest.raises(NotParallelizable, match="attribute `log`, which"):
        w.resolve(updates, lambda i: batches[i], {}, 2)


def test_a_bound_method_item_is_written_back_to_its_object() -> None:
    """``ticks = [c.tick for c in counters]``: calling an item changes its
    ``self``, the kernel's own counter (another name for it sees it)."""
    ns: dict[str, Any] = {"__name__": "__main__"}
    exec("class C:\n    n = 0\n    def tick(self):\n        self.n += 1\n", ns)
    counters = [ns["C"](), ns["C"]()]
    ticks = [c.tick for c in counters]
    updates, cannot = _engine(ticks, lambda f: f())
    assert not cannot
    w.apply(w.resolve(updates, lambda i: ticks[i], {}, 2))
    assert [c.n for c in counters] == [1, 1]
    with pytest.raises(NotParallelizable, match="`keep` holds it"):
        w.resolve(updates, lambda i: ticks[i], {"keep": [counters[1]]}, 2)


def test_an_optimizer_with_its_module_is_loaded_by_position() -> None:
    """``for net, opt in zip(nets, opts)``: the kernel's optimizer ends with
    the engine copy's state, keyed by the kernel's own parameters, so its
    next step is the serial run's."""
    torch = pytest.importorskip("torch")
    torch.manual_seed(0)
    x, y = torch.randn(8, 3), torch.randn(8, 1)
    nets = [torch.nn.Linear(3, 1) for _ in range(2)]
    items = [(n, torch.optim.Adam(n.parameters(), lr=0.1)) for n in nets]

    def step(pair: tuple) -> None:
        net, opt = pair
        opt.zero_grad()
        torch.nn.functional.mse_loss(net(x), y).backward()
        opt.step()

    serial = _written(items, step, False)
    for (net, opt), (snet, sopt) in zip(items, serial, strict=True):
        assert all(p in opt.state for p in net.parameters())
        step((net, opt))
        step((snet, sopt))
        assert torch.equal(net.weight, snet.weight)


def test_a_module_attribute_trained_in_place_keeps_its_identity() -> None:
    """A trainer's ``model`` trained in place: written into the kernel's own
    module (``nets``, another name for it, sees it); one model shared by two
    trainers is refused."""
    torch = pytest.importorskip("torch")
    ns: dict[str, Any] = {"__name__": "__main__"}
    exec("class T:\n    def __init__(self, m):\n        self.model = m\n", ns)
    torch.manual_seed(0)
    nets = [torch.nn.Linear(2, 1) for _ in range(2)]
    trainers = [ns["T"](n) for n in nets]

    def fit(t: Any) -> None:
        t.model(torch.ones(3, 2)).sum().backward()
        with torch.no_grad():
            t.model.weight -= t.model.weight.grad
        t.runs = 1

    serial = _written(trainers, fit, False)
    assert [t.model is n for t, n in zip(trainers, nets, strict=True)] == [True] * 2
    assert all(
        torch.equal(n.weight, s.model.weight) for n, s in zip(nets, serial, strict=True)
    )
    twins = [ns["T"](nets[0]), ns["T"](nets[0])]
    updates, _ = _engine(twins, fit)
    with pytest.raises(NotParallelizable, match="hold one object"):
        w.resolve(updates, lambda i: twins[i], {}, 2)


def _noop(*args: Any) -> None:
    return None


def test_hooks_added_to_an_own_module_or_tensor_are_refused_not_dropped() -> None:
    """A hook is code registered on the engine's copy: written back by its
    parameters alone, the kernel's model would silently lack it."""
    import types

    torch = pytest.importorskip("torch")
    cases: list[tuple[list[Any], Callable[[Any], Any]]] = [
        ([torch.nn.Linear(2, 1)], lambda m: m.register_forward_hook(_noop)),
        (
            [torch.nn.Sequential(torch.nn.Linear(2, 1))],
            lambda m: m[0].register_full_backward_hook(_noop),
        ),
        ([torch.nn.Parameter(torch.zeros(2))], lambda p: p.register_hook(_noop)),
        (
            [types.SimpleNamespace(model=torch.nn.Linear(2, 1))],
            lambda o: o.model.weight.register_post_accumulate_grad_hook(_noop),
        ),
    ]
    for items, step in cases:
        updates, cannot = _engine(items, step)
        assert not updates
        assert cannot and "cannot be written back: hooks were added" in cannot[0]
        assert "register hooks before the loop" in cannot[0]


def test_an_own_array_made_read_only_is_written_back_with_its_flag() -> None:
    arrs = [np.arange(3.0), np.arange(3.0)]
    _written(arrs, lambda a: a.setflags(write=False), by_value=False)
    assert [a.flags.writeable for a in arrs] == [False, False]
    assert all(np.array_equal(a, np.arange(3.0)) for a in arrs)

    def scale_then_freeze(a: Any) -> None:
        a *= 2
        a.flags.writeable = False

    arrs = [np.arange(3.0)]
    _written(arrs, scale_then_freeze, by_value=False)
    assert not arrs[0].flags.writeable and np.array_equal(arrs[0], [0.0, 2.0, 4.0])
    # a read-only kernel array takes a flag alone, not new bytes, nor a
    # writable flag its memory does not allow
    ro = np.frombuffer(bytes(24), dtype="f8")
    updates, _ = _engine([np.zeros(3)], lambda a: a.setflags(write=False))
    w.apply(w.resolve(updates, lambda i: ro, {}, 1))
    assert not ro.flags.writeable
    updates, _ = _engine([np.ones(3)], scale_then_freeze)
    with pytest.raises(NotParallelizable, match="read-only"):
        w.resolve(updates, lambda i: ro, {}, 1)
    copies = [np.zeros(3)]  # (an engine's copy it may make writable)
    copies[0].flags.writeable = False
    was = checkout.before(copies, 0)
    copies[0].flags.writeable = True
    updates, _ = checkout.changes(was, copies, 0)
    with pytest.raises(NotParallelizable, match="cannot be made writable"):
        w.resolve(updates, lambda i: ro, {}, 1)
    own = np.zeros(3)
    own.flags.writeable = False
    w.apply(w.resolve(updates, lambda i: own, {}, 1))
    assert own.flags.writeable


def test_a_logger_item_configured_by_a_helper_is_refused_saying_why() -> None:
    """A helper the analysis cannot read configures each item: a logger
    travels by name (the engine's copy is its own), so it is refused."""
    import logging

    lg = logging.getLogger("test_writeback_kinds.item")
    try:
        updates, cannot = _engine([lg], lambda x: x.setLevel(logging.ERROR))
    finally:
        lg.setLevel(logging.NOTSET)
    assert not updates and "configure loggers before the loop" in cannot[0]
