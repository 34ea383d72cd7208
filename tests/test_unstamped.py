"""Long chunks of a cheap body run the chunk program without per-iteration
stamps (``rewrite.unstamped``), and lose nothing a stamp gave: the iteration an
error or a print belongs to, the count, the loop's locals."""

from __future__ import annotations

import io

import pytest

from gpucell.core.analysis import analyse
from gpucell.engine.chunk import UNSTAMPED_MIN, Where, run_chunk
from gpucell.engine.worker import _Tagged

N = UNSTAMPED_MIN + 1000


def _program(cell: str, known=()):
    return analyse(cell, known_names=known).engine_program()


def test_a_cheap_reduction_gets_an_unstamped_variant_and_a_del_does_not():
    assert _program("acc = 0\nfor i in range(10):\n    acc += i\n", ["acc"])[3]
    cell = "out = []\nfor i in range(10):\n    x = i\n    out.append(x)\n    del x\n"
    assert _program(cell, ["out"])[3] is None


def test_a_long_chunk_runs_unstamped_with_the_same_result():
    prog = _program(
        "acc = 0\nfor i in range(n):\n    x = i * 2\n    acc += x\n", ["acc", "n"]
    )
    where = Where({}, 5)
    r = run_chunk(prog, {"n": N}, ("range", range(5, 5 + N)), 5, where=where)
    assert where.unstamped and not where.stamps
    assert r.count == N
    assert r.reductions["acc"] == ("+", sum(2 * i for i in range(5, 5 + N)))
    assert r.last_values["x"] == (4 + N, "value", 2 * (4 + N))
    assert r.last_values["i"] == (4 + N, "value", 4 + N)


@pytest.mark.parametrize("items", ["range", "list", "tuple"])
def test_an_error_names_its_iteration_without_stamps(items):
    seq = {"range": range(N), "list": list(range(N)), "tuple": tuple(range(N))}
    prog = _program(
        "acc = 0\nfor i in xs:\n    if i == 123_456:\n        raise ValueError(i)\n"
        "    acc += i\n",
        ["acc", "xs"],
    )
    where = Where({}, 0)
    with pytest.raises(ValueError) as e:
        run_chunk(
            prog,
            {"xs": None},
            ("seq" if items != "range" else "range", seq[items]),
            0,
            where=where,
        )
    assert where.unstamped
    assert e.value.gpucell_iteration == 123_456
    assert where.current() == 123_456


def test_a_print_is_tagged_with_its_iteration_without_stamps():
    prog = _program(
        "acc = 0\nfor i in range(n):\n    if i % 100_000 == 7:\n        print(i)\n"
        "    acc += i\n",
        ["acc", "n"],
    )
    buf = io.StringIO()
    where = Where({}, 0)
    import contextlib

    with contextlib.redirect_stdout(_Tagged(buf, 3, where)):
        run_chunk(prog, {"n": N}, ("range", range(N)), 0, where=where)
    assert where.unstamped
    lines = buf.getvalue().splitlines()
    assert lines[:2] == [
        "[engine 3 | iteration 7] 7",
        "[engine 3 | iteration 100007] 100007",
    ]


def test_short_chunks_seeds_and_trials_keep_their_stamps():
    prog = _program("acc = 0\nfor i in range(n):\n    acc += i\n", ["acc", "n"])
    where = Where({}, 0)
    run_chunk(prog, {"n": 10}, ("range", range(10)), 0, where=where)
    assert not where.unstamped and len(where.stamps) == 10
    where = Where({}, 0)
    run_chunk(
        prog, {"n": N}, ("range", range(N)), 0, where=where, seed_fn=lambda i: None
    )
    assert not where.unstamped and len(where.stamps) == N
