"""``--seed``'s cheaper paths are exact (issue 34).

The seeder makes its keys a block at a time and calls numpy's ``seed`` with
no frame of its own; the engines read the generators' states in place
(``gpucell.engine.rngstate``) instead of through their getters.  Neither may
change a number: iteration ``i`` draws what the documented seeding gives it
(blake2b of ``f"{S}:{i}"``, 8 bytes little-endian: ``random.seed(key)``,
``np.random.seed(key % 2**32)``, torch's ``manual_seed(key % 2**63)``) in any
order and any chunking, and every draw, a cached Gaussian's included, is seen.
"""

from __future__ import annotations

import hashlib
import random

import numpy as np
import pytest
import torch

from gpucell.engine import rngstate
from gpucell.engine.reseed import seeder


def _key(seed: int, i: int) -> int:
    """The documented key, written out apart from the seeder."""
    digest = hashlib.blake2b(f"{seed}:{i}".encode(), digest_size=8).digest()
    return int.from_bytes(digest, "little")


def _documented(seed: int, i: int) -> tuple[float, float, float]:
    x = _key(seed, i)
    random.seed(x)
    np.random.seed(x % 2**32)
    torch.manual_seed(x % 2**63)
    return random.random(), float(np.random.random()), float(torch.rand(1))


def _draws() -> tuple[float, float, float]:
    return random.random(), float(np.random.random()), float(torch.rand(1))


def test_each_iteration_draws_the_documented_numbers_in_any_order() -> None:
    """Keys come in blocks: out of order, backwards, far apart and across a
    block's end (1024), iteration i's numbers are still its own."""
    order = [0, 1, 2, 5, 3, 1023, 1024, 1025, 4000, 17, 16, 15, -1, 2**40]
    want = {i: _documented(7, i) for i in order}
    every = seeder(7)
    one = {name: seeder(7, [name]) for name in ("random", "numpy", "torch")}
    for i in order:
        every(i)
        assert _draws() == want[i], i
        for k, name in enumerate(("random", "numpy", "torch")):
            random.seed(1)
            np.random.seed(1)
            torch.manual_seed(1)
            one[name](i)
            assert _draws()[k] == want[i][k], (i, name)
    seed_numpy = seeder(7, ["numpy"])
    for i in range(3000):  # blocks growing from 16 to 1024, in order
        seed_numpy(i)
        if i in want:
            assert float(np.random.random()) == want[i][1], i
    seed_numpy(2999)
    np.random.seed(_key(7, 2999) % 2**32)
    want_last = np.random.random(4)
    seed_numpy(2999)
    assert (np.random.random(4) == want_last).all()


def test_a_rand_bound_before_the_loop_and_a_cached_gaussian_are_reseeded() -> None:
    """``from numpy.random import rand`` draws from the same global generator
    the seeder seeds; a Gaussian cached by the iteration before (legacy
    ``standard_normal`` makes two and keeps one) is dropped as ``np.random.seed``
    drops it."""
    from numpy.random import rand, standard_normal

    seed_fn = seeder(11, ["numpy"])
    seed_fn(3)
    first = rand(), standard_normal()
    seed_fn(4)
    standard_normal()  # one made and one cached
    assert np.random.get_state()[3] == 1
    seed_fn(3)
    assert np.random.get_state()[3] == 0
    assert (rand(), standard_normal()) == first


def test_the_states_are_read_in_place_on_this_python_and_numpy() -> None:
    """Where the layouts are not found the getters are used (right, but ~30x
    slower): on the supported Python and numpy the fast path is the one run."""
    assert rngstate.in_place() == {"random": True, "numpy": True}


