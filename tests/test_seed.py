"""``--seed`` reseeds only the generators a loop can reach (issue 34).

The decision (``gpucell.core.seeding``) must never miss a generator the loop
draws from (that would be silently different from the serial cell seeded the
same way): every doubt reseeds all of them.  The engines' seeder
(``gpucell.engine.reseed``) must draw exactly what the all-generator seeding
draws, for the generators it reseeds.
"""

from __future__ import annotations

import functools
import random
import types

import numpy as np
import pytest
import torch

from gpucell.core.seeding import ALL, generators, loop_generators
from gpucell.engine.reseed import seeder

LOOP = "for i in range(4):\n    out.append({})\n"


def _ns(**values: object) -> dict[str, object]:
    ns: dict[str, object] = {"out": [], "np": np, "random": random, "torch": torch}
    ns.update(values)
    return ns


def _notebook_function(ns: dict[str, object], src: str, name: str) -> object:
    """A function defined in the notebook: its globals are the namespace."""
    exec(src, ns)  # noqa: S102 - a test's own text
    fn = ns[name]
    assert isinstance(fn, types.FunctionType) and fn.__globals__ is ns
    return fn


@pytest.mark.parametrize(
    ("body", "want"),
    [
        ("np.random.random()", {"numpy"}),
        ("np.random.normal(size=3).sum()", {"numpy"}),
        ("random.random()", {"random"}),
        ("torch.rand(2)", {"torch"}),
        ("sum(j * j for j in range(i))", set()),
        ("np.random.default_rng(i).normal()", {"numpy"}),
        ("[random.random(), np.random.rand()]", {"random", "numpy"}),
    ],
)
def test_a_loop_reseeds_the_generators_its_modules_draw_from(body, want):
    ns = _ns()
    assert generators(LOOP.format(body), {"np": np, "random": random}, ns) == want


@pytest.mark.parametrize(
    "body",
    [
        "eval('random.random()')",  # text we cannot see through
        "__import__('random').random()",
        "est.fit(X)",  # an object: its methods may call anything
        "make()",  # a name found nowhere
        "objs[i].draw()",  # an array of objects
        "part(i)",  # a partial of a notebook function
        "vec(i)",  # np.vectorize calls a function it holds
        "pd_like.sample()",  # a library not known to draw only its own
    ],
)
def test_anything_unknown_reseeds_every_generator(body):
    class Est:
        def fit(self, x: object) -> None:
            np.random.random()

    ns = _ns(
        est=Est(),
        X=np.zeros(3),
        objs=np.array([object()] * 4),
        part=functools.partial(lambda i: random.random()),
        vec=np.vectorize(lambda i: random.random()),
        pd_like=types.SimpleNamespace(sample=lambda: 0),
    )
    assert generators(LOOP.format(body), {}, ns) == ALL


def test_an_import_in_the_loop_counts_by_its_package():
    assert generators("for i in range(3):\n    import math\n", {}, {}) == set()
    assert generators("for i in range(3):\n    import sklearn\n", {}, {}) == ALL
    assert generators("for i in range(3):\n    from . import x\n", {}, {}) == ALL


def test_a_library_drawing_from_numpys_global_generator_reseeds_it():
    """First law: sklearn with ``random_state=None`` draws from numpy's global
    generator; a loop calling it must have numpy reseeded (here: all)."""
    sklearn = pytest.importorskip("sklearn.utils")
    ns = _ns(sk=sklearn)
    got = generators(LOOP.format("sk.shuffle([1, 2, 3])"), {"sk": sklearn}, ns)
    assert "numpy" in got


def test_notebook_functions_are_followed_through_their_globals():
    """A helper defined in the notebook reaches what its own globals reach,
    and what it closes over or takes as defaults."""
    ns = _ns()
    coin = _notebook_function(ns, "def coin(i):\n    return random.random()\n", "coin")
    assert generators(LOOP.format("coin(i)"), {"coin": coin}, ns) == {"random"}
    _notebook_function(ns, "def twice(i):\n    return 2 * coin(i)\n", "twice")
    assert generators(LOOP.format("twice(i)"), {}, ns) == {"random"}

    def outer():  # a closure over something that may draw from anything
        held = types.SimpleNamespace()
        return lambda i: held

    assert generators(LOOP.format("f(i)"), {"f": outer()}, ns) == ALL


def test_a_notebook_function_with_a_cycle_is_followed_once():
    ns = _ns()
    _notebook_function(
        ns, "def ping(n):\n    return pong(n - 1) if n else np.random.rand()\n", "ping"
    )
    _notebook_function(ns, "def pong(n):\n    return ping(n)\n", "pong")
    assert generators(LOOP.format("ping(3)"), {}, ns) == {"numpy"}


def test_the_loops_own_lines_are_read_from_the_cell():
    cell = (
        "import sklearn\nout = []\nfor i in range(4):\n"
        "    out.append(np.random.rand())\n"
    )
    ns = _ns()
    assert loop_generators(cell, (1, 2), None, {"np": np}, ns) == ("numpy",)
    assert loop_generators(cell, None, None, {"np": np}, ns) == tuple(sorted(ALL))
    assert loop_generators("for i in (:\n", None, None, {}, ns) == tuple(sorted(ALL))
    # a `with` around the loop runs on the engines too; the epilogue does not
    cell = (
        "with ctx:\n    for i in range(4):\n        out.append(random.random())\n"
        "import sklearn\n"
    )
    got = loop_generators(cell, None, (4, 4), {}, _ns(ctx=np.errstate()))
    assert got == tuple(sorted(ALL))  # (an object's __enter__: anything)
    got = loop_generators(cell, None, (4, 4), {}, _ns(ctx=np.zeros(1)))
    assert got == ("random",)


