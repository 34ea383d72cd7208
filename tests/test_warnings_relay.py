"""Warnings an iteration shows on an engine are issued again in the kernel,
in iteration order, as the serial cell shows them: once per place under the
default filter, every time under "always", turned into ``py.warnings`` log
records by ``logging.captureWarnings``; a ``catch_warnings(record=True)``
inside the body still records them there; one around the loop is refused
(each engine would record into its own copy of the list)."""

from __future__ import annotations

import pytest

from gpucell.errors import NotParallelizable

pytestmark = pytest.mark.cluster

#: on the engines, never inline in the kernel
ENGINES = "--quiet --schedule static"

LOOP = "for i in range(6):\n    warnings.warn(f'w{i % 2}', UserWarning)\n"


def _run(ip, cell: str, parallel: bool) -> None:
    if parallel:
        ip.run_cell_magic("gpu_parallel", ENGINES, cell)
    else:
        r = ip.run_cell(cell)
        assert r.success, r.error_in_exec


@pytest.fixture
def fresh_warnings(ip):
    ip.run_cell("import warnings\nwarnings.resetwarnings()")
    yield
    ip.run_cell(
        "import logging\nlogging.captureWarnings(False)\nwarnings.resetwarnings()"
    )
    ip.user_ns.pop("__warningregistry__", None)


@pytest.mark.parametrize("action", ["default", "always", "once"])
def test_warnings_are_shown_as_often_as_serially(ip, cluster, fresh_warnings, action):
    import warnings

    shown = []
    for parallel in (False, True):
        ip.user_ns.pop("__warningregistry__", None)
        with warnings.catch_warnings(record=True) as caught:
            ip.run_cell(f"warnings.simplefilter({action!r})")
            _run(ip, LOOP, parallel)
        shown.append([(str(w.message), w.category, w.lineno) for w in caught])
    serial, parallel = shown
    # the magic's own line is the cell's first: the loop's lines are one down
    assert parallel == [(m, c, n + 1) for m, c, n in serial]
    assert len(serial) == {"default": 2, "always": 6, "once": 2}[action]


def test_capture_warnings_logs_them_in_order_among_the_records(
    ip, cluster, fresh_warnings
):
    setup = (
        "import logging\nclass _Keep(logging.Handler):\n"
        "    def emit(self, r):\n        got.append((r.name, r.getMessage()[-40:]))\n"
        "got = []\nlogging.captureWarnings(True)\n"
        "lg = logging.getLogger('nb')\nlg.setLevel(logging.INFO)\n"
        "for name in ('py.warnings', 'nb'):\n"
        "    logging.getLogger(name).handlers[:] = [_Keep()]\n"
        "    logging.getLogger(name).propagate = False\n"
        "warnings.simplefilter('always')\n"
    )
    cell = "for i in range(4):\n    lg.info(f'it {i}')\n    warnings.warn(f'w{i}')\n"
    runs = []
    for parallel in (False, True):
        ip.run_cell(setup)
        _run(ip, cell, parallel)
        runs.append(list(ip.user_ns["got"]))
    assert runs[1] == runs[0]
    assert [n for n, _m in runs[0]] == ["nb", "py.warnings"] * 4


def test_a_record_inside_the_body_still_records_there(ip, cluster, fresh_warnings):
    ip.run_cell("warnings.simplefilter('always')")
    cell = (
        "counts = []\nfor i in range(5):\n"
        "    with warnings.catch_warnings(record=True) as w:\n"
        "        for _ in range(i):\n            warnings.warn('x')\n"
        "    counts.append(len(w))\n"
    )
    ip.run_cell_magic("gpu_parallel", ENGINES, cell)
    assert ip.user_ns["counts"] == [0, 1, 2, 3, 4]


def test_an_error_filter_still_fails_the_iteration(ip, cluster, fresh_warnings):
    ip.run_cell("warnings.simplefilter('error')\nout = []")
    with pytest.raises(UserWarning, match="w[01]"):
        ip.run_cell_magic("gpu_parallel", ENGINES, "out = []\n" + LOOP)
    assert ip.user_ns["out"] == []


def test_a_recording_catch_warnings_around_the_loop_is_refused(
    ip, cluster, fresh_warnings
):
    ip.user_ns["caught"] = "before"
    cell = (
        "with warnings.catch_warnings(record=True) as caught:\n"
        "    warnings.simplefilter('always')\n"
        "    for i in range(3):\n        warnings.warn(f'w{i}')\n"
    )
    with pytest.raises(NotParallelizable, match=r"record=True\).*line 2.*own copy"):
        ip.run_cell_magic("gpu_parallel", ENGINES, cell)
    assert ip.user_ns["caught"] == []  # the prelude entered the with, as serially