@pytest.mark.parametrize(
    "draw, name",
    [
        (lambda: random.random(), "random"),
        (lambda: random.gauss(0, 1), "random"),
        (lambda: np.random.random(), "numpy"),
        (lambda: np.random.randint(3), "numpy"),
        (lambda: torch.rand(1), "torch"),
    ],
)
def test_every_draw_changes_its_generators_state_and_no_other(draw, name) -> None:
    before = rngstate.states()
    assert rngstate.drew(before) == []
    draw()
    assert rngstate.drew(before) == [name]
    assert rngstate.drew({k: v for k, v in before.items() if k != name}) == []


def test_a_draw_that_only_takes_a_cached_gaussian_is_seen() -> None:
    """Legacy ``standard_normal`` makes two numbers and caches one: the next
    call takes the cached one without touching MT19937's words, so the
    words alone would miss it; ``random.gauss`` likewise."""
    np.random.standard_normal()
    if np.random.get_state()[3] == 0:
        np.random.standard_normal()
    before = rngstate.states()
    np.random.standard_normal()
    assert rngstate.drew(before) == ["numpy"]
    random.seed(5)
    random.gauss(0, 1)
    before = rngstate.states()
    random.gauss(0, 1)
    assert rngstate.drew(before) == ["random"]


def test_a_state_put_back_reads_as_unchanged() -> None:
    """Equal states read equal: a chunk that saved and restored a generator
    did not draw from it, as the getters said."""
    before = rngstate.states()
    saved = random.getstate(), np.random.get_state(), torch.get_rng_state()
    random.random(), np.random.standard_normal(), torch.rand(1)
    random.setstate(saved[0])
    np.random.set_state(saved[1])
    torch.set_rng_state(saved[2])
    assert rngstate.drew(before) == []


def test_a_bound_rand_travels_as_the_receivers_own_generator() -> None:
    """Pickled, ``rand``'s generator would be a copy carrying the kernel's
    state, which ``--seed`` does not reseed (and an input that changed):
    the process-wide generators go by reference, other generators by value;
    as inputs the global ones are compared by identity, as modules are."""
    from random import randint

    from numpy.random import rand

    from gpucell.engine.checkin import token
    from gpucell.protocol import wire

    assert wire.loads(wire.dumps(rand)).__self__ is np.random.mtrand._rand
    assert wire.loads(wire.dumps(randint)).__self__ is random._inst
    assert wire.loads(wire.dumps(np.random.mtrand._rand)) is np.random.mtrand._rand
    own = np.random.RandomState(1)
    copy = wire.loads(wire.dumps(own.rand))
    assert copy.__self__ is not own and copy() == own.rand()
    before = token(rand), token(own.rand)
    rand(), own.rand()
    assert token(rand) == before[0] and token(own.rand) != before[1]


# ------------------------------------------------------------- on a cluster


@pytest.mark.cluster
def test_draws_are_equal_across_chunkings_and_engine_counts(
    ip, cluster, capsys
) -> None:
    """A numpy-only loop drawing through a ``rand`` bound in the notebook:
    two engines, chunks of one, one engine all give the documented numbers.
    Without ``--seed`` it runs too (it failed as an input changed in place),
    the draw warned by name."""
    ip.run_cell("from numpy.random import rand")
    cell = "vals = []\nfor i in range(16):\n    vals.append(float(rand()))\n"
    want = []
    for i in range(16):
        np.random.seed(_key(9, i) % 2**32)
        want.append(float(np.random.random()))
    for line in ("", "--chunksize 1", f"--targets {cluster.ids[0]}"):
        ip.run_cell_magic("gpu_parallel", f"--quiet --seed 9 {line}", cell)
        assert ip.user_ns["vals"] == want, line
    ip.run_line_magic("config", "GpuCell.inline_below = 0")  # (on the engines)
    try:
        capsys.readouterr()
        ip.run_cell_magic("gpu_parallel", "--quiet", cell)
    finally:
        ip.run_line_magic("config", "GpuCell.inline_below = 0.005")
    assert len(ip.user_ns["vals"]) == 16
    said = capsys.readouterr().out
    assert "`rand` (line 4) draw(s) from a global random generator" in said