def _draws() -> tuple[float, float, float]:
    return random.random(), float(np.random.random()), float(torch.rand(1))


def test_the_engines_seeder_draws_what_seeding_all_of_them_draws():
    every = seeder(7)
    for i in (0, 1, 12345):
        every(i)
        want = _draws()
        for subset in (["random"], ["numpy"], ["torch"], ["numpy", "torch"]):
            random.seed(-1)
            np.random.seed(1)
            torch.manual_seed(1)
            seeder(7, subset)(i)
            got = _draws()
            for k, name in enumerate(("random", "numpy", "torch")):
                assert (got[k] == want[k]) is (name in subset), (subset, name)


def test_the_seeder_refuses_a_generator_it_does_not_know():
    with pytest.raises(ValueError, match="cannot reseed \\['jax'\\]"):
        seeder(0, ["numpy", "jax"])


# ------------------------------------------------------------- on a cluster


def _engine_random_states(cluster) -> list[object]:
    def state() -> object:
        import random

        return random.getstate()

    return cluster.client[:].apply_sync(state)


@pytest.mark.cluster
def test_a_numpy_only_loop_reseeds_numpy_alone_and_draws_the_serial_numbers(
    ip, cluster
):
    """The engines reseed numpy's generator per iteration (the numbers are
    the serial loop's, seeded as the engines seed) and leave ``random``'s
    alone: the loop cannot reach it."""
    ip.user_ns["np"] = np
    before = _engine_random_states(cluster)
    cell = "vals = []\nfor i in range(40):\n    vals.append(float(np.random.rand()))\n"
    ip.run_cell_magic("gpu_parallel", "--quiet --seed 5", cell)
    seed_fn = seeder(5)
    want = []
    for i in range(40):
        seed_fn(i)
        want.append(float(np.random.rand()))
    assert ip.user_ns["vals"] == want
    assert _engine_random_states(cluster) == before


@pytest.mark.cluster
def test_a_draw_inside_a_notebook_function_is_still_reseeded(ip, cluster):
    """First law: the loop's text names no generator, the notebook function
    it calls draws from ``random``: reseeded, so one engine or two give the
    same numbers, the serial seeded ones."""
    ip.run_cell("import random\ndef coin(i):\n    return random.random() + i\n")
    cell = "flips = []\nfor i in range(24):\n    flips.append(coin(i))\n"
    ip.run_cell_magic("gpu_parallel", "--quiet --seed 3", cell)
    two = list(ip.user_ns["flips"])
    ip.run_cell_magic(
        "gpu_parallel", f"--quiet --seed 3 --targets {cluster.ids[0]}", cell
    )
    assert ip.user_ns["flips"] == two
    seed_fn = seeder(3)
    want = []
    for i in range(24):
        seed_fn(i)
        want.append(random.random() + i)
    assert two == want


def test_big_containers_of_plain_values_are_data_and_odd_subclasses_are_not():
    ns = _ns(xs=[0.5] * 100_000, table={i: float(i) for i in range(20_000)})
    assert generators(LOOP.format("xs[i] + table[i]"), {}, ns) == set()

    class Odd(int):  # its operator could draw from anything
        pass

    ns = _ns(k=Odd(3), many=[object()] * 20_000)
    assert generators(LOOP.format("k + i"), {}, ns) == ALL
    assert generators(LOOP.format("many[i]"), {}, ns) == ALL


def _run_chunk_on_this_engine(cell: str, names: list[str], inputs, reseed):
    """``worker.run`` in this process (the engine's code, no cluster), with
    ``--seed 1`` and ``reseed`` as the kernel decided."""
    from gpucell.core.analysis.driver import analyse
    from gpucell.engine import worker
    from gpucell.protocol import wire

    setup = {
        "program": analyse(cell, known_names=names).engine_program(),
        "names": list(inputs),
        "keys": {n: None for n in inputs},
        "watch": {"names": [], "items": False},
        "warnings": [],
        "logging": None,
        "state": {},
        "cache_bytes": None,
        "cwd": "",
    }
    kernel = "seed-test-kernel"
    chunk = wire.dumps(("range", range(4)))
    try:
        frames = worker.run(
            "c",
            chunk,
            0,
            0,
            1,
            setup,
            wire.dumps(inputs),
            None,
            None,
            kernel,
            False,
            reseed,
        )
        return wire.loads(frames)
    finally:
        worker.clear(kernel)


def test_a_draw_from_a_generator_left_unseeded_fails_the_chunk_loudly():
    """The safety net under the decision: were it ever wrong, the engines see
    a generator they did not reseed change and fail the run (nothing merged)
    rather than return numbers that differ from the serial seeded ones."""
    cell = "out = []\nfor i in range(4):\n    out.append(random.random())\n"
    inputs = {"random": random}
    status, payload, _ = _run_chunk_on_this_engine(
        cell, ["out", "random"], inputs, ("numpy",)
    )
    assert status == "error" and "did not reseed" in payload["message"]
    assert "`random`" in payload["message"]
    status, payload, _ = _run_chunk_on_this_engine(
        cell, ["out", "random"], inputs, ("random",)
    )
    assert status == "ok"
