"""The held-in sweep of tests/sweep_loops_corpus_writeback.py (issue 28's
categories: an iteration's own item written back and its unsafe twins,
sinks, side effects, iteration forms) against the first law, with
tests/test_sweep_loops.py's harness: each case runs serially, then through
``%%gpu_parallel`` after a fresh setup, and must leave the same namespace
and log lines, or refuse / fail with the namespace untouched (a refusal of a
"safe" case is a false refusal).

Known false refusals and silent differences are ``xfail(strict=True)`` in
``KNOWN``.  ``SWEEP_REPORT_WB=path.json`` writes every case's outcome there.
"""

from __future__ import annotations

import pytest
from sweep_loops_corpus_writeback import CASES, Case
from test_sweep_loops import (  # noqa: F401 - fixtures, used by name
    Outcome,
    _always_send,
    check_case,
    corpus_params,
    judge,
    report_to,
    sweep,
)

pytestmark = pytest.mark.cluster

# case id -> why its test is xfail(strict=True): "false refusal: ..." for a
# safe case the magic refused or stopped, "SILENT: ..." for a run whose
# namespace differs from the serial one.

KNOWN: dict[str, str] = {
    # ------------------------------------------------ silent differences
    "wb-fx-warnings-catch-around": (
        "false refusal: `catch_warnings(record=True)` around the loop is refused "
        "before any iteration (each engine would record into its own copy; was "
        "SILENT), after the kernel entered it and bound `caught`, which this "
        "sweep does not count as the prelude's"
    ),
    "wb-fx-capture-warnings-logging": (
        "the records are now the serial ones (warnings issued again in the "
        "kernel, in order), but each names the cell as gpucell compiled it: "
        "another filename, and the line one down (the magic's line is line 1)"
    ),
    # ------------------------------------------------ false refusals
    "wb-fx-redirect-stdout-around": (
        "false refusal (was SILENT: re-entered on each engine with a copy of "
        "buf, the prints stayed there): a notebook stream in a `with` around "
        "the loop is refused before anything runs"
    ),
}

OUTCOMES: dict[str, Outcome] = {}


_report = report_to("SWEEP_REPORT_WB", OUTCOMES)


@pytest.mark.parametrize("c", list(corpus_params(CASES, KNOWN)))
def test_loop(sweep, private_cluster, c: Case):  # noqa: F811 - sweep is a fixture
    check_case(sweep, private_cluster, c, OUTCOMES)


def test_a_notebook_stream_in_a_with_around_the_loop_is_refused(sweep, private_cluster):  # noqa: F811
    """``with redirect_stdout(buf):`` around the loop is re-entered on each
    engine with a copy of ``buf``: what the loop printed stayed there and
    ``buf`` was empty (silently).  Refused before anything runs, naming it;
    a redirection to ``sys.stderr`` (no notebook stream) still runs."""
    from gpucell.errors import NotParallelizable

    ip = sweep.ip
    ip.run_cell("import io, sys, contextlib\nbuf = io.StringIO()\n").raise_error()
    cell = (
        "with contextlib.redirect_stdout(buf):\n"
        "    for i in range(4):\n"
        "        print('row', i)\n"
        "captured = buf.getvalue()\n"
    )
    with pytest.raises(NotParallelizable, match="with a copy of `buf`"):
        ip.run_cell_magic("gpu_parallel", "--quiet", cell)
    assert "captured" not in ip.user_ns and buf_empty(ip)
    ip.run_cell_magic("gpu_parallel", "--quiet", cell.replace("(buf)", "(sys.stderr)"))
    assert ip.user_ns["i"] == 3


def buf_empty(ip) -> bool:
    return ip.user_ns["buf"].getvalue() == ""


def test_an_item_reached_by_index_or_key_is_written_back(sweep, private_cluster):  # noqa: F811
    """``for i in range(len(accs)): accs[i].grow()`` changes iteration ``i``'s
    own element: written back into the kernel's objects, as serially (also
    by key, and through a name for it).  An element that is not the
    iteration's own (``accs[i - 1]``) changes an input: refused, nothing
    merged, and the error says the loop that is written back."""
    from gpucell.errors import InputChanged

    ip = sweep.ip
    ip.run_cell(
        "class Acc:\n    def __init__(self):\n        self.n = 0\n"
        "    def grow(self, k=1):\n        self.n += k\n"
        "accs = [Acc() for _ in range(3)]\nfirst = accs[0]\n"
        "by = {'a': Acc(), 'b': Acc()}\n"
    ).raise_error()
    run = ip.run_cell_magic
    run("gpu_parallel", "--quiet", "for i in range(len(accs)):\n    accs[i].grow(i)\n")
    assert [a.n for a in ip.user_ns["accs"]] == [0, 1, 2]
    assert ip.user_ns["first"] is ip.user_ns["accs"][0] and ip.user_ns["i"] == 2
    run(
        "gpu_parallel",
        "--quiet",
        "for k in by:\n    acc = by[k]\n    acc.grow(len(k))\n",
    )
    assert [a.n for a in ip.user_ns["by"].values()] == [1, 1]
    assert ip.user_ns["acc"] is ip.user_ns["by"]["b"] and ip.user_ns["k"] == "b"
    cell = "for i in range(len(accs)):\n    accs[i - 1].grow()\n"
    with pytest.raises(InputChanged, match=r"written `for x in accs:` or"):
        run("gpu_parallel", "--quiet", cell)
    assert [a.n for a in ip.user_ns["accs"]] == [0, 1, 2]


def test_an_iterator_of_keys_is_read_once_for_its_own_elements(sweep, private_cluster):  # noqa: F811
    """``for k in it: by[k].grow()`` with ``it`` an iterator (or a generator):
    the kernel draws the keys once and reads ``by[k]`` for each; the elements
    are written back in place, as serially (the iterable read twice had no
    keys the second time)."""
    from gpucell.errors import NotParallelizable

    ip = sweep.ip
    ip.run_cell(
        "class Acc:\n    def __init__(self):\n        self.n = 0\n"
        "    def grow(self, k=1):\n        self.n += k\n"
        "by = {'a': Acc(), 'b': Acc(), 'c': Acc()}\nfirst = by['b']\n"
        "it = iter(['b', 'c', 'a'])\n"
        "gs = {'x': [3, 1, 2], 'y': [9, 8]}\nks = (k for k in ['y', 'x'])\n"
    ).raise_error()
    run = ip.run_cell_magic
    run("gpu_parallel", "--quiet", "for k in it:\n    by[k].grow(ord(k))\n")
    assert [a.n for a in ip.user_ns["by"].values()] == [97, 98, 99]
    assert ip.user_ns["first"] is ip.user_ns["by"]["b"] and ip.user_ns["k"] == "a"
    assert next(ip.user_ns["it"], None) is None
    run("gpu_parallel", "--quiet", "for k in ks:\n    gs[k].sort()\n")
    assert ip.user_ns["gs"] == {"x": [1, 2, 3], "y": [8, 9]}
    # a generator made by a call: evaluated once, as serially
    ip.run_cell("def pick(d):\n    yield from sorted(d)\n").raise_error()
    run("gpu_parallel", "--quiet", "for k in pick(by):\n    by[k].grow()\n")
    assert [a.n for a in ip.user_ns["by"].values()] == [98, 99, 100]
    cell = "for i, k in enumerate(pick(by)):\n    by[k].grow(i)\n"
    with pytest.raises(NotParallelizable, match=r"`by\[k\]`.*items = list"):
        run("gpu_parallel", "--quiet", cell)
    assert [a.n for a in ip.user_ns["by"].values()] == [98, 99, 100]
