"""The fourth held-in sweep, tests/sweep_loops_corpus_s4.py (concatenation
rebinds and container changes replayed on the kernel, with their traps; then
groupby iterators, parameter grids, scipy per item, seed sequences, ``match``,
results held by objects, rows placed by ``loc[len(df)]``, files), against the
first law with tests/test_sweep_loops.py's harness: each case runs serially,
then through ``%%gpu_parallel`` after a fresh setup, and must leave the same
namespace and log lines, or refuse / fail with the namespace untouched (a
refusal of a "safe" case is a false refusal).

Known failures are ``xfail(strict=True)`` in ``KNOWN``.
``SWEEP_REPORT_S4=path.json`` writes every case's outcome there.
"""

from __future__ import annotations

import pytest
from sweep_loops_corpus_s4 import CASES, Case
from test_sweep_loops import (  # noqa: F401 - fixtures, used by name
    Outcome,
    _always_send,
    check_case,
    check_message,
    corpus_params,
    report_to,
    sweep,
)

pytestmark = pytest.mark.cluster

# case id -> why its test is xfail(strict=True): "SILENT: ..." for a run
# whose namespace differs from the serial one, "false refusal: ..." for a
# safe case the magic refused or stopped, "misleading: ..." for a refusal
# whose message names the wrong cause.

KNOWN: dict[str, str] = {
    # ------------------------------------------------ silent differences
    "s4-str-itertools-groupby-runs": (
        "SILENT (documented exception with a visible effect): grp (only its "
        "type): the groups are drawn with their keys before any iteration "
        "runs, each as an iterator over its own items (a list_iterator; "
        "serially an itertools._grouper), so the results are the serial ones "
        "and the loop variable left after the loop is an exhausted iterator "
        "of another type (was SILENT: every group empty)"
    ),
    "s4-str-groupby-itemgetter-records": (
        "SILENT (documented exception with a visible effect): grp (only its "
        "type), as s4-str-itertools-groupby-runs"
    ),
    "s4-rp-bound-method-alias": (
        "false refusal (was SILENT): `remember = seen_words.add` before the "
        "loop, `remember(w)` in the body: refused before anything runs, "
        "advising `seen_words.add(w)` (merged as a union); gpucell does not "
        "yet resolve the alias to its object"
    ),
    "s4-rp-list-append-alias": (
        "false refusal (was SILENT): `emit = lengths.append`; as "
        "s4-rp-bound-method-alias"
    ),
    "s4-rp-deque-append-alias": (
        "false refusal (was SILENT): `push = recent.appendleft`; as "
        "s4-rp-bound-method-alias"
    ),
    "s4-rp-map-bound-add": (
        "false refusal (was SILENT): `any(map(vocab.add, ...))` stops at run "
        "time (InputChanged: `vocab` changed in place), nothing merged: the "
        "bound method passed to map is now watched, not replayed"
    ),
    "s4-rp-default-arg-bound-append": (
        "false refusal (was SILENT): a helper's default argument "
        "`sink=metrics.append` stops at run time (InputChanged: a default "
        "argument it keeps state in changed), nothing merged"
    ),
    "s4-io-csv-writer-per-item": (
        "SILENT (documented exception with a visible effect): w (only "
        "serially): the loop-local `w = csv.writer(out)` cannot travel back, "
        "`w` keeps its value from before the cell, with a note"
    ),
    # ------------------------------------------------ false refusals
    "s4-cat-np-piece-mutated-after": (
        "false refusal: a preallocated buffer `row[:] = [...]` then "
        "`table = np.vstack([table, row])` then `row *= 0`: 'row is combined "
        "across iterations (indexed write) and is also used here' (the whole "
        "buffer is overwritten each iteration: the last write wins); the "
        "message also says `table` is used elsewhere, which it is not"
    ),
}

#: cases whose outcome is a race between the engines (not strict)
FLAKY: dict[str, str] = {}

#: cases whose engines may keep process-wide state: what puts it back there
ENGINE_STATE: dict[str, str] = {}

OUTCOMES: dict[str, Outcome] = {}


_report = report_to("SWEEP_REPORT_S4", OUTCOMES)


@pytest.mark.parametrize("c", list(corpus_params(CASES, KNOWN, FLAKY)))
def test_loop(sweep, private_cluster, c: Case):  # noqa: F811 - sweep is a fixture
    check_case(sweep, private_cluster, c, OUTCOMES, ENGINE_STATE)


# ---------------------------------------------------------------- messages
# A refusal the sweep accepts (the namespace is right) can still send the
# user the wrong way: each row is a cell, the message's check, and why it is
# xfail(strict=True) while the message misleads.

MESSAGES = [
    pytest.param(
        "import numpy as np\n",
        "x = np.array([1.0])\nfor i in range(6):\n"
        "    x = np.append(x, x[-1] * 1.5 + i)\n",
        "!`x += ...`",
        id="concat-read-in-same-statement-no-elementwise-advice",
    ),
    pytest.param(
        "import numpy as np\nbatches = [np.ones((2, 3)) * k for k in range(4)]\n",
        "X_all = None\nfor b in batches:\n"
        "    X_all = b if X_all is None else np.vstack([X_all, b])\n",
        "!hits[0]",
        id="none-start-concat-is-not-a-first-match",
    ),
    pytest.param(
        "from collections import Counter\nstock = Counter(a=5, b=5)\n"
        "orders = [(['a'], ['b']), (['b', 'b'], [])]\n",
        "for sold, back in orders:\n    stock.subtract(sold)\n    stock.update(back)\n",
        "!set union",
        id="counter-update-is-not-a-set-union",
    ),
    pytest.param(
        "index = {'Cat': {1}, 'dog': {2}}\n",
        "for k in list(index):\n    index.setdefault(k.lower(), set()).add(len(k))\n",
        "!for k.lower()",
        id="advice-is-python",
    ),
]


@pytest.mark.parametrize(("setup", "cell", "check"), MESSAGES)
def test_message(sweep, private_cluster, setup: str, cell: str, check: str):  # noqa: F811
    check_message(sweep, setup, cell, check)
