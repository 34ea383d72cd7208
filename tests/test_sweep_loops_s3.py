"""The third held-in sweep, tests/sweep_loops_corpus_s3.py (scikit-learn
cross-validation and grids, pandas group / row / column loops, numpy and
scipy per-parameter loops, torch sweeps, control-flow forms, side effects),
against the first law with tests/test_sweep_loops.py's harness: each case
runs serially, then through ``%%gpu_parallel`` after a fresh setup, and must
leave the same namespace and log lines, or refuse / fail with the namespace
untouched (a refusal of a "safe" case is a false refusal).

Known failures are ``xfail(strict=True)`` in ``KNOWN``.
``SWEEP_REPORT_S3=path.json`` writes every case's outcome there.
"""

from __future__ import annotations

import pytest
from sweep_loops_corpus_s3 import CASES, Case
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
    # ------------------------------------------------ false refusals
    "s3-fx-counter-subtract": (
        "false refusal: `budget.subtract(...)` on a Counter made before the "
        "loop stops at run time (InputChanged: '`budget` changed in place ... "
        "Inputs are read-only'), while `budget.update(...)` is merged as a "
        "keyed reduction: subtract is its negation"
    ),
    "s3-torch-prune-own-models": (
        "false refusal: `prune.l1_unstructured(layer, ...)` on the loop's own "
        "layers stops at the merge: 'the item of iteration 0 (a Linear) "
        "changed in place and cannot be written back: its parameters are not "
        "the ones the engine's copy has' (pruning replaces `weight` by a "
        "`weight_orig` parameter, a `weight_mask` buffer and a forward "
        "pre-hook; the write-back would have to carry all three)"
    ),
    "s3-np-own-arrays-reshape-attr": (
        "false refusal: `g_.shape = (3, 4)` on the loop's own arrays stops at "
        "the merge: 'the item of iteration 0 (a ndarray) changed in place and "
        "cannot be written back: its shape changed' (setting `.shape` on the "
        "kernel's array, then copying, would be the serial result)"
    ),
}

#: cases whose engines may keep process-wide state: what puts it back there
ENGINE_STATE: dict[str, str] = {
    "s3-fx-u-np-set-printoptions-in-body": (
        "import numpy\nnumpy.set_printoptions(precision=8)\n"
    ),
    "s3-fx-u-pd-options-attr-in-body": (
        "import pandas\npandas.reset_option('display.precision')\n"
    ),
    "s3-fx-u-torch-backends-flag-in-body": (
        "import torch.backends.cudnn\ntorch.backends.cudnn.benchmark = False\n"
    ),
    "s3-fx-u-logger-levels-per-item": (
        "import logging\n"
        "for _n in ('db', 'net', 'ui'):\n"
        "    logging.getLogger('s3app.' + _n).setLevel(logging.NOTSET)\n"
    ),
}

OUTCOMES: dict[str, Outcome] = {}


_report = report_to("SWEEP_REPORT_S3", OUTCOMES)


@pytest.mark.parametrize("c", list(corpus_params(CASES, KNOWN)))
def test_loop(sweep, private_cluster, c: Case):  # noqa: F811 - sweep is a fixture
    check_case(sweep, private_cluster, c, OUTCOMES, ENGINE_STATE)


# ---------------------------------------------------------------- messages
# A refusal or warning the sweep accepts (the namespace is right) can still
# send the user the wrong way: each row is a cell, the message's check, and
# why it is xfail(strict=True) while the message misleads.

MESSAGES = [
    pytest.param(
        "x_n, it = 3.0, 0\n",
        "while abs(x_n * x_n - 2) > 1e-12 and it < 50:\n"
        "    x_n = x_n - (x_n * x_n - 2) / (2 * x_n)\n"
        "    it += 1\n",
        "while",
        id="while-loop-is-named",
    ),
    pytest.param(
        "import torch\n",
        "inits = []\nfor seed in range(4):\n"
        "    g = torch.Generator().manual_seed(seed)\n"
        "    inits.append(torch.randn(3, generator=g))\n",
        "!global random generator",
        id="explicit-torch-generator-is-not-global",
    ),
    pytest.param(
        "import numpy as np\n"
        "splits = [np.array([0, 2, 4]), np.array([1, 2, 5]), np.array([0, 3])]\n",
        "votes = np.zeros(6)\nfor va in splits:\n    votes[va] = votes[va] + 1\n",
        "votes[va]",
        id="overlapping-index-key-by-its-source",
    ),
    pytest.param(
        "import pandas as pd\ndf = pd.DataFrame({'u': [1.0, 2.0, 3.0, 4.0]})\n",
        "df['s'] = 0.0\nfor i in df.index[1:]:\n"
        "    df.loc[i, 's'] = df.loc[i - 1, 's'] + df.loc[i, 'u']\n",
        "!iterates over `df`",
        id="index-slice-is-not-the-frame",
    ),
]


@pytest.mark.parametrize(("setup", "cell", "check"), MESSAGES)
def test_message(sweep, private_cluster, setup: str, cell: str, check: str):  # noqa: F811
    check_message(sweep, setup, cell, check)


def test_the_bar_the_loop_iterates_ends_as_serially(sweep, private_cluster):  # noqa: F811
    """``for d in pbar: pbar.set_postfix(...)``: the kernel draws the items
    through the bar and makes its drawing calls in iteration order at the
    merge (core/progressbars.py): the bar ends as the serial cell leaves it.
    (Not a corpus case: two setups' bars differ in fields the sweep compares.)"""
    import io

    from tqdm import tqdm

    ip = sweep.ip
    docs = ["a b", "c", "d e f", "g", "h i", "j"]
    ip.run_cell("import io\nfrom tqdm import tqdm\n").raise_error()
    ip.user_ns.update(docs=docs, pbar=tqdm(docs, file=io.StringIO(), mininterval=3600))
    cell = "for d in pbar:\n    pbar.set_postfix(words=len(d.split()), refresh=False)\n"
    serial = tqdm(docs, file=io.StringIO(), mininterval=3600)
    for d in serial:
        serial.set_postfix(words=len(d.split()), refresh=False)
    ip.run_cell_magic("gpu_parallel", "--quiet", cell)
    pbar = ip.user_ns["pbar"]
    assert (pbar.n, pbar.postfix, pbar.disable) == (
        serial.n,
        serial.postfix,
        serial.disable,
    )
